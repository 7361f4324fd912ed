"""Claims with limits on SQL: concurrency per key and in all, rates per key and in all.

One transaction (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a transaction on the claimer's
connection):

1. count the live leases in the leased states, per key (one range of the ``lease`` index
   per state: as many rows as there are live leases, whatever the backlog);
2. pick candidates in the claim's order (:meth:`stores.sql.claims.ClaimOps._ranked`,
   index walks, no sort), stepping over the rows of keys already full, a few more than
   the claim may take (``FOR UPDATE SKIP LOCKED`` on PostgreSQL);
3. PostgreSQL: take the lifecycle's advisory transaction lock when it counts in all (a
   wait: such claims go one at a time), and *try* one per candidate key (never a wait:
   a key another claimer holds is its to serve, and its rows are left for the next
   claim), then count again in a new snapshot: every claim that held a lock before has
   committed and is counted, so two claimers never both take a key's last slot.  SQLite
   has one writer at a time: its counts are exact already;
4. count the starts inside each rate window (the ``starts`` table);
5. admit candidates in order while every count stays under its limit
   (:class:`stores.gate.ClaimGate`) and take the admitted rows with the same guarded
   writes as any claim (PostgreSQL: the claim's own statement over the admitted ids;
   SQLite: row by row), then record the starts a rate counts.

The rows picked but not admitted are left as they were (their locks end with the
transaction).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fsm.limits import check_slots_args
from fsm.records import ClaimLimits, ClaimRequest, ClaimStart, Snapshot
from stores.gate import ALL, ClaimGate
from stores.sql.claims import _in_order
from stores.sql.core import SqlCore

log = logging.getLogger("fsm.store")

OVERPICK = 4
"""Candidates a limited claim picks per slot it may take: rows of a full key are stepped
over, so a few more than the slots keep the claim full when keys crowd the line."""
MAX_PICK = 1000


def _counted(rows: Any) -> tuple[dict[str, int], int]:
    """``(key, count)`` rows as the counts per key and their total."""
    held: dict[str, int] = {}
    total = 0
    for key, n in rows:
        total += int(n)
        if key is not None:
            held[str(key)] = int(n)
    return held, total


def lock_id(text: str) -> int:
    """A signed 64-bit advisory lock id for ``text``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


