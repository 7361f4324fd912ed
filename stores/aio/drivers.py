"""Async driver connections with the synchronous DBAPI face the SQL store's code uses.

The SQL store runs its statements through ``slot.cursor.execute / fetchall`` and, for
multi-statement writes, ``slot.conn.transaction()`` (PostgreSQL) or ``BEGIN IMMEDIATE``
/ ``rollback()`` (SQLite).  These adapters give exactly that face over psycopg's
``AsyncConnection`` and aiosqlite, suspending the calling greenlet on each round trip
(:func:`stores.aio.greenlets.wait`), as SQLAlchemy's own async dialects do.  Each
``execute`` fetches every row in the same round trip, so a statement costs one wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from stores.aio.greenlets import wait
from stores.sql.dialect import sqlite_ts_add, sqlite_ts_norm


class LaneCursor:
    """``execute`` (rows fetched at once), ``fetchall``, ``fetchone``, ``rowcount``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._rows: list[Any] = []
        self.rowcount = -1

    def execute(self, sql: str, params: Any = None) -> LaneCursor:
        self._rows, self.rowcount = wait(self._conn.execute_all(sql, params))
        return self

    def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def close(self) -> None:
        self._rows = []


_TUPLES_OK = 2  # psycopg.pq.ExecStatus.TUPLES_OK


class PsycopgLane:
    """A psycopg ``AsyncConnection`` (autocommit, UTC) with the sync face of the store."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._cur = driver.cursor()

    @classmethod
    async def open(cls, url: sa.URL, connect_timeout: int = 10) -> PsycopgLane:
        import psycopg

        params: dict[str, Any] = {k: v for k, v in url.query.items() if isinstance(v, str)}
        params.setdefault("connect_timeout", connect_timeout)
        for key, value in (
            ("host", url.host),
            ("port", url.port),
            ("user", url.username),
            ("password", url.password),
            ("dbname", url.database),
        ):
            if value is not None:
                params[key] = value
        driver = await psycopg.AsyncConnection.connect(autocommit=True, **params)
        await driver.execute("SET TIME ZONE 'UTC'")
        return cls(driver)

    async def execute_all(self, sql: str, params: Any) -> tuple[list[Any], int]:
        cur = self._cur
        await cur.execute(sql, params)
        result = cur.pgresult  # not ``description``: it builds a column object per column per call
        rows = await cur.fetchall() if result is not None and result.status == _TUPLES_OK else []
        return rows, cur.rowcount

    @property
    def closed(self) -> bool:
        return bool(self.driver.closed)

    @property
    def broken(self) -> bool:
        return bool(self.driver.broken)

    def rollback(self) -> None:
        wait(self.driver.rollback())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """``BEGIN`` .. ``COMMIT`` (``ROLLBACK`` on an exception), as psycopg's own."""
        tx = self.driver.transaction()
        wait(tx.__aenter__())
        try:
            yield
        except BaseException as err:
            wait(tx.__aexit__(type(err), err, err.__traceback__))
            raise
        wait(tx.__aexit__(None, None, None))

    def cursor(self) -> LaneCursor:
        return LaneCursor(self)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.driver.close()


class SqliteLane:
    """An aiosqlite connection set up as the sync store sets up sqlite3 (autocommit mode,
    ``busy_timeout``, foreign keys, ``synchronous``, the ``fsm_ts*`` functions)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.closed = False
        self.broken = False

    @classmethod
    async def open(cls, path: str, busy_timeout_ms: int, synchronous: str) -> SqliteLane:
        import aiosqlite

        driver = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        await driver.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        await driver.execute("PRAGMA foreign_keys = ON")
        await driver.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        await driver.create_function("fsm_ts_add", 2, sqlite_ts_add, deterministic=True)
        await driver.create_function("fsm_ts", 1, sqlite_ts_norm, deterministic=True)
        return cls(driver)

    async def execute_all(self, sql: str, params: Any) -> tuple[list[Any], int]:
        cur = await self.driver.execute(sql, params if params is not None else ())
        try:
            rows = list(await cur.fetchall())
            return rows, cur.rowcount
        finally:
            await cur.close()

    @property
    def in_transaction(self) -> bool:
        return bool(self.driver.in_transaction)

    def rollback(self) -> None:
        wait(self.driver.rollback())

    def cursor(self) -> LaneCursor:
        return LaneCursor(self)

    async def aclose(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.driver.close()


__all__ = ["LaneCursor", "PsycopgLane", "SqliteLane"]
