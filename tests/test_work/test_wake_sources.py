"""Every way work becomes claimable wakes a drained worker before its poll: a create, a
reaper's requeue and reclaim, a released lease, and a due time reached (a retry's
backoff, a delayed job), on every store.

The poll interval is a day in these tests: a worker that found the job only by polling
would never finish, so a test passes only if the wake-up (or the due time the worker read)
brought the worker back.  Waits are bounded (``PATIENT``); nothing is timed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import STORE_FACTORIES

from fsm import AsyncEngine, Engine, InvalidArgument, JobLifecycle, ManualClock
from fsm.aio import AsyncWorker
from fsm.reaping import Reaper
from fsm.work import Job, Worker
from fsm.work.loop import MIN_DUE_WAIT, Call, WorkerCore
from fsm.work.pool import HandlerPool
from stores import MemoryStore, Store
from stores.aio import AsyncMemoryStore

A_DAY = timedelta(days=1)
PATIENT = 30.0


def wait_until(predicate: Any, what: str) -> None:
    pause = threading.Event()
    for _ in range(int(PATIENT / 0.01)):
        if predicate():
            return
        pause.wait(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture(params=sorted(STORE_FACTORIES))
def real_time_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each store on the real clock (a due time must arrive while the worker sleeps)."""
    store = STORE_FACTORIES[request.param](None)  # type: ignore[arg-type]
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()


