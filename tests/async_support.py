"""The async stores seen through a synchronous facade, so the store contract suite runs
unchanged on both faces: the contract modules import the ``any_store`` fixture from here, which
adds the async adapters (:mod:`stores.aio`) to the sync ones of ``tests/conftest.py``
(``from async_support import every_face``: a fixture named ``any_store``).

Each facade call is one coroutine of the async store, run on a private event loop in its
own thread (``asyncio.run_coroutine_threadsafe``): the async adapter's own I/O (psycopg's
``AsyncConnection``, aiosqlite, the greenlet bridge, the connection pool) is what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest
from conftest import STORE_FACTORIES, postgres_url

from fsm import ManualClock
from stores import Store
from stores.aio.greenlets import bridged, wait


class LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fsm-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class SyncFacade:
    """A :class:`stores.Store` whose every method awaits the async store's method."""

    def __init__(self, store: Any, loop: LoopThread, cleanup: Callable[[], None] | None = None) -> None:
        self.async_store = store
        self._loop = loop
        self._cleanup = cleanup

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.async_store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "run" and len(args) > 2 and not inspect.iscoroutinefunction(args[2]):
                # a blocking effect (the contract's gates wait on barriers) runs in a thread,
                # as an async application would run one; the async face awaits it
                fn = args[2]

                async def in_thread(key: str) -> Any:
                    return await asyncio.to_thread(fn, key)

                args = (*args[:2], in_thread, *args[3:])
            if threading.current_thread() is self._loop.thread and bridged():
                return wait(attr(*args, **kwargs))  # from an effect's fn, already on the loop
            return self._loop.run(attr(*args, **kwargs))

        return call

    def close(self) -> None:
        try:
            self._loop.run(self.async_store.close())
        finally:
            self._loop.stop()
            if self._cleanup is not None:
                self._cleanup()

    def __repr__(self) -> str:
        return f"SyncFacade({self.async_store!r})"


def async_memory(clock: ManualClock) -> SyncFacade:
    from stores.aio import AsyncMemoryStore

    return SyncFacade(AsyncMemoryStore(clock=clock), LoopThread())


def async_sqlite(clock: ManualClock) -> SyncFacade:
    from stores.aio import AsyncSqlStore

    directory = tempfile.mkdtemp(prefix="fsm-aiosqlite-")
    store = AsyncSqlStore(f"sqlite:///{directory}/fsm.db", clock=clock)
    return SyncFacade(store, LoopThread(), lambda: shutil.rmtree(directory, ignore_errors=True))


def async_postgres(clock: ManualClock, url: str) -> SyncFacade:
    import sqlalchemy as sa

    from stores.aio import AsyncSqlStore
    from stores.sql.migrate import drop_schema

    prefix = f"t{uuid.uuid4().hex[:10]}_"
    store = AsyncSqlStore(url, clock=clock, table_prefix=prefix)

    def drop() -> None:
        engine = sa.create_engine(url)
        try:
            drop_schema(engine, table_prefix=prefix)
        finally:
            engine.dispose()

    return SyncFacade(store, LoopThread(), drop)


FACES = ["aio-memory", "aio-sqlite", "aio-postgres"]


@pytest.fixture(name="any_store", params=[*sorted(STORE_FACTORIES), *FACES])
def every_face(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[Store]:
    """Each store adapter, sync and async (the async ones through :class:`SyncFacade`)."""
    name = request.param
    if name == "aio-memory":
        store: Any = async_memory(clock)
    elif name == "aio-sqlite":
        store = async_sqlite(clock)
    elif name == "aio-postgres":
        store = async_postgres(clock, postgres_url())
    else:
        store = STORE_FACTORIES[name](clock)
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()


@contextlib.asynccontextmanager
async def async_store_at(where: str, clock: ManualClock, directory: Any) -> AsyncIterator[Any]:
    """An async store for one test, in the running loop: ``memory``, ``sqlite`` (a file in
    ``directory``) or ``postgres`` (tables of its own, dropped after; skips without a server)."""
    from stores.aio import AsyncMemoryStore, AsyncSqlStore

    prefix = f"a{uuid.uuid4().hex[:10]}_"
    store: Any
    if where == "memory":
        store = AsyncMemoryStore(clock=clock)
    elif where == "sqlite":
        store = AsyncSqlStore(f"sqlite:///{directory}/fsm.db", clock=clock)
    else:
        store = AsyncSqlStore(postgres_url(), clock=clock, table_prefix=prefix)
    try:
        yield store
    finally:
        if where == "postgres":
            import sqlalchemy as sa

            from stores.sql.migrate import drop_schema

            engine = sa.create_engine(postgres_url())
            try:
                drop_schema(engine, table_prefix=prefix)
            finally:
                engine.dispose()
        await store.close()
