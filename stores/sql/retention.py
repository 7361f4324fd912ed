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

A partitioned history (PostgreSQL, :mod:`stores.sql.partitions`): :meth:`prune_partitions`
drops the partitions whose entities all go, before ``prune``'s batches (the engine calls
it first); the batches then remove what is left in the partitions that stay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from fsm.errors import ConfigError, UnknownEntity
from stores.retention import check_prune, check_trim
from stores.sql.connections import unavailable
from stores.sql.core import SqlCore, SqliteWrite
from stores.sql.joined import JOINED


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
        params: dict[str, Any] = {"kind": kind, "states": f.ids(finals), "before": f.time(before), "limit": limit}
        params.update({f"st{i}": state for i, state in enumerate(finals)})
        if dry_run:
            return [row[0] for row in self._run(self._prune_pick(len(finals), False), params)]
        gone = f"{f.in_ids('entity_id', 'ids')}"
        remove = (
            f"DELETE FROM {sql.E} WHERE {c['id']} IN (SELECT e.{c['id']} FROM {sql.E} AS e "
            f"WHERE {where} AND {f.in_ids('e.' + c['id'], 'ids')})"
        )
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_prune") as cur:
                    return self._remove(cur, self._prune_pick(len(finals), False), params, gone, remove)
            with slot.conn.transaction():
                return self._remove(slot.cursor, self._prune_pick(len(finals), True), params, gone, remove)
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _prune_pick(self, states: int, lock: bool) -> str:
        """A batch's pick: per final state, the rows last updated longest ago, each an
        ordered walk of the ``recent`` index ``(kind, state, updated_at, id)`` that stops at
        ``limit`` rows; then the oldest ``limit`` of those.  (One ``state IN (..)`` filter
        cannot read that index in order across states: it read every finished row and
        sorted them, at every batch.)  ``lock`` (PostgreSQL): each walk locks its rows
        ``FOR UPDATE SKIP LOCKED``, so two pruners divide the rows."""
        sql, f = self._sql, self._f
        c = sql.L.col
        locking = " FOR UPDATE OF e SKIP LOCKED" if lock else ""
        walks = [
            f"SELECT * FROM (SELECT e.{c['id']} AS id, e.{c['updated_at']} AS u FROM {sql.E} AS e "
            f"WHERE e.{c['kind']} = {f.p('kind')} AND e.{c['state']} = {f.p(f'st{i}')} "
            f"AND e.{c['updated_at']} < {f.p('before')} AND e.{c['lease_owner']} IS NULL "
            f"ORDER BY e.{c['updated_at']}, e.{c['id']} LIMIT {f.p('limit')}{locking}) AS w{i}"
            for i in range(states)
        ]
        return f"SELECT id FROM ({' UNION ALL '.join(walks)}) AS p ORDER BY u, id LIMIT {f.p('limit')}"

    def prune_partitions(self, rules: Mapping[str, Sequence[str]], before: datetime) -> list[tuple[str, str]]:
        """PostgreSQL with a partitioned history (:mod:`stores.sql.partitions`): drop each
        partition entirely older than ``before`` whose entities all go under ``rules``
        (kind -> final states, as :meth:`prune` takes them), with those entities and their
        effects; returns their ``(kind, id)``.  Elsewhere (SQLite, a plain history, a bound
        store) it removes nothing and returns ``[]``: :meth:`prune`'s batches do the work."""
        for kind, states in rules.items():
            check_prune(kind, states, before, 1, False)
        if self._sqlite or self._sql.L.binding is not None or not rules:
            return []
        joined = JOINED.get()
        if joined is not None and id(self._conns) in joined:
            # the caller's transaction (``within``): a DROP there would hold the history's
            # exclusive lock until the caller commits; the batches run in it instead
            return []
        from stores.sql.partitions import drop_partitions, is_partitioned

        engine = self.engine  # type: ignore[attr-defined]
        prefix, schema = self.table_prefix, getattr(self, "schema", None)  # type: ignore[attr-defined]
        try:
            with engine.connect() as conn:
                if not is_partitioned(conn, prefix, schema):
                    return []
            return drop_partitions(engine, prefix, schema, rules, before)
        except sa.exc.DBAPIError as err:
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
