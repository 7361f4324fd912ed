"""The asyncio face takes an event's eventless and completion steps in the same commit,
on every store (the async stores run the store's own apply_chain)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from fsm import AsyncEngine, ManualClock
from fsm.table import AUTOMATIC
from stores.aio import AsyncMemoryStore, AsyncSqlStore


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_fire_takes_its_chain_in_one_commit(where: str, tmp_path: Any) -> None:
    from conftest import postgres_url
    from test_chains import Build

    async def scenario() -> None:
        clock = ManualClock()
        prefix = f"ac{uuid.uuid4().hex[:10]}_"
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
            engine = AsyncEngine(Build, store, clock=clock)
            await engine.create("a1", data={"lint_ok": True, "tests_ok": True})
            await engine.fire("a1", "start")
            fired = await engine.fire("a1", "check")
            assert fired.state == "finalizing"
            assert [r.event for r in fired.automatic] == [AUTOMATIC, AUTOMATIC, "done.state.checks"]
            assert [h.seq for h in await engine.history("a1")] == [1, 2, 3, 4, 5]
        finally:
            if where == "postgres":
                from stores.sql import create_engine
                from stores.sql.migrate import drop_schema

                sql = create_engine(postgres_url())
                drop_schema(sql, table_prefix=prefix)
                sql.dispose()
            await store.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_create_takes_the_initial_states_steps_in_one_commit(where: str, tmp_path: Any) -> None:
    from conftest import postgres_url
    from test_chains import Intake

    async def scenario() -> None:
        clock = ManualClock()
        prefix = f"ai{uuid.uuid4().hex[:10]}_"
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
            engine = AsyncEngine(Intake, store, clock=clock)
            made = await engine.create("i1", data={"complete": True})
            assert (made.state, made.version) == ("running", 1)
            assert [h.event for h in await engine.history("i1")] == [AUTOMATIC]
            many = await engine.create_many([{"complete": True}, None], ids=["i2", "i3"])
            assert [s.state for s in many] == ["running", "received"]
        finally:
            if where == "postgres":
                from stores.sql import create_engine
                from stores.sql.migrate import drop_schema

                sql = create_engine(postgres_url())
                drop_schema(sql, table_prefix=prefix)
                sql.dispose()
            await store.close()

    asyncio.run(scenario())
