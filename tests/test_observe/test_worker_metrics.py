"""A worker's Prometheus endpoint (``metrics_port=``), scraped from another process: a
worker process (sync or async) serves it while it works, and the test scrapes it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.exporter.prometheus")

from fsm import ConfigError, Engine, JobLifecycle, observe
from fsm.work import Worker
from stores import MemoryStore

CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    from datetime import timedelta
    from fsm import AsyncEngine, Engine, JobLifecycle, RetryPolicy
    from fsm.aio import AsyncWorker
    from fsm.work import Worker
    from stores.aio import AsyncSqlStore
    from stores.sql import SqlStore

    face, url = sys.argv[1], sys.argv[2]
    quick = timedelta(milliseconds=1)
    policy = JobLifecycle.policy.replace(
        default_retry=RetryPolicy(initial_interval=quick, max_interval=quick, jitter=0.0))
    seen = set()

    def agent(job):
        if job.id == "flaky" and job.id not in seen:  # fails once, then runs: one retry
            seen.add(job.id)
            raise RuntimeError("flaky agent")
        return "exited"

    async def agent_async(job):
        return agent(job)

    async def gates_async(job):
        return "complete"

    def report(worker):
        print("metrics on", worker.metrics.url, flush=True)
        sys.stdin.readline()  # the test scraped: stop

    if face == "sync":
        store = SqlStore(url)
        engine = Engine(JobLifecycle, store, policy=policy)
        for name in ("flaky", "steady"):
            engine.create(name)
        worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"},
                        poll_interval=timedelta(milliseconds=10), metrics_port=0)
        runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        runner.start()
        while engine.counts().get("completed", 0) < 2:
            threading.Event().wait(0.02)
        report(worker)
        worker.stop()
        runner.join()
        store.close()
    else:
        async def main():
            store = AsyncSqlStore(url)
            engine = AsyncEngine(JobLifecycle, store, policy=policy)
            for name in ("flaky", "steady"):
                await engine.create(name)
            worker = AsyncWorker(engine, {"running": agent_async, "finalizing": gates_async},
                                 poll_interval=timedelta(milliseconds=10), metrics_port=0)
            task = asyncio.create_task(worker.run())
            while (await engine.counts()).get("completed", 0) < 2:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(report, worker)
            await worker.stop()
            await task
            await store.close()
        asyncio.run(main())
    print("stopped", flush=True)
    """
)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def value(text: str, name: str, *labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_worker_process_serves_its_metrics_on_metrics_port(tmp_path: Path, face: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(CHILD)
    url = f"sqlite:///{tmp_path}/fsm.db"
    proc = subprocess.Popen(
        [sys.executable, str(script), face, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.startswith("metrics on "), (line, proc.stderr.read() if proc.poll() is not None else "")
        text = scrape(line.split()[-1])
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "stopped"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    job = 'fsm_kind="job"'
    assert value(text, "fsm_transitions_total", job, 'fsm_event="start"', 'fsm_actor="worker"') == 3, text
    assert value(text, "fsm_transitions_total", job, 'fsm_event="retry"') == 1, text
    assert value(text, "fsm_transitions_total", job, 'fsm_event="complete"') == 2, text
    assert value(text, "fsm_retries_total", job, 'fsm_state="running"', 'error_type="RuntimeError"') == 1, text
    assert value(text, "messaging_process_duration_seconds_count", 'fsm_outcome="retry"') == 1, text
    assert value(text, "fsm_claim_latency_seconds_count", job) == 3, text


def test_the_workers_of_a_process_share_one_endpoint_closed_by_the_last() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    first = Worker(engine, {"running": lambda job: None}, metrics_port=0)
    try:
        assert first.metrics is not None and observe.active() is first.metrics.instrumentation
        second = Worker(engine, {"running": lambda job: None}, metrics_port=first.metrics.port)
        third = Worker(engine, {"running": lambda job: None}, metrics_port=0)
        assert second.metrics is first.metrics and third.metrics is first.metrics
        with pytest.raises(ConfigError, match="one endpoint per process"):
            Worker(
                engine,
                {"running": lambda job: None},
                metrics_port=first.metrics.port + 1 if first.metrics.port < 65535 else 1,
            )
        url = first.metrics.url
        first.stop()
        second.stop()
        second.stop()  # a second stop releases nothing twice
        assert "fsm" in scrape(url) or scrape(url) is not None  # still served for the third
        third.stop()
        assert observe.active() is None
        with pytest.raises(OSError):
            scrape(url)
    finally:
        first.stop()
        observe.uninstrument()


@pytest.mark.parametrize("port", [-1, 70000, "9464", True, 1.5])
def test_a_bad_metrics_port_is_refused_with_a_typed_error_before_any_work(port: object) -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    with pytest.raises(ConfigError):
        Worker(engine, {"running": lambda job: None}, metrics_port=port)  # type: ignore[arg-type]
    assert observe.active() is None


def test_without_metrics_port_a_worker_serves_nothing() -> None:
    worker = Worker(Engine(JobLifecycle, MemoryStore()), {"running": lambda job: None})
    assert worker.metrics is None and observe.active() is None
    worker.stop()
