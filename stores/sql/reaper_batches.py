"""The reaper's set-based reads and writes of the SQL store (DESIGN sections 5 and 6).

``candidates`` is a keyset-paged query answered from the reaper indexes;
``apply_batch`` moves every still-qualifying row in one transaction.  On PostgreSQL that
is one statement: a CTE claims the rows with ``FOR UPDATE SKIP LOCKED`` (a row another
reaper is moving is skipped, not waited for), the ``UPDATE`` re-checks every condition
against ``statement_timestamp()``, and the history rows are inserted from its
``RETURNING``.  On SQLite (one writer at a time under ``BEGIN IMMEDIATE``) the
``UPDATE ... RETURNING`` is followed by one ``INSERT ... SELECT`` of the history rows.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from fsm.errors import FsmError, MalformedRow
from fsm.limits import check_batch_write, check_int, check_page
from fsm.records import BatchWrite, Condition, DataChange, HistoryRecord, LeaseChange, Snapshot, apply_changes
from stores.sql.connections import is_undecodable, unavailable
from stores.sql.core import SqlCore
from stores.sql.dialect import condition_shape
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.schema import AFTER_ENTITY, decode_time

log = logging.getLogger("stores.sql")

CUSTOM_PLANS = False
"""psycopg's ``prepare`` for the reaper's claims and candidate reads: never prepared, so
PostgreSQL plans each with its parameters (the page size, the staleness bounds).  A generic
plan of a prepared one guesses them, and its guesses (a bitmap scan that collects every
stale row before the page's ``LIMIT``, a parallel scan for a page of 500) cost more than the
planning saves (a fraction of a millisecond per page)."""

MAX_SQL_CHANGES = 2
"""PostgreSQL applies up to this many declared data changes inside the claim statement
(each repeats the data expression it changes, so the text grows threefold per change);
more than that are applied in Python, in the claim's transaction."""


def _custom_plans(slot: Any) -> dict[str, Any]:
    """``execute`` options for :data:`CUSTOM_PLANS` on a psycopg connection (no others)."""
    return {"prepare": CUSTOM_PLANS} if hasattr(slot.conn, "prepare_threshold") else {}


def _text_when(change: DataChange) -> bool:
    """Whether ``change`` only matches strings: there JSON and Python equality agree (a
    Python ``1 == True`` has no JSON counterpart), so SQL can judge it exactly."""
    return all(w.__class__ is str for w in change.when)


def _plain_path(change: DataChange) -> bool:
    """Whether ``change``'s key and field can be written as SQLite JSON path labels.
    SQLite (before 3.45) matches a quoted label against the key's stored text, escapes and
    all: only printable ASCII without a quote or a backslash is spelled the same both ways
    (json.dumps never escapes it); any other name leaves every row to Python."""
    return all(" " <= ch <= "~" and ch not in '"\\' for ch in change.key + change.field)


def _check_brief(row: Any, keeps_lease: bool) -> None:
    """A brief SQLite row's kept times parse as a full decode would parse them, or
    ``MalformedRow``: (id, version, token, kind, created_at, key, data[, owner, expiry])."""
    try:
        decode_time(row[4])
        if keeps_lease and row[8] is not None:
            decode_time(row[8])
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=str(err)) from None


