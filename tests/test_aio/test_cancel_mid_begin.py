"""A call cancelled while its BEGIN IMMEDIATE waits on the SQLite lock must not hand its
connection (inside the transaction that BEGIN opens later) to the next call, whose write
would then run under SAVEPOINT/RELEASE and never be committed: the connection is dropped."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile

from fsm import AsyncEngine, PipelineLifecycle
from stores.aio import AsyncSqlStore


def test_cancel_during_begin_immediate_does_not_leak_an_open_transaction() -> None:
    path = f"{tempfile.mkdtemp(prefix='fsm-rev-')}/fsm.db"

    async def main() -> None:
        store = AsyncSqlStore(f"sqlite:///{path}", pool_size=1, busy_timeout=2.0)
        engine = AsyncEngine(PipelineLifecycle, store)
        a = await engine.create()
        b = await engine.create()
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        task = asyncio.create_task(engine.fire(a.id, "start"))
        await asyncio.sleep(0.3)  # the lane's BEGIN IMMEDIATE is waiting on busy_timeout
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        blocker.execute("COMMIT")  # the lock is free: the abandoned BEGIN IMMEDIATE now succeeds
        await asyncio.sleep(0.3)
        fired = await engine.fire(b, "start")  # same lane (pool_size=1); reports success
        assert fired.snapshot.state == "running"
        # another connection must see the committed write, and must be able to write
        check = sqlite3.connect(path, isolation_level=None, timeout=0.5)
        prefix = "fsm_"
        state = check.execute(f"SELECT state FROM {prefix}entities WHERE id = ?", (b.id,)).fetchone()[0]
        try:
            assert state == "running", f"the reported write is not committed (state {state!r})"
            check.execute("BEGIN IMMEDIATE")  # raises 'database is locked' if the lane holds it
            check.execute("ROLLBACK")
        finally:
            await store.close()

    asyncio.run(main())
