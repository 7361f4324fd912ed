"""What happened lately, and who holds what: the charts' data and the holders table.

Neither may scan the store.  History has no time index (one would cost every transition a
write), so the charts are read off a bounded **sample**: the entities changed in the last
hour, newest first, at most :data:`SAMPLE` of them (walks of the ``(kind, state,
updated_at)`` index, one per pair), and their history rows of that hour (primary key
lookups).  While fewer than :data:`SAMPLE` entities changed in the hour, that is every
transition of the hour; past it the page says the charts cover the newest ones.  From it:
transitions, claims (the lease-taking starts) and reaper moves per minute, and the median
claim latency per minute, counted as the ``fsm.claim.latency`` metric counts a start
(:func:`fsm.observe.hooks.claim_latency`): the start's time minus the time its entity
became **due**, its ``run_after`` (a delayed job's due time, a retry's end of backoff, the
creation otherwise; a requeue keeps it), not the transition before the start, which would
count a delay or a backoff as waiting for a worker.  The row keeps only its latest
``run_after``: a start it was not set for (a later retry set it again, so it is later than
that start) has no due time left to count from, and is left out of the median.

The holders table walks the lease index: rows with a lease, grouped by owner, with the
last renewal logged for what each holds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fsm.records import RENEWALS_KEY
from stores.sql.schema import decode_time

SAMPLE = 2000
"""Entities the charts sample at most (the newest changed in the window)."""
WINDOW = timedelta(minutes=60)
HOLDER_ROWS = 10_000
"""Leased rows the holders table reads at most."""


@dataclass(frozen=True)
class Move:
    """One reaper transition (from history)."""

    entity_id: str
    kind: str
    event: str
    source: str
    target: str
    reason: str | None
    at: datetime


@dataclass
class Activity:
    """Per-minute series over the window ending at ``now`` (index 0 is the oldest minute)."""

    now: datetime
    minutes: int
    sampled: int = 0
    capped: bool = False
    transitions: list[int] = field(default_factory=list)
    claims: list[int] = field(default_factory=list)
    reaper: list[int] = field(default_factory=list)
    latency: list[float | None] = field(default_factory=list)
    """Median claim latency (seconds, from the due time) of each minute's claims whose due
    time is known (:func:`claim_wait`); ``None`` when none."""
    moves: list[Move] = field(default_factory=list)
    """The reaper's moves in the sample, newest first."""


@dataclass(frozen=True)
class Holder:
    """An owner with live or lapsed leases."""

    owner: str
    held: int
    ids: list[str]
    soonest: datetime
    latest: datetime
    last_renewal: datetime | None
    expired: int
    all_ids: tuple[str, ...] = ()
    """Every entity it holds (read), soonest expiry first: the holder filter's rows."""


def claim_wait(started_at: datetime, run_after: datetime) -> float | None:
    """Seconds a start waited for a worker once due, as :func:`fsm.observe.hooks.claim_latency`
    counts a start: from the row's ``run_after`` (the store reads a row without one as due
    since its creation, as the metric's first attempt counts) to the start's commit, at
    least 0.  ``None`` when ``run_after`` is later than the start: a due time set after it
    (a retry's backoff), so the one this start had is gone.

    A due-setting write (a create, a retry) sets ``run_after`` to its own time or later,
    and a requeue or release keeps it; so a ``run_after`` no later than a start is the one
    that start was claimed under."""
    if run_after > started_at + timedelta(milliseconds=1):  # the stores' clocks round to microseconds
        return None
    return max(0.0, (started_at - run_after).total_seconds())


