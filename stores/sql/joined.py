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
simplest: ``Session(store.engine)``.  Checked once per block, before the store runs a
statement (:func:`check_database`):

- SQLite: the file the caller's connection has open (``PRAGMA database_list``), its path
  resolved, is the store's; an in-memory database only through the store's own engine.
- PostgreSQL: the URLs name the same host, port and database (driver aside); when they do
  not (``localhost`` for ``127.0.0.1``, a pooler in between), the servers are asked: the
  same cluster (``pg_control_system()``'s system identifier) and ``current_database()``.
  Each engine's answer is kept for the engine's lifetime: one question per engine.
- Another database is refused with ``ConfigError`` naming both (passwords hidden), before
  anything is written: the store's writes would land where the store never reads them.

One block per store and thread (or task) at a time (:func:`open_join`): a ``within()``
nested on the *same* Session or Connection (another engine of the store, or the same
engine again) joins the open block; one on *another* connection is refused with
``ConfigError`` at once.  On SQLite the same holds across stores on one database file:
SQLite allows one writer, and the second connection would only wait for the first's lock
until the busy timeout.  Joining the caller's connection never lets a driver's or
SQLAlchemy's error out: a locked or unreachable database is ``StoreUnavailable``, a
Session or Connection that cannot be joined (a failed flush pending its rollback, a
PostgreSQL transaction aborted by a failed statement of the caller's) is ``ConfigError``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sqlite3
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
import sqlalchemy.orm

from fsm.errors import ConfigError, FsmError, StoreCorrupt, StoreUnavailable

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


ABORTED = "25P02"
"""PostgreSQL's SQLSTATE for "current transaction is aborted, commands ignored until end of
transaction block" (``in_failed_sql_transaction``)."""


def aborted() -> ConfigError:
    """The caller's PostgreSQL transaction is aborted: nothing can run in it any more."""
    return ConfigError(
        "the caller's transaction is aborted: one of its own statements failed, and PostgreSQL "
        "ignores every command until the transaction is rolled back",
        problems=[
            "roll the transaction back (or back to a savepoint begun before the failed statement) "
            "before the store's next call; the store wrote nothing"
        ],
    )


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
        try:
            if sql.lstrip()[:6].upper() == "SELECT":
                cur.execute(sql, *params, **options)
                self._take()
                return self
            cur.execute("SAVEPOINT fsm_statement")
        except Exception as err:
            if getattr(err, "sqlstate", None) == ABORTED:  # the caller's own statement failed before
                raise aborted() from err
            raise
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

    def __init__(
        self, connection: sa.Connection, conn: Any, session: sa.orm.Session | None = None, database: Any = None
    ) -> None:
        self.connection = connection
        self.transaction = connection.get_transaction()
        self.slot = JoinedSlot(conn, self)
        self.session = session
        self.database = database  # the store's database (:func:`home_of`): one SQLite writer per file
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
        if not self.ended and self.session is not None:
            with joining_errors(self.connection.engine.url):
                if self.session.connection() is not self.connection:
                    self.transaction = None
        if self.ended:
            raise ConfigError(
                "the transaction this block joined has ended (committed or rolled back): "
                "open a new joined block on a connection in a transaction"
            )
        return self.slot

    def serves(self, target: Any) -> bool:
        """Whether ``target`` (a Session or Connection, sync or async) is this block's own:
        its Session, its Connection, or a Session bound to that Connection."""
        if target is self.connection or getattr(target, "sync_connection", None) is self.connection:
            return True
        session = session_of(target)
        return session is not None and (session is self.session or session.bind is self.connection)


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
    status = dbapi.info.transaction_status
    if status == 0:  # IDLE: a transaction() block would commit on its own
        dbapi.execute("SELECT 1")
    elif status == 3:  # INERROR: a statement of the caller's failed
        raise aborted()


# -- one block per store (and per SQLite file) and thread ------------------------------------


def open_join(key: int, database: Any, target: Any) -> Joined | None:
    """The open block of the store ``key`` in this thread (or task) that ``target`` joins,
    ``None`` when there is none, or ``ConfigError`` when one is open on another connection
    (of this store; on SQLite, of any store on the same file ``database``).  Checked before
    ``target`` is asked for a connection: on SQLite the second connection's ``BEGIN`` would
    wait for the first's write lock until the busy timeout."""
    found = JOINED.get()
    if not found:
        return None
    sqlite = isinstance(database, tuple) and database[0] in SQLITE_KEYS
    for other_key, joined in found.items():
        if joined.ended:  # a spent block (its transaction committed or rolled back) holds nothing
            continue
        if other_key == key:
            if joined.serves(target):
                return joined
            raise ConfigError(
                "another within() block of this store is open on another connection in this thread"
                + (": SQLite allows one writer, and this one would wait for its lock" if sqlite else ""),
                problems=[
                    "nest the blocks on the same Session or Connection (a nested block on it joins the open one)",
                    "or commit (or roll back) the first before opening the second",
                ],
            )
        if sqlite and joined.database == database and not joined.serves(target):
            raise ConfigError(
                f"a within() block on this SQLite database ({database[1]}) is open on another connection "
                "in this thread: SQLite allows one writer, and this one would wait for its lock",
                problems=[
                    "nest the blocks on the same Session or Connection",
                    "or commit (or roll back) the first before opening the second",
                ],
            )
    return None


@contextlib.contextmanager
def entered(key: int, joined: Joined) -> Iterator[Joined]:
    """``joined`` as this context's joined connection of the store ``key`` (in place of a
    spent one: :func:`open_join` refused an open one already)."""
    current = JOINED.get() or {}
    found = current.get(key)
    if found is not None and not found.ended:
        raise ConfigError("another within() block of this store is open on another connection in this thread")
    token = JOINED.set({**current, key: joined})
    try:
        yield joined
    finally:
        JOINED.reset(token)


# -- which database: the store's and the caller's --------------------------------------------

SQLITE_KEYS = ("sqlite", "sqlite-memory")

_homes: weakref.WeakKeyDictionary[sa.Engine, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""A store's engine -> its database: ``("sqlite", path)``, ``("sqlite-memory", id)`` or
``("postgresql", host, port, database)``."""

_seen: weakref.WeakKeyDictionary[sa.Engine, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""A caller's engine -> the database its connections reach, as the database told (SQLite:
the resolved file; PostgreSQL: ``("server", system identifier, database)``)."""

_servers: weakref.WeakKeyDictionary[sa.Engine, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""A PostgreSQL store's engine -> its server's answer to :data:`POSTGRES_IDENTITY`."""

SQLITE_IDENTITY = "PRAGMA database_list"
POSTGRES_IDENTITY = "SELECT (SELECT system_identifier FROM pg_control_system())::text, current_database()"
"""The cluster (fixed at ``initdb``, the same through any host name, port or pooler) and
the database a PostgreSQL connection is on."""


def sqlite_key(rows: Sequence[Any], engine: sa.Engine) -> tuple[Any, ...]:
    """The database of a sqlite3 connection from its ``PRAGMA database_list``: the resolved
    path of its ``main`` file, or an in-memory database of its own engine."""
    path = next((row[2] for row in rows if row[1] == "main"), "")
    return ("sqlite", os.path.realpath(path)) if path else ("sqlite-memory", id(engine))


def postgres_key(url: sa.URL) -> tuple[Any, ...]:
    """The database a PostgreSQL URL names, driver aside: host (a socket directory when the
    URL has none), port and database (libpq's defaults when absent)."""

    def first(name: str) -> str | None:
        value = url.query.get(name)
        return value[0] if isinstance(value, tuple) else value

    host = url.host or first("host") or ""
    port = url.port or first("port") or 5432
    return ("postgresql", host.lower(), str(port), url.database or first("dbname") or url.username or "")


def server_key(rows: Sequence[Any]) -> tuple[Any, ...]:
    """A PostgreSQL connection's answer to :data:`POSTGRES_IDENTITY` (no rows: unknown)."""
    return ("server", str(rows[0][0]), str(rows[0][1])) if rows else ("server-unknown",)


def home_of(engine: sa.Engine) -> tuple[Any, ...]:
    """The database of a store's engine (asked once per engine: SQLite opens a connection
    of the pool and reads its file; PostgreSQL reads the URL)."""
    found = _homes.get(engine)
    if found is None:
        url = engine.url
        if url.get_backend_name() != "sqlite":
            found = postgres_key(url)
        elif url.database in (None, "", ":memory:") or "mode=memory" in str(url):
            found = ("sqlite-memory", id(engine))
        else:
            with joining_errors(url):
                raw = engine.raw_connection()
                try:
                    cur = raw.cursor()
                    cur.execute(SQLITE_IDENTITY)
                    found = sqlite_key(cur.fetchall(), engine)
                finally:
                    raw.close()
        _homes[engine] = found
    return found


def store_server(engine: sa.Engine) -> tuple[Any, ...]:
    """The PostgreSQL store's cluster and database, asked once per engine (a connection of
    its pool; run in a thread by the async face)."""
    found = _servers.get(engine)
    if found is None:
        try:
            with engine.connect() as conn:
                found = server_key(conn.exec_driver_sql(POSTGRES_IDENTITY).all())
        except sa.exc.SQLAlchemyError:
            found = server_key([])
        _servers[engine] = found
    return found


def known_database(store_engine: sa.Engine, home: tuple[Any, ...], connection: sa.Connection) -> bool:
    """Whether ``connection`` is known to reach the store's database without asking it:
    the store's own engine, a PostgreSQL URL naming the same database, or an engine asked
    before (``ConfigError`` when its answer was another database)."""
    engine = connection.engine
    if engine is store_engine or (home[0] == "postgresql" and postgres_key(engine.url) == home):
        return True
    seen = _seen.get(engine)
    if seen is None:
        return False
    judge(store_engine, home, connection, seen)
    return True


def judge(store_engine: sa.Engine, home: tuple[Any, ...], connection: sa.Connection, seen: tuple[Any, ...]) -> None:
    """``ConfigError`` unless ``seen`` (what the caller's database answered) is the store's
    database; nothing was written yet."""
    _seen[connection.engine] = seen
    if home[0] in SQLITE_KEYS:
        if seen == home:
            return
        theirs = seen[1] if seen[0] == "sqlite" else "another in-memory database"
        ours = home[1] if home[0] == "sqlite" else "an in-memory database of the store's own engine"
    else:
        server = store_server(store_engine)
        if seen == server and server[0] == "server":
            return
        theirs = connection.engine.url.render_as_string(hide_password=True)
        ours = store_engine.url.render_as_string(hide_password=True)
        if seen[0] == "server" and server[0] == "server":
            theirs += f" (database {seen[2]!r} of the cluster {seen[1]})"
            ours += f" (database {server[2]!r} of the cluster {server[1]})"
    raise ConfigError(
        f"within() was given a connection to another database than the store's: the store is on {ours}, "
        f"the connection on {theirs}; the engine's writes would land there, where the store never reads them",
        problems=["pass a Session or Connection of the store's own database (Session(store.engine) is simplest)"],
    )


def check_database(store_engine: sa.Engine, home: tuple[Any, ...], connection: sa.Connection, dbapi: Any) -> None:
    """:func:`judge` the caller's sync connection, asking its database only the first time
    its engine is seen (SQLite: before ``BEGIN``; PostgreSQL: inside the transaction,
    under a savepoint, so a server that refuses the question leaves it usable)."""
    if known_database(store_engine, home, connection):
        return
    if home[0] in SQLITE_KEYS:
        seen = sqlite_key(dbapi.execute(SQLITE_IDENTITY).fetchall(), connection.engine)
    else:
        import psycopg

        try:
            with dbapi.transaction():  # inside the caller's transaction: a savepoint
                seen = server_key(dbapi.execute(POSTGRES_IDENTITY).fetchall())
        except psycopg.Error:
            seen = server_key([])
    judge(store_engine, home, connection, seen)


# -- errors met while joining ----------------------------------------------------------------


def _driver_errors() -> tuple[type[BaseException], ...]:
    psycopg = sys.modules.get("psycopg")
    return (sa.exc.SQLAlchemyError, sqlite3.Error) + ((psycopg.Error,) if psycopg is not None else ())


def _unreachable(err: BaseException) -> bool:
    orig = getattr(err, "orig", None) or err
    if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.TimeoutError):
        return True
    if isinstance(orig, sqlite3.OperationalError | sqlite3.InterfaceError):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError)


@contextlib.contextmanager
def joining_errors(url: sa.URL) -> Iterator[None]:
    """Driver and SQLAlchemy errors met while joining the caller's connection (or asking
    its Session for it), as typed errors: a corrupt SQLite file -> ``StoreCorrupt``; the
    database locked (SQLite's one writer), down or refusing the connection ->
    ``StoreUnavailable``; a transaction PostgreSQL aborted -> ``ConfigError`` (roll it
    back); anything else (a Session pending its rollback after a failed flush, a closed
    Connection) -> ``ConfigError``."""
    try:
        yield
    except FsmError:
        raise
    except _driver_errors() as err:
        from stores.sql.connections import database_name, is_corrupt, reason_of

        where, reason = database_name(url), reason_of(err)
        if is_corrupt(err):
            raise StoreCorrupt(where, reason=reason) from err
        if getattr(getattr(err, "orig", None) or err, "sqlstate", None) == ABORTED:
            raise aborted() from err
        if _unreachable(err):
            locked = "locked" in reason.lower() and url.get_backend_name() == "sqlite"
            raise StoreUnavailable(
                f"cannot join the caller's transaction on {where}: {reason}"
                + (
                    " (another connection holds SQLite's write lock: SQLite allows one writer, "
                    "and within() waited its busy timeout for it)"
                    if locked
                    else ""
                )
            ) from err
        raise ConfigError(f"the Session or Connection given cannot be joined: {reason}") from err


def joined_sync(store: Any, target: Any) -> contextlib.AbstractContextManager[Joined]:
    """:meth:`stores.sql.SqlStore.joined`: the block open on ``target`` already
    (:func:`open_join`), or a new one once ``target`` proves to reach the store's database
    with its driver."""
    if not isinstance(target, sa.orm.Session | sa.Connection):
        raise ConfigError(f"joined() takes a SQLAlchemy Connection or Session, not {type(target).__name__}")
    engine: sa.Engine = store.engine
    key, home = id(store._conns), home_of(engine)
    outer = open_join(key, home, target)
    if outer is not None:
        return contextlib.nullcontext(outer)
    with joining_errors(engine.url):
        connection = sync_connection(target)
        dbapi = connection.connection.dbapi_connection
        if engine.dialect.name == "sqlite":
            check_driver(connection, "sqlite", ("pysqlite",))
            check_database(engine, home, connection, dbapi)
            prepare_sqlite(dbapi)  # type: ignore[arg-type]
            conn: Any = JoinedSqlite(dbapi)
        else:
            check_driver(connection, "postgresql", ("psycopg",))
            prepare_postgres(dbapi)
            check_database(engine, home, connection, dbapi)
            conn = JoinedPostgres(dbapi)
    return entered(key, Joined(connection, conn, session_of(target), home))


def current(key: int) -> Joined | None:
    """The joined block of the store ``key`` in this context, if any."""
    found = JOINED.get()
    return None if found is None else found.get(key)


__all__ = [
    "JOINED",
    "POSTGRES_IDENTITY",
    "SQLITE_IDENTITY",
    "Joined",
    "JoinedConnections",
    "JoinedPostgres",
    "JoinedSlot",
    "JoinedSqlite",
    "aborted",
    "check_database",
    "check_driver",
    "current",
    "entered",
    "home_of",
    "joined_sync",
    "joining_errors",
    "judge",
    "known_database",
    "open_join",
    "postgres_key",
    "server_key",
    "session_of",
    "sqlite_key",
    "store_server",
]
