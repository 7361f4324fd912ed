"""Metrics of fsm.observe, read through the SDK's InMemoryMetricReader."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

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


def _flaky_policy() -> Any:
    from fsm import RetryPolicy

    quick = timedelta(milliseconds=1)
    return JobLifecycle.policy.replace(
        default_retry=RetryPolicy(initial_interval=quick, max_interval=quick, jitter=0.0)
    )


def test_a_retried_handler_error_is_counted_as_a_retry_and_its_transition(telemetry: Telemetry) -> None:
    engine = Engine(JobLifecycle, MemoryStore(), policy=_flaky_policy())
    engine.create("flaky")
    raised: list[str] = []

    def run_agent(job: Job) -> str:
        if not raised:
            raised.append(job.id)
            raise TimeoutError("agent timed out")
        return "exited"

    with Worker(engine, {"running": run_agent, "finalizing": lambda job: "complete"}) as worker:
        for _ in range(500):
            worker.run_once()
            if engine.get("flaky").state == "completed":
                break
            threading.Event().wait(0.01)
    assert engine.get("flaky").state == "completed"
    assert telemetry.value("fsm.retries", fsm__kind="job", fsm__state="running", error__type="TimeoutError") == 1
    assert telemetry.value("fsm.retries") == 1
    assert telemetry.value("fsm.transitions", fsm__event="retry", fsm__actor="worker") == 1
    assert telemetry.value("fsm.transitions", fsm__event="start") == 2
    assert telemetry.value("messaging.process.duration", fsm__outcome="retry") == 1


def test_the_async_worker_counts_a_retry_too(telemetry: Telemetry) -> None:
    import asyncio

    from fsm import AsyncEngine
    from fsm.aio import AsyncJob, AsyncWorker
    from stores.aio import AsyncMemoryStore

    async def main() -> None:
        engine = AsyncEngine(JobLifecycle, AsyncMemoryStore(), policy=_flaky_policy())
        await engine.create("flaky")
        raised: list[str] = []

        async def run_agent(job: AsyncJob) -> str:
            if not raised:
                raised.append(job.id)
                raise TimeoutError("agent timed out")
            return "exited"

        async def run_gates(job: AsyncJob) -> str:
            return "complete"

        worker = AsyncWorker(engine, {"running": run_agent, "finalizing": run_gates})
        for _ in range(500):
            await worker.run_once()
            if (await engine.get("flaky")).state == "completed":
                break
            await asyncio.sleep(0.01)
        await worker.stop()
        assert (await engine.get("flaky")).state == "completed"

    asyncio.run(main())
    assert telemetry.value("fsm.retries", fsm__kind="job", fsm__state="running", error__type="TimeoutError") == 1
    assert telemetry.value("fsm.transitions", fsm__event="retry", fsm__actor="worker") == 1


def test_a_retried_start_waits_from_its_run_after_not_its_creation(
    telemetry: Telemetry, any_store: Any, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    clock.advance(timedelta(seconds=5))
    (first,) = engine.claim()
    assert first.lease is not None
    clock.advance(timedelta(seconds=20))
    engine.fire(first, "retry", lease=first.lease, run_after=timedelta(seconds=30))  # due 55 s after creation
    clock.advance(timedelta(seconds=40))  # claimed 65 s after creation: 10 s after it was due again
    (second,) = engine.claim()
    assert second.attempt == 2
    sums = sorted(p.sum for p in telemetry.points("fsm.claim.latency"))
    counts = sum(p.count for p in telemetry.points("fsm.claim.latency"))
    assert counts == 2 and sum(sums) == pytest.approx(5.0 + 10.0, abs=0.01), sums  # not 5 + 65


def test_a_requeued_start_keeps_its_place_and_waits_from_its_run_after(telemetry: Telemetry) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("j1", run_after=timedelta(seconds=10))
    clock.advance(timedelta(seconds=12))
    (first,) = engine.claim()  # waited 2 s
    clock.advance(TTL + timedelta(seconds=1))  # its holder dies
    assert Reaper(store, [JobLifecycle], clock=clock).run_once().moved["job.expire"] == 1
    assert engine.get("j1").state == "queued"
    clock.advance(timedelta(seconds=3))
    (second,) = engine.claim()
    assert second.attempt == 2 and second.run_after == first.run_after  # its place in line, kept
    waited = (clock.now() - first.run_after).total_seconds()  # from its due time, not from its creation
    total = sum(p.sum for p in telemetry.points("fsm.claim.latency"))
    assert total == pytest.approx(2.0 + waited, abs=0.01)