class ActivitySql:
    """The sample's and the holders' reads over one store."""

    def __init__(self, store: Any, live: str, base_params: dict[str, Any], claim_events: dict[str, set[str]]) -> None:
        self.store = store
        sql = store._sql
        self.lay, self.f, self.E, self.H = sql.L, store._f, sql.E, sql.H
        self.live = live
        self.base = base_params
        self.claim_events = claim_events

    def ref(self, name: str) -> str:
        return str(self.lay.ref(name, "e"))

    def _walks(self, pairs: list[tuple[str, str]], params: dict[str, Any], cols: str, where: str, order: str) -> str:
        p, ref = self.f.p, self.ref
        parts = []
        for i, (kind, state) in enumerate(pairs):
            params[f"k{i}"], params[f"s{i}"] = kind, state
            parts.append(
                f"SELECT * FROM (SELECT {cols} FROM {self.E} AS e WHERE {ref('kind')} = {p(f'k{i}')} "
                f"AND {ref('state')} = {p(f's{i}')} AND {self.live}{where} ORDER BY {order} LIMIT {p('cap')}) AS p{i}"
            )
        return " UNION ALL ".join(parts)

    def activity(self, pairs: list[tuple[str, str]], now: datetime) -> Activity:
        minutes = int(WINDOW.total_seconds() // 60)
        found = Activity(now, minutes, transitions=[0] * minutes, claims=[0] * minutes, reaper=[0] * minutes)
        found.latency = [None] * minutes
        if not pairs:
            return found
        p, ref = self.f.p, self.ref
        since = now - WINDOW
        params: dict[str, Any] = {**self.base, "since": self.f.time(since), "cap": SAMPLE}
        walks = self._walks(
            pairs,
            params,
            f"{ref('id')} AS fsm_i, {ref('kind')} AS fsm_k, {ref('created_at')} AS fsm_c, "
            f"{ref('updated_at')} AS fsm_u, {ref('run_after')} AS fsm_r",
            f" AND {ref('updated_at')} >= {p('since')}",
            f"{ref('updated_at')} DESC",
        )
        sampled = self.store._run(f"SELECT * FROM ({walks}) AS m ORDER BY fsm_u DESC LIMIT {p('cap')}", params)
        found.sampled, found.capped = len(sampled), len(sampled) >= SAMPLE
        if not sampled:
            return found
        kinds = {str(r[0]): str(r[1]) for r in sampled}
        due = {str(r[0]): decode_time(r[4]) if r[4] is not None else decode_time(r[2]) for r in sampled}
        rows = self.store._run(
            f"SELECT h.entity_id, h.seq, h.event, h.source, h.target, h.actor, h.reason, h.at FROM {self.H} AS h "
            f"WHERE {self.f.in_ids('h.entity_id', 'ids')} ORDER BY h.entity_id, h.seq",
            {"ids": self.f.ids(list(kinds))},
        )
        buckets: dict[int, list[float]] = defaultdict(list)
        for entity_id, _seq, event, source, target, actor, reason, at_raw in rows:
            at = decode_time(at_raw)
            if at < since or at > now + timedelta(seconds=5):
                continue
            minute = min(minutes - 1, int((at - since).total_seconds() // 60))
            found.transitions[minute] += 1
            kind = kinds.get(entity_id, "")
            if actor == "reaper":
                found.reaper[minute] += 1
                found.moves.append(Move(entity_id, kind, event, source, target, reason, at))
            if event in self.claim_events.get(kind, ()):
                found.claims[minute] += 1
                waited = claim_wait(at, due[entity_id])
                if waited is not None:
                    buckets[minute].append(waited)
        for minute, waits in buckets.items():
            found.latency[minute] = statistics.median(waits)
        found.moves.sort(key=lambda m: (m.at, m.entity_id), reverse=True)
        return found

    def holders(self, pairs: list[tuple[str, str]], limit: int = 50) -> list[Holder]:
        """Owners holding leases (lapsed ones too, counted apart), most held first; the last
        renewal is looked up for the first ``limit`` owners."""
        if not pairs:
            return []
        p, ref = self.f.p, self.ref
        params: dict[str, Any] = {**self.base, "cap": HOLDER_ROWS}
        now = self.store._now()
        if now is not None:
            params["now"] = self.f.time(now)
        exp = ref("lease_expires_at")
        walks = self._walks(
            pairs,
            params,
            f"{ref('lease_owner')} AS fsm_o, {ref('id')} AS fsm_i, {exp} AS fsm_x, "
            f"CASE WHEN {exp} < {self.f.now} THEN 1 ELSE 0 END AS fsm_d",
            f" AND {ref('lease_owner')} IS NOT NULL AND {exp} IS NOT NULL",
            f"{exp}",
        )
        rows = self.store._run(f"SELECT * FROM ({walks}) AS m", params)
        by_owner: dict[str, list[tuple[str, datetime, int]]] = defaultdict(list)
        for owner, entity_id, expires, lapsed in rows:
            by_owner[str(owner)].append((str(entity_id), decode_time(expires), int(lapsed)))
        ranked = sorted(by_owner.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        shown = [e for _, held in ranked[:limit] for e, _, _ in held[:20]]
        renewed: dict[str, datetime] = {}
        if shown:
            for entity_id, at in self.store._run(
                f"SELECT entity_id, recorded_at FROM {self.store._sql.L.effects} WHERE key = {p('key')} "
                f"AND {self.f.in_ids('entity_id', 'ids')}",
                {"key": RENEWALS_KEY, "ids": self.f.ids(shown)},
            ):
                if at is not None:
                    renewed[str(entity_id)] = decode_time(at)
        found = []
        for owner, held in ranked:
            times = [renewed[e] for e, _, _ in held if e in renewed]
            found.append(
                Holder(
                    owner,
                    len(held),
                    [e for e, _, _ in held[:5]],
                    min(x for _, x, _ in held),
                    max(x for _, x, _ in held),
                    max(times) if times else None,
                    sum(d for _, _, d in held),
                    tuple(e for e, _, _ in sorted(held, key=lambda h: (h[1], h[0]))),
                )
            )
        return found


__all__ = ["SAMPLE", "WINDOW", "Activity", "ActivitySql", "Holder", "Move", "claim_wait"]
