"""Leases outside transitions: acquire, renew, release (DESIGN section 5).

None of them is a transition: version and history never move.  Each is one guarded
``UPDATE ... RETURNING``; renewal moves ``lease_expires_at`` only, never past the state's
renewal budget (``min(now + ttl, state_entered_at + budget)``, refused once ``now`` reaches
the deadline) and never revives an expired lease (the reaper may be taking over).

A successful acquire or renewal is logged in the same transaction, on the reserved ledger
row :data:`~fsm.records.RENEWALS_KEY` (a JSON list of the newest
:data:`~fsm.records.RENEWALS_KEPT` entries): on PostgreSQL the update and the log's upsert
are one statement (``WITH u AS (UPDATE .. RETURNING ..) INSERT .. SELECT .. FROM u ON
CONFLICT ..``, still one round trip); on SQLite the upsert follows the update inside one
``BEGIN IMMEDIATE`` (a savepoint inside a claim's transaction).  A refused write matches no
row, so it logs nothing.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from fsm.errors import FsmError, LeaseLost, MalformedRow, StaleVersion, UnknownEntity
from fsm.limits import check_id, check_int, check_lease_args, check_renewals, check_store_ttl
from fsm.records import EFFECT_RENEWALS, RENEWALS_KEPT, RENEWALS_KEY, Lease, LeaseRenewal, Snapshot
from stores.ledger import renewal_entry, renewals_of
from stores.sql.connections import unavailable
from stores.sql.core import ATTEMPTS, SqliteWrite
from stores.sql.effects import effect_of
from stores.sql.rows import snapshot_of
from stores.sql.wakeups import WakeOps

log = logging.getLogger("fsm.store")


class _Undone(Exception):
    """A statement of the batch failed: its transaction cannot commit."""


LOG_COLUMNS = "entity_id, key, status, lease_token, attempts, result, recorded_at"


class LeaseOps(WakeOps):
    """``acquire_lease``, ``renew_lease``, ``release_lease`` and ``renewals`` of :class:`stores.sql.SqlStore`."""

    _lease_statements: dict[tuple[str, bool], str]
    _log_statement: str

    def _lease_sql(self, what: str, budget: bool) -> str:
        """The guarded update of ``what`` (``acquire`` or ``renew``), and on PostgreSQL the
        renewal log's upsert in the same statement; cached per shape."""
        shapes: dict[tuple[str, bool], str] | None = getattr(self, "_lease_statements", None)
        if shapes is None:
            shapes = {}
            self._lease_statements = shapes
        found = shapes.get((what, budget))
        if found is not None:
            return found
        update = (self._sql.acquire if what == "acquire" else self._sql.renew)(budget)
        if self._sqlite:
            found = update
        else:
            found = (
                f"WITH u AS ({update}), r AS ({self._log_upsert_pg('u', acquired=what == 'acquire')}) SELECT * FROM u"
            )
        shapes[(what, budget)] = found
        return found

    def _log_upsert_pg(self, source: str, *, acquired: bool) -> str:
        """PostgreSQL: the renewal log's upsert of every row of ``source`` (a CTE returning
        ``id``, ``lease_owner``, ``lease_token``, ``lease_expires_at``), one entry each."""
        f, ef = self._f, self._sql.L.effects
        entry = (
            f"jsonb_build_object('at', {f.now}, 'expires_at', {source}.lease_expires_at, 'owner', "
            f"{source}.lease_owner, 'token', {source}.lease_token" + (", 'acquired', TRUE" if acquired else "") + ")"
        )
        # the log holds N: drop the oldest, append (a longer one, N lowered, is cut to N - 1)
        n, length = RENEWALS_KEPT, "jsonb_array_length(lg.result)"
        old = (
            f"CASE WHEN COALESCE(jsonb_typeof(lg.result), '') <> 'array' THEN '[]'::jsonb "
            f"WHEN {length} < {n} THEN lg.result WHEN {length} = {n} THEN lg.result - 0 "
            f"ELSE jsonb_path_query_array(lg.result, '$[last - {n - 2} to last]') END"
        )
        return (
            f"INSERT INTO {ef} AS lg ({LOG_COLUMNS}) "
            f"SELECT {source}.id, '{RENEWALS_KEY}', '{EFFECT_RENEWALS}', {source}.lease_token, 1, "
            f"jsonb_build_array({entry}), {f.now} FROM {source} ON CONFLICT (entity_id, key) DO UPDATE SET "
            "status = excluded.status, lease_token = excluded.lease_token, attempts = lg.attempts + 1, "
            f"recorded_at = excluded.recorded_at, result = ({old}) || excluded.result"
        )

    def _log_sql(self) -> str:
        """SQLite: the renewal log's upsert (run after the update, in its transaction)."""
        found: str | None = getattr(self, "_log_statement", None)
        if found is None:
            found = self._log_statement = self._log_sqlite(
                f"VALUES (:id, '{RENEWALS_KEY}', '{EFFECT_RENEWALS}', :log_token, 1, json_array(json(:entry)), :now)",
                "json(:entry)",
            )
        return found

    def _log_many_sql(self) -> str:
        """SQLite: the renewal log's upsert of many entries from one JSON document
        (``[[id, token, entry], ..]``), as :meth:`_log_sql` upserts one."""
        found: str | None = getattr(self, "_log_many_statement", None)
        if found is None:
            entry = "json(json_extract(r.value, '$[2]'))"
            found = self._log_many_statement = self._log_sqlite(
                f"SELECT json_extract(r.value, '$[0]'), '{RENEWALS_KEY}', '{EFFECT_RENEWALS}', "
                f"json_extract(r.value, '$[1]'), 1, json_array({entry}), :now FROM json_each(:rows) AS r WHERE 1",
                "json(json_extract(excluded.result, '$[0]'))",  # WHERE 1: SQLite's upsert rule
            )
        return found

    def _log_sqlite(self, rows: str, entry: str) -> str:
        """SQLite: the renewal log's upsert of ``rows`` (``VALUES`` or a ``SELECT``),
        appending ``entry`` to a log that exists."""
        ef = self._sql.L.effects
        # the log holds N: drop the oldest, append (a longer one, N lowered, is cut to N - 1);
        # json_type() raises on malformed JSON: the outer CASE calls it only on valid text;
        # the cut keeps each entry as it is (an object or array is JSON text, a scalar its
        # SQL value; json(j.value) would raise on a text entry and fail the renewal)
        n, length = RENEWALS_KEPT, "json_array_length(lg.result)"
        cut = (
            "(SELECT json_group_array(CASE j.type WHEN 'true' THEN json('true') WHEN 'false' THEN json('false') "
            f"ELSE j.value END) FROM json_each(lg.result) AS j WHERE j.key > {length} - {n})"
        )
        kept = (
            "CASE WHEN json_valid(lg.result) THEN CASE WHEN json_type(lg.result) <> 'array' THEN '[]' "
            f"WHEN {length} < {n} THEN lg.result WHEN {length} = {n} THEN json_remove(lg.result, '$[0]') "
            f"ELSE {cut} END ELSE '[]' END"
        )
        return (
            f"INSERT INTO {ef} AS lg ({LOG_COLUMNS}) {rows} "
            "ON CONFLICT (entity_id, key) DO UPDATE SET status = excluded.status, "
            "lease_token = excluded.lease_token, attempts = lg.attempts + 1, recorded_at = excluded.recorded_at, "
            f"result = json_insert({kept}, '$[#]', {entry})"
        )

    def _lease_write(self, what: str, budget: bool, params: dict[str, Any], now: datetime | None) -> Snapshot | None:
        """The guarded lease update and its log entry in one transaction; the new row, or
        None when the guard matched no row (nothing written)."""
        sql = self._lease_sql(what, budget)
        if not self._sqlite:
            rows = self._run(sql, params)
            return self._attach([snapshot_of(rows[0])])[0] if rows else None
        try:
            with SqliteWrite(self._conns.slot(), "fsm_lease") as cur:
                cur.execute(sql, params)
                rows = cur.fetchall()
                snap = snapshot_of(rows[0]) if rows else None  # decoded before COMMIT: a bad row rolls back
                if snap is not None:
                    assert now is not None  # SQLite always has a Python-side now
                    entry = renewal_entry(snap, now, acquired=what == "acquire")
                    cur.execute(
                        self._log_sql(),
                        {
                            "id": snap.id,
                            "log_token": snap.lease_token,
                            "entry": json.dumps(entry, ensure_ascii=False),
                            "now": params["now"],
                        },
                    )
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        return None if snap is None else self._attach([snap])[0]

    def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        """See :meth:`stores.Store.acquire_lease`."""
        check_lease_args(entity_id, owner, ttl=check_store_ttl(ttl), budget=budget)
        check_int("expect_version", expect_version)
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "version": expect_version}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            taken = self._lease_write("acquire", budget is not None, params, now)
            if taken is not None:
                return taken
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            if row.version != expect_version:
                raise StaleVersion(entity_id, expected=expect_version, found=row.version)
            exp = row.lease_expires_at
            if row.lease_owner is not None and exp is not None and exp >= now:
                detail = f"held by {row.lease_owner} until {exp.isoformat()}"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
            if budget is not None and now >= row.budget_since + budget:
                detail = f"renewal budget of state {row.state!r} is spent"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
        raise LeaseLost(entity_id, expected_token=None, found_token=None, owner=owner, detail="contended")

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        """See :meth:`stores.Store.renew_lease`."""
        check_lease_args(entity_id, owner, token=check_int("token", token), ttl=check_store_ttl(ttl), budget=budget)
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "token": token}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            renewed = self._lease_write("renew", budget is not None, params, now)
            if renewed is not None:
                return renewed
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            lost = functools.partial(
                LeaseLost, entity_id, expected_token=token, found_token=row.lease_token, owner=owner
            )
            if row.lease_owner != owner or row.lease_token != token:
                raise lost()
            if row.lease_expires_at is None or row.lease_expires_at < now:
                raise lost(detail="the lease expired before the renewal")
            if budget is not None and now >= row.budget_since + budget:
                raise lost(detail=f"renewal budget of state {row.state!r} is spent")
        raise LeaseLost(entity_id, expected_token=token, found_token=None, owner=owner, detail="contended")

    def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]:
        """See :meth:`stores.Store.renew_leases`: one statement renews every lease it can,
        each guarded by its own owner, token, expiry and its state's budget, and logs them
        (PostgreSQL: the update and the log's upsert in one statement, its own
        transaction; SQLite: the update, then one upsert of the log entries, in one
        ``BEGIN IMMEDIATE``).  A lease the statement did not renew changed nothing: it is
        renewed alone (:meth:`renew_lease`), which says why it is refused.  A bound table
        (a status column, child tables) renews lease by lease in one transaction."""
        batch = check_renewals(leases, ttl, budgets)
        if not batch:
            return []
        if self.binding is not None or self._children:  # type: ignore[attr-defined]
            return self._renew_each(batch, ttl, budgets)
        budget_of = dict(budgets)  # a state given twice: the last budget, as renew_lease's callers read it
        now = self._now()
        params: dict[str, Any] = {}
        self._time_params(params, now, ttl)
        try:
            if self._sqlite:
                assert now is not None  # SQLite's time is always this process's
                rows = [[lease.entity_id, lease.owner, lease.token] for lease in batch]
                params["rows"] = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
                params["budgets"] = json.dumps({k: self._f.interval(v) for k, v in budget_of.items()})
                with SqliteWrite(self._conns.slot(), "fsm_renew_many") as cur:
                    sql, values = self._qmark(self._renew_many_sql())
                    cur.execute(sql, values(params))
                    renewed = [snapshot_of(r) for r in cur.fetchall()]  # decoded before COMMIT
                    if renewed:
                        entries = [
                            [snap.id, snap.lease_token, renewal_entry(snap, now, acquired=False)] for snap in renewed
                        ]
                        log_sql, log_values = self._qmark(self._log_many_sql())
                        cur.execute(
                            log_sql,
                            log_values({"rows": json.dumps(entries, ensure_ascii=False), "now": params["now"]}),
                        )
            else:
                params["id"] = [lease.entity_id for lease in batch]
                params["owner"] = [lease.owner for lease in batch]
                params["token"] = [lease.token for lease in batch]
                params["bstate"] = list(budget_of)
                params["bvalue"] = list(budget_of.values())
                cur = self._conns.slot().cursor  # one statement: its own transaction
                cur.execute(self._renew_many_sql(), params)
                renewed = [snapshot_of(r) for r in cur.fetchall()]
        except MalformedRow as err:  # a row that cannot be decoded (SQLite: undone): lease by lease
            log.info("renewal of %d leases undone (%s); renewing them one by one", len(batch), err)
            return self._renew_each(batch, ttl, budgets)
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns) from err
        mine = {(snap.id, snap.lease_owner, snap.lease_token): snap for snap in self._attach(renewed)}
        states: dict[str, str] | None = None
        results: list[Snapshot | FsmError] = []
        for lease in batch:
            found = mine.get((lease.entity_id, lease.owner, lease.token))
            if found is not None:
                results.append(found)
                continue
            if states is None:
                states = self._states_of([x.entity_id for x in batch if (x.entity_id, x.owner, x.token) not in mine])
            state = states.get(lease.entity_id)
            budget = None if state is None else budget_of.get(state)
            try:
                results.append(
                    self.renew_lease(lease.entity_id, owner=lease.owner, token=lease.token, ttl=ttl, budget=budget)
                )
            except FsmError as err:
                results.append(err)
        return results

    def _renew_many_sql(self) -> str:
        """The renewal of many leases in one statement (see :meth:`renew_leases`)."""
        found: str | None = getattr(self, "_renew_many_statement", None)
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        exp = f"e.{c['lease_expires_at']}"
        if self._sqlite:
            budget = f"(SELECT b.value FROM json_each(:budgets) AS b WHERE b.key = e.{c['state']})"
            since = sql.budget_since(f"e.{c['state_entered_at']}", f"e.{c['run_after']}")
            deadline = f"fsm_ts_add({since}, {budget})"
            expiry = f"CASE WHEN {deadline} IS NULL THEN :ttl ELSE min(:ttl, {deadline}) END"
            picks = ", ".join(
                f"json_extract(j.value, '$[{n}]') AS {name}" for n, name in enumerate(("id", "owner", "token"))
            )
            source = f"(SELECT {picks} FROM json_each(:rows) AS j) AS v"
            ids = ""
            returning = sql.ret
        else:
            budget = (
                f"(SELECT b.budget FROM unnest(CAST(%(bstate)s AS text[]), CAST(%(bvalue)s AS interval[])) "
                f"AS b(state, budget) WHERE b.state = e.{c['state']})"
            )
            since = sql.budget_since(f"e.{c['state_entered_at']}", f"e.{c['run_after']}")
            deadline = f"({since} + {budget})"
            expiry = f"LEAST({f.now_plus('ttl')}, {deadline})"  # LEAST ignores a NULL (no budget)
            source = (
                "unnest(CAST(%(id)s AS text[]), CAST(%(owner)s AS text[]), CAST(%(token)s AS bigint[])) "
                "AS v(id, owner, token)"
            )
            # the ids again as an array the primary key probes (a prepared plan may otherwise
            # scan the table once per lease)
            ids = f" AND e.{c['id']} = ANY(CAST(%(id)s AS text[]))"
            returning = sql.ret
        where = (
            f"e.{c['id']} = v.id{ids} AND NOT e.{c['deleted']} AND {f.is_object('e.' + c['data'])} "
            f"AND e.{c['lease_owner']} = v.owner AND e.{c['lease_token']} = v.token AND {exp} >= {f.now} "
            f"AND ({deadline} IS NULL OR {deadline} > {f.now})"
        )
        update = (
            f"UPDATE {sql.E} AS e SET {c['lease_expires_at']} = {f.greatest}({expiry}, {exp}) "
            f"FROM {source} WHERE {where} RETURNING {returning}"
        )
        if not self._sqlite:
            update = f"WITH u AS ({update}), r AS ({self._log_upsert_pg('u', acquired=False)}) SELECT * FROM u"
        self._renew_many_statement = update
        return update

    def _renew_each(
        self, batch: list[Lease], ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...]
    ) -> list[Snapshot | FsmError]:
        """Lease by lease in one transaction (a bound table; a batch that could not be
        decoded); a transaction that fails is undone and each lease renewed on its own."""
        budget_of = dict(budgets)
        states = self._states_of([lease.entity_id for lease in batch])

        def one(lease: Lease) -> Snapshot | FsmError:
            state = states.get(lease.entity_id)
            budget = None if state is None else budget_of.get(state)
            try:
                return self.renew_lease(lease.entity_id, owner=lease.owner, token=lease.token, ttl=ttl, budget=budget)
            except FsmError as err:
                return err

        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_renew_many"):
                    return [one(lease) for lease in batch]
            with slot.conn.transaction():
                results = [one(lease) for lease in batch]
                if any(isinstance(r, FsmError) and not isinstance(r, LeaseLost | UnknownEntity) for r in results):
                    raise _Undone  # a statement failed (not a refusal): the transaction cannot commit
                return results
        except Exception as err:
            if isinstance(err, (FsmError, _Undone, *self._errors)):
                log.info("renewal of %d leases undone (%s); renewing them one by one", len(batch), err)
                return [one(lease) for lease in batch]
            raise

    def _states_of(self, ids: list[str]) -> dict[str, str]:
        """The current state of each entity in ``ids`` (missing ones left out)."""
        c, table = self._sql.L.col, self._sql.E
        found: dict[str, str] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ", ".join(self._f.p(f"x{n}") for n in range(len(chunk)))
            rows = self._run(
                f"SELECT {c['id']}, {c['state']} FROM {table} WHERE {c['id']} IN ({marks})",
                {f"x{n}": v for n, v in enumerate(chunk)},
            )
            found.update((r[0], r[1]) for r in rows)
        return found

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        """See :meth:`stores.Store.release_lease`."""
        check_lease_args(entity_id, owner, token=check_int("token", token))
        rows = self._run(self._sql.release, {"id": entity_id, "owner": owner, "token": token})
        if rows:
            released = self._attach([snapshot_of(rows[0])])[0]
            self._released_notice(released.kind)
            return released
        row, _ = self._current(entity_id)
        if row is None or row.deleted:
            raise UnknownEntity(entity_id)
        raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)

    def _released_notice(self, kind: str) -> None:
        """A released lease leaves its entity for another worker: wake the lifecycle's
        workers (a hint: a failure to send it is logged, the release stands)."""
        try:
            self.notify_work(kind)
        except FsmError as err:
            log.info("wake-up after a release not sent: %s", err)

    def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        """See :meth:`stores.Store.renewals`."""
        ef = self._sql.L.effects
        sql = f"SELECT {LOG_COLUMNS} FROM {ef} WHERE entity_id = {self._f.p('id')} AND key = '{RENEWALS_KEY}'"
        rows = self._run(sql, {"id": check_id("entity id", entity_id)})
        if not rows:
            if not self._run(self._sql.exists, {"id": entity_id}):
                raise UnknownEntity(entity_id)
            return []
        return renewals_of(entity_id, effect_of(rows[0], self._sqlite))


__all__ = ["LeaseOps"]