class LimitedClaimOps(SqlCore):
    """``claim`` with :class:`~fsm.records.ClaimLimits` (see the module doc)."""

    table_prefix: str

    def _claim_limited(self, request: ClaimRequest) -> list[Snapshot]:
        claimed: list[Snapshot] = self._in_claim_transaction(self._limited_locked, request)  # type: ignore[attr-defined]
        return claimed

    def _limited_locked(self, cur: Any, request: ClaimRequest) -> list[Snapshot]:
        limits = request.limits
        assert limits is not None
        now = self._now()
        params: dict[str, Any] = {"kind": request.kind}
        self._time_params(params, now, None)
        held, held_all, candidates = self._held_and_candidates(cur, request, now)
        gate = ClaimGate(limits, held, held_all, {}, 0)
        if gate.full() or not candidates:
            return []
        keys = sorted({key for _, _, _, key, _ in candidates if key is not None}) if limits.keyed else []
        if not self._sqlite:  # lock, then count again in a new snapshot (see the module doc)
            keys = self._lock_keys(cur, request, gate, candidates)
            candidates = [c for c in candidates if c[3] is None or not limits.keyed or c[3] in keys]
            held, held_all = self._held(cur, limits, params)
        started, started_all = self._started(cur, request.kind, limits, keys, now)
        gate = ClaimGate(limits, held, held_all, started, started_all)
        admitted: list[tuple[str, str, int, str | None, ClaimStart | None]] = []
        for candidate in candidates:
            if len(admitted) >= request.limit:
                break
            if gate.admit(candidate[3], candidate[4] is not None):
                admitted.append(candidate)
        claimed = self._take_admitted(cur, request, admitted, now)
        if limits.rate is not None or limits.key_rate is not None:
            started_keys = {c[0]: c[3] for c in admitted if c[4] is not None}  # starts, not resumes
            starts: list[str] = []
            for snap in claimed:
                if snap.id in started_keys:
                    key = started_keys[snap.id]
                    starts += [ALL] if key is None else [ALL, key]
            if starts:
                self._record_starts(cur, request.kind, limits, starts, now)
        return claimed

    def _lock_keys(
        self,
        cur: Any,
        request: ClaimRequest,
        stale: ClaimGate,
        candidates: list[tuple[str, str, int, str | None, ClaimStart | None]],
    ) -> list[str]:
        """PostgreSQL: the lifecycle's lock (waited for) when it counts in all, then a try
        of the keys' locks, the oldest candidate's key first, only as many keys as the
        claim may fill its limit with (by the counts read before the locks): claimers
        that pick at once then share the keys instead of the first one holding them all.
        Returns the keys this claim holds."""
        limits, kind = stale.limits, request.kind
        if limits.total is not None or limits.rate is not None:
            cur.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": lock_id(f"{self.table_prefix}claim:{kind}")})
            cur.fetchall()
        if not limits.keyed:
            return []
        gate = ClaimGate(limits, stale.held, stale.held_all, {}, 0)
        gate.held_all, gate.limits = 0, ClaimLimits(limits.leased, per_key=limits.per_key)  # per key only
        worth: dict[str | None, int] = {}  # what each key may add, in the order of its oldest candidate
        for _, _, _, key, _ in candidates:
            worth.setdefault(key, 0)
            if gate.admit(key, False):
                worth[key] += 1
        have = worth.pop(None, 0)
        order = [(k, n) for k, n in worth.items() if k is not None and n > 0]
        locked: list[str] = []
        missed: list[tuple[str, int]] = []
        while order and have < request.limit:
            take, need = [], request.limit - have
            while order and need > 0:
                key, n = order.pop(0)
                take.append((key, n))
                need -= n
            ids = {lock_id(f"{self.table_prefix}claim:{kind}:{key}"): (key, n) for key, n in take}
            cur.execute(
                "SELECT k FROM unnest(CAST(%(locks)s AS bigint[])) AS t(k) WHERE pg_try_advisory_xact_lock(k)",
                {"locks": list(ids)},
            )
            got = {k for (k,) in cur.fetchall()}
            for k, (key, n) in ids.items():
                if k in got:
                    locked.append(key)
                    have += n
                else:
                    missed.append((key, n))
        if not locked and missed:
            # every key this claim could fill is another claimer's right now: wait for the
            # first one (its holder commits within a statement or two) rather than come
            # back empty while rows are due.  Holding no key lock while it waits, this
            # claim closes no cycle of waits.
            key = missed[0][0]
            cur.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": lock_id(f"{self.table_prefix}claim:{kind}:{key}")})
            cur.fetchall()
            locked.append(key)
        return locked

    def _take_admitted(
        self,
        cur: Any,
        request: ClaimRequest,
        admitted: list[tuple[str, str, int, str | None, ClaimStart | None]],
        now: datetime | None,
    ) -> list[Snapshot]:
        """Take the admitted rows with the claim's own guarded writes."""
        if not admitted:
            return []
        # the claim's own statements over the admitted ids, one array per state in the
        # claim's order (resumes, then starts), with the claim's time: the history rows
        # say when the limits were counted
        parts = [*request.resumes, *(s.source for s in request.starts)]
        params = self._claim_params(request, now)  # type: ignore[attr-defined]
        given = [[c[0] for c in admitted if c[1] == state] for state in parts]
        if self._sqlite:
            assert now is not None  # SQLite's time is always this process's
            taken = self._sqlite_parts(cur, request, params, now, given)  # type: ignore[attr-defined]
            return list(self._attach(_in_order(taken)))
        for n, ids in enumerate(given):
            params[f"ids{n}"] = ids
        cur.execute(self._claim_pg_sql(request, given=True), params)  # type: ignore[attr-defined]
        rows = cur.fetchall()
        return list(self._claimed_pg(rows))  # type: ignore[attr-defined]

    def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int:
        """See :meth:`stores.Store.slots`: the limited claim's own count."""
        check_slots_args(kind, leased, key)
        params: dict[str, Any] = {"kind": kind, **{f"ls{i}": s for i, s in enumerate(leased)}}
        self._time_params(params, self._now(), None)
        held, total = _counted(self._run(self._held_sql(len(leased)), params))  # one autocommit read
        return total if key is None else held.get(key, 0)

    def _held(self, cur: Any, limits: ClaimLimits, params: dict[str, Any]) -> tuple[dict[str, int], int]:
        """Live leases in the leased states: per key, and in all.  Live as a holder's
        write sees it: ``lease_expires_at >= now`` (:meth:`fsm.records.Lease.is_fresh`)."""
        cur.execute(
            self._held_sql(len(limits.leased)), {**params, **{f"ls{i}": s for i, s in enumerate(limits.leased)}}
        )
        return _counted(cur.fetchall())

    def _held_sql(self, states: int) -> str:
        """Live leases per key in ``states`` leased states (parameters ``ls0``...)."""
        key = ("held", states)
        found: str | None = self._sql._shapes.get(key)
        if found is None:
            lay, f, sql = self._sql.L, self._f, self._sql
            marks = ", ".join(f.p(f"ls{i}") for i in range(states))
            found = self._sql._shapes[key] = (
                f"SELECT {lay.ref('concurrency_key', 'e')}, COUNT(*) FROM {sql._indexed('lease')} "
                f"WHERE {lay.ref('kind', 'e')} = {f.p('kind')} AND {lay.ref('state', 'e')} IN ({marks}) "
                f"AND {lay.ref('lease_expires_at', 'e')} >= {f.now} AND NOT {lay.ref('deleted', 'e')} "
                f"GROUP BY {lay.ref('concurrency_key', 'e')}"
            )
        return found

    def _held_and_candidates(
        self, cur: Any, request: ClaimRequest, now: datetime | None
    ) -> tuple[dict[str, int], int, list[tuple[str, str, int, str | None, ClaimStart | None]]]:
        """One statement: the live leases per key (as :meth:`_held` counts them), and the
        candidates in the claim's order (each state's pick, resumes first), stepping over
        the rows of keys already full, at most ``OVERPICK`` times the claim's limit (of the rows
        at the default priority: raised and lowered ones, at most the claim's limit)."""
        limits = request.limits
        assert limits is not None
        f = self._f
        params: dict[str, Any] = {
            "kind": request.kind,
            "limit": min(MAX_PICK, request.limit * OVERPICK),
            "raised": request.limit,
        }
        self._time_params(params, now, None)
        params.update({f"ls{i}": s for i, s in enumerate(limits.leased)})
        parts = [*request.resumes, *(s.source for s in request.starts)]
        params.update({f"st{i}": s for i, s in enumerate(parts)})
        if limits.per_key is not None:
            params["per_key"] = limits.per_key
        if request.starve_after is not None:
            params["starve"] = f.offset(now, -request.starve_after) if self._sqlite else request.starve_after
        if request.definition is not None:
            params["defn"] = request.definition
        cur.execute(self._held_and_candidates_sql(request), params)
        held: dict[str, int] = {}
        total = 0
        starts: list[ClaimStart | None] = [*(None for _ in request.resumes), *request.starts]
        found: list[tuple[str, str, int, str | None, ClaimStart | None]] = []
        seen: set[str] = set()
        for part, entity_id, state, number, key in cur.fetchall():
            if part < 0:  # a key's live leases
                total += int(number)
                if key is not None:
                    held[str(key)] = int(number)
            elif entity_id not in seen:
                seen.add(entity_id)
                found.append((entity_id, state, int(number), key, starts[int(part)]))
        return held, total, found

    def _held_and_candidates_sql(self, request: ClaimRequest) -> str:
        limits = request.limits
        assert limits is not None
        key = (
            "held+candidates",
            len(request.resumes),
            len(request.starts),
            len(limits.leased),
            limits.per_key is not None,
            request.starve_after is not None,
            request.definition is not None,
        )
        cache = self._sql._shapes
        found: str | None = cache.get(key)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        kind, state, deleted = lay.ref("kind", "e"), lay.ref("state", "e"), lay.ref("deleted", "e")
        ck = lay.ref("concurrency_key", "e")
        marks = ", ".join(f.p(f"ls{i}") for i in range(len(limits.leased)))
        held = (
            f"SELECT {ck} AS ck, COUNT(*) AS n FROM {sql._indexed('lease')} "
            f"WHERE {kind} = {f.p('kind')} AND {state} IN ({marks}) "
            f"AND {lay.ref('lease_expires_at', 'e')} >= {f.now} AND NOT {deleted} GROUP BY {ck}"
        )
        ctes = [f"held AS ({held})"]
        skip = ""
        if limits.per_key is not None:
            ctes.append(f"full_keys AS (SELECT ck FROM held WHERE ck IS NOT NULL AND n >= {f.p('per_key')})")
            skip = f" AND ({ck} IS NULL OR {ck} NOT IN (SELECT ck FROM full_keys))"
        what = f"{lay.ref('id', 'e')} AS id, {state} AS state, {lay.ref('version', 'e')} AS version, {ck} AS ck"
        lock = "" if self._sqlite else "FOR UPDATE OF e SKIP LOCKED"
        starve = request.starve_after is not None
        free = f" AND {lay.ref('lease_owner', 'e')} IS NULL"
        picks = []
        for i in range(len(request.resumes) + len(request.starts)):
            where = f"{kind} = {f.p('kind')} AND NOT {deleted} AND {state} = {f.p(f'st{i}')} "
            where += f"AND {lay.ref('run_after', 'e')} <= {f.now}{skip}"
            if i < len(request.resumes):
                where += free
            if key[6]:  # a claimer's definition version: rows at it or below
                where += sql.definition_pick("e")
            ranked = self._ranked(where, f.p("limit"), what, lock, starve, f.p("raised"))  # type: ignore[attr-defined]
            picks.append(f"SELECT {i} AS part, c{i}.* FROM ({ranked}) AS c{i}")
        candidates = f"SELECT * FROM ({' UNION ALL '.join(picks)}) AS c LIMIT {f.p('limit')}"
        found = cache[key] = (
            f"WITH {', '.join(ctes)} SELECT * FROM ({candidates}) AS picked "
            f"UNION ALL SELECT -1, NULL, NULL, n, ck FROM held"
        )
        return found

    def _started(
        self, cur: Any, kind: str, limits: ClaimLimits, keys: Sequence[str], now: datetime | None
    ) -> tuple[dict[str, int], int]:
        """Starts inside each rate window: per key, and of the lifecycle."""
        f, starts = self._f, self._sql.L.starts
        started: dict[str, int] = {}
        total = 0
        for rate, wanted in ((limits.rate, [ALL]), (limits.key_rate, list(keys))):
            if rate is None or not wanted:
                continue
            params: dict[str, Any] = {"kind": kind, "keys": f.ids(wanted)}
            self._time_params(params, now, None)
            params["cut"] = f.offset(now, -rate[1]) if self._sqlite else rate[1]
            cur.execute(
                f"SELECT key, COUNT(*) FROM {starts} WHERE kind = {f.p('kind')} AND {f.in_ids('key', 'keys')} "
                f"AND at > {f.now_minus('cut')} GROUP BY key",
                params,
            )
            for key, n in cur.fetchall():
                if key == ALL:
                    total = int(n)
                else:
                    started[str(key)] = int(n)
        return started, total

    def _record_starts(
        self, cur: Any, kind: str, limits: ClaimLimits, keys: Sequence[str], now: datetime | None
    ) -> None:
        """The starts of this claim, and the ones their windows no longer count forgotten."""
        f, starts = self._f, self._sql.L.starts
        counted = [k for k in keys if (k == ALL and limits.rate) or (k != ALL and limits.key_rate)]
        if not counted:
            return
        params: dict[str, Any] = {"kind": kind, "keys": f.ids(counted)}
        self._time_params(params, now, None)
        if self._sqlite:
            cur.execute(f"INSERT INTO {starts} (kind, key, at) SELECT :kind, value, :now FROM json_each(:keys)", params)
        else:
            cur.execute(
                f"INSERT INTO {starts} (kind, key, at) "
                f"SELECT %(kind)s, k, {f.now} FROM unnest(%(keys)s::text[]) AS t(k)",
                params,
            )
        for rate, which in ((limits.rate, [ALL]), (limits.key_rate, sorted({k for k in counted if k != ALL}))):
            if rate is None or not which:
                continue
            old = {"kind": kind, "keys": f.ids(which)}
            self._time_params(old, now, None)
            old["cut"] = f.offset(now, -rate[1]) if self._sqlite else rate[1]
            cur.execute(
                f"DELETE FROM {starts} WHERE kind = {f.p('kind')} AND {f.in_ids('key', 'keys')} "
                f"AND at <= {f.now_minus('cut')}",
                old,
            )


__all__ = ["LimitedClaimOps", "lock_id"]
