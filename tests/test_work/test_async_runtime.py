"""The asyncio worker's runtime is the thread worker's: handlers' outcomes share
transactions (``AsyncBatchCompleter``), one task renews every held lease
(``AsyncLeaseKeepers``), each row still fenced on its own and each refusal told to its own
handler.  Waits are bounded; nothing is timed."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

from fsm import AsyncEngine, Fenced, JobLifecycle, LeaseLost
from fsm.aio import AsyncJob, AsyncWorker
from fsm.work.completer import AsyncBatchCompleter
from fsm.work.keepers import AsyncLeaseKeepers
from stores.aio import AsyncMemoryStore

A_DAY = timedelta(days=1)
PATIENT = 30.0


async def until(predicate: Any, what: str) -> None:
    for _ in range(int(PATIENT / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_the_async_worker_writes_outcomes_in_batches_and_drains_every_job() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await jobs.create_many([{} for _ in range(30)])

        async def running(job: AsyncJob) -> str:
            return "exited"

        async def finalizing(job: AsyncJob) -> str:
            return "complete"

        worker = AsyncWorker(jobs, {"running": running, "finalizing": finalizing}, poll_interval=A_DAY)
        task = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.finished == 30, "all thirty completed")
        await worker.stop()
        await task
        assert (await jobs.counts())["completed"] == 30
        assert worker.completer.outcomes == 60
        assert worker.completer.batches < 60  # outcomes shared transactions
        assert [h.event for h in await jobs.history((await jobs.entities(limit=1))[0].id)] == [
            "start",
            "exited",
            "complete",
        ]

    asyncio.run(scenario())


def test_a_fenced_outcome_in_a_batch_is_told_to_its_own_handler_only() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore(), owner="w1")
        a, b = await jobs.create_many([{}, {}])
        claimed = {s.id: s for s in await jobs.claim(2)}
        completer = AsyncBatchCompleter(jobs, all_waiting=lambda n: n >= 2).start()
        la, lb = claimed[a.id].lease, claimed[b.id].lease
        assert la is not None and lb is not None
        results = await asyncio.gather(
            completer.fire(claimed[a.id], "exited", lease=la),
            completer.fire(claimed[b.id], "exited", lease=lb._replace(token=lb.token + 7)),
            return_exceptions=True,
        )
        await completer.stop()
        assert not isinstance(results[0], BaseException) and results[0].snapshot.state == "finalizing"
        assert isinstance(results[1], LeaseLost)
        assert completer.batches == 1  # one transaction for both, each row guarded on its own
        assert (await jobs.get(b.id)).state == "running"  # the refused one is unchanged
        # after stop, an outcome is written on its own
        assert (await completer.fire(results[0].snapshot, "complete", lease=la)).snapshot.state == "completed"

    asyncio.run(scenario())


def test_one_task_renews_every_lease_the_async_worker_holds() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await jobs.create_many([{} for _ in range(3)])
        release = asyncio.Event()
        held: list[Any] = []

        async def running(job: AsyncJob) -> str:
            held.append(job.held)
            await release.wait()
            return "exited"

        worker = AsyncWorker(jobs, {"running": running}, poll_interval=A_DAY, keeper_period=timedelta(milliseconds=50))
        task = asyncio.create_task(worker.run())
        await until(lambda: len(held) == 3, "three handlers running")
        first = {h.entity_id: h.lease.expires_at for h in held}
        await until(lambda: all(h.lease.expires_at > first[h.entity_id] for h in held), "every lease renewed")
        assert worker.keepers.rounds >= 1  # rounds renew them together: one task, not one per job
        assert len(worker.keepers) == 3
        release.set()
        await until(lambda: worker.running == 0, "the handlers finished")
        assert len(worker.keepers) == 0  # finished handlers leave the keeper
        await worker.stop()
        await task

    asyncio.run(scenario())


def test_a_lease_taken_over_stops_its_async_handler_only() -> None:
    async def scenario() -> None:
        store = AsyncMemoryStore()
        jobs = AsyncEngine(JobLifecycle, store, owner="w1")
        await jobs.create_many([{}, {}])
        seen: dict[str, str] = {}
        go = asyncio.Event()

        async def running(job: AsyncJob) -> str:
            await go.wait()
            try:
                await job.fire("exited")
            except Fenced as err:
                seen[job.id] = type(err).__name__
                raise
            seen[job.id] = "fired"
            return "complete"  # not reached for the fenced one

        async def finalizing(job: AsyncJob) -> None:
            return None

        worker = AsyncWorker(jobs, {"running": running, "finalizing": finalizing}, concurrency=2, poll_interval=A_DAY)
        task = asyncio.create_task(worker.run())
        await until(lambda: worker.running == 2, "both running")
        victim_held, (victim, _) = min(worker._running.items(), key=lambda item: item[1][0])
        await jobs.release_lease(victim_held.lease)  # as if it lapsed...
        (taken,) = await AsyncEngine(JobLifecycle, store, owner="w2").claim()  # ...and w2 took it
        assert taken.id == victim
        go.set()
        await until(lambda: len(seen) == 2, "both handlers answered")
        await worker.stop()
        await task
        assert sorted(seen.values()) == ["LeaseLost", "fired"]
        assert seen[victim] == "LeaseLost"

    asyncio.run(scenario())


def test_the_async_keepers_refuse_a_bad_lease() -> None:
    async def scenario() -> None:
        keepers = AsyncLeaseKeepers(AsyncEngine(JobLifecycle, AsyncMemoryStore()))
        from fsm import InvalidArgument

        with pytest.raises(InvalidArgument):
            keepers.keep("not a lease")  # type: ignore[arg-type]
        await keepers.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_worker_that_reaps_recovers_a_dead_holders_job(where: str, tmp_path: Any) -> None:
    from conftest import postgres_url

    from fsm import ManualClock
    from fsm.reaping import ReaperConfig
    from stores.aio import AsyncSqlStore

    async def scenario() -> None:
        clock = ManualClock()
        prefix = f"t{uuid.uuid4().hex[:10]}_"
        if where == "memory":
            store: Any = AsyncMemoryStore(clock=clock)
        elif where == "sqlite":
            store = AsyncSqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=clock)
        else:
            store = AsyncSqlStore(postgres_url(), clock=clock, table_prefix=prefix)
        try:
            dead = AsyncEngine(JobLifecycle, store, clock=clock, owner="dead")
            await dead.create("j")
            (snap,) = await dead.claim()  # ...and its holder dies
            clock.advance(dead.policy.lease_ttl + timedelta(seconds=1))
            ran = asyncio.Event()

            async def running(job: AsyncJob) -> str:
                ran.set()
                return "exited"

            rescuer = AsyncEngine(JobLifecycle, store, clock=clock, owner="rescuer")
            worker = AsyncWorker(
                rescuer,
                {"running": running},
                poll_interval=A_DAY,
                reap=ReaperConfig(interval=timedelta(milliseconds=50)),
            )
            assert worker.reaper is not None and worker.reaper.config.leader
            task = asyncio.create_task(worker.run())
            await asyncio.wait_for(ran.wait(), PATIENT)  # requeued by its reaper, then claimed at once
            await worker.stop()
            await task
            assert not worker.reaper.running
            assert [h.event for h in await rescuer.history("j")][:3] == ["start", "expire", "start"]
            assert snap.lease is not None
        finally:
            if where == "postgres":
                from stores.sql import create_engine
                from stores.sql.migrate import drop_schema

                engine = create_engine(postgres_url())
                drop_schema(engine, table_prefix=prefix)
                engine.dispose()
            await store.close()

    asyncio.run(scenario())


def test_two_stops_at_once_close_the_reapers_store_only_after_its_loop_ended(tmp_path: Any) -> None:
    """A stop while another is under way (the run's own way out and the caller's) waits for
    it: the reaper's twin store is closed once, after the reaper's loop has resigned.  A
    second stop used to resign and close the twin while the loop still resigned on it (a
    segfault in the SQLite driver, seen in CI)."""
    import threading
    import time

    from fsm import ManualClock
    from fsm.reaping import ReaperConfig
    from fsm.reaping.leader import LeaderLease
    from stores.aio import AsyncSqlStore

    async def scenario() -> None:
        clock = ManualClock()
        store = AsyncSqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=clock)
        engine = AsyncEngine(JobLifecycle, store, clock=clock)

        async def exited(job: AsyncJob) -> str:
            return "exited"

        worker = AsyncWorker(
            engine,
            {"running": exited, "finalizing": exited},
            poll_interval=A_DAY,
            reap=ReaperConfig(interval=timedelta(milliseconds=20)),
        )
        assert worker.reaper is not None
        seen: list[tuple[str, bool]] = []
        loops: list[threading.Thread] = []
        resign = LeaderLease.resign

        def slow_resign(self: LeaderLease) -> None:
            time.sleep(0.3)  # the loop is still resigning when the second stop comes
            seen.append(("resigned on", threading.current_thread().name == "fsm-reaper"))
            resign(self)

        twin = worker._reaper_store
        close = twin.close

        def recorded_close() -> None:
            seen.append(("closed", not loops[0].is_alive()))
            close()

        LeaderLease.resign = slow_resign  # type: ignore[method-assign]
        twin.close = recorded_close
        try:
            task = asyncio.create_task(worker.run())
            await until(lambda: worker.reaper is not None and bool(worker.reaper._led), "the reaper leads")
            loops.append(worker.reaper._thread)  # type: ignore[arg-type]
            await asyncio.gather(worker.stop(), worker.stop())
            await task
        finally:
            LeaderLease.resign = resign  # type: ignore[method-assign]
            await store.close()
        assert seen.count(("closed", True)) == 1 and ("closed", False) not in seen
        assert ("resigned on", True) in seen

    asyncio.run(scenario())


def test_reap_needs_an_async_store_with_a_sync_twin() -> None:
    from fsm import ConfigError

    class NoTwin(AsyncMemoryStore):
        sync_store = None  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="sync twin"):
        AsyncWorker(AsyncEngine(JobLifecycle, NoTwin()), {"running": lambda job: None}, reap=True)
