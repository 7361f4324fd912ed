"""A fire by id that the database judges: :class:`~fsm.id_write.IdWrite` as one write.

The update chooses the branch itself: it moves the row only if it is live, of the
lifecycle's kind, in one of the write's sources (and, with the caller's lease, held by it),
and sets the target its source maps to (``CASE state WHEN ..``).  There is no version to
compare: the row lock orders two such writes, and the second then finds the row in the
first's target, not a source (or a bumped lease token), and moves nothing.

- PostgreSQL: one statement, ``WITH u AS (UPDATE .. RETURNING ..), h AS (INSERT INTO
  history .. SELECT .. FROM u) SELECT * FROM u``: one round trip, no read.
- SQLite: ``UPDATE .. RETURNING`` then the history ``INSERT`` in one ``BEGIN IMMEDIATE``
  (a savepoint inside a caller's transaction).

The history row's ``source`` is the state the row left.  Where each target has one source
it is read off the target (``CASE u.state ..``); where two sources enter one target (a
``fail`` from running or finalizing), PostgreSQL locks the row first in the same statement
(``WITH o AS (SELECT .. FOR UPDATE), u AS (UPDATE .. FROM o ..)``: the locked row's state,
as the update sees it), and SQLite inserts the history row first from the row
(``INSERT INTO history .. SELECT .. FROM entities WHERE .. RETURNING seq, source, target``),
then updates the row at that version, both under its write lock.

A write that
moves nothing returns ``None`` and the engine reads the row to judge it the read-first way
(:mod:`fsm.engine.by_id`): the errors are that path's own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fsm.clock import read_clock
from fsm.errors import MalformedRow
from fsm.id_write import IdWrite, check_id_write
from fsm.records import HistoryRecord, LeaseChange, Snapshot
from stores.sql.connections import unavailable
from stores.sql.core import SqlCore, SqliteWrite
from stores.sql.rows import dumps_data, loads_object, memory_of, snapshot_of
from stores.sql.schema import decode_time

Applied = tuple[Snapshot, HistoryRecord]


class _Undo(Exception):
    """Roll the write back: the row was not where the history row said."""


class ByIdOps(SqlCore):
    """``apply_by_id`` of :class:`stores.sql.SqlStore` (see the module)."""

    @property
    def judges_by_id(self) -> bool:
        """Whether this store judges fires by id itself: on its own tables (a bound
        application table, or one with child tables, is read first)."""
        return self._sql.lean_ok and not self._children

    def apply_by_id(self, write: IdWrite) -> Applied | None:
        """The transition ``write`` on the row as it is, judged by the statement: the new
        snapshot and history row, or ``None`` if the row did not qualify (nothing written:
        unknown, deleted, another kind, in no source, its lease not the caller's).  On a
        bound or child-table layout, or for a write whose target has two sources, ``None``
        at once: the caller reads the row and writes with the version compare-and-set."""
        check_id_write(write)
        if not self.judges_by_id:
            return None
        return self.apply_by_id_checked(write)

    def apply_by_id_checked(self, write: IdWrite) -> Applied | None:
        """:meth:`apply_by_id` of a write the engine built from checked arguments and a
        plan it derived for this store (:attr:`judges_by_id`)."""
        moves = write.moves
        if self._sqlite and not _shared(moves):
            return self._by_id_sqlite_lean(write)
        due = write.run_after
        ttl = write.lease_ttl
        change = write.lease_change
        sql = self._by_id_statements(change, ttl is not None, write.expect_token is not None, write, due is not None)
        entity_id = write.entity_id
        howner = write.history_owner()
        error = write.error
        params: dict[str, Any] = {
            "id": entity_id,
            "kind": write.kind,
            "event": write.event,
            "actor": write.actor,
            "owner": write.expect_owner,
            "token": write.expect_token,
            "reason": write.reason,
            "key": None,
            "patch": None,
            "new_owner": write.new_owner,
            "howner": howner,
            "error": None if error is None else dumps_data(error, entity_id),
            "target": moves[0][1],
            "source": moves[0][0],
        }
        if len(moves) > 1:
            for i, (source, target) in enumerate(moves):
                params[f"s{i}"], params[f"t{i}"] = source, target
        else:
            params["s0"], params["t0"] = moves[0]
        now = self._now()
        self._time_params(params, now, ttl)
        if due is not None:
            params["due"] = self._f.offset(now, due)
        if self._sqlite:
            assert now is not None
            if now.tzinfo is not UTC:  # as the stored text reads back
                now = now.astimezone(UTC)
            run = self._by_id_sqlite_shared if _shared(moves) else self._by_id_sqlite
            found = run(sql, params, write, now)
        else:
            found = self._by_id_pg(sql[0], params)
        if found is None:
            return None
        snap, source, at = found
        record = HistoryRecord(
            entity_id, snap.version, write.event, source, snap.state, write.actor, snap.lease_token,
            write.reason, None, at, None, howner, None if error is None else json.loads(params["error"]),
        )  # fmt: skip
        return snap, record

    def _by_id_pg(self, sql: str, params: dict[str, Any]) -> tuple[Snapshot, str, Any] | None:
        cur = self._conns.slot().cursor
        try:
            cur.execute(sql, params)
            rows = cur.fetchall()
        except self._integrity:
            return None  # a history seq taken: the read-first path says what is wrong
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        if not rows:
            return None
        row = rows[0]
        return snapshot_of(row), row[-2], decode_time(row[-1])

    def _by_id_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], write: IdWrite, now: datetime
    ) -> tuple[Snapshot, str, Any] | None:
        update, update_values = self._qmark(sql[0])
        insert, insert_values = self._qmark(sql[1])
        try:
            with SqliteWrite(self._conns.slot(), "fsm_apply") as cur:
                cur.execute(update, update_values(params))
                rows = cur.fetchall()
                if not rows:
                    return None
                snap = _written(rows[0], write, now, params)  # decoded before COMMIT: a bad row rolls back
                source = next(s for s, t in write.moves if t == snap.state)
                params["seq"], params["htoken"] = snap.version, snap.lease_token
                params["source"], params["target"] = source, snap.state
                cur.execute(insert, insert_values(params))
        except self._integrity:
            return None
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        return snap, source, now

    def _by_id_sqlite_lean(self, write: IdWrite) -> Applied | None:
        """SQLite, each target with one source: ``UPDATE .. RETURNING`` what the write did
        not set itself, then the history row, in one transaction (see :class:`_Lean`)."""
        moves = write.moves
        change = write.lease_change
        ttl = write.lease_ttl
        due = write.run_after
        reason = write.reason
        error = write.error
        token = write.expect_token
        howner = write.new_owner if change is _ACQUIRE else write.expect_owner if write.holds else None
        key = (
            moves, change, ttl is None, token is None, write.bump_attempt, write.bump_reclaims, due is None,
            reason is None, error is None, howner is None,
        )  # fmt: skip
        cache = self._sql._shapes  # the store's cache of shaped statements: its own keys start with a name
        lean: _Lean | None = cache.get(key)
        if lean is None:
            lean = cache[key] = self._lean_statements(write)
        clock = self.clock
        now = datetime.now(UTC) if clock is None else read_clock(clock)
        stamp = now.isoformat(" ", "microseconds")
        entity_id = write.entity_id
        source, target = moves[0]
        params: dict[str, Any] = {
            "id": entity_id, "kind": write.kind, "event": write.event, "actor": write.actor, "now": stamp,
            "target": target, "source": source, "s0": source, "reason": reason, "howner": howner,
            "owner": write.expect_owner, "token": token, "new_owner": write.new_owner,
        }  # fmt: skip
        if lean.many:
            for i, (s, t) in enumerate(moves):
                params[f"s{i}"], params[f"t{i}"] = s, t
        if ttl is not None:
            params["ttl"] = (now + ttl).isoformat(" ", "microseconds")
        if due is not None:
            params["due"] = (now + due).isoformat(" ", "microseconds")
        if error is not None:
            params["error"] = dumps_data(error, entity_id)
        try:
            with SqliteWrite(self._conns.slot(), "fsm_apply") as cur:
                cur.execute(lean.update, lean.update_values(params))
                rows = cur.fetchall()
                if not rows:
                    return None
                snap = lean.snapshot(rows[0], write, now)  # decoded before COMMIT: a bad row rolls back
                if lean.many:
                    target = snap.state
                    source = next(s for s, t in moves if t == target)
                    params["source"], params["target"] = source, target
                params["seq"], params["htoken"] = snap.version, snap.lease_token
                cur.execute(lean.insert, lean.insert_values(params))
        except self._integrity:
            return None
        except self._errors as err:
            raise unavailable(err, self._conns, entity_id) from err
        record = _new(HistoryRecord, (
            entity_id, snap.version, write.event, source, target, write.actor, snap.lease_token,
            reason, None, now, None, howner, None if error is None else json.loads(params["error"]),
        ))  # fmt: skip
        return snap, record

    def _branch_sets(
        self, n: int, change: Any, has_ttl: bool, bump_attempt: bool, bump_reclaims: bool, has_due: bool
    ) -> tuple[str, str]:
        """The ``SET`` list of a by-id move among ``n`` branches (the target chosen by the
        row's state when there are several) and the placeholders of their source states."""
        st, f = self._sql, self._f
        c = st.L.col
        sets = st._move_sets(change, has_ttl, bump_attempt, bump_reclaims, False, has_due)
        plain = f"{c['state']} = {f.p('target')}"
        assert sets.startswith(plain)
        if n > 1:  # the branch the row's state takes
            whens = " ".join(f"WHEN {f.p(f's{i}')} THEN {f.p(f't{i}')}" for i in range(n))
            sets = f"{c['state']} = CASE e.{c['state']} {whens} END" + sets[len(plain) :]
        return sets, ", ".join(f.p(f"s{i}") for i in range(n))

    def _lean_statements(self, write: IdWrite) -> _Lean:
        """The two statements of ``write``'s lean shape, as ``?`` texts with their binders.

        The update returns only what the write does not know: never the id, kind, deleted
        flag or the times it set; the state only when there are several moves, the lease
        owner and expiry only when the write keeps the lease.  The history insert writes
        ``NULL`` for what the fire does not record (no idempotency key or data patch by id;
        reason, owner and error when absent): sqlite3 binds ``None`` through its adapter
        lookup, an exception raised and cleared per value."""
        change, n = write.lease_change, len(write.moves)
        has_ttl, token = write.lease_ttl is not None, write.expect_token is not None
        has_due, bump_attempt, bump_reclaims = write.run_after is not None, write.bump_attempt, write.bump_reclaims
        has_reason, has_error = write.reason is not None, write.error is not None
        has_howner = write.history_owner() is not None
        st, f = self._sql, self._f
        c = st.L.col
        sets, sources = self._branch_sets(n, change, has_ttl, bump_attempt, bump_reclaims, has_due)
        guard = f"{st.live} AND e.{c['kind']} = {f.p('kind')} AND e.{c['state']} IN ({sources})"
        if token:
            guard += f" AND {f.same('e.' + c['lease_owner'], 'owner')} AND e.{c['lease_token']} = {f.p('token')}"
        names = ["version", "lease_token", "created_at", "concurrency_key", "attempt", "reclaims", "data", "run_after"]
        names += ["priority", "parent_id", "definition"]
        if n > 1:
            names.append("state")
        if change is LeaseChange.KEEP:
            names += ["lease_owner", "lease_expires_at"]
        returning = ", ".join(f"{c[name]} AS {name}" for name in names)
        update = f"UPDATE {st.E} AS e SET {sets} WHERE {guard} RETURNING {returning}"
        values = [
            f.p("id"), f.p("seq"), f.p("event"), f.p("source"), f.p("target"), f.p("actor"), f.p("htoken"),
            f.p("reason") if has_reason else "NULL", "NULL", f.now, "NULL", f.p("howner") if has_howner else "NULL",
            f.p("error") if has_error else "NULL",
        ]  # fmt: skip
        insert = f"INSERT INTO {st.H} ({st.hist_cols}) VALUES ({', '.join(values)})"
        update_text, update_values = self._qmark(update)
        insert_text, insert_values = self._qmark(insert)
        return _Lean(update_text, update_values, insert_text, insert_values, n > 1, change, has_due)

    def _by_id_sqlite_shared(
        self, sql: tuple[str, ...], params: dict[str, Any], write: IdWrite, now: datetime
    ) -> tuple[Snapshot, str, Any] | None:
        """Two sources share a target: the history row first, from the row (its source),
        then the row at that version; one transaction under SQLite's write lock."""
        insert, insert_values = self._qmark(sql[0])
        update, update_values = self._qmark(sql[1])
        try:
            with SqliteWrite(self._conns.slot(), "fsm_apply") as cur:
                cur.execute(insert, insert_values(params))
                rows = cur.fetchall()
                if not rows:
                    return None
                seq, source, target = rows[0]
                params["target"], params["version"] = target, seq - 1
                cur.execute(update, update_values(params))
                rows = cur.fetchall()
                if not rows:  # pragma: no cover - the write lock is held since the insert read the row
                    raise _Undo
                snap = _written(rows[0], write, now, params)
        except _Undo:
            return None
        except self._integrity:
            return None
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        return snap, source, now

    def _by_id_statements(
        self, change: LeaseChange, has_ttl: bool, token: bool, write: IdWrite, has_due: bool
    ) -> tuple[str, ...]:
        """The statements of one shape (cached): lease change, ttl, holder check, counters,
        due time and the number of sources."""
        n = len(write.moves)
        shared = _shared(write.moves)
        key = ("by_id", change, has_ttl, token, write.bump_attempt, write.bump_reclaims, has_due, n, shared)
        cache = self._sql._shapes  # the store's cache of shaped statements (keys of its own)
        found: tuple[str, ...] | None = cache.get(key)
        if found is not None:
            return found
        st, f = self._sql, self._f
        c = st.L.col
        sets, sources = self._branch_sets(n, change, has_ttl, write.bump_attempt, write.bump_reclaims, has_due)
        guard = (
            f"{st.readable if st.pg else st.live} AND e.{c['kind']} = {f.p('kind')} AND e.{c['state']} IN ({sources})"
        )
        if token:
            guard += f" AND {f.same('e.' + c['lease_owner'], 'owner')} AND e.{c['lease_token']} = {f.p('token')}"
        hist = f"INSERT INTO {st.H} ({st.hist_cols})"
        common = f"{f.p('event')}"
        ret_cols = f"RETURNING {st.ret}"
        tail = (
            f"h AS ({hist} SELECT {f.p('id')}, u.version, {common}, u.fsm_source, u.state, {f.p('actor')}, "
            f"u.lease_token, {f.p('reason')}, {f.p('key')}, u.fsm_now, {f.json('patch')}, {f.p('howner')}, "
            f"{f.json('error')}, u.created_at FROM u) SELECT * FROM u"
        )
        if st.pg and shared:  # lock the row first: its state is the source, as the update sees it
            whens = " ".join(f"WHEN {f.p(f's{i}')} THEN {f.p(f't{i}')}" for i in range(n))
            sets = f"{c['state']} = CASE o.fsm_state {whens} END" + sets[sets.index(",") :]
            found = (
                f"WITH o AS (SELECT e.{c['id']} AS fsm_id, e.{c['state']} AS fsm_state FROM {st.E} AS e "
                f"WHERE {guard} FOR UPDATE), "
                f"u AS (UPDATE {st.E} AS e SET {sets} FROM o WHERE e.{c['id']} = o.fsm_id {ret_cols}, "
                f"o.fsm_state AS fsm_source, {f.now} AS fsm_now), {tail}",
            )
        elif st.pg:
            if n > 1:  # the source its target came from (one each)
                back = " ".join(f"WHEN {f.p(f't{i}')} THEN {f.p(f's{i}')}" for i in range(n))
                source = f"CASE e.{c['state']} {back} END"
            else:
                source = f.p("source")
            found = (
                f"WITH u AS (UPDATE {st.E} AS e SET {sets} WHERE {guard} {ret_cols}, "
                f"CAST({source} AS text) AS fsm_source, {f.now} AS fsm_now), {tail}",
            )
        elif shared:  # the history row first, from the row; then the row at that version
            whens = " ".join(f"WHEN {f.p(f's{i}')} THEN {f.p(f't{i}')}" for i in range(n))
            token_after = f"e.{c['lease_token']} + 1" if change is LeaseChange.ACQUIRE else f"e.{c['lease_token']}"
            plain_sets = f"{c['state']} = {f.p('target')}" + sets[sets.index(",") :]
            found = (
                f"{hist} SELECT e.{c['id']}, e.{c['version']} + 1, {common}, e.{c['state']}, "
                f"CASE e.{c['state']} {whens} END, {f.p('actor')}, {token_after}, {f.p('reason')}, {f.p('key')}, "
                f"{f.now}, {f.p('patch')}, {f.p('howner')}, {f.p('error')} FROM {st.E} AS e WHERE {guard} "
                "RETURNING seq, source, target",
                f"UPDATE {st.E} AS e SET {plain_sets} WHERE {st.live} AND e.{c['version']} = {f.p('version')} "
                f"{ret_cols}",
            )
        else:
            found = (
                f"UPDATE {st.E} AS e SET {sets} WHERE {guard} {ret_cols}",
                f"{hist} VALUES ({f.p('id')}, {f.p('seq')}, {common}, {f.p('source')}, {f.p('target')}, "
                f"{f.p('actor')}, {f.p('htoken')}, {f.p('reason')}, {f.p('key')}, {f.now}, {f.p('patch')}, "
                f"{f.p('howner')}, {f.p('error')})",
            )
        cache[key] = found
        return found


@functools.cache
def _shared(moves: tuple[tuple[str, str], ...]) -> bool:
    """Whether two sources of ``moves`` enter one target (the source is not read off it)."""
    targets = [t for _, t in moves]
    return len(set(targets)) != len(targets)


_new = tuple.__new__  # a NamedTuple from a tuple of its fields, as its _make does
_fromiso = datetime.fromisoformat
_ACQUIRE, _CLEAR = LeaseChange.ACQUIRE, LeaseChange.CLEAR


class _Lean:
    """One lean SQLite shape: the update and history insert as ``?`` texts with their
    binders, and how to read the update's narrow ``RETURNING`` row into a Snapshot."""

    __slots__ = ("change", "due", "insert", "insert_values", "many", "update", "update_values")

    def __init__(
        self,
        update: str,
        update_values: Callable[[dict[str, Any]], tuple[Any, ...]],
        insert: str,
        insert_values: Callable[[dict[str, Any]], tuple[Any, ...]],
        many: bool,
        change: LeaseChange,
        due: bool,
    ) -> None:
        self.update, self.update_values = update, update_values
        self.insert, self.insert_values = insert, insert_values
        self.many, self.change, self.due = many, change, due

    def snapshot(self, row: Any, write: IdWrite, now: datetime) -> Snapshot:
        """The row the update returned (version, lease token, created_at, concurrency key,
        attempt, reclaims, data, run_after, priority, parent, definition[, state][, lease owner, expiry]) as a Snapshot:
        the rest is what the write set (``now``, ``now + ttl``, the target, not deleted)."""
        try:
            data = row[6]
            data = {} if data == "{}" else loads_object(data)
            if data.__class__ is not dict:
                raise ValueError(f"data is not a JSON object: {str(data)[:60]!r}")
            change = self.change
            if change is _ACQUIRE:
                owner = write.new_owner
                exp = None if write.lease_ttl is None else now + write.lease_ttl
            elif change is _CLEAR:
                owner = exp = None
            else:
                owner, exp = row[-2], row[-1]
                if exp is not None:
                    exp = decode_time(exp)
            if self.due:
                assert write.run_after is not None
                due = now + write.run_after
            else:
                due = row[7]
                if due is not None:
                    due = _fromiso(due)
                    if due.tzinfo is None:
                        due = due.replace(tzinfo=UTC)
            created = _fromiso(row[2])
            if created.tzinfo is None:
                created = created.replace(tzinfo=UTC)
            return _new(Snapshot, (
                write.entity_id, write.kind, row[11] if self.many else write.moves[0][1], row[0], owner, row[1],
                exp, now, created, now, False, row[3], row[4], row[5], data, due,
                None,  # timer_since: a lifecycle with timers is never fired by id (fsm.engine.by_id)
                row[8], row[9], row[10],
                None,  # memory: a lifecycle with history states is never fired by id (fsm.engine.by_id)
            ))  # fmt: skip
        except (ValueError, TypeError, AttributeError) as err:
            raise MalformedRow(write.entity_id, reason=str(err)) from None


def _written(row: Any, write: IdWrite, now: datetime, params: dict[str, Any]) -> Snapshot:
    """The SQLite row the update returned, as a Snapshot: the times it wrote are ``now``
    (and the lease expiry it set, ``now + ttl``), so only the others are decoded."""
    try:
        data = row[14]
        data = {} if data == "{}" else json.loads(data)
        if data.__class__ is not dict:
            raise ValueError(f"data is not a JSON object: {str(data)[:60]!r}")
        change = write.lease_change
        if change is LeaseChange.ACQUIRE:
            exp = None if write.lease_ttl is None else now + write.lease_ttl
        elif change is LeaseChange.CLEAR:
            exp = None
        else:
            exp = None if row[6] is None else decode_time(row[6])
        due, since = row[15], row[16]
        # positional: the hot path of every fire by id
        return Snapshot(
            row[0], row[1], row[2], row[3], row[4], row[5], exp, now, decode_time(row[8]), now, False, row[11],
            row[12], row[13], data, None if due is None else decode_time(due),
            None if since is None else decode_time(since), row[17], row[18], row[19],
            None if row[20] is None else memory_of(row[20]),
        )  # fmt: skip
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=str(err)) from None


__all__ = ["ByIdOps"]
