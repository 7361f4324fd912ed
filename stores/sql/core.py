"""The plumbing every part of the SQL store shares: its state, its clock, one statement.

:class:`SqlCore` holds what :class:`stores.sql.SqlStore` sets up (statements, connections,
flavor, clock, child tables) and the few helpers its parts use: the write's ``now``, running
one statement on the calling thread's connection, re-reading a row to diagnose a refused
write.  The parts (``sql_leases``, ``sql_reaper``, ``sql``) are mixins over it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fsm.clock import Clock, read_clock
from fsm.errors import FsmError
from fsm.records import Snapshot
from stores.sql.children import ChildIO, attach
from stores.sql.connections import Connections, is_undecodable, tolerant_text, unavailable, undecodable_row
from stores.sql.dialect import Flavor, Statements
from stores.sql.rows import snapshot_of
from stores.sql.schema import AFTER_ENTITY, decode_time

ATTEMPTS = 3
"""Tries of a write whose refusal the re-read could not explain (the row moved in between)."""

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(?<![:\w]):([A-Za-z_]\w*)")

Positional = tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]]]


def positional(sql: str) -> Positional:
    """``sql`` with its ``:name`` parameters as ``?``, and what picks their values from a
    dict in that order.  sqlite3 binds a tuple faster than it looks names up in a dict
    (about 1.5 us per statement of the hot path).  Quoted literals and identifiers are left alone."""
    names: list[str] = []

    def mark(m: re.Match[str]) -> str:
        if m.group(1) is None:  # a quoted literal or identifier
            return m.group(0)
        names.append(m.group(1))
        return "?"

    text = _TOKEN.sub(mark, sql)
    if not names:
        return text, lambda _params: ()
    if len(names) == 1:
        (name,) = names
        return text, lambda params: (params[name],)
    return text, operator.itemgetter(*names)


class SqliteWrite:
    """One SQLite write transaction: ``BEGIN IMMEDIATE`` .. ``COMMIT``, or, inside a claim's
    transaction (which holds the lock already), a savepoint released at the end; undone on
    any exception.  ``with SqliteWrite(slot, "fsm_apply") as cur: ...``.  A class, not a
    generator context manager: every SQLite transition enters one."""

    __slots__ = ("_cur", "_own", "_savepoint", "_slot")

    def __init__(self, slot: Any, savepoint: str) -> None:
        self._slot = slot
        self._savepoint = savepoint
        self._cur: Any = None
        self._own = False

    def __enter__(self) -> Any:
        slot = self._slot
        cur = self._cur = slot.cursor
        self._own = not slot.conn.in_transaction
        cur.execute("BEGIN IMMEDIATE" if self._own else f"SAVEPOINT {self._savepoint}")
        return cur

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        cur, own = self._cur, self._own
        if kind is None:
            try:
                cur.execute("COMMIT" if own else f"RELEASE {self._savepoint}")
                return
            except BaseException:
                self._undo()
                raise
        self._undo()

    def _undo(self) -> None:
        if self._own:
            self._slot.conn.rollback()
        else:
            self._cur.execute(f"ROLLBACK TO {self._savepoint}")
            self._cur.execute(f"RELEASE {self._savepoint}")


class SqlCore:
    """State and helpers shared by the SQL store's parts."""

    clock: Clock | None
    _sql: Statements
    _f: Flavor
    _sqlite: bool
    _conns: Connections
    _errors: tuple[type[BaseException], ...]
    _integrity: tuple[type[BaseException], ...]
    _status: Callable[[str], str] | None
    _children: list[ChildIO]
    _positional: dict[str, Positional]

    def _qmark(self, sql: str) -> Positional:
        """:func:`positional` of ``sql``, converted once per statement text."""
        found = self._positional.get(sql)
        if found is None:
            found = self._positional[sql] = positional(sql)
        return found

    def _now(self) -> datetime | None:
        """The write's ``now`` in Python: the clock's, SQLite's wall clock, or None (server)."""
        if self.clock is not None:  # checked: the rule of every store (fsm.clock.read_clock)
            return read_clock(self.clock)
        return datetime.now(UTC) if self._sqlite else None

    def _run(self, sql: str, params: dict[str, Any], *, prepare: bool | None = None) -> list[Any]:
        """One statement (autocommit); all rows fetched, so SQLite finishes it at once.

        Integrity errors pass through (the caller says what they mean); other driver errors
        become typed ones (:func:`stores.sql.connections.unavailable`).  A row whose text
        is not UTF-8 raises ``MalformedRow`` naming it.  ``prepare`` is psycopg's (``False``:
        planned with its parameters every time; ``None``: the connection's default).
        """
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if prepare is not None and hasattr(slot.conn, "prepare_threshold"):  # a psycopg connection
                cur.execute(sql, params, prepare=prepare)
            else:
                cur.execute(sql, params)
            return cur.fetchall()  # type: ignore[no-any-return]
        except self._integrity:
            raise
        except self._errors as err:
            if "id" not in params and is_undecodable(err):  # a page of rows: find the bad one
                raise self._undecodable(sql, params) or unavailable(err, self._conns) from err
            raise unavailable(err, self._conns, params.get("id")) from err

    def _undecodable(self, sql: str, params: dict[str, Any]) -> FsmError | None:
        """Re-run a read whose rows failed to decode, reading bad text as markers, and name
        the first bad row (SQLite only: a read, so running it again changes nothing)."""
        conn = self._conns.slot().conn
        conn.text_factory = tolerant_text
        try:
            cur = conn.cursor()
            try:
                cur.execute(sql, params)
                return undecodable_row(cur.fetchall())
            finally:
                cur.close()
        except Exception:
            return None
        finally:
            conn.text_factory = str

    def _attach(self, snaps: list[Snapshot]) -> list[Snapshot]:
        """``snaps`` with their child rows loaded (bound tables with children only)."""
        return attach(self._children, self._conns.slot().cursor, snaps) if self._children else snaps

    def _current(self, entity_id: str) -> tuple[Snapshot | None, datetime]:
        """The row as it is now, and the store's now, for diagnosing a refused write."""
        now = self._now()
        rows = self._run(self._sql.diagnose, {"id": entity_id, "now": None if now is None else self._f.time(now)})
        if not rows:
            return None, now or datetime.now(UTC)
        return snapshot_of(rows[0]), now if now is not None else decode_time(rows[0][AFTER_ENTITY])

    def _time_params(self, params: dict[str, Any], now: datetime | None, ttl: timedelta | None) -> None:
        """``now`` (when bound) and ``now + ttl`` as the dialect takes them."""
        f = self._f
        if now is not None:
            params["now"] = f.time(now)
        params["ttl"] = None if ttl is None else f.offset(now, ttl)


__all__ = ["ATTEMPTS", "SqlCore", "SqliteWrite", "positional"]
