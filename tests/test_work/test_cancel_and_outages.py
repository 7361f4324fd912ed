"""A running job cancelled by an operator is told promptly; a store outage never fails a job.

- Cancel: the keeper reads the row of every lease held past ``fence_check`` (1 s by
  default) and tells the holder whose entity moved on without it (``job.lost``, the
  ``EntityMovedOn`` naming the event and the operator's reason).  The handler's late
  outcome is refused as ``Fenced``: one WARNING, no traceback, no retry or fail attempted.
- Outage: ``StoreUnavailable`` met by a handler (SQLite's write lock held by another
  process past the busy timeout) is retried with backoff and spends no attempt; recording
  that retry waits out the same outage while the lease is held; the job is never failed
  for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fsm import AsyncEngine, Engine, EntityMovedOn, Fenced, JobLifecycle, ManualClock, RetryPolicy
from fsm.aio import AsyncWorker
from fsm.errors import StoreUnavailable
from fsm.work import Job, Worker
from fsm.work.keepers import DEFAULT_FENCE_CHECK
from stores import Store
from stores.aio import AsyncMemoryStore

WAIT = 30.0
QUICK = {"poll_interval": timedelta(milliseconds=10)}


def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return
        threading.Event().wait(0.01)
    raise AssertionError(what)


@contextlib.contextmanager
def _running(worker: Worker) -> Iterator[None]:
    """``worker.run()`` on a thread for the block; stopped and joined after it."""
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    runner.start()
    try:
        yield
    finally:
        worker.stop()
        runner.join(WAIT)


def _failing_once(error: Exception) -> Any:
    """A running handler that raises ``error`` the first time and exits after."""
    calls: list[int] = []

    def agent(job: Job) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return "exited"

    return agent


# -- cancel ------------------------------------------------------------------------------------


def test_an_operators_cancel_reaches_the_running_handler_within_the_fence_check(
    any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's clock is real here: the keeper's check runs on its own time."""
    engine = Engine(JobLifecycle, any_store)
    job_id = engine.create().id
    told: dict[str, Any] = {}
    running = threading.Event()

    def agent(job: Job) -> str:
        running.set()
        job.held.wait_lost(WAIT)  # a long handler that checks job.lost between steps
        told["lost"], told["error"] = job.lost, job.held.error
        return "exited"  # its late outcome

    worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"}, **QUICK)
    caplog.set_level(logging.INFO)
    with _running(worker):
        assert running.wait(WAIT)
        engine.fire(job_id, "cancel", reason="operator alice: wrong branch")
        _until(lambda: "lost" in told, "the handler was never told")
        _until(lambda: worker.running == 0, "the handler never finished")
    assert told["lost"] is True
    error = told["error"]
    assert isinstance(error, EntityMovedOn) and isinstance(error, Fenced)
    assert error.cause == "cancel (operator alice: wrong branch)" and error.state == "failed"
    assert "operator alice" in str(error)
    snap = engine.get(job_id)
    assert snap.state == "failed" and [h.event for h in engine.history(job_id)] == ["start", "cancel"]
    assert worker.stats.fenced == 1 and worker.stats.failed == 0 and worker.stats.errors == []
    worker_lines = [r for r in caplog.records if r.name == "fsm.worker"]
    assert not [r for r in worker_lines if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere
    assert not [r for r in worker_lines if "could not retry" in r.getMessage() or "could not fail" in r.getMessage()]
    assert [r.levelno for r in worker_lines if "lost in running" in r.getMessage()] == [logging.WARNING]


def test_a_holders_late_outcome_after_a_cancel_is_fenced_not_transition_not_allowed(any_store: Store) -> None:
    engine = Engine(JobLifecycle, any_store)
    engine.create("j1")
    [held] = engine.claim(1)
    engine.fire("j1", "cancel", reason="operator bob")
    assert held.lease is not None
    with pytest.raises(EntityMovedOn, match=r"by cancel \(operator bob\)"):
        engine.fire(held, "exited", lease=held.lease)
    with pytest.raises(EntityMovedOn):
        engine.fire("j1", "exited", lease=held.lease)
    assert engine.get("j1").version == 2  # nothing written


def test_a_holder_that_finished_its_entity_itself_is_not_fenced_by_the_check(any_store: Store) -> None:
    from fsm.work.keepers import LeaseKeepers

    engine = Engine(JobLifecycle, any_store)
    engine.create("j1")
    [held] = engine.claim(1)
    assert held.lease is not None
    keepers = LeaseKeepers(engine, fence_check=timedelta(milliseconds=10))
    kept = keepers.keep(held.lease)
    after = engine.fire(held, "exited", lease=held.lease).snapshot
    engine.fire(after, "complete", lease=held.lease)
    threading.Event().wait(0.05)
    assert keepers.check_once() == {} and not kept.lost
    keepers.stop()


def test_the_async_worker_tells_a_cancelled_handler_too() -> None:
    async def scenario() -> dict[str, Any]:
        engine = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        job_id = (await engine.create()).id
        told: dict[str, Any] = {}

        async def agent(job: Any) -> str:
            deadline = time.monotonic() + WAIT
            while not job.lost and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            told["error"] = job.held.error
            return "exited"

        async def gates(job: Any) -> str:
            return "complete"

        worker = AsyncWorker(engine, {"running": agent, "finalizing": gates}, **QUICK)
        task = asyncio.create_task(worker.run())
        while (await engine.get(job_id)).state != "running":
            await asyncio.sleep(0.01)
        await engine.fire(job_id, "cancel", reason="operator carol")
        while "error" not in told or worker.running:
            await asyncio.sleep(0.01)
        await worker.stop()
        await task
        told["stats"] = worker.stats
        return told

    told = asyncio.run(asyncio.wait_for(scenario(), WAIT))
    assert isinstance(told["error"], EntityMovedOn) and told["error"].cause == "cancel (operator carol)"
    assert told["stats"].fenced == 1 and told["stats"].failed == 0


def test_the_fence_check_is_a_bounded_setting() -> None:
    from fsm import ConfigError
    from fsm.work.keepers import LeaseKeepers
    from stores import MemoryStore

    assert timedelta(0) < DEFAULT_FENCE_CHECK <= timedelta(seconds=5)
    for bad in (timedelta(0), timedelta(days=1), 1.0):
        with pytest.raises(ConfigError, match="fence_check"):
            LeaseKeepers(Engine(JobLifecycle, MemoryStore()), fence_check=bad)  # type: ignore[arg-type]


# -- outages -----------------------------------------------------------------------------------

_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held by another process
print("locked", flush=True)
sys.stdin.readline()  # until the test lets go
conn.execute("COMMIT")
"""


def _lock(db: Path) -> subprocess.Popen[str]:
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
    return locker


def _unlock(locker: subprocess.Popen[str]) -> None:
    try:
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.flush()
        locker.wait(WAIT)
    finally:
        if locker.poll() is None:
            locker.kill()
            locker.wait()


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_write_lock_held_by_another_process_through_a_handler_never_fails_the_job(
    tmp_path: Path, max_attempts: int
) -> None:
    """The handler meets the lock (StoreUnavailable after the busy timeout), and so does
    the worker recording the retry: it waits the lock out while the lease is held, the
    retry spends no attempt (even with ``max_attempts=1``), and the job completes."""
    from stores.sql import SqlStore

    db = tmp_path / "fsm.db"
    store = SqlStore(f"sqlite:///{db}", busy_timeout=0.2)
    quick = timedelta(milliseconds=1)
    retry = RetryPolicy(initial_interval=quick, max_interval=quick, jitter=0.0, max_attempts=max_attempts)
    engine = Engine(JobLifecycle, store, policy=JobLifecycle.policy.replace(default_retry=retry))
    engine.create("j1")
    lockers: list[subprocess.Popen[str]] = []
    ran: list[int] = []

    def agent(job: Job) -> str:
        ran.append(job.snapshot.attempt)
        if len(ran) == 1:
            lockers.append(_lock(db))
            threading.Timer(1.0, _unlock, args=(lockers[0],)).start()  # let go while the worker waits
            job.progress({"step": 1})  # meets the lock: StoreUnavailable
        return "exited"

    worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"}, **QUICK)
    try:
        with _running(worker):
            _until(lambda: engine.get("j1").state == "completed", "the job never completed")
    finally:
        for locker in lockers:
            if locker.poll() is None:
                locker.kill()
                locker.wait()
    history = engine.history("j1")
    assert [h.event for h in history] == ["start", "retry", "start", "exited", "complete"]
    retry_row = history[1]
    assert retry_row.error is not None and retry_row.error["transient"] is True
    assert retry_row.error["type"] == "StoreUnavailable" and retry_row.error["attempt"] == 1
    assert worker.stats.retried == 1 and len(ran) == 2
    store.close()


def test_an_outage_is_retried_without_a_retry_policy_and_spends_no_attempt(any_store: Store) -> None:
    """Without a RetryPolicy a handler error fails the job at once; an outage of the
    store does not: it is retried with the default backoff, its error marked transient."""
    engine = Engine(JobLifecycle, any_store, policy=JobLifecycle.policy.replace(default_retry=None))
    engine.create("j1")
    agent = _failing_once(StoreUnavailable("the database is restarting"))
    worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"}, **QUICK)
    assert worker.run_once() == 1
    _until(lambda: worker.running == 0, "the handler never finished")
    snap = engine.get("j1")
    assert snap.state == "queued" and snap.run_after is not None  # due again after the backoff
    [retry_row] = [h for h in engine.history("j1") if h.event == "retry"]
    assert retry_row.error is not None and retry_row.error["transient"] is True
    assert "fail" not in [h.event for h in engine.history("j1")]
    worker.stop()


def test_a_handler_error_whose_retry_meets_an_outage_is_retried_not_failed(
    any_store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's own trace: the handler raises, recording the retry meets an outage;
    the worker used to log "could not retry" and fail the job at attempt 1."""
    quick = timedelta(milliseconds=1)
    policy = JobLifecycle.policy.replace(default_retry=RetryPolicy(initial_interval=quick, max_interval=quick))
    engine = Engine(JobLifecycle, any_store, clock=clock, policy=policy)
    engine.create("j1")
    outages = [StoreUnavailable("too many clients already")] * 3
    real_fire = Job.fire

    def fire(self: Job, event: str, **kwargs: Any) -> Any:
        if event == "retry" and outages:
            raise outages.pop()
        return real_fire(self, event, **kwargs)

    monkeypatch.setattr(Job, "fire", fire)
    agent = _failing_once(RuntimeError("gate flaked"))
    worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"}, **QUICK)
    with _running(worker):
        _until(lambda: engine.get("j1").state == "queued" and not outages, "the retry was never recorded")
        clock.advance(seconds=1)  # past the backoff
        _until(lambda: engine.get("j1").state == "completed", "the job never completed")
    events = [h.event for h in engine.history("j1")]
    assert events == ["start", "retry", "start", "exited", "complete"] and not outages


@pytest.mark.parametrize("move", ["retry", "release"])
def test_a_holders_own_retry_or_release_before_it_leaves_the_keeper_is_not_a_loss(any_store: Store, move: str) -> None:
    """The keeper may read the row after the holder gave the lease back itself and before
    the worker stopped keeping it: that is the holder's own move, not a loss to report."""
    from fsm.work.keepers import LeaseKeepers

    engine = Engine(JobLifecycle, any_store)
    engine.create("j1")
    [held] = engine.claim(1)
    assert held.lease is not None
    keepers = LeaseKeepers(engine, fence_check=timedelta(milliseconds=10))
    kept = keepers.keep(held.lease)
    if move == "retry":
        engine.fire(held, "retry", lease=held.lease, run_after=timedelta(seconds=1))
    else:
        engine.release_lease(held.lease)
    threading.Event().wait(0.05)
    # the keeper's own thread checks every 10 ms too: a round of its may hold the lease
    # (its next check time set, its reads under way) when this one looks, so the lease is
    # forgotten by one round or the other, and neither may call it lost
    assert keepers.check_once() == {}
    _until(lambda: len(keepers) == 0, "the keeper forgot the lease its holder gave back")
    assert not kept.lost
    keepers.stop()


def test_a_fire_replayed_after_its_answer_was_lost_is_the_holders_own_not_fenced(any_store: Store) -> None:
    """The retry committed but its answer was lost (the connection broke): the worker
    fires it again with the same key and is given its own record, not ``EntityMovedOn``."""
    engine = Engine(JobLifecycle, any_store)
    engine.create("j1")
    [held] = engine.claim(1)
    assert held.lease is not None
    first = engine.fire(held, "retry", lease=held.lease, idempotency_key="worker-retry:1", run_after=timedelta(0))
    again = engine.fire(held, "retry", lease=held.lease, idempotency_key="worker-retry:1", run_after=timedelta(0))
    assert again.replayed and again.record.seq == first.record.seq
    assert [h.event for h in engine.history("j1")] == ["start", "retry"]


def test_a_store_error_that_never_heals_ends_in_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_OUTAGE_RETRIES outages in one state, the store's error is an attempt like
    any other: a handler whose store call always fails does not retry forever."""
    from fsm.work import loop
    from stores import MemoryStore

    monkeypatch.setattr(loop, "MAX_OUTAGE_RETRIES", 2)
    quick = timedelta(milliseconds=1)
    retry = RetryPolicy(initial_interval=quick, max_interval=quick, jitter=0.0, max_attempts=2)
    engine = Engine(JobLifecycle, MemoryStore(), policy=JobLifecycle.policy.replace(default_retry=retry))
    engine.create("j1")

    def agent(job: Job) -> str:
        raise StoreUnavailable("relation fsm_entities does not exist")

    worker = Worker(engine, {"running": agent, "finalizing": lambda job: "complete"}, **QUICK)
    with _running(worker):
        _until(lambda: engine.get("j1").state == "failed", "the job retried forever")
    retries = [h for h in engine.history("j1") if h.event == "retry"]
    assert [bool(h.error and h.error.get("transient")) for h in retries] == [True, True, False]
    assert engine.history("j1")[-1].reason == "error"


def test_the_fence_check_never_holds_up_the_renewals_during_an_outage() -> None:
    """One unreachable read ends the check (the rest wait for the next one), and no check
    runs while a renewal is failing: the keeper's next round tells holders in time."""
    from fsm.work.keepers import LeaseKeepers
    from stores import MemoryStore

    store = MemoryStore()
    engine = Engine(JobLifecycle, store)
    for i in range(3):
        engine.create(f"j{i}")
    claimed = engine.claim(3)
    keepers = LeaseKeepers(engine, fence_check=timedelta(hours=1))  # its own thread never checks here
    for snap in claimed:
        assert snap.lease is not None
        keepers.keep(snap.lease)
    reads: list[str] = []

    def unreachable(entity_id: str, **kwargs: Any) -> Any:
        reads.append(entity_id)
        raise StoreUnavailable("connection timed out")

    for kept in keepers._kept.values():
        kept.check = 0.0  # every one due for a check now
    engine.store.get = unreachable  # type: ignore[method-assign]
    assert keepers.check_once() == {} and len(reads) == 1
    engine.store.renew_leases = lambda *a, **k: (_ for _ in ()).throw(StoreUnavailable("down"))  # type: ignore[method-assign]
    keepers.run_once(all_of_them=True)  # every renewal fails: the keeper retries them sooner
    for kept in keepers._kept.values():
        kept.check = 0.0
    reads.clear()
    assert keepers.check_once() == {} and reads == []
    keepers.stop()
