"""The asyncio worker's durable steps go through its completer, as the thread worker's do:
``job.run``'s read before the effect and its record after are answered in the completer's
batches (from the engine's greenlet bridge), each under its own lease, on every async store."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import postgres_url

from fsm import AsyncEngine, JobLifecycle, LeaseLost
from fsm.aio import AsyncJob, AsyncWorker
from fsm.work.completer import AsyncBatchCompleter
from stores.aio import AsyncMemoryStore, AsyncSqlStore

JOBS = 20
STEPS = 3
PATIENT = 30.0


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    if request.param == "memory":
        yield AsyncMemoryStore
        return
    url = f"sqlite:///{tempfile.mkdtemp(prefix='fsm-aio-')}/fsm.db" if request.param == "sqlite" else postgres_url()
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield lambda: AsyncSqlStore(url, table_prefix=prefix)
    if request.param == "postgres":
        import sqlalchemy as sa

        from stores.sql.migrate import drop_schema

        engine = sa.create_engine(url)
        drop_schema(engine, table_prefix=prefix)
        engine.dispose()


def test_async_steps_share_the_completers_batches_and_each_runs_once(open_store: Callable[[], Any]) -> None:
    async def scenario() -> None:
        store = open_store()
        jobs = AsyncEngine(JobLifecycle, store)
        await jobs.create_many([{} for _ in range(JOBS)])
        calls: dict[str, int] = {}

        async def effect(key: str) -> dict[str, str]:
            calls[key] = calls.get(key, 0) + 1
            await asyncio.sleep(0)
            return {"done": key}

        async def running(job: AsyncJob) -> str:
            for i in range(STEPS):
                assert await job.run(f"step-{i}", effect) == {"done": f"{job.id}:step-{i}"}
            assert await job.run("step-0", effect) == {"done": f"{job.id}:step-0"}  # a replay: not run again
            return "exited"

        async def finalizing(job: AsyncJob) -> str:
            return "complete"

        worker = AsyncWorker(jobs, {"running": running, "finalizing": finalizing}, concurrency=8)
        task = asyncio.create_task(worker.run())
        for _ in range(int(PATIENT / 0.01)):
            if worker.stats.finished == JOBS:
                break
            await asyncio.sleep(0.01)
        await worker.stop()
        await task
        assert (await jobs.counts())["completed"] == JOBS
        assert len(calls) == JOBS * STEPS and set(calls.values()) == {1}
        assert worker.completer.steps == JOBS * (2 * STEPS + 1)  # a read and a record a step, a read the replay
        assert worker.completer.batches < worker.completer.steps + 2 * JOBS  # asks shared batches
        await store.close()

    asyncio.run(scenario())


def test_an_async_step_of_a_lost_lease_is_refused_in_its_batch() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore(), owner="w1")
        a, b = await jobs.create_many([{}, {}])
        claimed = {s.id: s for s in await jobs.claim(2)}
        completer = AsyncBatchCompleter(jobs, all_waiting=lambda n: n >= 2).start()
        ran: list[str] = []
        lease_a, lease_b = claimed[a.id].lease, claimed[b.id].lease
        assert lease_a is not None and lease_b is not None
        stale = lease_b._replace(token=lease_b.token + 7)
        results = await asyncio.gather(
            jobs._run_held(a.id, "k", ran.append, lease_a, ledger=completer),
            jobs._run_held(b.id, "k", ran.append, stale, ledger=completer),
            return_exceptions=True,
        )
        await completer.stop()
        assert ran == [f"{a.id}:k"]
        assert isinstance(results[1], LeaseLost)
        assert completer.steps == 3 and completer.batches <= 2  # both reads in one batch, then a's record

    asyncio.run(scenario())
