"""Metrics of fsm.observe, read through the SDK's InMemoryMetricReader."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from observe_support import Telemetry, telemetry

from fsm import Engine, Fenced, JobLifecycle, ManualClock, observe
from fsm.engine.engine import Engine as EngineClass
from fsm.reaping import Reaper
from fsm.work import Job, Worker
from stores import MemoryStore

__all__ = ["telemetry"]

TTL = timedelta(minutes=2)


def test_uninstrumented_the_engine_runs_its_own_functions_and_instrument_puts_them_back() -> None:
    original = EngineClass.__dict__["fire"]
    observe.instrument()
    try:
        assert EngineClass.__dict__["fire"] is not original
        assert observe.active() is not None
    finally:
        observe.uninstrument()
    assert EngineClass.__dict__["fire"] is original
    assert observe.active() is None
    observe.uninstrument()  # a second uninstrument is a no-op


def test_a_job_through_claim_effect_renewal_reclaim_and_a_late_write_is_counted(telemetry: Telemetry) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w1")
    engine.create("j1")
    clock.advance(timedelta(seconds=5))
    (snap,) = engine.claim()
    lease = snap.lease
    assert lease is not None
    assert telemetry.value("messaging.client.consumed.messages", messaging__destination__name="job") == 1
    assert telemetry.value("fsm.transitions", fsm__kind="job", fsm__event="start", fsm__actor="worker") == 1
    (latency,) = telemetry.points("fsm.claim.latency")
    assert latency.count == 1 and latency.sum == pytest.approx(5.0)

    lease = engine.renew_lease(lease)
    assert telemetry.value("fsm.lease.renewals", fsm__kind="job") == 1
    engine.fire("j1", "exited", lease=lease)
    assert engine.run("j1", "gate", lambda key: {"ok": True}, lease) == {"ok": True}
    assert telemetry.value("fsm.transitions", fsm__event="exited", fsm__actor="worker") == 1
    assert telemetry.value("fsm.effect.duration", fsm__kind="job", fsm__outcome="ok") == 1

    clock.advance(TTL + timedelta(seconds=1))  # the holder dies: its lease lapses
    result = Reaper(store, [JobLifecycle], clock=clock).run_once()
    assert result.moved["job.reclaim"] == 1
    assert telemetry.value("fsm.reaper.moves", fsm__kind="job", fsm__event="reclaim") == 1
    assert telemetry.value("fsm.transitions", fsm__event="reclaim", fsm__actor="reaper") == 1
    assert telemetry.value("fsm.reaper.tick.duration") == 1
    assert telemetry.value("fsm.reaper.lost_races") == result.lost_races
    assert telemetry.value("fsm.reaper.bad_rows") == result.bad_rows

    with pytest.raises(Fenced):
        engine.fire("j1", "complete", lease=lease)  # the dead holder's late write
    assert telemetry.value("fsm.writes.refused", fsm__kind="job", fsm__operation="fire") == 1
    assert telemetry.value("fsm.lease.lapses", fsm__kind="job") == 1
    # the refused fire wrote no transition, and the reclaim was counted once (by the tick)
    assert telemetry.value("fsm.transitions", fsm__event="complete") == 0
    assert telemetry.value("fsm.transitions", fsm__actor="reaper") == 1


def test_a_reaper_fire_row_by_row_is_counted_once_by_its_tick(telemetry: Telemetry) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    for i in range(3):
        engine.create(f"j{i}")
    engine.claim(3)
    clock.advance(TTL + timedelta(seconds=1))
    result = Reaper(store, [JobLifecycle], clock=clock).run_once()
    moved = result.total_moved
    assert moved == 3
    assert telemetry.value("fsm.transitions", fsm__actor="reaper") == moved
    assert telemetry.value("fsm.reaper.moves") == moved


def test_worker_handlers_are_timed_with_their_outcome(telemetry: Telemetry) -> None:
    engine = Engine(JobLifecycle, MemoryStore(), policy=JobLifecycle.policy.replace(default_retry=None))
    engine.create("ok")
    engine.create("bad")

    def run_agent(job: Job) -> str:
        if job.id == "bad":
            raise RuntimeError("agent crashed")
        return "exited"

    with Worker(
        engine,
        {"running": run_agent, "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=10),
    ) as worker:
        for _ in range(500):
            worker.run_once()
            if worker.stats.claimed >= 2 and worker.running == 0:
                break
            threading.Event().wait(0.01)
    attrs = {"messaging__destination__name": "job"}
    assert telemetry.value("messaging.process.duration", fsm__outcome="completed", **attrs) == 2  # running, finalizing
    assert telemetry.value("messaging.process.duration", fsm__outcome="failed", error__type="RuntimeError") == 1
    assert telemetry.value("fsm.transitions", fsm__event="complete", fsm__actor="worker") == 1
    assert telemetry.value("fsm.transitions", fsm__event="fail", fsm__actor="worker") == 1


def test_a_claim_that_resumes_a_reclaimed_finalizer_is_timed_from_the_reclaim(telemetry: Telemetry) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("j1")
    (snap,) = engine.claim()
    assert snap.lease is not None
    engine.fire("j1", "exited", lease=snap.lease)
    clock.advance(TTL + timedelta(seconds=1))
    Reaper(store, [JobLifecycle], clock=clock).run_once()
    clock.advance(timedelta(seconds=30))  # waits half a minute for a worker
    (resumed,) = engine.claim()
    assert resumed.state == "finalizing"
    points = [p for p in telemetry.points("fsm.claim.latency") if p.attributes["fsm.state"] == "finalizing"]
    assert len(points) == 1 and points[0].sum == pytest.approx(30.0)
    # a resume is a claim but no transition
    assert telemetry.value("messaging.client.consumed.messages") == 2
    assert telemetry.value("fsm.transitions", fsm__actor="worker", fsm__event="start") == 1
