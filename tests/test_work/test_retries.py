"""Handler errors are attempts: retried under the state's RetryPolicy with a backoff (the
entity is due again only after it), each error recorded in history on the transition it
causes, and the entity failed with reason ``error`` once the attempts are spent."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from fsm import AsyncEngine, ConfigError, Engine, JobLifecycle, ManualClock
from fsm.aio import AsyncJob, AsyncWorker
from fsm.policy import NO_RETRY, Policy, RetryPolicy
from fsm.work import Job, Worker
from stores import Store
from stores.aio import AsyncMemoryStore

STEADY = RetryPolicy(max_attempts=3, initial_interval=timedelta(seconds=10), jitter=0.0)
QUICK = {"poll_interval": timedelta(milliseconds=10), "grace": timedelta(seconds=5)}


def settle(worker: Worker) -> None:
    """Wait until every handler the worker started has finished."""
    for _ in range(3000):
        if worker.running == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError("handlers never finished")


def test_a_connection_error_twice_then_success_completes_with_both_errors_in_history(
    any_store: Store, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock, policy=JobLifecycle.policy.replace(default_retry=STEADY))
    engine.create("j1")
    calls: list[int] = []

    def flaky(job: Job) -> str:
        calls.append(job.snapshot.attempt)
        if len(calls) <= 2:
            raise ConnectionError(f"database went away ({len(calls)})")
        return "exited"

    worker = Worker(engine, {"running": flaky}, **QUICK)
    for backoff in (timedelta(seconds=10), timedelta(seconds=20)):  # initial, then x2
        assert worker.run_once() == 1
        settle(worker)
        snap = engine.get("j1")
        assert snap.state == "queued" and snap.lease_owner is None
        assert snap.run_after == clock.now() + backoff  # due again after the backoff, not before
        clock.advance(backoff - timedelta(seconds=1))
        assert worker.run_once() == 0  # not yet due
        clock.advance(seconds=1)
    assert worker.run_once() == 1
    settle(worker)
    worker.stop()
    assert engine.get("j1").state == "finalizing" and calls == [1, 2, 3]
    retries = [h for h in engine.history("j1") if h.event == "retry"]
    assert [(h.source, h.target, h.actor) for h in retries] == [("running", "queued", "worker")] * 2
    errors = [h.error for h in retries]
    assert all(e is not None for e in errors)
    assert [(e["type"], e["message"], e["attempt"]) for e in errors if e] == [
        ("ConnectionError", "database went away (1)", 1),
        ("ConnectionError", "database went away (2)", 2),
    ]
    assert all("flaky" in e["traceback"] for e in errors if e)
    assert all(h.owner == engine.owner for h in retries)  # who held it, beside the token
    assert worker.stats.retried == 2 and worker.stats.failed == 2
    from fsm.inspect.timeline import timeline
    from fsm.inspect.views import attempts_section

    table = attempts_section(clock.now(), engine.history("j1"))
    assert "ConnectionError: database went away (1)" in table and "ConnectionError: database went away (2)" in table
    line = timeline(clock.now(), engine.history("j1"), [], None, [])  # the entity page's timeline rows
    assert "error 2 in running: ConnectionError: database went away (2)" in line


def test_spent_attempts_fail_the_entity_with_reason_error_and_the_last_error(
    any_store: Store, clock: ManualClock
) -> None:
    policy = JobLifecycle.policy.replace(default_retry=STEADY.replace(max_attempts=2))
    engine = Engine(JobLifecycle, any_store, clock=clock, policy=policy)
    engine.create("j1")

    def broken(job: Job) -> str:
        raise TimeoutError("gate timed out")

    worker = Worker(engine, {"running": broken}, **QUICK)
    worker.run_once()
    settle(worker)
    clock.advance(seconds=10)
    worker.run_once()
    settle(worker)
    worker.stop()
    last = engine.history("j1")[-1]
    assert engine.get("j1").state == "failed"
    assert (last.event, last.reason) == ("fail", "error")
    assert last.error is not None and (last.error["type"], last.error["attempt"]) == ("TimeoutError", 2)


def test_a_non_retryable_error_fails_at_once_and_retry_on_limits_what_retries(store: Store, clock: ManualClock) -> None:
    picky = STEADY.replace(retry_on=(OSError,), non_retryable=("PermissionError",))
    engine = Engine(JobLifecycle, store, clock=clock, policy=JobLifecycle.policy.replace(default_retry=picky))
    raised = {"a": ConnectionError("x"), "b": PermissionError("no"), "c": KeyError("k")}
    for entity_id in raised:
        engine.create(entity_id)

    def handler(job: Job) -> str:
        raise raised[job.id]

    worker = Worker(engine, {"running": handler}, concurrency=3, **QUICK)
    worker.run_once()
    settle(worker)
    worker.stop()
    assert {i: engine.get(i).state for i in raised} == {"a": "queued", "b": "failed", "c": "failed"}
    assert picky.retries(ConnectionError()) and not picky.retries(PermissionError()) and not picky.retries(KeyError())


def test_a_finalizer_error_retries_the_finalizer_and_replays_its_recorded_effects(
    store: Store, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, store, clock=clock, policy=JobLifecycle.policy.replace(default_retry=STEADY))
    engine.create("j1")
    gates: list[str] = []
    runs: list[int] = []

    def finalize(job: Job) -> str:
        runs.append(1)
        job.run("security", lambda key: gates.append("security") or {"ok": True})
        if len(runs) == 1:
            raise ConnectionError("merge gate unreachable")
        job.run("merge", lambda key: gates.append("merge") or {"ok": True})
        return "complete"

    worker = Worker(engine, {"running": lambda job: "exited", "finalizing": finalize}, **QUICK)
    worker.run_once()
    settle(worker)
    snap = engine.get("j1")
    assert (snap.state, snap.lease_owner) == ("finalizing", None)  # waiting for its backoff, not failed
    assert engine.history("j1")[-1].event == "retry" and snap.reclaims == 0
    clock.advance(seconds=10)
    worker.run_once()  # resumed: the security gate replays from the ledger
    settle(worker)
    worker.stop()
    assert engine.get("j1").state == "completed" and gates == ["security", "merge"]


def test_the_async_worker_retries_with_the_same_logic() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        engine = AsyncEngine(
            JobLifecycle,
            AsyncMemoryStore(clock=clock),
            clock=clock,
            policy=JobLifecycle.policy.replace(default_retry=STEADY),
        )
        await engine.create("j1")
        calls = 0

        async def flaky(job: AsyncJob) -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise ConnectionError("once")
            return "exited"

        worker = AsyncWorker(engine, {"running": flaky}, **QUICK)
        await worker.run_once()
        while worker.running:
            await asyncio.sleep(0.01)
        assert (await engine.get("j1")).state == "queued"
        assert await worker.run_once() == 0  # its backoff has not passed
        clock.advance(seconds=10)
        await worker.run_once()
        while worker.running:
            await asyncio.sleep(0.01)
        await worker.stop()
        history = await engine.history("j1")
        assert (await engine.get("j1")).state == "finalizing"
        assert [h.error["type"] for h in history if h.error] == ["ConnectionError"]

    asyncio.run(scenario())


def test_backoff_grows_by_the_coefficient_up_to_the_cap_and_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=3.0,
        max_interval=timedelta(seconds=20),
        jitter=0.0,
    )
    assert [policy.backoff(n).total_seconds() for n in (1, 2, 3, 4, 50_000)] == [1, 3, 9, 20, 20]
    jittery = policy.replace(jitter=0.5)
    assert jittery.backoff(2, rand=lambda: 0.0) == timedelta(seconds=1.5)
    assert jittery.backoff(2, rand=lambda: 1.0) == timedelta(seconds=4.5)
    assert NO_RETRY.max_attempts == 1


def test_retry_and_policy_settings_are_validated_with_every_problem_named() -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy().replace(max_attempts=0, jitter=2.0)
    assert len(info.value.problems) == 2
    assert any("max_attempts" in p for p in info.value.problems)
    with pytest.raises(ConfigError, match="max_interval"):
        RetryPolicy().replace(initial_interval=timedelta(minutes=10))
    with pytest.raises(ConfigError, match="no field lease_tll"):
        JobLifecycle.policy.replace(lease_tll=timedelta(seconds=5))
    with pytest.raises(ConfigError, match="max_wait"):
        Policy().replace(max_wait=timedelta(seconds=1))
    shorter = JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=30))
    assert shorter.lease_ttl == timedelta(seconds=30)
    assert shorter.renewal_budget == JobLifecycle.policy.renewal_budget  # the rest is kept
    with pytest.raises(Exception, match="exception types"):
        RetryPolicy(retry_on=(42,))  # type: ignore[arg-type]
