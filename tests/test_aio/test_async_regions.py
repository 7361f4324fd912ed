"""The asyncio face runs parallel regions on every store: entering creates the regions'
rows in one commit (the async stores' apply_group), each region's async engine runs its
row, and the join follows the last region's final write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from async_support import async_store_at
from faults.release import Release

from fsm import AsyncEngine, ManualClock
from fsm.errors import InvalidArgument


@pytest.mark.parametrize("where", ["memory", "sqlite", "postgres"])
def test_async_regions_enter_run_and_join(where: str, tmp_path: Any) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with async_store_at(where, clock, tmp_path) as store:
            engine = AsyncEngine(Release, store, clock=clock)
            await engine.create("r1", data={"sha": "abc"})
            assert (await engine.fire("r1", "begin")).state == "checks"
            kids = await store.children("r1")
            assert {(k.id, k.state) for k in kids} == {("r1/build", "compiling"), ("r1/tests", "testing")}
            build, tests = engine.region("build"), engine.region("tests")
            assert engine.region("build") is build
            (b,) = await build.claim(owner="builder")
            b = (await build.fire(b, "finish", lease=b.lease)).snapshot
            await build.fire(b, "succeed", lease=b.lease)
            assert (await engine.get("r1")).state == "checks"
            (t,) = await tests.claim(owner="tester")
            await tests.fire(t, "test_pass", lease=t.lease)
            assert (await engine.get("r1")).state == "released"
            with pytest.raises(InvalidArgument):
                engine.region("deploy")

    asyncio.run(scenario())
