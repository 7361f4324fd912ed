"""The caller's transaction: a SQL store's calls on the application's own connection.

``with store.joined(connection_or_session): ...`` makes every call of this store, in this
thread (or asyncio task) and inside the block, run on the caller's SQLAlchemy connection
and inside its open transaction; the caller commits or rolls back the store's writes with
its own.  The store's SQL, its compare-and-set conditions, fencing and argument checks are
the same statements it runs on its own connections: only where they run changes.

- The store's own transaction brackets become a savepoint of the caller's transaction
  (SQLite: ``BEGIN IMMEDIATE`` / ``COMMIT`` / ``rollback()`` are spelled as ``SAVEPOINT``
  / ``RELEASE`` / ``ROLLBACK TO``; PostgreSQL: psycopg's ``transaction()`` nests as a
  savepoint by itself).  A refused or failed write undoes only its own statements.
- On PostgreSQL a failed statement would abort the whole transaction (the caller's next
  statement would fail with "current transaction is aborted"), so each write statement of
  the store runs under a savepoint of its own, released at once.  That costs two round
  trips per write; the joined path serves a request's transaction, not a queue's hot path.
- Signals are the engine's (:meth:`fsm.Engine.within` holds them until the caller's
  commit); a store sends none.
- After the caller's commit or rollback the block is spent: a further call of the store
  inside it raises ``ConfigError`` (the store never writes outside a transaction it was
  told to join).

The caller's connection must reach the same database with the store's driver: sqlite3 (or
aiosqlite for an ``AsyncConnection``) and psycopg 3.  The store's own engine is the
simplest: ``Session(store.engine)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
import sqlalchemy.orm

from fsm.errors import ConfigError

JOINED: contextvars.ContextVar[dict[int, Joined] | None] = contextvars.ContextVar("fsm_joined", default=None)
"""The joined connections of this thread or task: id of the store's connections -> Joined."""


