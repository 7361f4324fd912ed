"""Retention on the SQL store: :meth:`prune` and :meth:`trim_history` (see :mod:`stores.retention`).

``prune`` picks a batch of finished entities (kind, one of the given states, last updated
before the cut-off) oldest first, walking the ``(kind, state, updated_at)`` index the
reaper's idle rule already uses, and removes their effects (the renewal log is one of
them), history and rows in one transaction: ``BEGIN IMMEDIATE`` on SQLite, and on
PostgreSQL the batch's rows locked first (``FOR UPDATE SKIP LOCKED``, so two pruners divide
the rows).  The entity delete repeats the conditions, so a row can only go if it still
matches them in the deleting transaction.

A store bound to the application's own table refuses: those rows are the application's
to delete (with ``ON DELETE CASCADE`` the library's history and effects follow them).

The store checks the shape of ``states`` (:func:`stores.retention.check_prune`: a collection
of 1 to 100 non-empty names, not a string), not their meaning: it knows no lifecycle, so it
cannot tell a final state from another.  That is the caller's part; :meth:`fsm.Engine.prune`
always passes its lifecycle's final states and takes none from its own caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fsm.errors import ConfigError, UnknownEntity
from stores.retention import check_prune, check_trim
from stores.sql.connections import unavailable
from stores.sql.core import SqlCore, SqliteWrite


class RetentionOps(SqlCore):
    """The SQL store's retention (a mixin over :class:`stores.sql.core.SqlCore`)."""

    def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]:
        kind, finals, before, limit, dry_run = check_prune(kind, states, before, limit, dry_run)
        sql, f = self._sql, self._f
        if sql.L.binding is not None:
            raise ConfigError(
                f"prune removes rows of the library's own table; table {sql.L.binding.table!r} is the "
                "application's: delete its rows yourself (history and effects follow them on cascade)"
            )
        c = sql.L.col
        where = (
            f"e.{c['kind']} = {f.p('kind')} AND {f.in_ids('e.' + c['state'], 'states')} "
            f"AND e.{c['updated_at']} < {f.p('before')} "
            # a held row is live work, whatever states the caller named (a final state's
            # lease is always cleared): a wrong ``states`` never deletes a running job
            f"AND e.{c['lease_owner']} IS NULL"
        )
        pick = (
            f"SELECT e.{c['id']} FROM {sql.E} AS e WHERE {where} "
            f"ORDER BY e.{c['updated_at']}, e.{c['id']} LIMIT {f.p('limit')}"
        )
        params: dict[str, Any] = {"kind": kind, "states": f.ids(finals), "before": f.time(before), "limit": limit}
        if dry_run:
            return [row[0] for row in self._run(pick, params)]
        gone = f"{f.in_ids('entity_id', 'ids')}"
        remove = (
            f"DELETE FROM {sql.E} WHERE {c['id']} IN (SELECT e.{c['id']} FROM {sql.E} AS e "
            f"WHERE {where} AND {f.in_ids('e.' + c['id'], 'ids')})"
        )
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_prune") as cur:
                    return self._remove(cur, pick, params, gone, remove)
            with slot.conn.transaction():
                return self._remove(slot.cursor, pick + " FOR UPDATE SKIP LOCKED", params, gone, remove)
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _remove(self, cur: Any, pick: str, params: dict[str, Any], gone: str, remove: str) -> list[str]:
        sql, f = self._sql, self._f
        cur.execute(pick, params)
        ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return []
        params = {**params, "ids": f.ids(ids)}
        cur.execute(f"DELETE FROM {sql.L.effects} WHERE {gone}", params)
        cur.execute(f"DELETE FROM {sql.H} WHERE {gone}", params)
        cur.execute(remove, params)
        return ids

    def trim_history(self, entity_id: str, keep: int) -> int:
        entity_id, keep = check_trim(entity_id, keep)
        sql, f, c = self._sql, self._f, self._sql.L.col
        params = {"id": entity_id, "keep": keep}
        cut = (
            f"DELETE FROM {sql.H} WHERE entity_id = {f.p('id')} AND seq <= "
            f"(SELECT e.{c['version']} FROM {sql.E} AS e WHERE e.{c['id']} = {f.p('id')}) - {f.p('keep')}"
        )
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_trim") as cur:
                    cur.execute(sql.exists, params)
                    if not cur.fetchall():
                        raise UnknownEntity(entity_id)
                    cur.execute(cut, params)
                    return int(cur.rowcount)
            with slot.conn.transaction():
                cur = slot.cursor
                cur.execute(sql.exists, params)
                if not cur.fetchall():
                    raise UnknownEntity(entity_id)
                cur.execute(cut, params)
                return int(cur.rowcount)
        except self._errors as err:
            raise unavailable(err, self._conns, entity_id) from err


__all__ = ["RetentionOps"]
