"""The worker: claims, runs a handler per state under a keeper, fires outcomes, stops gracefully."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest

from fsm import ConfigError, Engine, JobLifecycle, ManualClock
from fsm.work import Job, Worker
from stores import MemoryStore

GATES = ("security", "merge-gate", "coverage", "image-freshness")
QUICK = {"poll_interval": timedelta(milliseconds=10), "grace": timedelta(seconds=5)}


def drain(worker: Worker, expected: int) -> None:
    """Claim until ``expected`` entities were claimed, then wait for the handlers."""
    for _ in range(1000):
        worker.run_once()
        if worker.stats.claimed >= expected and worker.running == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"claimed {worker.stats.claimed} of {expected}")


def test_the_worker_claims_runs_each_state_handler_and_fires_its_outcome() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    executions: Counter[str] = Counter()

    def run_agent(job: Job) -> tuple[str, dict[str, int]]:
        return "exited", {"exit_code": 0}

    def run_gates(job: Job) -> str:
        for gate in GATES:
            job.run(gate, lambda key, gate=gate: executions.update([gate]) or {"status": "passed"})
        return "complete"

    for i in range(6):
        engine.create(f"j{i}")
    with Worker(engine, {"running": run_agent, "finalizing": run_gates}, concurrency=3, **QUICK) as worker:
        drain(worker, 6)
    assert {engine.get(f"j{i}").state for i in range(6)} == {"completed"}
    assert executions == Counter({gate: 6 for gate in GATES})
    assert worker.stats.claimed == 6 and worker.stats.finished == 6 and worker.stats.failed == 0
    assert engine.get("j0").data["exit_code"] == 0


def test_a_resumed_finalizer_replays_recorded_gates_and_runs_only_the_rest() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    first = Engine(JobLifecycle, store, clock=clock, owner="dead-worker")
    first.create("j1")
    (snap,) = first.claim()
    lease = snap.lease
    assert lease is not None
    first.fire("j1", "exited", lease=lease)
    for gate in GATES[:2]:  # the first owner records two gates, then dies
        first.run("j1", gate, lambda key: {"status": "passed"}, lease)
    clock.advance(first.policy.lease_ttl + timedelta(seconds=1))
    first.fire("j1", "reclaim", actor="reaper")
    executions: list[str] = []

    def run_gates(job: Job) -> str:
        for gate in GATES:
            job.run(gate, lambda key, gate=gate: executions.append(gate) or {"status": "passed"})
        return "complete"

    engine = Engine(JobLifecycle, store, clock=clock, owner="rescuer")
    with Worker(engine, {"finalizing": run_gates}, **QUICK) as worker:
        drain(worker, 1)
    assert executions == list(GATES[2:])  # gates 1-2 replayed from the ledger
    assert engine.get("j1").state == "completed"
    assert [e.key for e in engine.effects("j1")] == sorted(GATES)
    assert all(e.attempts == 1 for e in engine.effects("j1"))


def test_a_handler_that_raises_fails_its_entity_and_never_kills_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(JobLifecycle, MemoryStore(), policy=JobLifecycle.policy.replace(default_retry=None))

    def run_agent(job: Job) -> str:
        if job.id == "bad":
            raise RuntimeError("agent crashed")
        return "exited"

    engine.create("bad")
    engine.create("good")
    with Worker(engine, {"running": run_agent}, **QUICK) as worker:
        drain(worker, 2)
    assert engine.get("bad").state == "failed"
    failure = engine.history("bad")[-1]
    assert failure.reason == "error" and failure.error is not None
    assert (failure.error["type"], failure.error["message"], failure.error["attempt"]) == (
        "RuntimeError",
        "agent crashed",
        1,
    )
    assert "raise RuntimeError" in failure.error["traceback"]
    assert engine.get("good").state == "finalizing"
    assert worker.stats.failed == 1 and "bad: RuntimeError: agent crashed" in worker.stats.errors
    assert any("bad" in r.getMessage() for r in caplog.records if r.name == "fsm.worker")


def test_at_most_concurrency_handlers_run_at_once() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    release = threading.Event()
    running: list[int] = []
    lock = threading.Lock()
    active = 0

    def run_agent(job: Job) -> str:
        nonlocal active
        with lock:
            active += 1
            running.append(active)
        release.wait(10)
        with lock:
            active -= 1
        return "exited"

    for i in range(5):
        engine.create(f"j{i}")
    worker = Worker(engine, {"running": run_agent}, concurrency=2, **QUICK)
    assert worker.run_once() == 2
    assert worker.run_once() == 0  # no free slot: nothing more is claimed
    assert engine.counts()["queued"] == 3
    release.set()
    drain(worker, 5)
    worker.stop()
    assert max(running) <= 2 and engine.counts()["finalizing"] == 5


def test_stop_stops_claiming_waits_the_grace_then_releases_what_it_still_holds() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    started = threading.Event()
    finish = threading.Event()
    outcome: list[str] = []

    def stuck_agent(job: Job) -> str:
        started.set()
        finish.wait(10)
        try:
            job.fire("exited")
        except Exception as err:  # the released holder is fenced
            outcome.append(type(err).__name__)
            raise
        return "exited"

    engine.create("j1")
    engine.create("j2")
    worker = Worker(engine, {"running": stuck_agent}, concurrency=1, **QUICK)
    worker.run_once()
    assert started.wait(5)
    worker.stop(grace=timedelta(milliseconds=100))
    assert worker.run_once() == 0  # stopped: no more claims
    assert worker.stats.released == 1
    held_one = engine.get("j1")
    assert held_one.lease_owner is None and held_one.state == "running"
    other = Engine(JobLifecycle, engine.store, owner="other")
    assert {s.id for s in other.claim(5)} == {"j1", "j2"}  # released: claimable at once
    finish.set()
    for _ in range(100):
        if outcome:
            break
        threading.Event().wait(0.02)
    assert outcome == ["LeaseLost"]
    assert engine.get("j1").lease_owner == "other"


def test_a_worker_with_unknown_or_final_states_or_bad_settings_is_refused() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    with pytest.raises(ConfigError, match="finalising"):
        Worker(engine, {"finalising": lambda job: None})
    with pytest.raises(ConfigError, match="final states"):
        Worker(engine, {"completed": lambda job: None})
    with pytest.raises(ConfigError, match="concurrency"):
        Worker(engine, {"running": lambda job: None}, concurrency=0)
