"""The SQL store's async face: psycopg's ``AsyncConnection`` or aiosqlite, one per call.

:class:`AsyncSqlStore` runs the synchronous :class:`stores.sql.SqlStore`'s own code (its
statements from :mod:`stores.sql.dialect`, row decoders, refusal diagnosis, claim and
ledger logic) in a greenlet over an async connection (:mod:`stores.aio.drivers`): the SQL
and its semantics exist once.  Each call takes one connection of a small pool
(``pool_size``, opened on demand, newest first), so concurrent tasks never share a
connection and a multi-statement write keeps its transaction to itself.

The constructor is synchronous (it checks or creates the tables, as ``SqlStore`` does);
from a running loop use :func:`open_async_store`, which does that in a thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import sqlalchemy as sa

from fsm.clock import Clock
from fsm.errors import ConfigError, FsmError, StoreUnavailable
from stores.aio.drivers import PsycopgLane, SqliteLane
from stores.aio.face import AsyncFace
from stores.aio.greenlets import wait
from stores.sql.binding import TableBinding
from stores.sql.connections import is_memory
from stores.sql.dialect import sqlite_ts_add, sqlite_ts_norm
from stores.sql.joined import (
    POSTGRES_IDENTITY,
    SQLITE_IDENTITY,
    Joined,
    JoinedConnections,
    JoinedPostgres,
    JoinedSqlite,
    aborted,
    check_driver,
    current,
    entered,
    home_of,
    joining_errors,
    judge,
    known_database,
    open_join,
    server_key,
    session_of,
    sqlite_key,
    store_server,
)
from stores.sql.store import SqlStore

DEFAULT_POOL_SIZE = 10


class _Slot:
    __slots__ = ("conn", "cursor")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cursor = conn.cursor()


class _LaneConnections:
    """What the SQL store's code asks of its connections, for one async connection."""

    lock = None

    def __init__(self, conn: Any, engine: sa.Engine) -> None:
        self._slot = _Slot(conn)
        self.engine = engine
        self.dropped = False

    def slot(self) -> _Slot:
        if self.dropped:
            raise StoreUnavailable("the connection broke; the next call opens a new one")
        return self._slot

    def current(self) -> _Slot:
        return self._slot

    def drop(self) -> None:
        self.dropped = True

    def close(self) -> None:
        self.dropped = True


class _Lane:
    """One async connection and a view of the store whose calls run on it."""

    def __init__(self, base: SqlStore, conn: PsycopgLane | SqliteLane) -> None:
        self.conn = conn
        self.conns = _LaneConnections(conn, base.engine)
        self.store = copy.copy(base)
        self.store._conns = self.conns  # type: ignore[assignment]


