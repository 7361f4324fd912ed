"""Claiming and listing on SQL: workers take the oldest claimable entities.

A claim takes up to ``limit`` entities in one statement with their history: for each
claimable state (resumes first: work already under way; then starts) it picks the rows
due the longest (``run_after <= now``, in ``run_after`` order, walking the ``claim``
index, never sorting), skipping rows it cannot read, and takes them:

- PostgreSQL: one statement, its own transaction.  Per state a ``MATERIALIZED`` pick
  locks its rows ``FOR UPDATE SKIP LOCKED`` (concurrent claimers divide the rows instead
  of waiting for each other; READ COMMITTED re-checks the pick on a row's newest version
  when it locks it), under a ``LIMIT`` of what the earlier states left; an ``UPDATE`` by
  primary key gives each a new token, lease and version (a start: the transition, with
  its history row inserted from the ``RETURNING``; a resume: the lease only, and its
  renewal log entry).
- SQLite: inside ``BEGIN IMMEDIATE`` (claimers queue for the write lock), per state one
  ``UPDATE .. WHERE id IN (the pick) RETURNING``, then one insert of the history rows
  (or the renewal log entries) of the rows it took.

A resumed finalizer gets its lease back (token + 1, no transition, its recorded effects
replayed by its next holder); a start bumps ``attempt`` when its transition does.  A claim
with a definition version (``ClaimRequest.definition``) picks only rows whose
``definition`` is NULL or at most it (its own statement shapes: a claim without one
runs the statements it always ran); it leaves the rows' versions as they are: a row
records the definition it was created or last migrated under, the shape of its state
and data, which a claim does not change.  A store
bound to an application's table (a status column, child tables) claims row by row, as
before: the pick, then each row through the store's own guarded ``apply`` or
``acquire_lease``.  Every write keeps its guard, so even a claimer that raced past the
lock could not take an entity twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fsm.errors import LeaseLost, MalformedRow, StaleVersion
from fsm.limits import check_children_args, check_claim_request, check_id, check_listing
from fsm.records import ClaimRequest, ClaimStart, Snapshot, TimerMode
from stores.ledger import renewal_entry
from stores.sql.connections import unavailable
from stores.sql.core import SqlCore, SqliteWrite
from stores.sql.rows import snapshot_of
from stores.sql.schema import AFTER_ENTITY

log = logging.getLogger("fsm.store")


class ClaimOps(SqlCore):
    """``claim``, ``entities`` and ``count_states`` of :class:`stores.sql.SqlStore`."""

    def _ranked(self, where: str, n: str, what: str, lock: str = "", starve: bool = False, raised: str = "") -> str:
        """A state's pick in the claim's order, each part an index walk that stops after
        ``n`` rows (no sort, whatever the backlog): with ``starve``, the one row due the
        longest if due since ``now - starve`` (priorities' starvation rule, the ``claim``
        index); then raised rows, highest first (the partial ``priority`` index); then rows
        at the default priority in due order (``claim``); then lowered rows (``priority``).
        ``where`` is the state's filter on rows aliased ``e``; ``what`` the columns, the
        first named ``id``.  The starved row is picked once (a CTE the other parts step
        over), so the claim still takes up to ``n``.  ``raised``: a smaller limit of the
        raised and lowered parts (a limited claim picks more rows at the default priority
        than it may take; the planner walks the small partial index for a small limit)."""
        lay, f, sql = self._sql.L, self._f, self._sql
        due, prio = lay.ref("run_after", "e"), lay.ref("priority", "e")
        lock = f" {lock}" if lock else ""
        head, skip = "", ""
        parts: list[str] = []

        def part(index: str, extra: str, order: str, limit: str) -> str:
            return (
                f"SELECT * FROM (SELECT {what} FROM {sql._indexed(index)} WHERE {where}{extra}{skip} "
                f"ORDER BY {order} LIMIT {limit}{lock}) AS r{len(parts)}"
            )

        if starve:
            starved = part("claim", f" AND {due} <= {f.now_minus('starve')}", due, "1")
            head = f"WITH starved AS MATERIALIZED ({starved}) "
            skip = f" AND {lay.ref('id', 'e')} NOT IN (SELECT id FROM starved)"
            parts.append("SELECT * FROM starved")
        ranked = f"{prio} DESC, {due}"
        parts.append(part("priority", f" AND {prio} <> 0 AND {prio} > 0", ranked, raised or n))
        parts.append(part("claim", f" AND {prio} = 0", due, n))
        parts.append(part("priority", f" AND {prio} <> 0 AND {prio} < 0", ranked, raised or n))
        return f"{head}SELECT * FROM ({' UNION ALL '.join(parts)}) AS ranked LIMIT {n}"

    _claim_pg_statements: dict[tuple[tuple[bool, ...], tuple[tuple[bool, TimerMode], ...], bool, bool, bool], str]
    _claim_sqlite_statements: dict[tuple[str, bool, TimerMode, bool, bool, bool], str]

    def _claim_sql(self) -> dict[str, str]:
        found: dict[str, str] | None = getattr(self, "_claim_statements", None)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
        live = f"{kind} = {f.p('kind')} AND NOT {deleted}"
        lock = "FOR UPDATE OF e SKIP LOCKED" if f.name == "postgresql" else ""
        # one state at a time, in the claim's order (:meth:`_ranked`): range scans of the
        # claim and priority indexes up to now that stop after ``limit`` unlocked rows, so
        # a claim costs the same whatever the backlog, and a row not yet due is never
        # looked at.  Each part is in its index's order: a tie-break on id would sort.
        what = f"{lay.ref('id', 'e')} AS id, {state} AS state, {lay.ref('version', 'e')} AS version, "
        what += f"{lay.ref('concurrency_key', 'e')} AS ck"
        pick = f"{live} AND {state} = {f.p('state')} AND {lay.ref('run_after', 'e')} <= {f.now}"
        free = f" AND {lay.ref('lease_owner', 'e')} IS NULL"
        found = {
            "list": f"SELECT {sql.cols_e} FROM {sql.E} AS e WHERE {live}",
            "count": f"SELECT {state}, COUNT(*) FROM {sql.E} AS e WHERE {live} GROUP BY {state}",
        }
        for starve in (False, True):
            for defined in (False, True):  # a claimer's definition version: rows at it or below
                mark = ("+starve" if starve else "") + ("+def" if defined else "")
                where = pick + sql.definition_pick("e") if defined else pick
                found["start" + mark] = self._ranked(where, f.p("limit"), what, lock, starve)
                found["resume" + mark] = self._ranked(where + free, f.p("limit"), what, lock, starve)
        self._claim_statements = found
        return found

    def claim(self, request: ClaimRequest) -> list[Snapshot]:
        """See :meth:`stores.Store.claim`."""
        check_claim_request(request)
        states = [*request.resumes, *(s.source for s in request.starts)]
        if request.limits is not None and states:
            return self._claim_limited(request)  # type: ignore[attr-defined,no-any-return]
        if (
            self.binding is not None  # type: ignore[attr-defined]
            or self._children
            or self._sql.L.status_col is not None
            or len(set(states)) != len(states)  # a state picked twice: row by row
        ):
            return self._claim_each(request)
        if not states:
            return []
        try:
            return self._claim_set(request) if self._sqlite else self._claim_pg(request)
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    # -- one statement (PostgreSQL) ------------------------------------------------------

    def _claim_pg_sql(self, request: ClaimRequest, given: bool = False) -> str:
        """The whole claim of ``request``'s shape as one statement (see the module doc).
        ``given``: the rows are picked already (and locked, in this transaction): each
        state's are the array parameter ``ids{n}`` (a limited claim's admitted rows).  With
        a definition version (``defn``) the picks take only rows at it or below."""
        key = (
            tuple(request.budget_for(s) is not None for s in request.resumes),
            tuple((s.bump_attempt, s.timer) for s in request.starts),
            request.starve_after is not None,
            given,
            request.definition is not None,
        )
        cache: dict[tuple[tuple[bool, ...], tuple[tuple[bool, TimerMode], ...], bool, bool, bool], str] | None = (
            getattr(self, "_claim_pg_statements", None)
        )
        if cache is None:
            cache = self._claim_pg_statements = {}
        found = cache.get(key)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        c = lay.col
        kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
        due = lay.ref("run_after", "e")
        lock = "FOR UPDATE OF e SKIP LOCKED"
        parts: list[str] = []
        outs: list[str] = []
        taken = "0"  # what the earlier states took: the rest of the limit is this state's
        n = 0
        defined = key[4]
        only = sql.definition_pick("e") if defined else ""

        def pick(i: int, extra: str) -> str:
            # the pick of the row-by-row claim (its plan: range scans of the claim and
            # priority indexes in the claim's order, no sort), its LIMIT what the earlier
            # states left
            if given:
                return f"p{i} AS (SELECT unnest(CAST(%(ids{i})s AS text[])) AS id)"
            where = f"{kind} = %(kind)s AND NOT {deleted} AND {state} = %(st{i})s AND {due} <= {f.now}{extra}{only}"
            left = f"GREATEST(%(limit)s - ({taken}), 0)"
            ranked = self._ranked(where, left, f"{lay.ref('id', 'e')} AS id", lock, key[2])
            return f"p{i} AS MATERIALIZED ({ranked})"

        # the UPDATE finds its rows by primary key from an array (an index probe per row,
        # whatever a prepared plan guesses of the claim's size), and takes only the rows it
        # can read (and, resuming, whose renewal budget is left): a row it leaves is stepped
        # over, as the row-by-row claim steps over it
        readable = f" AND {f.is_object('e.' + c['data'])}"
        for budget in key[0]:
            deadline = f"{sql.budget_since('e.' + c['state_entered_at'], 'e.' + c['run_after'])} + %(bud{n})s"
            expiry = f"LEAST({f.now_plus('ttl')}, {deadline})" if budget else f.now_plus("ttl")
            parts.append(pick(n, f" AND {lay.ref('lease_owner', 'e')} IS NULL"))
            sets = (
                f"{c['lease_owner']} = %(owner)s, {c['lease_token']} = e.{c['lease_token']} + 1, "
                f"{c['lease_expires_at']} = {expiry}"
            )
            spent = f" AND {deadline} > {f.now}" if budget else ""
            parts.append(
                f"u{n} AS (UPDATE {sql.E} AS e SET {sets} WHERE e.{c['id']} = ANY(ARRAY(SELECT id FROM p{n}))"
                f"{readable}{spent} RETURNING {sql.ret}, {n} AS part)"
            )
            parts.append(f"l{n} AS ({self._log_upsert_pg(f'u{n}', acquired=True)})")  # type: ignore[attr-defined]
            outs.append(f"SELECT * FROM u{n}")
            taken += f" + (SELECT count(*) FROM u{n})"
            n += 1
        hist = f"INSERT INTO {sql.H} ({sql.hist_cols})"
        for bump, timer in key[1]:
            parts.append(pick(n, ""))
            sets = (
                f"{c['state']} = %(tg{n})s, {c['version']} = e.{c['version']} + 1, {c['lease_owner']} = %(owner)s, "
                f"{c['lease_token']} = e.{c['lease_token']} + 1, {c['lease_expires_at']} = {f.now_plus('ttl')}, "
                f"{c['state_entered_at']} = {f.now}, {c['updated_at']} = {f.now}"
            )
            sets += "".join(f", {s}" for s in sql.timer_sets(timer))
            if bump:
                sets += f", {c['attempt']} = e.{c['attempt']} + 1, {c['reclaims']} = 0"
            parts.append(
                f"u{n} AS (UPDATE {sql.E} AS e SET {sets} WHERE e.{c['id']} = ANY(ARRAY(SELECT id FROM p{n}))"
                f"{readable} RETURNING {sql.ret}, {n} AS part)"
            )
            parts.append(
                f"h{n} AS ({hist} SELECT u{n}.id, u{n}.version, %(ev{n})s, %(st{n})s, %(tg{n})s, 'worker', "
                f"u{n}.lease_token, NULL, NULL, {f.now}, NULL, %(owner)s, NULL, u{n}.created_at FROM u{n})"
            )
            outs.append(f"SELECT * FROM u{n}")
            taken += f" + (SELECT count(*) FROM u{n})"
            n += 1
        found = cache[key] = f"WITH {', '.join(parts)} " + " UNION ALL ".join(outs)
        return found

    def _claim_params(self, request: ClaimRequest, now: datetime | None) -> dict[str, Any]:
        params: dict[str, Any] = {"kind": request.kind, "owner": request.owner, "limit": request.limit}
        self._time_params(params, now, request.ttl)
        if request.starve_after is not None:
            starve = request.starve_after
            params["starve"] = self._f.offset(now, -starve) if self._sqlite else starve
        if request.definition is not None:
            params["defn"] = request.definition
        n = 0
        for state in request.resumes:
            params[f"st{n}"] = state
            budget = request.budget_for(state)
            if budget is not None:
                params[f"bud{n}"] = self._f.interval(budget)
            n += 1
        for start in request.starts:
            params[f"st{n}"], params[f"tg{n}"], params[f"ev{n}"] = start.source, start.target, start.event
            n += 1
        return params

    def _claim_pg(self, request: ClaimRequest) -> list[Snapshot]:
        """PostgreSQL: the claim in one statement, its own transaction on the autocommit
        connection (inside the caller's, the joined cursor's savepoint)."""
        cur = self._conns.slot().cursor
        cur.execute(self._claim_pg_sql(request), self._claim_params(request, self._now()))
        return self._claimed_pg(cur.fetchall())

    def _claimed_pg(self, rows: list[Any]) -> list[Snapshot]:
        """The rows a PostgreSQL claim statement returned, as snapshots in the claim's order."""
        taken: list[tuple[int, Snapshot]] = []
        for row in rows:
            try:
                taken.append((row[AFTER_ENTITY], snapshot_of(row)))
            except MalformedRow as err:  # taken, but unreadable: its lease lapses, the reaper sees it
                log.warning("claim took a row it cannot decode: %s", err)
        return self._attach(_in_order(taken))

    # -- SQLite: a statement per state inside BEGIN IMMEDIATE ----------------------------

    def _claim_set(self, request: ClaimRequest) -> list[Snapshot]:
        """SQLite: per state one ``UPDATE .. WHERE id IN (pick) RETURNING``, then the history
        rows (or renewal log entries) of what it took, inside one ``BEGIN IMMEDIATE``.  A
        returned row that cannot be decoded undoes the claim, which then goes row by row
        (the row-by-row claim steps over it)."""
        now = self._now()
        assert now is not None  # SQLite's time is always this process's
        params = self._claim_params(request, now)
        slot = self._conns.slot()
        if not slot.conn.in_transaction and not self._claimable(slot.cursor, request, params):
            return []
        try:
            with SqliteWrite(slot, "fsm_claim") as cur:
                taken = self._sqlite_parts(cur, request, params, now)
        except MalformedRow as err:
            log.info("claim undone (%s); claiming row by row", err)
            return self._claim_each(request)
        return self._attach(_in_order(taken))

    def _sqlite_parts(
        self,
        cur: Any,
        request: ClaimRequest,
        params: dict[str, Any],
        now: datetime,
        given: list[list[str]] | None = None,
    ) -> list[tuple[int, Snapshot]]:
        """SQLite, inside the claim's write lock: per state (resumes, then starts) the
        update of its pick, then the history rows (or renewal log entries) of what it took.
        ``given``: the rows each state takes, picked already (a limited claim's admitted
        rows), instead of the pick."""
        taken: list[tuple[int, Snapshot]] = []
        starve = request.starve_after is not None
        picked = given is not None
        defined = request.definition is not None
        for n, state in enumerate(request.resumes):
            left = request.limit - len(taken)
            if left <= 0 or (given is not None and not given[n]):
                continue
            budget = request.budget_for(state) is not None
            sql, values = self._qmark(
                self._claim_sqlite_sql("resume", budget, starve=starve, given=picked, defined=defined)
            )
            ids = None if given is None else json.dumps(given[n])
            cur.execute(sql, values({**params, "state": state, "left": left, "bud": params.get(f"bud{n}"), "ids": ids}))
            got = [snapshot_of(r) for r in cur.fetchall()]
            if got:  # their renewal log entries, in one statement
                entries = [[snap.id, snap.lease_token, renewal_entry(snap, now, acquired=True)] for snap in got]
                log_sql, log_values = self._qmark(self._log_many_sql())  # type: ignore[attr-defined]
                cur.execute(
                    log_sql, log_values({"rows": json.dumps(entries, ensure_ascii=False), "now": params["now"]})
                )
            taken += [(n, s) for s in got]
        for n, start in enumerate(request.starts, len(request.resumes)):
            left = request.limit - len(taken)
            if left <= 0 or (given is not None and not given[n]):
                continue
            sql, values = self._qmark(
                self._claim_sqlite_sql("start", start.bump_attempt, start.timer, starve, given=picked, defined=defined)
            )
            ids = None if given is None else json.dumps(given[n])
            cur.execute(
                sql, values({**params, "state": start.source, "target": start.target, "left": left, "ids": ids})
            )
            got = [snapshot_of(r) for r in cur.fetchall()]
            if got:
                history = [
                    (s.id, s.version, start.event, start.source, start.target, "worker", s.lease_token,
                     None, None, params["now"], None, request.owner, None)
                    for s in got
                ]  # fmt: skip
                cur.execute(
                    self._history_sql(),  # type: ignore[attr-defined]
                    (json.dumps(history, ensure_ascii=False, separators=(",", ":")),),
                )
            taken += [(n, s) for s in got]
        return taken

    def _claimable(self, cur: Any, request: ClaimRequest, params: dict[str, Any]) -> bool:
        """SQLite: whether anything may be claimable now, read without the write lock.

        An idle worker polls; if every poll took ``BEGIN IMMEDIATE``, idle workers would
        hold the file's one write lock many times a second, and a live holder's keeper,
        queued behind them on ``busy_timeout`` (SQLite's busy handler is not fair), could
        miss its renewal on a loaded machine.  WAL readers never block the writer, so a
        read first costs a few microseconds and leaves the lock to the writers that have
        work.  It may say yes to a row another claimer takes first (the claim then takes
        nothing, as before) and no to a row committed just after it (the next poll or
        wake-up takes it): nothing is lost either way."""
        found: list[Any] = []
        defined = request.definition is not None
        for what, state in [*(("resume", s) for s in request.resumes), *(("start", s.source) for s in request.starts)]:
            sql, values = self._qmark(self._peek_sql(what, defined))
            cur.execute(sql, values({**params, "state": state}))
            found = cur.fetchall()  # all of it: SQLite ends the read at once
            if found:
                return True
        return False

    def _peek_sql(self, what: str, defined: bool = False) -> str:
        cache: dict[tuple[str, bool], str] | None = getattr(self, "_claim_peek_statements", None)
        if cache is None:
            cache = {}
            self._claim_peek_statements = cache
        found = cache.get((what, defined))
        if found is None:
            lay, sql = self._sql.L, self._sql
            kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
            where = f"{kind} = :kind AND NOT {deleted} AND {state} = :state AND {lay.ref('run_after', 'e')} <= :now"
            if what == "resume":
                where += f" AND {lay.ref('lease_owner', 'e')} IS NULL"
            if defined:
                where += sql.definition_pick("e")
            found = cache[(what, defined)] = f"SELECT 1 FROM {sql._indexed('claim')} WHERE {where} LIMIT 1"
        return found

    def _claim_sqlite_sql(
        self,
        what: str,
        flag: bool,
        timer: TimerMode = TimerMode.KEEP,
        starve: bool = False,
        given: bool = False,
        defined: bool = False,
    ) -> str:
        """SQLite: the update of one state's pick (``resume``: ``flag`` is a budget;
        ``start``: ``flag`` bumps ``attempt``, ``timer`` is what it does to the timer clock;
        ``starve``: the starvation rule's pick first; ``given``: the rows are the JSON array
        ``:ids``, picked already, and still in the state; ``defined``: only rows at the
        claimer's definition version ``:defn`` or below)."""
        cache: dict[tuple[str, bool, TimerMode, bool, bool, bool], str] | None = getattr(
            self, "_claim_sqlite_statements", None
        )
        if cache is None:
            cache = self._claim_sqlite_statements = {}
        shape = (what, flag, timer, starve, given, defined)
        found = cache.get(shape)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        c = lay.col
        kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
        due = lay.ref("run_after", "e")
        # the pick of the row-by-row claim; the rows it cannot read (or, resuming, whose
        # renewal budget is spent) are left by the update's own filter, stepped over
        where = f"{kind} = :kind AND NOT {deleted} AND {state} = :state AND {due} <= :now"
        if defined:
            where += sql.definition_pick("e")
        outer = f.is_object(c["data"])
        expiry = ":ttl"
        if what == "resume":
            where += f" AND {lay.ref('lease_owner', 'e')} IS NULL"
            sets = f"{c['lease_owner']} = :owner, {c['lease_token']} = {c['lease_token']} + 1"
            if flag:
                deadline = f.col_plus(sql.budget_since(c["state_entered_at"], c["run_after"]), "bud")
                outer += f" AND {deadline} > :now"
                expiry = f"min(:ttl, {deadline})"
            sets += f", {c['lease_expires_at']} = {expiry}"
        else:
            sets = (
                f"{c['state']} = :target, {c['version']} = {c['version']} + 1, {c['lease_owner']} = :owner, "
                f"{c['lease_token']} = {c['lease_token']} + 1, {c['lease_expires_at']} = :ttl, "
                f"{c['state_entered_at']} = :now, {c['updated_at']} = :now"
            )
            if flag:
                sets += f", {c['attempt']} = {c['attempt']} + 1, {c['reclaims']} = 0"
            sets += "".join(f", {s}" for s in sql.timer_sets(timer))
        pick = self._ranked(where, ":left", f"{lay.ref('id', 'e')} AS id", starve=starve)
        if given:  # the admitted rows, re-checked against the pick's filter (same write lock)
            ids = f.in_ids(lay.ref("id", "e"), "ids")
            pick = f"SELECT {lay.ref('id', 'e')} FROM {sql.E} AS e WHERE {where} AND {ids}"
        found = cache[shape] = f"UPDATE {sql.E} SET {sets} WHERE {c['id']} IN ({pick}) AND {outer} RETURNING {sql.ret}"
        return found

    # -- row by row (a bound table) ------------------------------------------------------

    def _claim_each(self, request: ClaimRequest) -> list[Snapshot]:
        """The pick, then each row through the store's own guarded writes, in one transaction."""
        return self._in_claim_transaction(self._claim_locked, request)

    def _in_claim_transaction(
        self, body: Callable[[Any, ClaimRequest], list[Snapshot]], request: ClaimRequest
    ) -> list[Snapshot]:
        """``body(cursor, request)`` in one transaction: SQLite's ``BEGIN IMMEDIATE`` (the
        write lock from the first read), PostgreSQL's on the claimer's connection."""
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._sqlite:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    claimed = body(cur, request)
                    cur.execute("COMMIT")
                except BaseException:
                    slot.conn.rollback()
                    raise
                return claimed
            with slot.conn.transaction():
                return body(cur, request)
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _claim_locked(self, cur: Any, request: ClaimRequest) -> list[Snapshot]:
        """Pick and take, resumes first (work already under way), then starts."""
        statements = self._claim_sql()
        claimed: list[Snapshot] = []
        picks: list[tuple[str, ClaimStart | None]] = [(s, None) for s in request.resumes]
        picks += [(s.source, s) for s in request.starts]
        for state, start in picks:
            left = request.limit - len(claimed)
            if left <= 0:
                break
            params = {"kind": request.kind, "state": state, "limit": left}
            now = self._now()
            self._time_params(params, now, None)
            mark = ""
            if request.starve_after is not None:
                mark = "+starve"
                params["starve"] = self._f.offset(now, -request.starve_after) if self._sqlite else request.starve_after
            if request.definition is not None:
                mark += "+def"
                params["defn"] = request.definition
            cur.execute(statements[("resume" if start is None else "start") + mark], params)
            for entity_id, _, version, _ in cur.fetchall():
                taken = self._take(entity_id, state, version, start, request)
                if taken is not None:
                    claimed.append(taken)
        return claimed

    def _take(
        self, entity_id: str, state: str, version: int, start: ClaimStart | None, request: ClaimRequest
    ) -> Snapshot | None:
        try:
            if start is not None:
                snap: Snapshot = self.apply(request.start_write(start, entity_id, version))[0]  # type: ignore[attr-defined]
                return snap
            taken: Snapshot = self.acquire_lease(  # type: ignore[attr-defined]
                entity_id,
                owner=request.owner,
                ttl=request.ttl,
                budget=request.budget_for(state),
                expect_version=version,
            )
            return taken
        except MalformedRow as err:
            log.warning("claim stepped over a malformed row: %s", err)
        except (LeaseLost, StaleVersion):
            pass  # a spent budget (the reaper will fail it), or moved under a weaker lock
        return None

    def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        """See :meth:`stores.Store.entities`.  A row that cannot be decoded is left out (and
        logged); :meth:`count_states` still counts it."""
        check_listing(kind, state, limit, after_id)
        lay, f = self._sql.L, self._f
        sql = self._claim_sql()["list"]
        params: dict[str, Any] = {"kind": kind, "limit": limit}
        if state is not None:
            sql += f" AND {lay.ref('state', 'e')} = {f.p('state')}"
            params["state"] = state
        if after_id is not None:
            sql += f" AND {lay.ref('id', 'e')} > {f.p('after')}"
            params["after"] = after_id
        sql += f" ORDER BY {lay.ref('id', 'e')} LIMIT {f.p('limit')}"
        found = []
        for row in self._run(sql, params):
            try:
                found.append(snapshot_of(row))
            except MalformedRow as err:
                log.warning("listing left out a malformed row: %s", err)
        return self._attach(found)

    def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        """See :meth:`stores.Store.children`: a range of the ``parent`` index."""
        check_children_args(parent_id, limit, after_id)
        lay, f, sql = self._sql.L, self._f, self._sql
        statement = f"SELECT {sql.cols_e} FROM {sql.E} AS e WHERE {lay.ref('parent_id', 'e')} = {f.p('parent')} "
        statement += f"AND NOT {lay.ref('deleted', 'e')}"
        params: dict[str, Any] = {"parent": parent_id, "limit": limit}
        if after_id is not None:
            statement += f" AND {lay.ref('id', 'e')} > {f.p('after')}"
            params["after"] = after_id
        statement += f" ORDER BY {lay.ref('id', 'e')} LIMIT {f.p('limit')}"
        found = []
        for row in self._run(statement, params):
            try:
                found.append(snapshot_of(row))
            except MalformedRow as err:
                log.warning("listing left out a malformed row: %s", err)
        return self._attach(found)

    def count_states(self, kind: str) -> dict[str, int]:
        """See :meth:`stores.Store.count_states`."""
        rows = self._run(self._claim_sql()["count"], {"kind": check_id("kind", kind)})
        return {str(s): int(n) for s, n in rows}


def _in_order(taken: list[tuple[int, Snapshot]]) -> list[Snapshot]:
    """Claimed rows in the claim's order: by state (resumes first), then the longest due
    (then id: a statement returns its rows in no promised order)."""
    far = datetime.max.replace(tzinfo=UTC)
    taken.sort(key=lambda t: (t[0], -t[1].priority, t[1].run_after or far, t[1].id))
    return [snap for _, snap in taken]


__all__ = ["ClaimOps"]
