"""The asyncio face restores history states from the entity's memory, on every store (the
async stores run the store's own apply, which writes the memory)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from fsm import AsyncEngine, ManualClock
from stores.aio import AsyncMemoryStore, AsyncSqlStore


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_pause_remembers_and_a_resume_restores(where: str, tmp_path: Any) -> None:
    from conftest import postgres_url
    from test_history_states import Resumable

    async def scenario() -> None:
        clock = ManualClock()
        prefix = f"ah{uuid.uuid4().hex[:10]}_"
        if where == "memory":
            store: Any = AsyncMemoryStore(clock=clock)
        elif where == "sqlite":
            store = AsyncSqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=clock)
        else:
            url = postgres_url()
            if url is None:
                pytest.skip("no PostgreSQL (FSM_TEST_POSTGRES_URL)")
            store = AsyncSqlStore(url, clock=clock, table_prefix=prefix)
        try:
            engine = AsyncEngine(Resumable, store, clock=clock)
            await engine.create("a1")
            for event in ("start", "check", "linted"):
                await engine.fire("a1", event)
            paused = await engine.fire("a1", "pause")
            assert paused.snapshot.memory == (await engine.get("a1")).memory == {"active": "test"}
            assert (await engine.fire("a1", "resume")).state == "lint"  # shallow: checks at its start
            await engine.fire("a1", "linted")
            await engine.fire("a1", "pause")
            assert (await engine.fire("a1", "resume_exactly")).state == "test"  # deep: the very leaf
        finally:
            if where == "postgres":
                from stores.sql import create_engine
                from stores.sql.migrate import drop_schema

                sql = create_engine(postgres_url())
                drop_schema(sql, table_prefix=prefix)
                sql.dispose()
            await store.close()

    asyncio.run(scenario())
