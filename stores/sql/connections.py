"""Connections of the SQL store: one DBAPI connection per thread, and typed failures.

The hot path runs precompiled SQL on a DBAPI connection: the design measured SQLAlchemy
Core statements at 0.45x and the pooled DBAPI connection at 0.9x of raw sqlite3.  Each
thread that uses the store gets its own connection, opened through the engine (its URL,
``connect_args`` and ``creator`` apply), detached from the pool and owned by the store
for that thread: no lock is shared on the hot path, a reaper thread and worker threads
never wait for each other in Python, and the database arbitrates their writes.  The
connection is closed when its thread ends or the store is closed.

An in-memory SQLite database exists only within one connection, so it is the exception:
one connection, shared by every thread under a lock.

Connection set-up:
- SQLite: autocommit mode (the store issues ``BEGIN IMMEDIATE`` itself, so a writer takes
  the write lock up front and concurrent processes queue on ``busy_timeout`` instead of
  failing on a lock upgrade), WAL, ``busy_timeout``, ``foreign_keys=ON``, ``synchronous``,
  and the ``fsm_ts_add`` function;
- PostgreSQL: autocommit (each store statement is its own transaction, so a transition is
  one round trip; multi-statement writes open an explicit transaction), session time
  zone UTC.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from fsm.errors import ConfigError, FsmError, InvalidArgument, MalformedRow, StoreCorrupt, StoreUnavailable
from stores.sql.dialect import sqlite_ts_add, sqlite_ts_norm
from stores.sql.joined import JOINED
from stores.sql.parsed import cursor_factory


class _Slot:
    """One thread's connection and its reusable cursor."""

    __slots__ = ("__weakref__", "conn", "cursor", "fairy", "planned_for_work")

    def __init__(self, conn: Any, fairy: Any = None) -> None:
        self.planned_for_work = False
        """Whether :meth:`stores.sql.SqlStore.plan_for_work` set this connection up."""
        self.conn = conn
        self.cursor = conn.cursor()
        self.fairy = fairy  # the pool's handle, kept (not detached) for a shared :memory: connection

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                self.cursor.close()
                if self.fairy is not None:
                    self.fairy.close()  # back to the static pool; the database lives on with it
                else:
                    conn.close()

    def __del__(self) -> None:  # the owning thread ended, or the store was dropped
        self.close()


