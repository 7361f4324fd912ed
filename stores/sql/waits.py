"""Durable waits on SQL: ``park``, ``send_message`` and ``wake`` (:class:`stores.base.Waits`).

- ``park`` gives the holder's lease back and sets the entity's due time, in one guarded
  ``UPDATE`` (owner and token in its ``WHERE``): the entity keeps its state and waits, with
  no owner, until a claim resumes it when due.
- ``send_message`` inserts the message's ledger row (``fsm:msg:{name}:{key}``; ``ON
  CONFLICT DO NOTHING``: one per key) and commits it, *then* wakes the entity in a second
  statement.  A handler about to wait does the mirror image: it parks (committed), then
  reads the messages.  Whatever the interleaving, one of the two sees the other: either the
  handler finds the message, or the wake finds the entity parked.  The wake is ``run_after
  = now`` on a parked row (no owner, due later), plus the lifecycle's ``NOTIFY``; a park
  sends it too, so that idle workers wait for the new due time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from fsm.errors import LeaseLost, UnknownEntity
from fsm.limits import check_id, check_message_args, check_park_args
from fsm.records import EFFECT_MESSAGE, PARKED_KEY, EffectRecord, Snapshot
from stores.ledger import json_result, message_key, message_result
from stores.sql.core import SqlCore
from stores.sql.effects import EFFECT_COLUMNS, effect_of
from stores.sql.rows import dumps_data, snapshot_of


class WaitOps(SqlCore):
    """``park``, ``send_message`` and ``wake`` of :class:`stores.sql.SqlStore`."""

    _released_notice: Callable[[str], None]  # the lease mixin's: wake the lifecycle's workers

    def _wait_sql(self) -> dict[str, str]:
        found: dict[str, str] | None = getattr(self, "_wait_statements", None)
        if found is not None:
            return found
        sql, f, lay = self._sql, self._f, self._sql.L
        c = lay.col
        owned = f"e.{c['lease_owner']} = {f.p('owner')} AND e.{c['lease_token']} = {f.p('token')}"
        # parked: no owner, due later, and the park's mark carries the entity's token (a
        # create due later, or a retry's backoff, is not a park: a message leaves it alone)
        parked = (
            f"e.{c['lease_owner']} IS NULL AND {lay.ref('run_after', 'e')} > {f.now} AND EXISTS (SELECT 1 FROM "
            f"{lay.effects} AS m WHERE m.entity_id = e.{c['id']} AND m.key = '{PARKED_KEY}' "
            f"AND m.lease_token = e.{c['lease_token']})"
        )
        found = {
            "park": (
                f"UPDATE {sql.E} AS e SET {c['lease_owner']} = NULL, {c['lease_expires_at']} = NULL, "
                f"{c['run_after']} = {f.p('until')} WHERE {sql.readable} AND {owned} RETURNING {sql.ret}"
            ),
            "message": (
                f"INSERT INTO {lay.effects} ({EFFECT_COLUMNS}) "
                f"SELECT e.{c['id']}, {f.p('key')}, '{EFFECT_MESSAGE}', e.{c['lease_token']}, 1, "
                f"{f.json('result')}, {f.now} FROM {sql.E} AS e WHERE {sql.live} "
                f"ON CONFLICT (entity_id, key) DO NOTHING RETURNING {EFFECT_COLUMNS}"
            ),
            "wake": (
                f"UPDATE {sql.E} AS e SET {c['run_after']} = {f.now} WHERE {sql.live} AND {parked} "
                # RETURNING: SQLite takes only unqualified names there
                f"RETURNING {lay.ref('kind', '' if self._sqlite else 'e')}"
            ),
        }
        self._wait_statements = found
        return found

    def _now_params(self, params: dict[str, Any]) -> None:
        now = self._now()
        if now is not None:
            params["now"] = self._f.time(now)

    def park(self, entity_id: str, *, owner: str, token: int, until: datetime) -> Snapshot:
        """See :meth:`stores.base.Waits.park`."""
        when = check_park_args(entity_id, owner, token, until)
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "token": token, "until": self._f.time(when)}
        self._now_params(params)
        rows = self._run(self._wait_sql()["park"], params)
        if rows:
            parked = self._attach([snapshot_of(rows[0])])[0]
            self._released_notice(parked.kind)  # idle workers learn the new due time
            return parked
        row, _ = self._current(entity_id)
        if row is None or row.deleted:
            raise UnknownEntity(entity_id)
        raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)

    def send_message(self, entity_id: str, name: str, key: str, payload: Any) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.base.Waits.send_message`."""
        check_message_args(entity_id, name, key)
        stored = json_result(payload, "a message payload")
        ledger_key = message_key(name, key)
        params: dict[str, Any] = {
            "id": entity_id,
            "key": ledger_key,
            "result": dumps_data(message_result(name, key, stored), entity_id),
        }
        self._now_params(params)
        rows = self._run(self._wait_sql()["message"], params)  # committed before the wake below
        if not rows:
            existing = self.effect(entity_id, ledger_key)  # type: ignore[attr-defined]
            if existing is None:
                raise UnknownEntity(entity_id)
            return existing, False
        self.wake(entity_id)
        return effect_of(rows[0], self._sqlite), True

    def wake(self, entity_id: str) -> bool:
        """See :meth:`stores.base.Waits.wake`."""
        params: dict[str, Any] = {"id": check_id("entity id", entity_id)}
        self._now_params(params)
        rows = self._run(self._wait_sql()["wake"], params)
        if not rows:
            return False
        self._released_notice(rows[0][0])
        return True


__all__ = ["WaitOps"]
