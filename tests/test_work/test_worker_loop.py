"""The worker's loop on both faces: it never sleeps while full, a wake-up claims at once,
a stop ends every wait at once, and handlers still running past the grace are told.

The poll interval is a day in these tests: a loop that slept it anywhere would never
finish, so each test can only pass if the loop waits on the right event instead.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from fsm import AsyncEngine, Engine, JobLifecycle
from fsm.aio import AsyncJob, AsyncWorker
from fsm.work import Job, Worker
from fsm.work.loop import STOPPING
from stores import MemoryStore, Store
from stores.aio import AsyncMemoryStore

A_DAY = timedelta(days=1)
PATIENT = 30.0  # seconds a test waits for a thing that happens at once, before it fails


def in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return thread


def wait_until(predicate: object, what: str) -> None:
    done = threading.Event()
    for _ in range(int(PATIENT / 0.01)):
        if predicate():  # type: ignore[operator]
            return
        done.wait(0.01)
    raise AssertionError(f"never happened: {what}")


def test_a_full_worker_takes_the_next_job_when_a_slot_frees_not_at_the_next_poll() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    for i in range(6):
        engine.create(f"j{i}")
    worker = Worker(engine, {"running": lambda job: "exited"}, concurrency=1, poll_interval=A_DAY)
    thread = in_thread(worker)
    wait_until(lambda: engine.counts()["finalizing"] == 6, "all six drained through one slot")
    worker.stop()
    thread.join(PATIENT)
    assert not thread.is_alive()
    assert worker.stats.claimed == 6


def test_a_drained_worker_claims_at_once_when_woken() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    worker = Worker(engine, {"running": lambda job: "exited"}, concurrency=2, poll_interval=A_DAY)
    thread = in_thread(worker)
    wait_until(lambda: worker.stats.claimed == 0 and thread.is_alive(), "the loop running")
    threading.Event().wait(0.05)  # the loop is now waiting for work (a day)
    engine.create("late")
    worker.wake()
    wait_until(lambda: engine.get("late").state == "finalizing", "the woken worker took the new job")
    worker.stop()
    thread.join(PATIENT)
    assert not thread.is_alive()


def test_stop_ends_the_wait_for_work_and_the_wait_for_a_slot_at_once() -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    idle = Worker(engine, {"running": lambda job: "exited"}, poll_interval=A_DAY)
    idle_thread = in_thread(idle)
    engine.create("busy")
    release = threading.Event()
    full = Worker(engine, {"running": lambda job: release.wait(PATIENT) and "exited"}, concurrency=1)
    idle.stop()
    idle_thread.join(PATIENT)
    assert not idle_thread.is_alive()  # stopped in its day-long wait for work
    full_thread = in_thread(full)
    wait_until(lambda: full.running == 1, "the full worker's slot taken")
    stopper = threading.Thread(target=full.stop, kwargs={"grace": timedelta(seconds=PATIENT)})
    stopper.start()
    release.set()
    stopper.join(PATIENT)
    full_thread.join(PATIENT)
    assert not full_thread.is_alive()
    assert engine.get("busy").state == "finalizing"


def test_a_handler_running_past_the_grace_is_told_the_worker_is_stopping(any_store: Store) -> None:
    engine = Engine(JobLifecycle, any_store)
    engine.create("slow")
    started, told = threading.Event(), threading.Event()
    seen: list[object] = []

    def slow(job: Job) -> str:
        started.set()
        job.held.wait_lost(PATIENT)
        seen.extend([job.lost, job.held.reason])
        told.set()
        return "exited"  # refused: the lease was released at stop

    worker = Worker(engine, {"running": slow}, concurrency=1, poll_interval=A_DAY)
    worker.run_once()
    assert started.wait(PATIENT)
    worker.stop(grace=timedelta(milliseconds=50))
    assert told.wait(PATIENT)
    assert seen == [True, STOPPING]
    wait_until(lambda: worker.stats.fenced == 1, "the late outcome refused (fenced)")
    snap = engine.get("slow")
    assert snap.state == "running" and snap.lease_owner is None  # released for another worker


# -- the asyncio face drives the same loop -------------------------------------------------


def test_the_async_worker_drains_through_one_slot_wakes_and_stops_at_once() -> None:
    async def scenario() -> None:
        engine = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        for i in range(4):
            await engine.create(f"j{i}")

        async def agent(job: AsyncJob) -> str:
            return "exited"

        worker = AsyncWorker(engine, {"running": agent}, concurrency=1, poll_interval=A_DAY)
        run = asyncio.create_task(worker.run())
        async with asyncio.timeout(PATIENT):
            while (await engine.counts())["finalizing"] < 4:
                await asyncio.sleep(0.01)
            await engine.create("late")
            threading.Thread(target=worker.wake).start()  # from another thread, as a listener would
            while (await engine.get("late")).state != "finalizing":
                await asyncio.sleep(0.01)
            await worker.stop()
            stats = await run
        assert stats.claimed == 5

    asyncio.run(scenario())


def test_an_async_handler_running_past_the_grace_is_told_then_cancelled() -> None:
    async def scenario() -> None:
        engine = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await engine.create("slow")
        seen: list[object] = []
        started = asyncio.Event()

        async def slow(job: AsyncJob) -> str:
            started.set()
            try:
                await asyncio.sleep(PATIENT)
            except asyncio.CancelledError:
                seen.extend([job.lost, job.held.reason])
                raise
            return "exited"

        worker = AsyncWorker(engine, {"running": slow}, concurrency=1, poll_interval=A_DAY)
        await worker.run_once()
        await started.wait()
        await worker.stop(grace=timedelta(milliseconds=50))
        assert seen == [True, STOPPING]
        snap = await engine.get("slow")
        assert snap.state == "running" and snap.lease_owner is None

    asyncio.run(scenario())


def test_a_worker_that_reaps_runs_a_leader_reaper_of_its_lifecycle_and_policy_and_stops_it() -> None:
    from fsm import ConfigError
    from fsm.reaping import ReaperConfig

    policy = JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=7))
    engine = Engine(JobLifecycle, MemoryStore(), policy=policy)
    worker = Worker(engine, {"running": lambda job: "exited"}, poll_interval=A_DAY, reap=True)
    assert worker.reaper is not None
    assert worker.reaper.config.leader and worker.reaper.config.interval == timedelta(seconds=7)
    assert [p.effective_policy for p in worker.reaper.policies] == [policy]  # one source of truth
    thread = in_thread(worker)
    wait_until(lambda: worker.reaper is not None and worker.reaper.running, "the reaper ticking")
    worker.stop()
    thread.join(PATIENT)
    assert not worker.reaper.running
    chosen = Worker(engine, {"running": lambda job: None}, reap=ReaperConfig(interval=timedelta(seconds=3)))
    assert chosen.reaper is not None and chosen.reaper.config.leader  # always under the leader lease
    assert Worker(engine, {"running": lambda job: None}).reaper is None
    with pytest.raises(ConfigError):
        Worker(engine, {"running": lambda job: None}, reap={"interval": -1})


def test_a_reaping_worker_ticks_at_most_every_ten_seconds_so_a_dead_leader_is_replaced_soon() -> None:
    from fsm.work.worker import WORKER_REAP_INTERVAL

    worker = Worker(Engine(JobLifecycle, MemoryStore()), {"running": lambda job: "exited"}, reap=True)
    assert worker.reaper is not None
    assert JobLifecycle.policy.lease_ttl > WORKER_REAP_INTERVAL == worker.reaper.config.interval
    assert worker.reaper.config.effective_leader_ttl == 3 * WORKER_REAP_INTERVAL
