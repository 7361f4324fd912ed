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
from fsm.records import BatchWrite, Condition, DataChange, HistoryRecord, Snapshot, apply_changes
from stores.sql.connections import is_undecodable, unavailable
from stores.sql.core import SqlCore
from stores.sql.dialect import condition_shape
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.schema import decode_time

log = logging.getLogger("stores.sql")


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
        found = [snapshot_of(row) for row in self._run(sql, params)]
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
        with ``FOR UPDATE SKIP LOCKED``), one ``BEGIN IMMEDIATE`` transaction on SQLite."""
        check_batch_write(batch)
        check_int("limit", limit, low=1, high=1_000_000)
        sql = self._sql.claim(
            batch.lease_change,
            batch.lease_ttl is not None,
            condition_shape(batch.require),
            batch.require,
            (batch.bump_attempt, batch.bump_reclaims),
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
        now = self._now()
        self._time_params(params, now, batch.lease_ttl)
        self._sql.condition_params(params, batch.require, now)
        moved = (
            self._batch_sqlite(sql, params, now, batch.changes)
            if self._sqlite
            else self._batch_pg(sql, params, batch.changes)
        )
        snaps = self._attach([s for s, _ in moved])
        return [
            (s, HistoryRecord(s.id, s.version, batch.event, batch.source, batch.target, batch.actor,
                              s.lease_token, batch.reason, None, when, None))
            for s, (_, when) in zip(snaps, moved, strict=True)
        ]  # fmt: skip

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
                    slot.cursor.execute(sql[0], params)
                    moved = self._decode_pg(slot.cursor.fetchall())
                    return self._apply_changes(slot.cursor, moved, changes) if moved else moved
            except self._errors as err:
                raise unavailable(err, self._conns) from err
        return self._decode_pg(self._run(sql[0], params))

    @staticmethod
    def _decode_pg(rows: list[Any]) -> list[Any]:
        moved = []
        for row in rows:
            try:
                moved.append((snapshot_of(row), decode_time(row[15])))
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
