"""The effects ledger on SQL: one guarded upsert records a result under the caller's lease.

The lease check sits inside the recording statement (``INSERT .. SELECT .. FROM entities
WHERE lease_owner = :owner AND lease_token = :token``; PostgreSQL also takes a share
lock on the entity row, so a takeover waits for the recording to commit or the
recording sees the takeover), so a holder fenced between running the effect and
recording it records nothing.  ``ON CONFLICT .. DO UPDATE .. WHERE status IN (..)`` lets
only a replaceable record (a failure to retry, a progress row) be overwritten: the first
result wins (I4).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fsm.errors import FsmError, LeaseLost, MalformedRow, UnknownEntity
from fsm.limits import check_effect_args, check_id
from fsm.records import RENEWALS_KEY, EffectRecord
from stores.ledger import (
    EffectWrite,
    HolderAndEffect,
    LedgerRun,
    check_effect_key,
    check_ledger_batch,
    effect_write,
    json_result,
    ledger_pair,
    record_one,
)
from stores.sql.core import ATTEMPTS, SqlCore
from stores.sql.rows import dumps_data
from stores.sql.schema import decode_time

EFFECT_COLUMNS = "entity_id, key, status, lease_token, attempts, result, recorded_at"


def effect_of(row: Any, text_json: bool) -> EffectRecord:
    """A ledger row as an :class:`EffectRecord`, or ``MalformedRow``.  ``text_json``: the
    result column holds JSON text (SQLite); PostgreSQL's jsonb arrives decoded."""
    try:
        result = row[5]
        if text_json and result is not None:
            result = json.loads(result)
        return EffectRecord(
            row[0], row[1], row[2], row[3], row[4], result, None if row[6] is None else decode_time(row[6])
        )
    except (ValueError, TypeError) as err:
        raise MalformedRow(str(row[0]), reason=f"effect {row[1]!r}: {err}") from None


