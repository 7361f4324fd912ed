"""The asyncio face takes an event's eventless and completion steps in the same commit,
on every store (the async stores run the store's own apply_chain)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from async_support import async_store_at

from fsm import AsyncEngine, ManualClock
from fsm.table import AUTOMATIC


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_fire_takes_its_chain_in_one_commit(where: str, tmp_path: Any) -> None:
    from test_chains import Build

    async def scenario() -> None:
        clock = ManualClock()
        async with async_store_at(where, clock, tmp_path) as store:
            engine = AsyncEngine(Build, store, clock=clock)
            await engine.create("a1", data={"lint_ok": True, "tests_ok": True})
            await engine.fire("a1", "start")
            fired = await engine.fire("a1", "check")
            assert fired.state == "finalizing"
            assert [r.event for r in fired.automatic] == [AUTOMATIC, AUTOMATIC, "done.state.checks"]
            assert [h.seq for h in await engine.history("a1")] == [1, 2, 3, 4, 5]

    asyncio.run(scenario())


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_create_takes_the_initial_states_steps_in_one_commit(where: str, tmp_path: Any) -> None:
    from test_chains import Intake

    async def scenario() -> None:
        clock = ManualClock()
        async with async_store_at(where, clock, tmp_path) as store:
            engine = AsyncEngine(Intake, store, clock=clock)
            made = await engine.create("i1", data={"complete": True})
            assert (made.state, made.version) == ("running", 1)
            assert [h.event for h in await engine.history("i1")] == [AUTOMATIC]
            many = await engine.create_many([{"complete": True}, None], ids=["i2", "i3"])
            assert [s.state for s in many] == ["running", "received"]

    asyncio.run(scenario())