class ReaperOps(SqlCore):
    """``candidates`` and ``apply_batch`` of :class:`stores.sql.SqlStore`."""

    def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        """See :meth:`stores.Store.candidates`.  A row that cannot be decoded raises
        ``MalformedRow`` naming it (the reaper counts it, logs it and steps over it)."""
        check_page(kind, state, limit, after_id)
        sql = self._sql.candidates(condition_shape(require), require, after_id is not None)
        now = self._now()
        params: dict[str, Any] = {"kind": kind, "state": state, "limit": limit, "after": after_id}
        self._time_params(params, now, None)
        self._sql.condition_params(params, require, now)
        found = [snapshot_of(row) for row in self._run(sql, params, prepare=CUSTOM_PLANS)]
        return self._attach(found)

    def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        """See :meth:`stores.Store.apply_batch`.  Rows whose data is not a readable JSON
        object never qualify; a row that still fails to decode is logged and left alone."""
        check_batch_write(batch)
        if not batch.ids:
            return []
        sql = self._sql.batch(
            batch.lease_change,
            batch.lease_ttl is not None,
            condition_shape(batch.require),
            batch.require,
            (batch.bump_attempt, batch.bump_reclaims),
            batch.timer,
        )
        ids = list(dict.fromkeys(batch.ids))
        params: dict[str, Any] = {
            "kind": batch.kind,
            "source": batch.source,
            "target": batch.target,
            "event": batch.event,
            "actor": batch.actor,
            "reason": batch.reason,
            "new_owner": batch.new_owner,
        }
        if self._status is not None:
            params["status"] = self._status(batch.target)
        while ids:
            now = self._now()
            params["ids"] = self._f.ids(ids)
            self._time_params(params, now, batch.lease_ttl)
            self._sql.condition_params(params, batch.require, now)
            try:
                moved = (
                    self._batch_sqlite(sql, params, now, batch.changes)
                    if self._sqlite
                    else self._batch_pg(sql, params, batch.changes)
                )
            except MalformedRow as err:  # SQLite only: rolled back; move the others without it
                log.error("skipping malformed %s %r: %s", batch.kind, err.entity_id, err.reason)
                ids.remove(err.entity_id)
                continue
            order = {entity_id: i for i, entity_id in enumerate(batch.ids)}
            snaps = self._attach(sorted((s for s, _ in moved), key=lambda s: order[s.id]))
            at = {s.id: when for s, when in moved}
            return [
                (s, HistoryRecord(s.id, s.version, batch.event, batch.source, batch.target, batch.actor,
                                  s.lease_token, batch.reason, None, at[s.id], None))
                for s in snaps
            ]  # fmt: skip
        return []

    def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]:
        """See :meth:`stores.Store.move_candidates`: one statement on PostgreSQL (claimed
        with ``FOR UPDATE SKIP LOCKED``, declared data changes applied by the statement
        when it can), one ``BEGIN IMMEDIATE`` transaction on SQLite."""
        sql, params, now, rest = self._claim_statement(batch, limit, brief=False)
        moved = self._batch_sqlite(sql, params, now, rest) if self._sqlite else self._batch_pg(sql, params, rest)
        snaps = self._attach([s for s, _ in moved])
        return [
            (s, HistoryRecord(s.id, s.version, batch.event, batch.source, batch.target, batch.actor,
                              s.lease_token, batch.reason, None, when, None))
            for s, (_, when) in zip(snaps, moved, strict=True)
        ]  # fmt: skip

    def move_candidates_brief(self, batch: BatchWrite, *, limit: int) -> list[HistoryRecord]:
        """See :meth:`stores.base.BriefMoves.move_candidates_brief`: the claim of
        :meth:`move_candidates`, returning the history rows only (no row is decoded into a
        snapshot; a row's data only when a declared change must be applied in Python)."""
        sql, params, now, rest = self._claim_statement(batch, limit, brief=True)
        if self._sqlite:
            assert now is not None
            rows = self._brief_sqlite(sql, params, batch, rest)
            at = now
        else:
            rows = self._brief_pg(sql, params, rest)
            if not rows:
                return []
            at = decode_time(rows[0][3])  # the statement's now: one instant for every row
        event, source, target, actor, reason = batch.event, batch.source, batch.target, batch.actor, batch.reason
        return [HistoryRecord(r[0], r[1], event, source, target, actor, r[2], reason, None, at, None) for r in rows]

    def _claim_statement(
        self, batch: BatchWrite, limit: int, *, brief: bool
    ) -> tuple[tuple[str, ...], dict[str, Any], datetime | None, tuple[DataChange, ...]]:
        """The claim's SQL and parameters, its ``now``, and the declared changes the caller
        applies itself (the rest the statement applies: PostgreSQL, string ``when`` values)."""
        check_batch_write(batch)
        check_int("limit", limit, low=1, high=1_000_000)
        children = {io.child.key for io in self._children}
        own = tuple(c for c in batch.changes if c.key not in children)
        in_sql = not self._sqlite and 0 < len(own) <= MAX_SQL_CHANGES and all(_text_when(c) for c in own)
        hits: int | None = None  # brief: which rows' data to return for the changes applied here
        if brief and own and not in_sql:
            hits = len(own) if self._sqlite and all(_text_when(c) and _plain_path(c) for c in own) else 0
        sql = self._sql.claim(
            batch.lease_change,
            batch.lease_ttl is not None,
            condition_shape(batch.require),
            batch.require,
            (batch.bump_attempt, batch.bump_reclaims),
            brief=brief,
            set_data=len(own) if in_sql else 0,
            hits=hits,
            timer=batch.timer,
        )
        params: dict[str, Any] = {
            "kind": batch.kind,
            "state": batch.source,
            "target": batch.target,
            "event": batch.event,
            "actor": batch.actor,
            "reason": batch.reason,
            "new_owner": batch.new_owner,
            "limit": limit,
        }
        if self._status is not None:
            params["status"] = self._status(batch.target)
        if in_sql:
            for i, change in enumerate(own):
                params[f"dk{i}"], params[f"df{i}"] = change.key, change.field
                params[f"dv{i}"] = dumps_data(change.value, "(claimed page)")
                params[f"dp{i}"] = [dumps_data([{change.field: w}], "(claimed page)") for w in change.when]
                params[f"do{i}"] = [dumps_data({change.field: w}, "(claimed page)") for w in change.when]
        elif hits:
            for i, change in enumerate(own):
                params[f"dk{i}"], params[f"df{i}"] = f'$."{change.key}"', f'$."{change.field}"'
                params[f"dw{i}"] = json.dumps(list(change.when))
        now = self._now()
        self._time_params(params, now, batch.lease_ttl)
        self._sql.condition_params(params, batch.require, now)
        rest = tuple(c for c in batch.changes if c.key in children) if in_sql else batch.changes
        return sql, params, now, rest

    def _brief_pg(self, sql: tuple[str, ...], params: dict[str, Any], changes: tuple[DataChange, ...]) -> list[Any]:
        """A brief claim on PostgreSQL: one autocommit statement, or, with changes left to
        apply here (child rows), the statement and the changes in one transaction."""
        slot = self._conns.slot()
        prepare = _custom_plans(slot)
        try:
            if not changes:
                slot.cursor.execute(sql[0], params, **prepare)
                return slot.cursor.fetchall()  # type: ignore[no-any-return]
            with slot.conn.transaction():
                slot.cursor.execute(sql[0], params, **prepare)
                rows: list[Any] = slot.cursor.fetchall()
                if rows:
                    # changes on the row's own data that the statement could not apply: it
                    # returned every row's data (decoded by the driver) after the times
                    own = any(c.key not in {io.child.key for io in self._children} for c in changes)
                    hit = [(r[0], r[4]) for r in rows] if own else []
                    self._change_rows(slot.cursor, [r[0] for r in rows], hit, changes)
                return rows
        except self._integrity:
            raise  # as SqlCore._run: the caller says what they mean
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _brief_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], batch: BatchWrite, changes: tuple[DataChange, ...]
    ) -> list[Any]:
        """A brief claim on SQLite, in one ``BEGIN IMMEDIATE`` transaction: the update, the
        history rows, the declared changes.  Every row is checked as a full claim would
        decode it (its kept text columns read as UTF-8, its kept times parsed), so a row
        the store cannot read still fails the claim and is left to the keyset path."""
        slot = self._conns.slot()
        cur = slot.cursor
        keeps_lease = batch.lease_change is LeaseChange.KEEP
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(sql[0], params)
                rows: list[Any] = cur.fetchall()
                for row in rows:
                    _check_brief(row, keeps_lease)
                if rows:
                    cur.execute(sql[1], {**params, "moved": self._f.ids([r[0] for r in rows])})
                    if changes:
                        # the hit flag is the last column when the batch changes its own data
                        own = any(c.key not in {io.child.key for io in self._children} for c in changes)
                        hit = [(r[0], r[6]) for r in rows if r[-1]] if own else []
                        self._change_rows(cur, [r[0] for r in rows], hit, changes)
                cur.execute("COMMIT")
            except BaseException:
                slot.conn.rollback()
                raise
        except self._integrity:
            raise
        except self._errors as err:
            if is_undecodable(err):  # rolled back: the reaper reads the candidates row by row
                raise MalformedRow("(claimed page)", reason="a row's text is not UTF-8") from err
            raise unavailable(err, self._conns) from err
        return rows

    def _change_rows(
        self, cur: Any, ids: list[str], hit: list[tuple[str, Any]], changes: tuple[DataChange, ...]
    ) -> None:
        """Declared changes on moved rows known by id (a brief claim): child rows by one
        ``UPDATE`` per change; the data of the ``hit`` rows (id, data) in Python."""
        children = {io.child.key: io for io in self._children}
        for change in changes:
            io = children.get(change.key)
            if io is not None and change.field in io.child.fields:
                io.set_where(cur, ids, change.field, change.when, change.value)
        own = tuple(c for c in changes if c.key not in children)
        if not own or not hit:
            return
        col, f = self._sql.L.col, self._f
        update = f"UPDATE {self._sql.E} SET {col['data']} = {f.json('data')} WHERE {col['id']} = {f.p('id')}"
        for entity_id, text in hit:
            try:
                data: Any = json.loads(text) if text.__class__ is str else text  # SQLite text; jsonb is decoded
            except ValueError as err:
                raise MalformedRow(entity_id, reason=f"data is not JSON: {err}") from None
            if data.__class__ is not dict:
                raise MalformedRow(entity_id, reason="data is not a JSON object")
            new = apply_changes(own, data)
            if new is not None:
                cur.execute(update, {"id": entity_id, "data": dumps_data(new, entity_id)})

    def _batch_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None, changes: tuple[DataChange, ...]
    ) -> list[Any]:
        slot = self._conns.slot()
        cur = slot.cursor
        assert now is not None
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(sql[0], params)
                moved = [(snapshot_of(r), now) for r in cur.fetchall()]
                if moved:
                    cur.execute(sql[1], {**params, "moved": self._f.ids([s.id for s, _ in moved])})
                    if changes:
                        moved = self._apply_changes(cur, moved, changes)
                cur.execute("COMMIT")
            except BaseException:
                slot.conn.rollback()
                raise
        except self._integrity:
            raise
        except self._errors as err:
            if is_undecodable(err):  # rolled back: name the bad row, apply_batch moves the others
                if "ids" not in params:  # a claimed page (move_candidates): the reaper reads it row by row
                    raise MalformedRow("(claimed page)", reason="a row's text is not UTF-8") from err
                raise self._undecodable_among(params) or unavailable(err, self._conns) from err
            raise unavailable(err, self._conns) from err
        return moved

    def _undecodable_among(self, params: dict[str, Any]) -> MalformedRow | None:
        """The first row of the batch whose stored text is not UTF-8, as ``MalformedRow``."""
        for entity_id in json.loads(params["ids"]) if isinstance(params["ids"], str) else params["ids"]:
            try:
                self.get(entity_id, include_deleted=True)  # type: ignore[attr-defined]
            except MalformedRow as err:
                return err
            except FsmError:
                continue
        return None

    def _batch_pg(self, sql: tuple[str, ...], params: dict[str, Any], changes: tuple[DataChange, ...]) -> list[Any]:
        if changes:  # the statement and the declared data changes in one transaction
            slot = self._conns.slot()
            try:
                with slot.conn.transaction():
                    slot.cursor.execute(sql[0], params, **_custom_plans(slot))
                    moved = self._decode_pg(slot.cursor.fetchall())
                    return self._apply_changes(slot.cursor, moved, changes) if moved else moved
            except self._errors as err:
                raise unavailable(err, self._conns) from err
        return self._decode_pg(self._run(sql[0], params, prepare=CUSTOM_PLANS))

    @staticmethod
    def _decode_pg(rows: list[Any]) -> list[Any]:
        moved = []
        for row in rows:
            try:
                moved.append((snapshot_of(row), decode_time(row[AFTER_ENTITY])))
            except MalformedRow as err:  # committed already; cannot happen for jsonb objects
                log.error("moved a malformed row %r: %s", err.entity_id, err.reason)
        return moved

    def _apply_changes(
        self, cur: Any, moved: list[tuple[Snapshot, datetime]], changes: tuple[DataChange, ...]
    ) -> list[tuple[Snapshot, datetime]]:
        """The batch's declared data changes on the moved rows, inside the batch's transaction:
        on a bound table's child rows with one ``UPDATE`` per change, else on each moved
        row's JSON data that the change alters (the rest are not written)."""
        children = {io.child.key: io for io in self._children}
        ids = [s.id for s, _ in moved]
        own = tuple(c for c in changes if c.key not in children)
        for change in changes:
            io = children.get(change.key)
            if io is not None and change.field in io.child.fields:
                io.set_where(cur, ids, change.field, change.when, change.value)
        if not own:
            return moved
        col, f = self._sql.L.col, self._f
        update = f"UPDATE {self._sql.E} SET {col['data']} = {f.json('data')} WHERE {col['id']} = {f.p('id')}"
        out = []
        for snap, at in moved:
            data = apply_changes(own, snap.data)
            if data is not None:
                cur.execute(update, {"id": snap.id, "data": dumps_data(data, snap.id)})
            out.append((snap if data is None else snap._replace(data=data), at))
        return out


__all__ = ["ReaperOps"]
