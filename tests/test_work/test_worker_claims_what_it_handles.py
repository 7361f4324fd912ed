"""A worker claims only what it has a handler for, and refuses a handler map it cannot use.

A claim leaves an entity in a state (``running`` when it starts a queued job,
``finalizing`` when it resumes a reclaimed or released finalizer).  A worker passes the
states it handles to the claim (``Engine.claim(into=...)``), so a finalizer pool
(``{"finalizing": ...}``) never starts queued jobs it cannot run, and an agent pool
(``{"running": ...}``) gives the finalizer's lease back at once for a pool that has the
handler.  A map that handles none of those states is refused with a typed error naming them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from conftest import SqlTarget

from fsm import ConfigError, Engine, InvalidArgument, JobLifecycle, ManualClock
from fsm.work import Worker
from stores import Store

QUICK = {"poll_interval": timedelta(milliseconds=10)}
WAIT = 30.0


def settle(worker: Worker) -> None:
    deadline = time.monotonic() + WAIT
    while worker.running and time.monotonic() < deadline:
        threading.Event().wait(0.005)
    assert worker.running == 0, "handlers never finished"


@pytest.mark.parametrize("handlers", [{}, {"queued": lambda job: None}])
def test_a_handler_map_for_no_state_a_claim_leaves_an_entity_in_is_refused_naming_them(
    handlers: dict[str, Any],
) -> None:
    engine = Engine(JobLifecycle, _memory())
    with pytest.raises(
        ConfigError, match=r"no handler for a state a claim leaves an entity in \(finalizing, running\)"
    ):
        Worker(engine, handlers)


@pytest.mark.parametrize(
    ("handlers", "named"),
    [
        (None, "handlers must be a mapping"),
        ([], "handlers must be a mapping"),
        ({5: lambda job: None}, "handler keys must be state names"),
        ({"running": 5}, "every handler must be callable"),
    ],
)
def test_a_handler_map_of_the_wrong_type_is_a_config_error(handlers: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Worker(Engine(JobLifecycle, _memory()), handlers)


@pytest.mark.parametrize("interval", [timedelta(0), timedelta(milliseconds=1), timedelta(days=2), 1.0])
def test_a_poll_interval_that_would_spin_a_core_or_is_not_a_timedelta_is_refused(interval: Any) -> None:
    with pytest.raises(ConfigError, match="poll_interval must be a timedelta from 5 ms to 1 day"):
        Worker(Engine(JobLifecycle, _memory()), {"running": lambda job: "exited"}, poll_interval=interval)


def test_claim_into_refuses_states_the_lifecycle_does_not_have(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    for bad in ("running", ["nowhere"], [5], 7):
        with pytest.raises(InvalidArgument):
            engine.claim(1, into=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="nothing to claim"):
        engine.claim(1, into=["queued"])  # no claim leaves an entity queued
    assert engine.get("j1").state == "queued" and engine.get("j1").version == 0


def test_a_finalizer_pool_never_starts_queued_jobs_even_with_one_slot(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    for i in range(3):
        engine.create(f"q{i}")
    finalized: list[str] = []
    worker = Worker(engine, {"finalizing": lambda job: finalized.append(job.id) or "complete"}, concurrency=1, **QUICK)
    for _ in range(3):
        assert worker.run_once() == 0  # the queued jobs are the agent pool's
    settle(worker)
    assert [engine.get(f"q{i}").state for i in range(3)] == ["queued"] * 3
    assert all(engine.get(f"q{i}").lease_owner is None for i in range(3))
    assert worker.stats.claimed == 0 and worker.stats.finished == 0
    # a finalizer given back (a stopping worker, a reclaim) is this pool's to resume
    [started] = engine.claim(1)
    engine.fire(started, "exited", lease=started.lease)
    engine.release_lease(engine.get(started.id).lease)  # type: ignore[arg-type]
    assert worker.run_once() == 1
    settle(worker)
    worker.stop()
    assert finalized == [started.id] and engine.get(started.id).state == "completed"


def test_an_agent_pool_gives_the_finalizers_lease_back_at_once(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    worker = Worker(engine, {"running": lambda job: "exited"}, concurrency=1, **QUICK)
    assert worker.run_once() == 1
    settle(worker)
    snap = engine.get("j1")
    assert snap.state == "finalizing" and snap.lease_owner is None  # not held until the reaper's reclaim
    assert worker.stats.finished == 0 and worker.stats.released == 1
    assert worker.run_once() == 0  # and not claimed again by this pool
    [resumed] = engine.claim(1)  # the finalizer pool takes it at once
    assert resumed.id == "j1" and resumed.state == "finalizing"
    worker.stop()


_POOL = """
import signal, sys, threading
from datetime import timedelta
from fsm import Engine, JobLifecycle
from fsm.work import Worker
from stores.sql import SqlStore

url, prefix, pool = sys.argv[1], sys.argv[2], sys.argv[3]
store = SqlStore(url, table_prefix=prefix, create=False)
engine = Engine(JobLifecycle, store)
handlers = {"running": lambda job: "exited"} if pool == "agent" else {"finalizing": lambda job: "complete"}
worker = Worker(engine, handlers, concurrency=1, poll_interval=timedelta(milliseconds=20))
print("ready", flush=True)
worker.run()  # until SIGTERM
print("claimed", worker.stats.claimed, flush=True)
store.close()
"""


def _pool(target: SqlTarget, pool: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _POOL, target.url, target.prefix, pool],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _stop(child: subprocess.Popen[str]) -> int:
    child.send_signal(signal.SIGTERM)
    try:
        out, _ = child.communicate(timeout=WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    return int(out.split()[-1])


def test_two_worker_processes_split_by_state_each_claim_only_their_own(sql_target: SqlTarget) -> None:
    """A finalizer process alone leaves the queue untouched (one slot, no claims, no
    leases); an agent process beside it starts every job and hands each finalizer over:
    every job completes, no job waits for the reaper."""
    engine = Engine(JobLifecycle, sql_target.store())
    jobs = [engine.create().id for _ in range(6)]
    finalizers = _pool(sql_target, "finalizers")
    agents: subprocess.Popen[str] | None = None
    try:
        time.sleep(0.3)  # some idle polls of the finalizer pool: nothing it may claim
        assert all(engine.get(j).state == "queued" and engine.get(j).lease_owner is None for j in jobs)
        agents = _pool(sql_target, "agent")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and any(engine.get(j).state != "completed" for j in jobs):
            time.sleep(0.02)
        assert [engine.get(j).state for j in jobs] == ["completed"] * len(jobs)
        for j in jobs:  # one start, one exited, one complete: never a reclaim
            assert [h.event for h in engine.history(j)] == ["start", "exited", "complete"]
    finally:
        claimed_by_agents = _stop(agents) if agents is not None else 0
        claimed_by_finalizers = _stop(finalizers)
    assert claimed_by_agents == len(jobs) and claimed_by_finalizers == len(jobs)


def _memory() -> Store:
    from stores import MemoryStore

    return MemoryStore()


def test_claim_into_answers_hostile_collections_with_a_short_typed_error(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    for bad in (["\x00"], ["\ud800"], [f"s{i}" for i in range(100_000)], [None], [{"x": 1}]):
        with pytest.raises(InvalidArgument) as caught:
            engine.claim(1, into=bad)  # type: ignore[arg-type]
        assert len(str(caught.value)) < 1000
    assert engine.get("j1").state == "queued" and engine.get("j1").version == 0