class Idle:
    """A worker run on a thread, with a flag raised once it sleeps for work (so what the
    test does next can only reach the worker by waking it)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.sleeping = threading.Event()
        original = worker.wait_work

        def wait_work(timeout: float) -> None:
            self.sleeping.set()
            original(timeout)

        worker.wait_work = wait_work  # type: ignore[method-assign]
        self.thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        self.thread.start()
        assert self.sleeping.wait(PATIENT), "the worker never went to sleep"

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(PATIENT)
        assert not self.thread.is_alive()


# -- the store's next due time -------------------------------------------------------------


def test_next_due_is_the_earliest_row_still_waiting_in_the_given_states(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    next_due = any_store.next_due  # type: ignore[attr-defined]
    assert next_due("job", ["queued"]) is None
    jobs.create("now")
    assert next_due("job", ["queued"]) is None  # due already: a claim takes it, no wait
    jobs.create("in-30", run_after=timedelta(seconds=30))
    jobs.create("in-10", run_after=timedelta(seconds=10))
    assert next_due("job", ["queued"]) == pytest.approx(10.0, abs=1e-3)
    assert next_due("job", ("running", "queued")) == pytest.approx(10.0, abs=1e-3)
    assert next_due("job", ["running"]) is None
    assert next_due("other", ["queued"]) is None
    clock.advance(seconds=10)
    assert next_due("job", ["queued"]) == pytest.approx(20.0, abs=1e-3)


def test_next_due_refuses_bad_arguments_with_a_typed_error(any_store: Store) -> None:
    next_due = any_store.next_due  # type: ignore[attr-defined]
    for kind, states in (("job", []), ("job", "queued"), ("job", ["q\x00"]), ("j\x00b", ["queued"]), (5, ["q"])):
        with pytest.raises(InvalidArgument):
            next_due(kind, states)
    with pytest.raises(InvalidArgument):
        next_due("job", ["s"] * 33)


# -- each wake source ---------------------------------------------------------------------


def test_a_drained_worker_claims_a_delayed_job_when_it_becomes_due(real_time_store: Store) -> None:
    jobs = Engine(JobLifecycle, real_time_store)
    ran = threading.Event()
    idle = Idle(Worker(jobs, {"running": lambda job: ran.set() or "exited"}, poll_interval=A_DAY))
    try:
        jobs.create("soon", run_after=timedelta(milliseconds=200))  # its create wakes nobody usefully
        assert ran.wait(PATIENT), "the worker slept past the job's due time"
    finally:
        idle.stop()


def test_a_retry_is_picked_up_when_its_backoff_ends_not_at_the_next_poll(real_time_store: Store) -> None:
    from fsm.policy import RetryPolicy

    retry = RetryPolicy(max_attempts=3, initial_interval=timedelta(milliseconds=200), jitter=0.0)
    jobs = Engine(JobLifecycle, real_time_store, policy=JobLifecycle.policy.replace(default_retry=retry))
    calls: list[int] = []
    done = threading.Event()

    def flaky(job: Job) -> str:
        calls.append(job.snapshot.attempt)
        if len(calls) == 1:
            raise ConnectionError("went away")
        done.set()
        return "exited"

    jobs.create("j")
    idle_worker = Worker(jobs, {"running": flaky}, poll_interval=A_DAY)
    thread = threading.Thread(target=idle_worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert done.wait(PATIENT), "the retry waited for the poll instead of its backoff"
        assert calls == [1, 2]
    finally:
        idle_worker.stop()
        thread.join(PATIENT)


@pytest.mark.parametrize("where", ["running", "finalizing"])
def test_a_reaper_requeue_or_reclaim_wakes_a_drained_worker(any_store: Store, clock: ManualClock, where: str) -> None:
    dead = Engine(JobLifecycle, any_store, clock=clock, owner="dead")
    dead.create("j")
    (snap,) = dead.claim()
    assert snap.lease is not None
    if where == "finalizing":
        dead.fire(snap, "exited", lease=snap.lease)
    ran = threading.Event()
    rescuer = Engine(JobLifecycle, any_store, clock=clock, owner="rescuer")
    handler = {where: lambda job: ran.set() or ("exited" if where == "running" else "complete")}
    idle = Idle(Worker(rescuer, handler, poll_interval=A_DAY))  # type: ignore[arg-type]
    try:
        clock.advance(dead.policy.lease_ttl + timedelta(seconds=1))  # the holder died
        moved = Reaper(any_store, [JobLifecycle], clock=clock).run_once().moved
        assert moved == ({"job.expire": 1} if where == "running" else {"job.reclaim": 1})
        assert ran.wait(PATIENT), "the worker slept through the reaper's move"
    finally:
        idle.stop()


def test_a_released_lease_wakes_a_drained_worker(any_store: Store, clock: ManualClock) -> None:
    first = Engine(JobLifecycle, any_store, clock=clock, owner="first")
    first.create("j")
    (snap,) = first.claim()
    assert snap.lease is not None
    first.fire(snap, "exited", lease=snap.lease)
    ran = threading.Event()
    second = Engine(JobLifecycle, any_store, clock=clock, owner="second")
    idle = Idle(Worker(second, {"finalizing": lambda job: ran.set() or "complete"}, poll_interval=A_DAY))
    try:
        first.release_lease(snap.lease)
        assert ran.wait(PATIENT), "the worker slept through the release"
    finally:
        idle.stop()


def test_the_async_worker_claims_a_delayed_job_when_it_becomes_due() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        ran = asyncio.Event()

        async def running(job: Any) -> str:
            ran.set()
            return "exited"

        worker = AsyncWorker(jobs, {"running": running}, poll_interval=A_DAY)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.05)
        await jobs.create("soon", run_after=timedelta(milliseconds=200))
        await asyncio.wait_for(ran.wait(), PATIENT)
        await worker.stop()
        await task

    asyncio.run(scenario())


# -- the loop's decisions, step by step -------------------------------------------------------


class Face:
    """A scripted face: what each step returns, and the steps the loop took."""

    def __init__(self, core: WorkerCore, claims: list[int], due: float | None) -> None:
        self.core, self.claims, self.due = core, claims, due
        self.steps: list[tuple[str, tuple[Any, ...]]] = []

    @property
    def stopping(self) -> bool:
        return not self.claims

    def run_once(self) -> int:
        n = self.claims.pop(0)
        self.core.running += n
        return n

    def wait_slot(self) -> None:
        self.core.running -= 1

    def wait_slot_more(self, need: int, timeout: float) -> None:
        self.core.running = 0

    def next_due(self) -> float | None:
        return self.due

    def wait_work(self, timeout: float) -> None:
        pass


def steps_of(face: Face) -> list[tuple[str, tuple[Any, ...]]]:
    gen = face.core.loop(face)  # type: ignore[arg-type]
    value: Any = None
    taken = []
    try:
        while True:
            call: Call = gen.send(value)
            taken.append((call.fn.__name__, call.args))
            value = call.fn(*call.args)
    except StopIteration:
        return taken


def core(**kw: Any) -> WorkerCore:
    engine = Engine(JobLifecycle, MemoryStore())
    options = {"concurrency": 4, "poll_interval": timedelta(seconds=5), "grace": timedelta(seconds=1)} | kw
    return WorkerCore(engine.table, engine.kind, {"running": lambda job: "exited"}, **options)


def test_a_full_worker_gathers_freed_slots_then_claims_them_all_at_once() -> None:
    c = core(claim_gather=timedelta(milliseconds=2))
    assert steps_of(Face(c, [4, 4], None)) == [
        ("run_once", ()),
        ("wait_slot", ()),
        ("wait_slot_more", (4, 0.002)),  # up to 2 ms for the other three
        ("run_once", ()),  # every free slot in one claim
    ]


def test_without_a_gather_window_a_freed_slot_is_claimed_at_once() -> None:
    c = core(claim_gather=timedelta(0))
    assert [name for name, _ in steps_of(Face(c, [4, 1], None))] == ["run_once", "wait_slot", "run_once"]


@pytest.mark.parametrize(("due", "wait"), [(None, 5.0), (0.25, 0.25), (60.0, 5.0), (0.0, MIN_DUE_WAIT)])
def test_a_drained_worker_sleeps_until_the_poll_or_the_next_due_time(due: float | None, wait: float) -> None:
    assert steps_of(Face(core(), [0], due)) == [("run_once", ()), ("next_due", ()), ("wait_work", (wait,))]


def test_the_claim_gather_is_validated() -> None:
    from fsm import ConfigError

    for bad in (timedelta(seconds=-1), timedelta(seconds=2), 0.002):
        with pytest.raises(ConfigError, match="claim_gather"):
            core(claim_gather=bad)


# -- the handler pool -----------------------------------------------------------------------


def test_the_handler_pool_runs_items_and_gives_back_the_unstarted_at_shutdown() -> None:
    gate = threading.Event()
    started: list[int] = []

    def work(item: int) -> None:
        started.append(item)
        gate.wait(PATIENT)

    pool: HandlerPool[int] = HandlerPool(work, 1, "test-pool")
    pool.submit(1)
    wait_until(lambda: started == [1], "the first item started")
    pool.submit(2)
    pool.submit(3)
    assert pool.shutdown() == [2, 3]  # queued behind the busy thread: never started
    with pytest.raises(RuntimeError):
        pool.submit(4)
    gate.set()
    assert pool.shutdown() == []  # idempotent
