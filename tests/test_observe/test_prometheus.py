"""The Prometheus endpoint, scraped over HTTP: in this process, and from ``fsm reaper``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from tests_support import guide_block_after

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.exporter.prometheus")

from fsm import ConfigError, Engine, JobLifecycle, ManualClock, observe
from fsm.reaping import Reaper
from stores import MemoryStore


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def test_serve_metrics_exports_transitions_and_reaper_ticks_in_the_prometheus_text_format() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    with observe.serve_metrics(0) as server:
        try:
            assert server.host == "127.0.0.1" and server.port > 0
            engine = Engine(JobLifecycle, store, clock=clock)
            engine.create("j1")
            (snap,) = engine.claim()
            assert snap.lease is not None
            engine.fire("j1", "exited", lease=snap.lease)
            clock.advance(timedelta(minutes=3))
            Reaper(store, [JobLifecycle], clock=clock).run_once()
            text = scrape(server.url)
        finally:
            observe.uninstrument()
    lines = text.splitlines()
    assert any(
        line.startswith("fsm_transitions_total{")
        and 'fsm_event="exited"' in line
        and 'fsm_actor="worker"' in line
        and line.endswith(" 1.0")
        for line in lines
    ), text
    assert any(line.startswith("fsm_reaper_moves_total{") and 'fsm_event="reclaim"' in line for line in lines), text
    assert any(line.startswith("fsm_reaper_tick_duration_seconds_count") for line in lines), text
    assert any(line.startswith("messaging_client_consumed_messages_total{") for line in lines), text


def test_serve_metrics_refuses_a_bad_port_with_a_typed_error() -> None:
    for port in (-1, 70000, "9464", True, None):
        with pytest.raises(ConfigError):
            observe.serve_metrics(port)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        observe.serve_metrics(0, "bad\x00host")
    assert observe.active() is None


def test_fsm_reaper_serves_its_metrics_on_metrics_port_in_its_own_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    code = "import sys; from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "reaper", "--db", "memory://", "--interval", "0.05", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        url = None
        for _ in range(50):
            line = proc.stdout.readline()
            if line.startswith("metrics on "):
                url = line.split()[-1]
                break
        assert url is not None, "the reaper did not print its metrics URL"
        ticks = 0.0
        for _ in range(100):
            text = scrape(url)
            counts = [ln for ln in text.splitlines() if ln.startswith("fsm_reaper_tick_duration_seconds_count")]
            ticks = sum(float(ln.rsplit(" ", 1)[1]) for ln in counts)
            if ticks >= 2:
                break
        assert ticks >= 2, text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert proc.returncode == 0


def test_fsm_reaper_metrics_port_in_use_is_a_clear_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from fsm.cli import main

    with observe.serve_metrics(0) as taken:
        try:
            code = main(["reaper", "--db", "memory://", "--once", "--metrics-port", str(taken.port)])
        finally:
            observe.uninstrument()
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot serve metrics" in err and "Traceback" not in err


def test_the_readme_observability_example_runs_as_written(tmp_path: Path) -> None:

    script = tmp_path / "observe_example.py"
    script.write_text(guide_block_after("# Metrics, traces and logs"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert 'fsm_event="exited"' in done.stdout and 'fsm_event="start"' in done.stdout