class _SqliteCursor:
    """A cursor on the caller's SQLite connection: the store's own ``BEGIN IMMEDIATE`` and
    ``COMMIT`` become a savepoint of the caller's transaction."""

    __slots__ = ("_cur",)

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, *params: Any) -> Any:
        if sql == "BEGIN IMMEDIATE":
            sql = "SAVEPOINT fsm_joined"
        elif sql == "COMMIT":
            sql = "RELEASE fsm_joined"
        return self._cur.execute(sql, *params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class JoinedSqlite:
    """The caller's SQLite connection (sqlite3, or an async lane over aiosqlite) with the
    face the store's code uses: always in a transaction, ``rollback()`` undoing only the
    store's own savepoint."""

    def __init__(self, conn: Any) -> None:
        object.__setattr__(self, "_conn", conn)

    in_transaction = True

    def cursor(self) -> _SqliteCursor:
        return _SqliteCursor(self._conn.cursor())

    def rollback(self) -> None:
        cur = self._conn.cursor()
        cur.execute("ROLLBACK TO fsm_joined")
        cur.execute("RELEASE fsm_joined")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:  # text_factory, when a bad row is diagnosed
        setattr(self._conn, name, value)


class _PostgresCursor:
    """A cursor on the caller's PostgreSQL connection: each write statement under a
    savepoint of its own, so a failed one leaves the caller's transaction usable."""

    __slots__ = ("_cur", "_rows", "rowcount")

    def __init__(self, cur: Any) -> None:
        self._cur = cur
        self._rows: list[Any] = []
        self.rowcount = -1

    def execute(self, sql: str, *params: Any, **options: Any) -> _PostgresCursor:
        cur = self._cur
        if sql.lstrip()[:6].upper() == "SELECT":
            cur.execute(sql, *params, **options)
            self._take()
            return self
        cur.execute("SAVEPOINT fsm_statement")
        try:
            cur.execute(sql, *params, **options)
            self._take()
        except BaseException:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK TO SAVEPOINT fsm_statement")
            raise
        cur.execute("RELEASE SAVEPOINT fsm_statement")
        return self

    def _take(self) -> None:
        cur = self._cur
        self.rowcount = cur.rowcount
        try:
            self._rows = list(cur.fetchall()) if getattr(cur, "description", True) is not None else []
        except Exception:  # a statement without rows (psycopg: "the last operation didn't produce a result")
            self._rows = []

    def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        self._rows = []


class JoinedPostgres:
    """The caller's psycopg connection (or an async lane over one) with the store's face."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def cursor(self) -> _PostgresCursor:
        return _PostgresCursor(self._conn.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class JoinedSlot:
    """What :meth:`stores.sql.connections.Connections.slot` hands out inside a joined block."""

    __slots__ = ("conn", "cursor", "joined")

    def __init__(self, conn: Any, joined: Joined) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.joined = joined

    def close(self) -> None:
        """Never closes the caller's connection; a broken one is the caller's to handle."""


class Joined:
    """One joined block: the caller's connection and its transaction, the store's view of it."""

    def __init__(self, connection: sa.Connection, conn: Any, session: sa.orm.Session | None = None) -> None:
        self.connection = connection
        self.transaction = connection.get_transaction()
        self.slot = JoinedSlot(conn, self)
        self.session = session
        self.store: Any = None  # the async face's view of the store on this connection

    @property
    def ended(self) -> bool:
        """Whether the caller's transaction committed or rolled back since the block began."""
        tx = self.transaction
        return tx is None or not tx.is_active or self.connection.closed

    def check(self) -> JoinedSlot:
        """The slot, for one statement of the store; ``ConfigError`` once the caller's
        transaction ended.  A Session is asked for its connection first: it emits a
        ``begin_nested()`` savepoint only when its connection is next used, and the store's
        statement must run inside that savepoint."""
        if not self.ended and self.session is not None and self.session.connection() is not self.connection:
            self.transaction = None
        if self.ended:
            raise ConfigError(
                "the transaction this block joined has ended (committed or rolled back): "
                "open a new joined block on a connection in a transaction"
            )
        return self.slot


class JoinedConnections:
    """What the SQL store's code asks of its connections, for a joined block (async face)."""

    lock = None

    def __init__(self, joined: Joined, engine: sa.Engine) -> None:
        self.joined = joined
        self.engine = engine

    def slot(self) -> JoinedSlot:
        return self.joined.check()

    def current(self) -> JoinedSlot:
        return self.joined.slot

    def drop(self) -> None:
        """The caller's connection is the caller's: left open."""

    def close(self) -> None:
        """Never closes the caller's connection."""


def session_of(target: Any) -> sa.orm.Session | None:
    """The sync Session behind ``target`` (a Session, or an AsyncSession's), if it is one."""
    if isinstance(target, sa.orm.Session):
        return target
    found = getattr(target, "sync_session", None)
    return found if isinstance(found, sa.orm.Session) else None


def sync_connection(target: Any) -> sa.Connection:
    """The caller's Connection, in a transaction: a Session's (it begins one), or the
    Connection itself (begun if it is not yet: the caller commits it)."""
    if isinstance(target, sa.orm.Session):
        connection = target.connection()
    elif isinstance(target, sa.Connection):
        connection = target
    else:
        raise ConfigError(f"joined() takes a SQLAlchemy Connection or Session, not {type(target).__name__}")
    if connection.closed or connection.invalidated:
        raise ConfigError("joined() needs an open connection")
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        raise ConfigError("the connection is in autocommit mode: it has no transaction to join")
    if not connection.in_transaction():
        connection.begin()
    return connection


def check_driver(connection: sa.Connection, dialect: str, drivers: tuple[str, ...]) -> None:
    if connection.dialect.name != dialect or connection.dialect.driver not in drivers:
        raise ConfigError(
            f"the store runs on {dialect} ({'/'.join(drivers)}); the connection given is "
            f"{connection.dialect.name}+{connection.dialect.driver}"
        )


def prepare_sqlite(dbapi: sqlite3.Connection) -> None:
    """Make the caller's sqlite3 connection ready for the store's statements."""
    from stores.sql.dialect import sqlite_ts_add, sqlite_ts_norm

    dbapi.create_function("fsm_ts_add", 2, sqlite_ts_add, deterministic=True)
    dbapi.create_function("fsm_ts", 1, sqlite_ts_norm, deterministic=True)
    if not dbapi.in_transaction:  # pysqlite's legacy mode begins only before DML: begin now, as a writer
        dbapi.execute("BEGIN IMMEDIATE")


def prepare_postgres(dbapi: Any) -> None:
    """Make sure psycopg is inside the transaction (it begins one only at the first statement)."""
    if dbapi.autocommit:
        raise ConfigError("the connection is in autocommit mode: it has no transaction to join")
    if dbapi.info.transaction_status == 0:  # IDLE: a transaction() block would commit on its own
        dbapi.execute("SELECT 1")


@contextlib.contextmanager
def entered(key: int, joined: Joined) -> Iterator[Joined]:
    """``joined`` as this context's joined connection of the store ``key``."""
    current = JOINED.get() or {}
    if key in current:
        raise ConfigError("this store already runs inside a joined block here; nest blocks of different stores only")
    token = JOINED.set({**current, key: joined})
    try:
        yield joined
    finally:
        JOINED.reset(token)


def joined_sync(store: Any, target: Any) -> contextlib.AbstractContextManager[Joined]:
    """:meth:`stores.sql.SqlStore.joined`."""
    connection = sync_connection(target)
    dialect = store.engine.dialect.name
    dbapi = connection.connection.dbapi_connection
    if dialect == "sqlite":
        check_driver(connection, "sqlite", ("pysqlite",))
        prepare_sqlite(dbapi)  # type: ignore[arg-type]
        conn: Any = JoinedSqlite(dbapi)
    else:
        check_driver(connection, "postgresql", ("psycopg",))
        prepare_postgres(dbapi)
        conn = JoinedPostgres(dbapi)
    return entered(id(store._conns), Joined(connection, conn, session_of(target)))


def current(key: int) -> Joined | None:
    """The joined block of the store ``key`` in this context, if any."""
    found = JOINED.get()
    return None if found is None else found.get(key)


__all__ = [
    "JOINED",
    "Joined",
    "JoinedConnections",
    "JoinedPostgres",
    "JoinedSlot",
    "JoinedSqlite",
    "check_driver",
    "current",
    "entered",
    "joined_sync",
    "session_of",
]