class EffectOps(SqlCore, LedgerRun):
    """``effect``, ``effects`` and ``record_effect`` of :class:`stores.sql.SqlStore`."""

    def _effect_sql(self) -> dict[str, str]:
        found: dict[str, str] | None = getattr(self, "_effect_statements", None)
        if found is not None:
            return found
        lay, f = self._sql.L, self._f
        ef, ent = lay.effects, lay.entities
        c = lay.col
        lock = " FOR SHARE" if f.name == "postgresql" else ""
        insert = (
            f"INSERT INTO {ef} ({EFFECT_COLUMNS}) "
            f"SELECT e.{c['id']}, {f.p('key')}, {f.p('status')}, {f.p('token')}, 1, {f.json('result')}, {f.now} "
            f"FROM {ent} AS e WHERE e.{c['id']} = {f.p('id')} AND NOT e.{c['deleted']} "
            f"AND e.{c['lease_owner']} = {f.p('owner')} AND e.{c['lease_token']} = {f.p('token')}{lock} "
            f"ON CONFLICT (entity_id, key) "
        )
        replace = (
            "DO UPDATE SET status = excluded.status, lease_token = excluded.lease_token, "
            f"attempts = {ef}.attempts + 1, result = excluded.result, recorded_at = excluded.recorded_at "
            f"WHERE {f.in_ids(ef + '.status', 'replace')} "
        )
        returning = f"RETURNING {EFFECT_COLUMNS}"
        found = {
            "one": f"SELECT {EFFECT_COLUMNS} FROM {ef} WHERE entity_id = {f.p('id')} AND key = {f.p('key')}",
            "all": (
                f"SELECT {EFFECT_COLUMNS} FROM {ef} WHERE entity_id = {f.p('id')} AND key <> '{RENEWALS_KEY}' "
                "ORDER BY key"
            ),
            "record": insert + "DO NOTHING " + returning,
            "record_or_replace": insert + replace + returning,
            # a batch of new records (PostgreSQL): each row under its own lease, as "record".
            # One JSON document (a row per array: id, key, owner, token, status, result text),
            # one text parameter: psycopg dumps a Python list per array element by element
            "record_many": (
                f"INSERT INTO {ef} ({EFFECT_COLUMNS}) "
                f"SELECT e.{c['id']}, v.key, v.status, v.token, 1, CAST(v.result AS jsonb), {f.now} "
                "FROM (SELECT j->>0 AS id, j->>1 AS key, j->>2 AS owner, CAST(j->>3 AS bigint) AS token, "
                "j->>4 AS status, j->>5 AS result FROM jsonb_array_elements(CAST(%(rows)s AS jsonb)) AS j) AS v "
                f"JOIN {ent} AS e ON e.{c['id']} = v.id AND NOT e.{c['deleted']} "
                f"AND e.{c['lease_owner']} = v.owner AND e.{c['lease_token']} = v.token "
                f"ORDER BY e.{c['id']}{lock and ' FOR SHARE OF e'} "
                f"ON CONFLICT (entity_id, key) DO NOTHING {returning}"
            ),
            # the holders and the recorded effects of many (entity, key) pairs in one read
            "probe_many": (
                f"SELECT v.n, {lay.ref('lease_owner', 'e')}, {lay.ref('lease_token', 'e')}, e.{c['id']} IS NOT NULL, "
                + ", ".join(f"f.{name.strip()}" for name in EFFECT_COLUMNS.split(","))
                + " FROM (SELECT CAST(j->>0 AS int) AS n, j->>1 AS id, j->>2 AS key "
                "FROM jsonb_array_elements(CAST(%(rows)s AS jsonb)) AS j) AS v "
                f"LEFT JOIN {ent} AS e ON e.{c['id']} = v.id AND NOT {lay.ref('deleted', 'e')} "
                "LEFT JOIN " + ef + " AS f ON f.entity_id = v.id AND f.key = v.key"
            ),
            # the holder and the recorded effect in one read (``run`` asks before each effect)
            "probe": (
                f"SELECT {lay.ref('lease_owner', 'e')}, {lay.ref('lease_token', 'e')}, "
                + ", ".join(f"f.{name.strip()}" for name in EFFECT_COLUMNS.split(","))
                + f" FROM {ent} AS e LEFT JOIN {ef} AS f ON f.entity_id = e.{c['id']} AND f.key = {f.p('key')} "
                f"WHERE e.{c['id']} = {f.p('id')} AND NOT {lay.ref('deleted', 'e')}"
            ),
        }
        self._effect_statements = found
        return found

    def effect(self, entity_id: str, key: str) -> EffectRecord | None:
        """See :meth:`stores.Store.effect`."""
        params = {"id": check_id("entity id", entity_id), "key": check_id("effect key", key)}
        rows = self._run(self._effect_sql()["one"], params)
        return effect_of(rows[0], self._sqlite) if rows else None

    def holder_and_effect(self, entity_id: str, key: str) -> tuple[tuple[str | None, int], EffectRecord | None]:
        """See :meth:`stores.ledger.LedgerRun.holder_and_effect`: one read, the entity row
        joined with its ledger row under ``key`` by primary key."""
        check_id("entity id", entity_id)
        check_effect_key(key)
        rows = self._run(self._effect_sql()["probe"], {"id": entity_id, "key": key})
        if not rows:
            raise UnknownEntity(entity_id)
        row = rows[0]
        return (row[0], row[1]), None if row[2] is None else effect_of(row[2:], self._sqlite)

    def holders_and_effects(self, pairs: Sequence[tuple[str, str]]) -> list[HolderAndEffect | FsmError]:
        """See :meth:`stores.ledger.LedgerRun.holders_and_effects`: on PostgreSQL one read
        for every pair (the entity rows joined with their ledger rows by primary key)."""
        if self._sqlite:
            return super().holders_and_effects(pairs)
        check_ledger_batch(pairs, "holders_and_effects takes a list of (entity_id, key) pairs")
        found: list[HolderAndEffect | FsmError | None] = [None] * len(pairs)
        asked: list[tuple[int, str, str]] = []
        for i, pair in enumerate(pairs):
            try:
                asked.append((i, *ledger_pair(pair)))
            except FsmError as err:
                found[i] = err
        if asked:
            params = {"rows": json.dumps(asked, ensure_ascii=False, separators=(",", ":"))}
            for row in self._run(self._effect_sql()["probe_many"], params):
                found[row[0]] = (
                    UnknownEntity(asked_id(asked, row[0]))
                    if not row[3]
                    else ((row[1], row[2]), None if row[4] is None else effect_of(row[4:], False))
                )
        return [UnknownEntity("?") if f is None else f for f in found]  # every asked row comes back

    def record_effects(self, writes: Sequence[EffectWrite]) -> list[tuple[EffectRecord, bool] | FsmError]:
        """See :meth:`stores.ledger.LedgerRun.record_effects`: on PostgreSQL every new record
        in one guarded insert (each row under its own lease, checked in the statement as
        :meth:`record_effect` checks it); a write the insert did not take (its lease is
        gone, a record exists, its entity is not there) is then answered by
        :meth:`record_effect` alone, which says why or replaces what may be replaced."""
        if self._sqlite:
            return super().record_effects(writes)
        check_ledger_batch(writes, "record_effects takes a list of EffectWrite")
        done: list[tuple[EffectRecord, bool] | FsmError | None] = [None] * len(writes)
        fresh: list[tuple[int, EffectWrite, str]] = []
        for i, write in enumerate(writes):
            try:
                w = effect_write(write)
                fresh.append((i, w, dumps_data(json_result(w.result, "an effect result"), w.entity_id)))
            except FsmError as err:
                done[i] = err
        if fresh:
            rows = [[w.entity_id, w.key, w.owner, w.token, w.status, text] for _, w, text in fresh]
            params: dict[str, Any] = {"rows": json.dumps(rows, ensure_ascii=False, separators=(",", ":"))}
            now = self._now()
            if now is not None:
                params["now"] = self._f.time(now)
            where = {(w.entity_id, w.key): i for i, w, _ in fresh}
            for row in self._run(self._effect_sql()["record_many"], params):
                record = effect_of(row, False)
                done[where[(record.entity_id, record.key)]] = (record, True)
        for i, write in enumerate(writes):
            if done[i] is None:  # not taken by the insert: its own statement says why
                try:
                    done[i] = record_one(self, effect_write(write))
                except FsmError as err:
                    done[i] = err
        return [d for d in done if d is not None]

    def effects(self, entity_id: str) -> list[EffectRecord]:
        """See :meth:`stores.Store.effects`."""
        rows = self._run(self._effect_sql()["all"], {"id": check_id("entity id", entity_id)})
        if not rows and not self._run(self._sql.exists, {"id": entity_id}):
            raise UnknownEntity(entity_id)
        return [effect_of(r, self._sqlite) for r in rows]

    def record_effect(
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.Store.record_effect`."""
        check_effect_args(entity_id, key, owner, token, status)
        check_effect_key(key, steps=True)
        params: dict[str, Any] = {
            "id": entity_id,
            "key": key,
            "owner": owner,
            "token": token,
            "status": status,
            "result": dumps_data(json_result(result, "an effect result"), entity_id),
        }
        sql = self._effect_sql()["record_or_replace" if replace else "record"]
        if replace:
            params["replace"] = self._f.ids(replace)
        for _ in range(ATTEMPTS):
            now = self._now()
            if now is not None:
                params["now"] = self._f.time(now)
            rows = self._run(sql, params)
            if rows:
                return effect_of(rows[0], self._sqlite), True
            row, _ = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            if row.lease_owner != owner or row.lease_token != token:
                raise LeaseLost(
                    entity_id,
                    expected_token=token,
                    found_token=row.lease_token,
                    owner=owner,
                    detail=f"the result of effect {key!r} was not recorded",
                )
            existing = self.effect(entity_id, key)
            if existing is not None and existing.status not in replace:
                return existing, False
        raise LeaseLost(entity_id, expected_token=token, found_token=None, owner=owner, detail="contended")


def asked_id(asked: list[tuple[int, str, str]], n: int) -> str:
    """The entity id of the asked pair numbered ``n``."""
    return next(entity_id for i, entity_id, _ in asked if i == n)


__all__ = ["EffectOps", "effect_of"]
