"""Many transitions in one transaction (``apply_many``), each fenced by its own guards.

The writes of a batch are grouped by *shape* (what their statement sets: the lease change,
counters, data, a due time, whether the caller holds the snapshot) and each group is one
statement, each row still guarded by its own version and lease token:

- PostgreSQL: ``WITH v AS (SELECT j->>0 AS id, .. FROM jsonb_array_elements(one JSON
  document, a row per array)), u AS (UPDATE .. FROM v WHERE e.id = v.id AND e.version =
  v.version AND e.lease_owner IS NOT DISTINCT FROM v.owner AND e.lease_token = v.token AND
  e.id = ANY(ARRAY(SELECT v.id FROM v)) RETURNING ..), h AS (INSERT the history rows FROM
  u) SELECT .. FROM u``: one round trip and one text parameter whatever the group's size,
  its text the same for every size (so psycopg prepares it);
- SQLite: ``UPDATE .. FROM (json_each of one JSON document) AS v WHERE .. RETURNING``, then
  the history rows of the returned ones (``executemany``), inside the batch's
  ``BEGIN IMMEDIATE``.

A write the statement did not return changed nothing: it is diagnosed on its own, as
:meth:`apply` diagnoses a refusal (``StaleVersion``, ``LeaseLost``, ``UnknownEntity``,
...), and answered in its place; if the row now qualifies (it moved back in between) the
write is applied alone.  Several writes on one entity run in *rounds* (the first write
of each entity, then the second...), so a later one sees the earlier one.  Writes the
set statement does not express (conditions, an idempotency key, a definition version, a
bound table or child tables) are applied one by one with ``apply`` in the same
transaction: on SQLite each in a savepoint; on PostgreSQL a batch holding an idempotency
key (which may break a unique key, failing the whole transaction) is applied write by
write instead.  If the transaction itself fails (a dropped connection, an unexpected
integrity error, a row that cannot be decoded), nothing of it is kept and each write is
applied again on its own, so every write still gets its answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from fsm.errors import ConditionFailed, Fenced, FsmError, IdempotencyKeyReused, StaleVersion, UnknownEntity
from fsm.limits import check_transition_writes
from fsm.records import HistoryRecord, LeaseChange, Snapshot, TimerMode, TransitionWrite
from stores.sql.core import SqlCore, SqliteWrite
from stores.sql.dialect import LEAN_COLUMNS
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.schema import ENTITY_COLUMNS, decode_time

log = logging.getLogger("fsm.store")

Applied = tuple[Snapshot, HistoryRecord] | FsmError


REFUSALS = (Fenced, StaleVersion, UnknownEntity, ConditionFailed, IdempotencyKeyReused)
"""What a guarded write answers without failing a statement (its ``WHERE`` matched no row,
or a savepoint kept the reused key's failure to itself): the transaction goes on."""


class _Undone(Exception):
    """A statement of the batch failed: its transaction cannot commit."""


_tuple_new = tuple.__new__
"""Builds a NamedTuple from a tuple of its fields without its generated ``__new__`` (hot paths)."""


class Shape(NamedTuple):
    """What a group's statement sets (one statement text per shape)."""

    change: LeaseChange
    has_ttl: bool
    token_check: bool
    bump_attempt: bool
    bump_reclaims: bool
    new_data: bool
    has_due: bool
    lean: bool
    timer: TimerMode = TimerMode.KEEP


class _Row(NamedTuple):
    """One write of a group, with its bound texts."""

    pos: int
    write: TransitionWrite
    before: Snapshot | None
    data: str | None
    patch: str | None
    error: str | None


_Round = tuple[dict[Shape, list[_Row]], list[int]]
"""One round of a batch: its set-based writes grouped by shape, and the writes applied alone."""

# PostgreSQL: the per-row fields of a group's ``v`` (name, SQL type), in the order of each
# row's JSON array: texts and numbers as JSON values; data, patch and error as the JSON text
# of their value (parsed as jsonb); a duration as the text psycopg sends for a timedelta
_PG_FIELDS = (
    ("id", "text"),
    ("version", "bigint"),
    ("owner", "text"),
    ("token", "bigint"),
    ("target", "text"),
    ("new_owner", "text"),
    ("ttl", "interval"),
    ("data", "jsonb"),
    ("due", "interval"),
    ("event", "text"),
    ("source", "text"),
    ("actor", "text"),
    ("reason", "text"),
    ("patch", "jsonb"),
    ("howner", "text"),
    ("error", "jsonb"),
)
# SQLite: what the update reads from each row's JSON array (history rows are bound apart)
_SQLITE_FIELDS = ("id", "version", "owner", "token", "target", "new_owner", "ttl", "data", "due")


def _interval(delta: timedelta) -> str:
    """PostgreSQL: ``delta`` (never negative) as the interval text psycopg sends for it (whole
    days in the day field, the rest in the time field), e.g. ``1 day 2:00:00.000001``."""
    return str(delta).replace(",", "")


class BatchOps(SqlCore):
    """``apply_many`` of :class:`stores.sql.SqlStore`."""

    _many_statements: dict[Shape, str]
    _many_history: str

    def apply_many(self, writes: Sequence[TransitionWrite]) -> list[Applied]:
        """See :meth:`stores.Store.apply_many`."""
        return self.apply_many_checked(check_transition_writes(writes))

    def apply_many_checked(self, writes: Sequence[TransitionWrite]) -> list[Applied]:
        """:meth:`apply_many` of writes already checked (see ``stores.base.unchecked_apply``)."""
        if not writes:
            return []
        if not self._sqlite and any(w.idempotency_key is not None for w in writes):
            # a reused key breaks a unique key, which fails the statement and with it
            # PostgreSQL's transaction before the refusal can be diagnosed: apply such a
            # batch write by write (the worker's outcomes carry no keys)
            return [self._one(w) for w in writes]
        results: list[Applied | None] = [None] * len(writes)
        rounds = self._plan(writes, results)
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_apply_many") as cur:
                    self._run_rounds(cur, writes, rounds, results)
            elif len(rounds) == 1 and not rounds[0][1] and len(rounds[0][0]) == 1:
                # one statement: its own transaction on the autocommit connection (no BEGIN
                # and COMMIT round trips; inside the caller's, the joined cursor gives it a
                # savepoint); a write it refused changed nothing, so it is diagnosed after
                ((shape, rows),) = rounds[0][0].items()
                for i, answer in self._group(slot.cursor, shape, rows, defer=True):
                    results[i] = answer
            else:
                with slot.conn.transaction():
                    self._run_rounds(slot.cursor, writes, rounds, results)
                    if any(isinstance(r, FsmError) and not isinstance(r, REFUSALS) for r in results):
                        raise _Undone  # a statement failed (not a refusal): the transaction cannot commit
        except Exception as err:  # the transaction is undone: every write again, on its own
            if isinstance(err, (FsmError, _Undone, *self._errors, *self._integrity)):
                log.info("batch of %d writes undone (%s); applying them one by one", len(writes), err)
                return [self._one(w) for w in writes]
            raise
        return [self._refused(w) if r is None else r for r, w in zip(results, writes, strict=True)]

    def _one(self, write: TransitionWrite) -> Applied:
        try:
            applied: tuple[Snapshot, HistoryRecord] = self.apply_checked(write)  # type: ignore[attr-defined]
            return applied
        except FsmError as err:
            return err

    def _set_based(self) -> bool:
        """Whether this store's writes can go through the set statement: the library's own
        tables (no status column, no child tables)."""
        return self._sql.lean_ok and self._sql.L.status_col is None and not self._children

    def _plan(self, writes: Sequence[TransitionWrite], results: list[Applied | None]) -> list[_Round]:
        """The rounds of a batch: the first write of each entity, then the second...; in
        each round the set-based writes grouped by shape, and the writes applied alone.  A
        write whose data is not JSON gets its refusal in ``results`` (nothing bound)."""
        rounds: list[_Round] = []
        seen: dict[str, int] = {}
        set_based = self._set_based()
        for i, write in enumerate(writes):
            k = seen.get(write.entity_id, 0)
            seen[write.entity_id] = k + 1
            if k == len(rounds):
                rounds.append(({}, []))
            groups, lone = rounds[k]
            if (
                not set_based
                or write.require
                or write.idempotency_key is not None
                or write.definition is not None
                or write.memory is not None
            ):
                # a definition version (a migration's rare write) or a history memory: applied alone
                lone.append(i)
                continue
            try:
                row = self._row(i, write)
            except FsmError as err:
                results[i] = err
                continue
            groups.setdefault(self._shape(write, row.before), []).append(row)
        return rounds

    def _run_rounds(
        self, cur: Any, writes: Sequence[TransitionWrite], rounds: list[_Round], results: list[Applied | None]
    ) -> None:
        """Every round inside the caller's transaction: one statement per shape, then the
        writes applied alone."""
        for groups, lone in rounds:
            for shape, rows in groups.items():
                for i, answer in self._group(cur, shape, rows):
                    results[i] = answer
            for i in lone:
                results[i] = self._one(writes[i])

    def _row(self, i: int, write: TransitionWrite) -> _Row:
        before = write.before
        if before is not None and (before.version != write.expect_version or before.id != write.entity_id):
            before = None  # not the snapshot this write was judged on: read the columns back
        entity_id, data, patch, error = write.entity_id, write.data, write.data_patch, write.error
        # built directly: a NamedTuple's generated __new__ is one more Python call per write
        return _tuple_new(_Row, (
            i,
            write,
            before,
            None if data is None else dumps_data(data, entity_id),
            None if patch is None else dumps_data(patch, entity_id),
            None if error is None else dumps_data(error, entity_id),
        ))  # fmt: skip

    @staticmethod
    def _shape(write: TransitionWrite, before: Snapshot | None) -> Shape:
        return _tuple_new(Shape, (
            write.lease_change,
            write.lease_ttl is not None,
            write.expect_token is not None,
            write.bump_attempt,
            write.bump_reclaims,
            write.data is not None,
            write.run_after is not None,
            before is not None,
            write.timer,
        ))  # fmt: skip

    # -- one group: one statement -------------------------------------------------------

    def _many_sql(self, shape: Shape) -> str:
        """The group statement of ``shape`` (see the module doc), cached per shape."""
        cache: dict[Shape, str] | None = getattr(self, "_many_statements", None)
        if cache is None:
            cache = self._many_statements = {}
        found = cache.get(shape)
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        e = "e."
        sets = [f"{c['state']} = v.target", f"{c['version']} = {e}{c['version']} + 1"]
        if shape.change is LeaseChange.ACQUIRE:
            expiry = (f"({f.now} + v.ttl)" if self._f.name == "postgresql" else "v.ttl") if shape.has_ttl else "NULL"
            sets += [
                f"{c['lease_owner']} = v.new_owner",
                f"{c['lease_token']} = {e}{c['lease_token']} + 1",
                f"{c['lease_expires_at']} = {expiry}",
            ]
        elif shape.change is LeaseChange.CLEAR:
            sets += [f"{c['lease_owner']} = NULL", f"{c['lease_expires_at']} = NULL"]
        sets += [f"{c['state_entered_at']} = {f.now}", f"{c['updated_at']} = {f.now}"]
        sets += sql.timer_sets(shape.timer)
        if shape.bump_attempt:
            sets += [f"{c['attempt']} = {e}{c['attempt']} + 1", f"{c['reclaims']} = 0"]
        elif shape.bump_reclaims:
            sets.append(f"{c['reclaims']} = {e}{c['reclaims']} + 1")
        if shape.new_data:
            sets.append(f"{c['data']} = v.data")
        if shape.has_due:
            sets.append(f"{c['run_after']} = " + (f"({f.now} + v.due)" if not self._sqlite else "v.due"))
        else:
            sets.append(sql.due_now())
        guard = f"{e}{c['id']} = v.id AND NOT {e}{c['deleted']} AND {e}{c['version']} = v.version"
        if shape.token_check:
            owner = f"{e}{c['lease_owner']} " + ("IS v.owner" if self._sqlite else "IS NOT DISTINCT FROM v.owner")
            guard += f" AND {owner} AND {e}{c['lease_token']} = v.token"
        if self._sqlite:
            # SQLite decodes a returned row in Python (a bad one undoes the batch); a lean
            # write's row was decoded by its caller at this version
            wanted = ["id", *LEAN_COLUMNS] if shape.lean else None
            returning = ", ".join(c[n] for n in wanted) if wanted else sql.ret
            picks = ", ".join(f"json_extract(j.value, '$[{n}]') AS {name}" for n, name in enumerate(_SQLITE_FIELDS))
            found = (
                f"UPDATE {sql.E} AS e SET {', '.join(sets)} FROM (SELECT {picks} FROM json_each(:rows) AS j) AS v "
                f"WHERE {guard} RETURNING {returning}"
            )
        else:
            # the ids of ``v`` again, as an array (an init plan) the primary key probes: a
            # prepared (generic) plan otherwise may scan the whole table once per row of ``v``
            # (measured: 10x slower)
            guard += f" AND {e}{c['id']} = ANY(ARRAY(SELECT v.id FROM v)) AND {f.is_object(e + c['data'])}"
            picks = ", ".join(
                f"j->>{n} AS {name}" if kind == "text" else f"CAST(j->>{n} AS {kind}) AS {name}"
                for n, (name, kind) in enumerate(_PG_FIELDS)
            )
            cols = ["id", *LEAN_COLUMNS] if shape.lean else None
            # the history row's ``born`` (the entity's created_at) is in the full columns
            born = f", {sql.L.ref('created_at', 'e')} AS created_at" if cols else ""
            returning = ", ".join(f"{e}{c[n]} AS {n}" for n in cols) + born if cols else sql.ret
            out = ", ".join(f"u.{n}" for n in cols) if cols else ", ".join(f"u.{n}" for n in ENTITY_COLUMNS)
            found = (
                f"WITH v AS (SELECT {picks} FROM jsonb_array_elements(CAST(%(rows)s AS jsonb)) AS j), "
                f"u AS (UPDATE {sql.E} AS e SET {', '.join(sets)} FROM v WHERE {guard} "
                f"RETURNING {returning}, {f.now} AS fsm_now, v.event AS h_event, v.source AS h_source, "
                "v.target AS h_target, v.actor AS h_actor, v.reason AS h_reason, v.patch AS h_patch, "
                "v.howner AS h_owner, v.error AS h_error), "
                f"h AS (INSERT INTO {sql.H} ({sql.hist_cols}) SELECT u.id, u.version, u.h_event, u.h_source, "
                "u.h_target, u.h_actor, u.lease_token, u.h_reason, NULL, u.fsm_now, u.h_patch, u.h_owner, "
                f"u.h_error, u.created_at FROM u) SELECT {out}, u.fsm_now FROM u"
            )
        cache[shape] = found
        return found

    def _group(self, cur: Any, shape: Shape, rows: list[_Row], *, defer: bool = False) -> list[tuple[int, Applied]]:
        """One group's statement, then each write it did not return diagnosed alone (with
        ``defer``, left out: the caller diagnoses it after the commit)."""
        now = self._now()
        params: dict[str, Any] = {}
        f = self._f
        if now is not None:
            params["now"] = f.time(now)
        sql = self._many_sql(shape)
        owners = [r.write.history_owner() for r in rows]  # the doc's and the history record's
        if self._sqlite:
            assert now is not None  # SQLite's time is always this process's
            doc = [
                [
                    r.write.entity_id,
                    r.write.expect_version,
                    r.write.expect_owner,
                    r.write.expect_token,
                    r.write.target,
                    r.write.new_owner,
                    None if r.write.lease_ttl is None else f.offset(now, r.write.lease_ttl),
                    r.data,
                    None if r.write.run_after is None else f.offset(now, r.write.run_after),
                ]
                for r in rows
            ]
            params["rows"] = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
            update, values = self._qmark(sql)
            cur.execute(update, values(params))
            returned = cur.fetchall()
        else:
            # one JSON document (a row per array, in ``_PG_FIELDS`` order), one text parameter:
            # psycopg's conversion of one list per field cost the client more than the rest
            # of the statement's round trip
            doc = [
                [
                    w.entity_id, w.expect_version, w.expect_owner, w.expect_token, w.target, w.new_owner,
                    None if w.lease_ttl is None else _interval(w.lease_ttl), r.data,
                    None if w.run_after is None else _interval(w.run_after), w.event, w.source, w.actor,
                    w.reason, r.patch, owners[n], r.error,
                ]
                for n, r in enumerate(rows)
                for w in (r.write,)
            ]  # fmt: skip
            params["rows"] = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
            cur.execute(sql, params)
            returned = cur.fetchall()
        by_id = {row[0]: row for row in returned}
        answers: list[tuple[int, Applied]] = []
        history: list[tuple[Any, ...]] = []
        for r, howner in zip(rows, owners, strict=True):
            row = by_id.get(r.write.entity_id)
            if row is None:
                if not defer:
                    answers.append((r.pos, self._refused(r.write)))
                continue
            at = now if self._sqlite else decode_time(row[-1])
            assert at is not None
            snap = self._snapshot(shape, r, row, at)
            w = r.write
            patch = None if r.patch is None else json.loads(r.patch)
            record = _tuple_new(HistoryRecord, (
                w.entity_id, snap.version, w.event, w.source, w.target, w.actor, snap.lease_token, w.reason,
                None, at, patch, howner, w.error,
            ))  # fmt: skip
            if self._sqlite:
                history.append(
                    (w.entity_id, snap.version, w.event, w.source, w.target, w.actor, snap.lease_token, w.reason,
                     None, params["now"], r.patch, howner, r.error)
                )  # fmt: skip
            answers.append((r.pos, (snap, record)))
        if history:  # one statement for every history row of the group
            cur.execute(self._history_sql(), (json.dumps(history, ensure_ascii=False, separators=(",", ":")),))
        return answers

    def _history_sql(self) -> str:
        """SQLite: the history rows of a group from one JSON document (a row per array)."""
        found: str | None = getattr(self, "_many_history", None)
        if found is None:
            picks = ", ".join(f"json_extract(j.value, '$[{n}]')" for n in range(13))
            found = self._many_history = (
                f"INSERT INTO {self._sql.H} ({self._sql.hist_cols}) SELECT {picks} FROM json_each(?) AS j"
            )
        return found

    def _snapshot(self, shape: Shape, r: _Row, row: Any, at: datetime) -> Snapshot:
        """The new snapshot of a returned row (lean: built from the caller's ``before``)."""
        if not shape.lean:
            snap = snapshot_of(row)  # MalformedRow undoes the batch: each write is then diagnosed alone
            return snap
        before, w = r.before, r.write
        assert before is not None
        exp, due, timer = row[4], row[7], w.timer
        since = before.timer_since if timer is TimerMode.KEEP else at if timer is TimerMode.ARM else None
        return _tuple_new(Snapshot, (
            w.entity_id, before.kind, w.target, row[1], row[2], row[3], None if exp is None else decode_time(exp),
            at, before.created_at, at, False, before.concurrency_key, row[5], row[6],
            before.data if w.data is None else w.data, None if due is None else decode_time(due), since,
            before.priority, before.parent_id, before.definition, before.memory,
        ))  # fmt: skip

    def _refused(self, write: TransitionWrite) -> Applied:
        """A write its group's statement did not return: why, as :meth:`apply` says it;
        applied alone if the row qualifies now."""
        try:
            failure: FsmError | None = self._diagnose_apply(write)  # type: ignore[attr-defined]
        except FsmError as err:  # the row cannot be read (MalformedRow)
            return err
        return failure if failure is not None else self._one(write)


__all__ = ["REFUSALS", "Applied", "BatchOps", "Shape"]
