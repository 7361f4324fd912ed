"""The asyncio face restores history states from the entity's memory, on every store (the
async stores run the store's own apply, which writes the memory)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from async_support import async_store_at

from fsm import AsyncEngine, ManualClock


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_an_async_pause_remembers_and_a_resume_restores(where: str, tmp_path: Any) -> None:
    from test_history_states import Resumable

    async def scenario() -> None:
        clock = ManualClock()
        async with async_store_at(where, clock, tmp_path) as store:
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

    asyncio.run(scenario())
