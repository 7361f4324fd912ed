"""AsyncEngine and AsyncWorker: the sync engine's behaviour, awaited, on every async store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import postgres_url

import signals
from fsm import (
    AsyncEngine,
    EntityMovedOn,
    GuardRejected,
    JobLifecycle,
    LeaseLost,
    PipelineLifecycle,
    TransitionNotAllowed,
)
from fsm.aio import AsyncJob, AsyncWorker
from fsm.records import RENEWALS_KEPT
from stores.aio import AsyncMemoryStore, AsyncSqlStore

Opener = Callable[[], Any]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """A factory of a fresh async store of each kind (PostgreSQL: own tables, dropped after)."""
    prefixes: list[str] = []
    url = ""
    if request.param == "memory":
        yield AsyncMemoryStore
        return
    url = f"sqlite:///{tempfile.mkdtemp(prefix='fsm-aio-')}/fsm.db" if request.param == "sqlite" else postgres_url()

    def opener() -> AsyncSqlStore:
        prefix = f"t{uuid.uuid4().hex[:10]}_"
        prefixes.append(prefix)
        return AsyncSqlStore(url, table_prefix=prefix)

    yield opener
    if request.param == "postgres":
        import sqlalchemy as sa

        from stores.sql.migrate import drop_schema

        engine = sa.create_engine(url)
        for prefix in prefixes:
            drop_schema(engine, table_prefix=prefix)
        engine.dispose()


def test_fire_claim_run_and_keep_work_as_on_the_sync_engine(open_store: Opener) -> None:
    async def main() -> None:
        store = open_store()
        jobs = AsyncEngine(JobLifecycle, store, owner="w1")
        created = await jobs.create("j1", data={"task": "deploy"})
        assert created.state == "queued"
        [claimed] = await jobs.claim()
        assert claimed.lease is not None and claimed.lease.owner == "w1"
        calls: list[str] = []

        async def gate(key: str) -> dict[str, str]:
            calls.append(key)
            await asyncio.sleep(0)
            return {"gate": "passed"}

        async with jobs.keep(claimed.lease, period=timedelta(milliseconds=20)) as held:
            assert await jobs.run("j1", "gate", gate, held.check()) == {"gate": "passed"}
            assert await jobs.run("j1", "gate", gate, held.check()) == {"gate": "passed"}  # replayed
            await asyncio.sleep(0.08)  # a few renewals through the async store
            await jobs.fire("j1", "exited", lease=held.check(), data={"exit_code": 0})
            done = await jobs.fire("j1", "complete", lease=held.check(), idempotency_key="k")
            again = await jobs.fire("j1", "complete", lease=held.check(), idempotency_key="k")
        assert calls == ["j1:gate"]
        assert done.state == "completed" and again.replayed
        renewals = await jobs.renewals("j1")  # each of the keeper's renewals, logged by the store
        assert len(renewals) == min(held.renewals, RENEWALS_KEPT)
        assert all((r.owner, r.token, r.acquired) == ("w1", claimed.lease.token, False) for r in renewals)
        assert [h.event for h in await jobs.history("j1")] == ["start", "exited", "complete"]
        assert [e.key for e in await jobs.effects("j1")] == ["gate"]
        assert (await jobs.counts())["completed"] == 1
        assert [s.id for s in await jobs.entities(state="completed")] == ["j1"]
        with pytest.raises(TransitionNotAllowed):
            await jobs.fire("j1", "exited")
        await store.close()

    asyncio.run(main())


def test_refusals_are_the_sync_engines_errors_and_change_nothing(open_store: Opener) -> None:
    async def main() -> None:
        store = open_store()
        jobs = AsyncEngine(JobLifecycle, store, owner="w1")
        await jobs.create("j1")
        [claimed] = await jobs.claim()
        assert claimed.lease is not None
        stale = claimed.lease
        await jobs.release_lease(stale)
        [again] = await jobs.claim(owner="w2")
        with pytest.raises((LeaseLost, EntityMovedOn)):
            await jobs.fire("j1", "exited", lease=stale)
        assert (await jobs.get("j1")).lease == again.lease
        pipelines = AsyncEngine(PipelineLifecycle, store)
        await pipelines.create("p1")
        with pytest.raises((GuardRejected, TransitionNotAllowed)):
            await pipelines.fire("p1", "expire", actor="reaper")
        await store.close()

    asyncio.run(main())


def test_many_tasks_fire_concurrently_without_sharing_a_connection(open_store: Opener) -> None:
    async def main() -> None:
        store = open_store()
        pipelines = AsyncEngine(PipelineLifecycle, store)
        ids = [(await pipelines.create()).id for _ in range(24)]

        async def through(entity_id: str) -> str:
            await pipelines.fire(entity_id, "start")
            lease = (await pipelines.fire(entity_id, "finish")).lease
            return (await pipelines.fire(entity_id, "succeed", lease=lease)).state

        assert await asyncio.gather(*(through(i) for i in ids)) == ["completed"] * 24
        await store.close()

    asyncio.run(main())


def test_async_receivers_are_awaited_after_the_commit_and_a_raising_one_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, str]] = []

    async def forward(sender: str, payload: Any) -> None:
        await asyncio.sleep(0)
        seen.append((payload.record.event, payload.snapshot.state))

    async def broken(sender: str, payload: Any) -> None:
        raise RuntimeError("webhook down")

    async def main() -> None:
        pipelines = AsyncEngine(PipelineLifecycle, AsyncMemoryStore())
        await pipelines.create("p1")
        result = await pipelines.fire("p1", "start")
        assert result.state == "running"
        assert seen == [("start", "running")]  # awaited before fire returned

    signals.transitioned.connect(forward)
    signals.transitioned.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="fsm.signals"):
            asyncio.run(main())
    finally:
        signals.transitioned.disconnect(forward)
        signals.transitioned.disconnect(broken)
    assert any("webhook down" in r.exc_text for r in caplog.records if r.exc_text)


def test_the_async_worker_runs_coroutine_handlers_with_bounded_concurrency_and_stops_gracefully() -> None:
    running = 0
    peak = 0

    async def run_agent(job: AsyncJob) -> tuple[str, dict[str, int]]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return "exited", {"exit_code": 0}

    async def run_gates(job: AsyncJob) -> str:
        await job.run("gate", lambda key: {"ok": key})
        return "complete"

    async def main() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        for i in range(10):
            await jobs.create(f"j{i}")
        worker = AsyncWorker(
            jobs,
            {"running": run_agent, "finalizing": run_gates},
            concurrency=3,
            poll_interval=timedelta(milliseconds=5),
        )
        task = asyncio.create_task(worker.run())
        for _ in range(400):
            if (await jobs.counts())["completed"] == 10:
                break
            await asyncio.sleep(0.01)
        await worker.stop()
        stats = await task
        assert stats.claimed == 10 and stats.finished == 10
        assert (await jobs.counts())["completed"] == 10
        assert 1 < peak <= 3

    asyncio.run(main())


def test_stop_releases_the_leases_of_handlers_still_running() -> None:
    async def forever(job: AsyncJob) -> str:
        await asyncio.sleep(3600)
        return "exited"

    async def main() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await jobs.create("j1")
        worker = AsyncWorker(jobs, {"running": forever}, grace=timedelta(milliseconds=20))
        assert await worker.run_once() == 1
        await worker.stop()
        snap = await jobs.get("j1")
        assert snap.state == "running" and snap.lease_owner is None
        assert worker.stats.released == 1

    asyncio.run(main())


def test_calls_cancelled_mid_statement_leave_the_store_and_the_engine_usable(open_store: Opener) -> None:
    """The bridge reuses its greenlets: a call cancelled while it waits on the database must
    end (its transaction rolled back or committed whole) and leave the next calls working."""

    async def main() -> None:
        store = open_store()
        engine = AsyncEngine(PipelineLifecycle, store)
        ids = [(await engine.create()).id for _ in range(12)]
        cancelled = 0
        for n, entity_id in enumerate(ids):
            task = asyncio.create_task(engine.fire(entity_id, "start"))
            for _ in range(n % 4):  # cancel at different points of the call
                await asyncio.sleep(0)
            cancelled += task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for entity_id in ids:  # each fire happened whole or not at all, and the engine still fires
            snap = await engine.get(entity_id)
            history = await engine.history(entity_id)
            assert len(history) == snap.version
            assert snap.state == ("running" if history else "queued")
            if snap.state == "queued":
                snap = (await engine.fire(entity_id, "start")).snapshot
            finished = await engine.fire(snap, "finish")
            assert (await engine.fire(finished, "succeed", lease=finished.lease)).state == "completed"
        assert cancelled >= 1
        close = getattr(store, "close", None)
        if close is not None:
            await close()

    asyncio.run(main())