class Connections:
    """Per-thread DBAPI connections of one engine (or one shared one, for ``:memory:``)."""

    def __init__(
        self,
        engine: sa.Engine,
        setup: Callable[[Any], None],
        *,
        shared: bool,
        errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.engine = engine
        self._errors: tuple[type[BaseException], ...] = (sa.exc.DBAPIError, sa.exc.TimeoutError, *errors)
        self._setup = setup
        self._local = threading.local()
        self._all: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self.lock: threading.RLock | None = threading.RLock() if shared else None
        self._shared: _Slot | None = None
        self._closed = False

    def slot(self) -> _Slot:
        """This thread's connection, opened on first use; inside a joined block
        (:mod:`stores.sql.joined`), the caller's connection."""
        joined = JOINED.get()
        if joined is not None and id(self) in joined:
            return joined[id(self)].check()  # type: ignore[return-value]
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None or slot.conn is None:
            slot = self._open()
        return slot

    def _open(self) -> _Slot:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        if self._shared is not None and self._shared.conn is not None:
            return self._shared
        lender: ConnectionLender | None = getattr(self._local, "lender", None)
        if lender is not None:  # a thread of a bounded group: one of its connections
            slot = lender.take()
            self._local.slot = slot
            return slot
        slot = self._connect()
        if self.lock is not None:
            self._shared = slot
        else:
            self._local.slot = slot
        return slot

    def _connect(self) -> _Slot:
        """A new connection, set up, owned by the store (not yet any thread's)."""
        try:
            fairy = self.engine.raw_connection()
        except self._errors as err:
            raise StoreUnavailable(f"cannot connect to {self.engine.url!r}: {reason_of(err)}") from err
        conn = fairy.dbapi_connection
        assert conn is not None
        if self.lock is None:
            fairy.detach()  # owned by this thread from now on, never handed to another
        try:
            self._setup(conn)
        except Exception as err:
            with contextlib.suppress(Exception):
                conn.close()
            raise StoreUnavailable(f"cannot set up a connection to {self.engine.url!r}: {err}") from err
        slot = _Slot(conn, fairy if self.lock is not None else None)
        self._all.add(slot)
        return slot

    def lender(self, limit: int, wait: float) -> ConnectionLender | None:
        """A bounded set of connections for a group of threads (a worker's handler
        threads), or ``None`` on SQLite: a SQLite connection costs the server nothing (there
        is none) and may be bound to the thread that opened it (``check_same_thread``, a
        caller's ``creator``), so each thread keeps its own.  See :class:`ConnectionLender`."""
        if self.lock is not None or self.engine.dialect.name == "sqlite":
            return None
        return ConnectionLender(self, limit, wait)

    def current(self) -> _Slot | None:
        """This thread's connection if it has one (never opens one)."""
        joined = JOINED.get()
        if joined is not None and id(self) in joined:
            return joined[id(self)].slot  # type: ignore[return-value]
        slot: _Slot | None = self._shared if self.lock is not None else getattr(self._local, "slot", None)
        return slot

    def drop(self) -> None:
        """Close this thread's connection (it broke); the next call opens a new one.
        The caller's connection of a joined block is the caller's: left open."""
        joined = JOINED.get()
        if joined is not None and id(self) in joined:
            return
        slot = self.current()
        if slot is not None:
            slot.close()

    def close(self) -> None:
        """Close every connection of every thread; later calls raise ``StoreUnavailable``."""
        self._closed = True
        for slot in list(self._all):
            slot.close()


class ConnectionLender:
    """At most ``limit`` PostgreSQL connections for a group of threads that come and go
    from the work (a worker's handler threads), each given back when its thread is idle.

    A thread joins with :meth:`join`; its first store call then takes an idle connection of
    the group (the most recently given back) or opens one, waiting up to ``wait`` seconds
    while ``limit`` are taken (then ``StoreUnavailable``).  :meth:`give_back` returns the
    thread's connection when it has finished a piece of work: an idle one is kept for the
    next taker, one left inside a transaction is closed.  So a worker with many handler
    threads holds no more connections than handlers that write at once, and never more
    than ``limit``, however many threads it runs.  Threads outside the group (the claim
    loop, the completer, the keeper) keep their own connection, as before."""

    def __init__(self, conns: Connections, limit: int, wait: float) -> None:
        self._conns = conns
        self.limit = limit
        self._wait = wait
        self._free = threading.BoundedSemaphore(limit)
        self._idle: list[_Slot] = []
        self._lock = threading.Lock()
        self.taken = 0
        """Connections taken by the group's threads now (tests and dashboards)."""
        self._closed = False

    def join(self) -> None:
        """Make the calling thread's store calls use this group's connections."""
        self._conns._local.lender = self

    def take(self) -> _Slot:
        """A connection for the calling thread (see the class doc)."""
        local = self._conns._local
        if getattr(local, "permit", None) is not self:  # a thread whose connection broke keeps its permit
            if not self._free.acquire(timeout=self._wait):
                raise StoreUnavailable(
                    f"every one of the {self.limit} connections for handlers is in use "
                    f"(waited {self._wait:g} s; Worker(handler_connections=...) sets how many)"
                )
            local.permit = self
            with self._lock:
                self.taken += 1
        try:
            with self._lock:
                while self._idle:
                    slot = self._idle.pop()
                    if slot.conn is not None:
                        return slot
            return self._conns._connect()
        except BaseException:
            self._release(local)
            raise

    def give_back(self) -> None:
        """The calling thread is done for now: its connection goes back to the group."""
        local = self._conns._local
        if getattr(local, "lender", None) is not self:
            return  # not a thread of this group: its connection is its own
        slot: _Slot | None = getattr(local, "slot", None)
        local.slot = None
        try:
            if slot is not None and slot.conn is not None:
                with self._lock:
                    kept = not self._closed and _idle(slot.conn)
                    if kept:
                        self._idle.append(slot)
                if not kept:  # left inside a transaction (never handed on like that), or closed
                    slot.close()
        finally:
            if getattr(local, "permit", None) is self:
                self._release(local)

    @property
    def idle(self) -> int:
        """Connections kept for the next taker."""
        return len(self._idle)

    def close(self) -> None:
        """Close the idle connections; one given back from now on is closed (the group's
        work is over: a stopped worker holds none)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.close()

    def _release(self, local: Any) -> None:
        local.permit = None
        with self._lock:
            self.taken -= 1
        self._free.release()


def _idle(conn: Any) -> bool:
    """Whether a psycopg connection (the only kind lent) is outside any transaction."""
    info = getattr(conn, "info", None)
    return info is not None and info.transaction_status == 0  # psycopg: TransactionStatus.IDLE


def create_engine(url: str, *, busy_timeout: float = 5.0, **options: Any) -> sa.Engine:
    """An engine for the store: ``postgresql://`` means psycopg 3; SQLite gets its pragmas
    and real transactions; an in-memory SQLite database gets one shared connection."""
    u = sa.make_url(url)
    if u.get_backend_name() not in {"sqlite", "postgresql", "postgres"}:
        raise ConfigError(f"SqlStore runs on sqlite or postgresql+psycopg, not {u.drivername!r}")
    if u.drivername in {"postgresql", "postgres"}:
        u = u.set(drivername="postgresql+psycopg")
    connect_args = dict(options.pop("connect_args", {}))
    if u.get_backend_name() == "postgresql" and "connect_timeout" not in u.query:
        connect_args.setdefault("connect_timeout", 10)
    if u.get_backend_name() == "sqlite" and is_memory(u):
        options.setdefault("poolclass", sa.pool.StaticPool)
        connect_args.setdefault("check_same_thread", False)  # one connection, every thread, under a lock
    engine = sa.create_engine(u, connect_args=connect_args, **options)
    if engine.dialect.name == "sqlite":
        install_sqlite_events(engine, int(busy_timeout * 1000))
    return engine


def is_memory(url: sa.URL) -> bool:
    """Whether the URL names an in-memory SQLite database."""
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url)


def setup_sqlite(busy_timeout_ms: int, synchronous: str) -> Callable[[Any], None]:
    """Connection set-up for SQLite (see the module docstring)."""
    if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ConfigError(f"sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")

    def setup(conn: sqlite3.Connection) -> None:
        conn.isolation_level = None
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.create_function("fsm_ts_add", 2, sqlite_ts_add, deterministic=True)
        conn.create_function("fsm_ts", 1, sqlite_ts_norm, deterministic=True)

    return setup


def setup_postgres(conn: Any) -> None:
    """Connection set-up for PostgreSQL through psycopg 3 (see the module docstring)."""
    if conn.info.transaction_status != 0:  # not idle: end whatever the pool left open
        conn.rollback()
    conn.autocommit = True
    conn.execute("SET TIME ZONE 'UTC'")
    parsed_once = cursor_factory()
    if parsed_once is not None and getattr(conn, "cursor_factory", None) is parsed_once.__base__:
        conn.cursor_factory = parsed_once  # the claim's 8 kB text parsed once (stores.sql.parsed)


def enable_wal(engine: sa.Engine) -> None:
    """Switch a SQLite file to WAL (persistent in the file; readers never block the writer)."""
    fairy = engine.raw_connection()  # outside any transaction: the mode cannot change inside one
    try:
        conn = fairy.dbapi_connection
        if conn is not None and conn.in_transaction:
            conn.rollback()
        cur = fairy.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        mode = cur.fetchone()[0]  # type: ignore[index]
        cur.close()
    finally:
        fairy.close()
    if str(mode).lower() != "wal":  # pragma: no cover - e.g. a read-only medium
        raise StoreUnavailable(f"cannot switch {engine.url!r} to WAL (journal mode is {mode!r})")


def install_sqlite_events(engine: sa.Engine, busy_timeout_ms: int) -> None:
    """On an engine the store created: pragmas on every pooled connection, and real
    transactions for SQLAlchemy (``BEGIN IMMEDIATE``), used by schema creation and Alembic.

    (pysqlite's legacy mode would neither begin a transaction before DDL nor take the write
    lock up front.)
    """

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        dbapi_conn.execute("PRAGMA foreign_keys = ON")

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


_DATA_ERRORS: tuple[type[BaseException], ...] = (UnicodeEncodeError, OverflowError)
"""Raised by a driver while binding a value it cannot send (lone surrogates, a huge int)."""


def driver_errors(dialect_name: str) -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(integrity errors, every other driver error the store maps to a typed one).

    The second tuple includes SQLite's base ``DatabaseError`` (a corrupt file), which is
    also the base of ``IntegrityError``: a call site that tells integrity errors apart
    catches them first.
    """
    if dialect_name == "sqlite":
        return (sqlite3.IntegrityError,), (sqlite3.DatabaseError, sqlite3.InterfaceError, *_DATA_ERRORS)
    import psycopg

    return (psycopg.IntegrityError,), (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        psycopg.DataError,
        psycopg.ProgrammingError,
        *_DATA_ERRORS,
    )


def is_undecodable(err: BaseException) -> bool:
    """Whether SQLite could not decode a stored text value as UTF-8 (one bad row, not the store)."""
    orig = getattr(err, "orig", err)
    return isinstance(orig, sqlite3.OperationalError) and "could not decode" in str(orig).lower()


class Undecodable:
    """A stored text value that is not valid UTF-8, as the tolerant text factory reads it."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"<not UTF-8: {self.raw[:40]!r}>"


def tolerant_text(raw: bytes) -> Any:
    """A text factory that reads invalid UTF-8 as :class:`Undecodable` instead of failing the
    whole query (used only to find the row that failed it)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return Undecodable(raw)


def undecodable_row(rows: list[Any]) -> MalformedRow | None:
    """``MalformedRow`` naming the first row holding an :class:`Undecodable` value."""
    for row in rows:
        for i, value in enumerate(row):
            if isinstance(value, Undecodable):
                name = row[0] if isinstance(row[0], str) else repr(row[0])
                return MalformedRow(name, reason=f"stored text is not valid UTF-8 (column {i}: {value!r})")
    return None


def database_name(url: sa.URL) -> str:
    """The file of a SQLite URL, or the URL (password hidden) of a server database."""
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return str(url.database)
    return url.render_as_string(hide_password=True)


def unavailable(err: BaseException, connections: Connections, entity_id: str | None = None) -> FsmError:
    """A driver error as the typed error it means; a broken connection is dropped for a new one.

    - a value the database cannot hold (NUL, lone surrogates, out of range) -> ``InvalidArgument``
      (the stores check the limits up front; this is the backstop);
    - stored text that is not UTF-8 (SQLite) -> ``MalformedRow`` naming ``entity_id``;
    - a file that is not a database, or a corrupt one -> ``StoreCorrupt`` naming the file;
    - anything else (down, restarting, locked, missing tables) -> ``StoreUnavailable``.
    """
    orig = getattr(err, "orig", None) or err
    backend = connections.engine.url.get_backend_name()
    if isinstance(orig, _DATA_ERRORS) or _is_data_error(orig):
        return InvalidArgument(f"the database ({backend}) refused a value: {reason_of(err)}")
    if is_undecodable(err):
        return MalformedRow(entity_id or "?", reason=f"stored text is not valid UTF-8 ({reason_of(err)})")
    if is_corrupt(err):
        return StoreCorrupt(database_name(connections.engine.url), reason=reason_of(err))
    slot = connections.current()
    conn = slot.conn if slot is not None else None
    broken = conn is None or bool(getattr(conn, "closed", False)) or bool(getattr(conn, "broken", False))
    if broken or connections.engine.dialect.is_disconnect(err, conn, None):  # type: ignore[arg-type]
        connections.drop()
    return StoreUnavailable(f"database unavailable ({backend}): {reason_of(err)}")


def is_corrupt(err: BaseException) -> bool:
    """Whether SQLite says the file is not a database, or a corrupt one (``SQLITE_NOTADB``,
    ``SQLITE_CORRUPT``: raised as the base ``sqlite3.DatabaseError``)."""
    orig = getattr(err, "orig", None) or err
    return type(orig) is sqlite3.DatabaseError


def _is_data_error(orig: BaseException) -> bool:
    if isinstance(orig, sqlite3.DataError):
        return True
    if isinstance(orig, sqlite3.ProgrammingError):  # not "closed database": a value it cannot bind
        return "binding" in str(orig).lower()
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(orig, psycopg.DataError)


@contextlib.contextmanager
def sqlite_write(slot: _Slot) -> Iterator[Any]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back on any exception."""
    cur = slot.cursor
    cur.execute("BEGIN IMMEDIATE")
    try:
        yield cur
        cur.execute("COMMIT")
    except BaseException:
        if slot.conn is not None and slot.conn.in_transaction:
            with contextlib.suppress(Exception):
                slot.conn.rollback()
        raise


@contextlib.contextmanager
def reaching(url: sa.URL, doing: str) -> Iterator[None]:
    """Driver errors met while ``doing`` something to the database at ``url`` outside a
    store's own calls (adding a binding's columns, reading or running migrations), as the
    typed errors a store raises: a file that is not a database -> ``StoreCorrupt``; the
    database down, refusing the connection or locked -> ``StoreUnavailable``; any other
    refusal (no permission to alter a table...) -> ``ConfigError``.  The message names the
    database (password hidden) and the driver's first line, never the driver's class."""
    try:
        yield
    except sa.exc.DBAPIError as err:
        if is_corrupt(err):
            raise StoreCorrupt(database_name(url), reason=reason_of(err)) from err
        if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError):
            raise StoreUnavailable(f"cannot {doing} {database_name(url)}: {reason_of(err)}") from err
        raise ConfigError(f"the database {database_name(url)} refused to {doing}: {reason_of(err)}") from err


def reason_of(err: BaseException) -> str:
    orig = getattr(err, "orig", None)
    text = str(orig if orig is not None else err).strip()
    return text.splitlines()[0] if text else err.__class__.__name__


__all__ = [
    "ConnectionLender",
    "Connections",
    "Undecodable",
    "create_engine",
    "database_name",
    "driver_errors",
    "enable_wal",
    "install_sqlite_events",
    "is_corrupt",
    "is_memory",
    "is_undecodable",
    "reaching",
    "reason_of",
    "setup_postgres",
    "setup_sqlite",
    "sqlite_write",
    "tolerant_text",
    "unavailable",
    "undecodable_row",
]
