"""The bridge's pooled greenlets: a call abandoned mid-way and finalized while another
bridge runs must hand its outcome to whoever resumes it, so no still-suspended greenlet
is ever put back in the pool (the next spawn would switch a job into it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from stores.aio.greenlets import spawn, wait


def _waits_then_cleans_up() -> None:
    try:
        wait(asyncio.sleep(10))
    except BaseException:
        wait(asyncio.sleep(0))  # cleanup that waits, as the SQL store's rollback does
        raise


def test_an_abandoned_call_finalized_inside_another_bridge_does_not_corrupt_the_pool() -> None:
    holder: list[object] = []

    def collect_then(x: int) -> tuple[str, int]:
        holder.clear()  # the last reference to the abandoned call goes: finalized here
        gc.collect()
        return ("done", x)

    async def main() -> None:
        coro = spawn(_waits_then_cleans_up)
        coro.send(None)  # suspended mid-call, waiting on the loop
        with contextlib.suppress(RuntimeError):
            coro.close()  # the cleanup's wait: "coroutine ignored GeneratorExit"
        holder.append(coro)
        del coro
        assert await spawn(collect_then, 1) == ("done", 1)
        assert [await spawn(lambda i=i: i) for i in range(4)] == [0, 1, 2, 3]

    asyncio.run(main())
