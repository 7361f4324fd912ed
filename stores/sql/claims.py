"""Claiming and listing on SQL: workers take the oldest claimable entities.

A claim is one transaction on the calling thread's connection: for each claimable state
(resumes first: work already under way; then starts) it selects the rows due the longest
(``run_after <= now``, in ``run_after`` order, walking the ``claim`` index) and locks
them (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so concurrent claimers divide the rows
instead of waiting for each other; SQLite: ``BEGIN IMMEDIATE`` takes the write lock
first, so claimers queue), then starts each one through the store's
own guarded ``apply`` (a transition with its history row) or takes its lease through
``acquire_lease`` (a reclaimed finalizer).  Every write keeps its compare-and-set, so even
a claimer that raced past the lock could not take an entity twice.
"""

from __future__ import annotations

import logging
from typing import Any

from fsm.errors import LeaseLost, MalformedRow, StaleVersion
from fsm.limits import check_claim_request, check_id, check_listing
from fsm.records import ClaimRequest, ClaimStart, Snapshot
from stores.sql.connections import unavailable
from stores.sql.core import SqlCore
from stores.sql.rows import snapshot_of

log = logging.getLogger("fsm.store")


class ClaimOps(SqlCore):
    """``claim``, ``entities`` and ``count_states`` of :class:`stores.sql.SqlStore`."""

    def _claim_sql(self) -> dict[str, str]:
        found: dict[str, str] | None = getattr(self, "_claim_statements", None)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
        live = f"{kind} = {f.p('kind')} AND NOT {deleted}"
        lock = " FOR UPDATE SKIP LOCKED" if f.name == "postgresql" else ""
        # one state at a time, due the longest first: a range scan on the (kind, state,
        # run_after) index up to now that stops after ``limit`` unlocked rows, so a claim
        # costs the same whatever the backlog, and a row not yet due is never looked at.
        # Ordered by the due time alone, the index order: a tie-break on id would sort.
        due = lay.ref("run_after", "e")
        pick = (
            f"SELECT {lay.ref('id', 'e')}, {state}, {lay.ref('version', 'e')} FROM {sql._indexed('claim')} "
            f"WHERE {live} AND {state} = {f.p('state')} AND {due} <= {f.now}"
        )
        order = f" ORDER BY {due} LIMIT {f.p('limit')}{lock}"
        found = {
            "start": pick + order,
            "resume": pick + f" AND {lay.ref('lease_owner', 'e')} IS NULL" + order,
            "list": f"SELECT {sql.cols_e} FROM {sql.E} AS e WHERE {live}",
            "count": f"SELECT {state}, COUNT(*) FROM {sql.E} AS e WHERE {live} GROUP BY {state}",
        }
        self._claim_statements = found
        return found

    def claim(self, request: ClaimRequest) -> list[Snapshot]:
        """See :meth:`stores.Store.claim`."""
        check_claim_request(request)
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._sqlite:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    claimed = self._claim_locked(cur, request)
                    cur.execute("COMMIT")
                except BaseException:
                    slot.conn.rollback()
                    raise
                return claimed
            with slot.conn.transaction():
                return self._claim_locked(cur, request)
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
            self._time_params(params, self._now(), None)
            cur.execute(statements["resume" if start is None else "start"], params)
            for entity_id, _, version in cur.fetchall():
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

    def count_states(self, kind: str) -> dict[str, int]:
        """See :meth:`stores.Store.count_states`."""
        rows = self._run(self._claim_sql()["count"], {"kind": check_id("kind", kind)})
        return {str(s): int(n) for s, n in rows}


__all__ = ["ClaimOps"]