class AsyncSqlStore(AsyncFace):
    """An :class:`~stores.aio.AsyncStore` on PostgreSQL (psycopg async) or SQLite (aiosqlite).

    ``url``: ``postgresql+psycopg://user@host/db`` or ``sqlite:///fsm.db`` (the ``+aiosqlite``
    and ``+psycopg_async`` spellings are taken too).  The other options are
    :class:`stores.sql.SqlStore`'s, ``binding`` included (the lifecycle on an application's
    own table).  An in-memory SQLite database is refused: each async connection would see
    its own; use ``memory://`` (:class:`~stores.aio.AsyncMemoryStore`).
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        table_prefix: str = "fsm_",
        create: bool = True,
        binding: TableBinding | None = None,
        schema: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        busy_timeout: float = 5.0,
        sqlite_synchronous: str = "FULL",
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            raise ConfigError(f"pool_size must be an integer from 1 to 1000, not {pool_size!r}")
        try:
            u = sa.make_url(url)
        except sa.exc.ArgumentError as err:
            raise ConfigError(f"cannot open {url!r}: {err}") from err
        backend = u.get_backend_name()
        if backend in {"postgresql", "postgres"}:
            u = u.set(drivername="postgresql+psycopg")
        elif backend == "sqlite":
            if is_memory(u):
                raise ConfigError("an in-memory SQLite database cannot be shared by async connections: use memory://")
            u = u.set(drivername="sqlite")
        else:
            raise ConfigError(f"AsyncSqlStore runs on sqlite or postgresql, not {u.drivername!r}")
        self.url = u
        self.pool_size = pool_size
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self._synchronous = sqlite_synchronous
        self._base = SqlStore(
            u.render_as_string(hide_password=False),
            clock=clock,
            table_prefix=table_prefix,
            create=create,
            binding=binding,
            schema=schema,
            busy_timeout=busy_timeout,
            sqlite_synchronous=sqlite_synchronous,
        )
        self._base.close()  # its sync connections did the schema; the lanes do the rest
        self._sync_options: dict[str, Any] = {
            "clock": clock,
            "table_prefix": table_prefix,
            "binding": binding,
            "schema": schema,
            "busy_timeout": busy_timeout,
            "sqlite_synchronous": sqlite_synchronous,
        }
        self.clock = clock
        self.table_prefix = table_prefix
        self._idle: list[_Lane] = []
        self._busy: set[_Lane] = set()
        self._waiters: collections.deque[asyncio.Future[_Lane | None]] = collections.deque()
        self._opened = 0
        self._closed = False

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return str(self._base.engine.dialect.name)

    @property
    def statements(self) -> Any:
        """The store's SQL (:class:`stores.sql.dialect.Statements`), shared with the sync store."""
        return self._base._sql

    def sync_store(self) -> SqlStore:
        """A new synchronous :class:`~stores.sql.SqlStore` on the same tables, with
        connections of its own, for work that runs on a thread of its own (an
        ``AsyncWorker``'s reaper); the caller closes it."""
        return SqlStore(self.url.render_as_string(hide_password=False), create=False, **self._sync_options)

    def subscribe_work(self, kind: str, callback: Callable[[], None]) -> Callable[[], None]:
        """See :class:`stores.base.WorkNotices`: the process's ``LISTEN`` connection on
        PostgreSQL (the callback runs on its thread), this process's subscribers on SQLite."""
        return self._base.subscribe_work(kind, callback)

    def __repr__(self) -> str:
        return f"AsyncSqlStore({self.url.render_as_string(hide_password=True)!r}, table_prefix={self.table_prefix!r})"

    # -- the one entry point: a sync store method on a connection of the pool -----------------

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        joined = current(id(self))
        if joined is not None:  # inside the caller's transaction: on its connection, never the pool's
            return getattr(joined.store, name)(*args, **kwargs)
        lane = self._take()
        try:
            return getattr(lane.store, name)(*args, **kwargs)
        except FsmError:
            raise
        except BaseException:
            # cancelled (or broken) mid-call: a statement may still run on this connection
            # (a BEGIN IMMEDIATE waiting on the lock): never hand it to another call
            lane.conns.drop()
            raise
        finally:
            self._give(lane)

    def _take(self) -> _Lane:
        while True:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            if self._idle:
                lane = self._idle.pop()
                self._busy.add(lane)
                return lane
            if self._opened < self.pool_size:
                self._opened += 1
                try:
                    lane = _Lane(self._base, wait(self._open()))
                except BaseException:
                    self._opened -= 1
                    raise
                self._busy.add(lane)
                return lane
            waiter: asyncio.Future[_Lane | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            found = wait(waiter)
            if found is not None:
                return found

    def _give(self, lane: _Lane) -> None:
        self._busy.discard(lane)
        if lane.conns.dropped or self._closed:
            self._opened -= 1
            asyncio.get_running_loop().create_task(lane.conn.aclose())
            lane = None  # type: ignore[assignment]
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                if lane is not None:
                    self._busy.add(lane)
                waiter.set_result(lane)  # None: open a new connection in its place
                return
        if lane is not None:
            self._idle.append(lane)

    async def _open(self) -> PsycopgLane | SqliteLane:
        try:
            if self.dialect == "postgresql":
                return await PsycopgLane.open(self.url)
            return await SqliteLane.open(self.url.database or "", self._busy_timeout_ms, self._synchronous)
        except Exception as err:
            raise StoreUnavailable(f"cannot connect to {self.url.render_as_string(hide_password=True)}: {err}") from err

    def joined(self, connection: Any) -> contextlib.AbstractAsyncContextManager[Joined]:
        """Inside the block, this store's calls in this task run on ``connection`` (a
        SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` on aiosqlite or psycopg, begun if
        it is not yet) and inside its transaction: the caller commits or rolls them back
        with its own writes (:mod:`stores.sql.joined`).  Signals are the engine's: use
        :meth:`fsm.AsyncEngine.within`."""
        return self._joined(connection)

    @contextlib.asynccontextmanager
    async def _joined(self, target: Any) -> AsyncIterator[Joined]:
        # the checks of stores.sql.joined.joined_sync, on the async driver
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if not isinstance(target, AsyncSession | AsyncConnection):
            raise ConfigError(
                f"joined() takes a SQLAlchemy AsyncConnection or AsyncSession, not {type(target).__name__}"
            )
        engine = self._base.engine
        home = home_of(engine)
        outer = open_join(id(self), home, target)
        if outer is not None:  # a block open on the same connection: this one joins it
            yield outer
            return
        with joining_errors(engine.url):
            aconn = await target.connection() if isinstance(target, AsyncSession) else target
            connection = aconn.sync_connection
            if aconn.closed or connection is None or connection.invalidated:
                raise ConfigError("joined() needs an open connection")
            if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
                raise ConfigError("the connection is in autocommit mode: it has no transaction to join")
            if not aconn.in_transaction():
                await aconn.begin()
            driver: Any = (await aconn.get_raw_connection()).driver_connection
            conn: Any
            if self.dialect == "sqlite":
                check_driver(connection, "sqlite", ("aiosqlite",))
                if not known_database(engine, home, connection):
                    cur = await driver.execute(SQLITE_IDENTITY)
                    judge(engine, home, connection, sqlite_key(await cur.fetchall(), connection.engine))
                await driver.create_function("fsm_ts_add", 2, sqlite_ts_add, deterministic=True)
                await driver.create_function("fsm_ts", 1, sqlite_ts_norm, deterministic=True)
                if not driver.in_transaction:  # pysqlite's legacy mode begins only before DML
                    await driver.execute("BEGIN IMMEDIATE")
                conn = JoinedSqlite(SqliteLane(driver))
            else:
                check_driver(connection, "postgresql", ("psycopg",))
                if driver.autocommit:
                    raise ConfigError("the connection is in autocommit mode: it has no transaction to join")
                status = driver.info.transaction_status
                if status == 0:  # IDLE: a transaction() block would commit on its own
                    await driver.execute("SELECT 1")
                elif status == 3:  # INERROR: a statement of the caller's failed
                    raise aborted()
                if not known_database(engine, home, connection):
                    await asyncio.to_thread(store_server, engine)  # once per engine, off the loop
                    judge(engine, home, connection, await self._server_of(driver))
                conn = JoinedPostgres(PsycopgLane(driver))
        joined = Joined(connection, conn, session_of(target), home)
        store = copy.copy(self._base)
        store._conns = JoinedConnections(joined, engine)  # type: ignore[assignment]
        joined.store = store
        with entered(id(self), joined):
            yield joined

    @staticmethod
    async def _server_of(driver: Any) -> tuple[Any, ...]:
        """The caller's PostgreSQL cluster and database (:data:`stores.sql.joined.POSTGRES_IDENTITY`),
        under a savepoint of its transaction: a server that refuses the question leaves it usable."""
        import psycopg

        try:
            async with driver.transaction():
                cur = await driver.execute(POSTGRES_IDENTITY)
                return server_key(await cur.fetchall())
        except psycopg.Error:
            return server_key([])

    def feed_wakeup(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """See :meth:`stores.sql.SqlStore.feed_wakeup` (``callback`` runs on the listener's
        thread: an async watcher hands it to its loop)."""
        return self._base.feed_wakeup(callback)

    def enable_feed_notify(self) -> None:
        """See :meth:`stores.sql.SqlStore.enable_feed_notify` (DDL, once, at setup)."""
        self._base.enable_feed_notify()

    def disable_feed_notify(self) -> None:
        """See :meth:`stores.sql.SqlStore.disable_feed_notify`."""
        self._base.disable_feed_notify()

    async def close(self) -> None:
        """Close every idle connection now, and each busy one when its call ends."""
        self._base._close_feed_listener()
        self._closed = True
        idle, self._idle = self._idle, []
        for lane in idle:
            await lane.conn.aclose()
        self._opened -= len(idle)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


async def open_async_store(url: str, **options: Any) -> AsyncFace:
    """An async store for ``url`` (``memory://`` too), its tables checked or created in a
    thread so the loop never blocks; options as :class:`AsyncSqlStore` takes them."""
    if url == "memory://":
        from stores.aio.memory import AsyncMemoryStore

        return AsyncMemoryStore(clock=options.get("clock"))
    return await asyncio.to_thread(lambda: AsyncSqlStore(url, **options))


__all__ = ["DEFAULT_POOL_SIZE", "AsyncSqlStore", "open_async_store"]
