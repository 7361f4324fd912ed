"""What the inspector reads: counts, filtered entity lists, one entity's story, the reaper's
recent moves, the stored schedules.  Read-only SQL over the store's own tables (names from
its layout), every value a bound parameter; the rows decode through the store's own decoders.

The reserved rows the reaper keeps (its leader leases ``fsm.leader``, its tick log
``fsm.reaper``) and the stored schedules (``fsm.schedule``) are not entities of a
lifecycle: every listing, count and chart leaves them out (the ``live`` predicate); the
schedules have a section of their own (:meth:`InspectorData.schedules`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fsm.engine.later import LATER_KIND_PREFIX
from fsm.errors import FsmError, MalformedRow
from fsm.inspect.activity import Activity, ActivitySql, Holder
from fsm.inspect.cache import Cached, Recomputed
from fsm.inspect.listing import Listed, ListingSql
from fsm.limits import text_problem
from fsm.records import PROGRESS_KEY, RENEWALS_KEPT, RENEWALS_KEY, EffectRecord, HistoryRecord, LeaseRenewal, Snapshot
from fsm.scheduling.service import ACTIVE as SCHEDULE_ACTIVE
from fsm.scheduling.service import PAUSED as SCHEDULE_PAUSED
from fsm.scheduling.service import SCHEDULE_KIND, schedule_row_id
from stores.ledger import renewals_of
from stores.sql import SqlStore
from stores.sql.rows import history_of
from stores.sql.schema import HISTORY_COLUMNS, decode_time

LEADER_KIND = "fsm.leader"
TICKS_KIND = "fsm.reaper"
TICKS_ID = "fsm-reaper-ticks"
MAX_ROWS = 500
RESERVED_KINDS = (LEADER_KIND, TICKS_KIND, SCHEDULE_KIND)
"""The kinds of the rows no listing, count or chart shows (none is a lifecycle's entity)."""
SCHEDULES_SHOWN = 100
"""Schedules the overview lists at most, per state (active, paused): schedules are few."""


class BadInput(FsmError, ValueError):
    """A query parameter the inspector cannot use (the page answers 400 with this message)."""


def check_param(name: str, value: str, *, limit: int = 255) -> str:
    """``value`` if it can be a bound parameter on every store (no NUL, no lone surrogate,
    at most ``limit`` characters), else :class:`BadInput` naming ``name``."""
    problem = text_problem(value, limit=limit, empty=True)
    if problem is not None:
        raise BadInput(f"{name} {problem}")
    return value


@dataclass(frozen=True)
class Filters:
    """The entity table's filters, from the query string (each optional)."""

    kind: str = ""
    state: str = ""
    text: str = ""
    """A prefix of the id (``q``)."""
    holder: str = ""
    """Only this lease holder's entities (``holder``)."""
    limit: int = 100
    expired: bool = False
    """Only entities whose holder's lease has expired (stuck until the reaper moves them)."""
    data_path: str = ""
    """A data field (``data``: ``key`` or ``key.sub``) that must equal :attr:`data_value`."""
    data_value: str = ""
    after: tuple[str, str] | None = None
    """The keyset position the page starts after (``after_t``, ``after_id``)."""

    @classmethod
    def of(cls, query: Any) -> Filters:
        """The filters of a query string; :class:`BadInput` for one no store could take."""
        raw = str(query.get("limit", "") or "100")
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
            raise BadInput(f"limit must be a whole number from 1 to {MAX_ROWS}, not {raw[:20]!r}")
        path = check_param("data", str(query.get("data", "")))
        if path and (any(not key for key in path.split(".")) or '"' in path or "\\" in path):
            raise BadInput("data must be a field name or a dotted path (a.b), without quotes or backslashes")
        after = None
        after_t, after_id = str(query.get("after_t", "")), check_param("after_id", str(query.get("after_id", "")))
        if after_id or after_t:  # a data search goes on from a time alone (after_id empty)
            if after_t:
                try:
                    when = datetime.fromisoformat(check_param("after_t", after_t, limit=40))
                except ValueError:
                    raise BadInput(f"after_t must be a timestamp, not {after_t[:40]!r}") from None
                if when.tzinfo is None:
                    raise BadInput("after_t must carry its UTC offset")
            after = (after_t, after_id)
        return cls(
            kind=check_param("kind", str(query.get("kind", ""))),
            state=check_param("state", str(query.get("state", ""))),
            text=check_param("q", str(query.get("q", ""))),
            holder=check_param("holder", str(query.get("holder", ""))),
            limit=max(1, min(int(raw), MAX_ROWS)),
            expired=query.get("expired", "") == "1",
            data_path=path,
            data_value=check_param("value", str(query.get("value", "")), limit=10_000) if path else "",
            after=after,
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """These filters as query parameters (with ``changes``), for links."""
        found = {
            "kind": self.kind,
            "state": self.state,
            "q": self.text,
            "holder": self.holder,
            "expired": "1" if self.expired else "",
            "data": self.data_path,
            "value": self.data_value if self.data_path else "",
            "limit": str(self.limit) if self.limit != 100 else "",
        }
        found.update(changes)
        return {k: v for k, v in found.items() if v}


@dataclass(frozen=True)
class ReaperTick:
    seq: int
    at: datetime
    summary: dict[str, Any]


@dataclass(frozen=True)
class RenewalLog:
    """An entity's logged lease renewals (oldest first), how many were ever logged, and why
    the log could not be read, if it could not."""

    entries: list[LeaseRenewal]
    total: int = 0
    problem: str | None = None

    def note(self) -> str:
        """What the timeline leaves out, for its heading ('' when nothing)."""
        if self.total > len(self.entries):
            return f" · the newest {len(self.entries)} of {self.total} lease renewals (the store keeps {RENEWALS_KEPT})"
        return ""


@dataclass(frozen=True)
class Flags:
    """Per kind: entities whose holder's lease expired, and entities waiting for a worker
    (in a state whose work needs a holder, with none: reclaimed or released), each counted
    up to :data:`FLAG_CAP` (``FLAG_CAP`` means "at least")."""

    expired: dict[str, int]
    waiting: dict[str, dict[str, int]]


FLAG_CAP = 1000


@dataclass(frozen=True)
class ScheduleRow:
    """One stored schedule as the overview shows it (:func:`schedule_row`): its lifecycle,
    id, when it runs, its policies, whether it is paused, its next due time and last run."""

    row_id: str
    kind: str
    """The lifecycle whose entities it creates (the row's concurrency key)."""
    schedule_id: str
    paused: bool
    cron: str | None
    every: float | None
    """The fixed interval in seconds (``None`` for a cron schedule)."""
    timezone: str
    overlap: str
    catch_up: str
    grace: float | None
    next_due: datetime | None
    """When its next run is due (``None`` while paused)."""
    last_run: str | None
    """The id of the entity it created last."""
    problem: str | None = None
    """What is wrong with the stored row (a field missing or of the wrong type), if anything."""


@dataclass(frozen=True)
class ScheduleList:
    """The stored schedules (:meth:`InspectorData.schedules`)."""

    rows: list[ScheduleRow]
    runs: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """Each last run that is stored: its state and whether it is deleted."""
    more: bool = False
    """More than :data:`SCHEDULES_SHOWN` schedules in a state: the first ones are listed."""
    problem: str | None = None
    """Why the schedules could not be read."""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def schedule_row(snap: Snapshot) -> ScheduleRow:
    """A schedule's reserved row (:mod:`fsm.scheduling.service`) as the overview shows it:
    each field as stored when it has the type it should, what is missing said."""
    data = snap.data if isinstance(snap.data, dict) else {}
    spec = data.get("schedule")
    spec = spec if isinstance(spec, dict) else {}
    problems = []
    kind = snap.concurrency_key or ""
    if not kind:
        problems.append("no lifecycle (concurrency key)")
    schedule_id = _text(data.get("id"))
    if schedule_id is None:
        schedule_id = snap.id.removeprefix(schedule_row_id(kind, ""))
        problems.append("no schedule id in its data")
    if not spec:
        problems.append("no stored schedule")
    cron, every = _text(spec.get("cron")), _seconds(spec.get("every"))
    if spec and (cron is None) == (every is None):
        problems.append("neither a cron expression nor an interval" if cron is None else "both cron and interval")
    last_run = _text(data.get("last_run"))
    if data.get("last_run") is not None and last_run is None:
        problems.append("last_run is not an id")
    return ScheduleRow(
        row_id=snap.id,
        kind=kind,
        schedule_id=schedule_id,
        paused=snap.state == SCHEDULE_PAUSED,
        cron=cron,
        every=every,
        timezone=_text(spec.get("timezone")) or "UTC",
        overlap=str(spec.get("overlap", "skip")),
        catch_up=str(spec.get("catch_up", "latest")),
        grace=_seconds(spec.get("grace")),
        next_due=snap.run_after if snap.state == SCHEDULE_ACTIVE else None,
        last_run=last_run,
        problem="; ".join(problems) or None,
    )


class InspectorData:
    """The inspector's reads over one :class:`stores.sql.SqlStore` (opened read-only).

    None of them scans the store per page: the counts come from a cache whose age the page
    shows (:mod:`fsm.inspect.cache`), everything else from index walks bounded by what
    they show (:mod:`fsm.inspect.listing`, :mod:`fsm.inspect.activity`).
    """

    def __init__(
        self,
        store: SqlStore,
        leaves: dict[str, list[str]] | None = None,
        *,
        resumes: dict[str, list[str]] | None = None,
        claim_events: dict[str, set[str]] | None = None,
        finals: dict[str, frozenset[str]] | None = None,
        count_every: float = 5.0,
    ) -> None:
        self.store = store
        sql = store._sql
        lay, f = sql.L, store._f
        self._f = f
        self._E, self._H = sql.E, sql.H
        self._ref = lay.ref
        self.leaves = leaves or {}
        self.finals: dict[str, frozenset[str]] = dict(finals or {})
        self.resumes = resumes or {}
        kind = lay.ref("kind", "e")
        self._base: dict[str, Any] = {"leader": LEADER_KIND, "ticks": TICKS_KIND, "schedules": SCHEDULE_KIND}
        self._base["later"] = f"{LATER_KIND_PREFIX}%"  # every lifecycle's delayed fires
        reserved = " AND ".join(f"{kind} <> {f.p(name)}" for name in self._base if name != "later")
        reserved += f" AND {kind} NOT LIKE {f.p('later')}"
        live = f"NOT {lay.ref('deleted', 'e')} AND {reserved}"
        self._live = live
        self._counts = (
            f"SELECT {lay.ref('kind', 'e')}, {lay.ref('state', 'e')}, COUNT(*) FROM {sql.E} AS e "
            f"WHERE {live} GROUP BY {lay.ref('kind', 'e')}, {lay.ref('state', 'e')}"
        )
        self._runs = (
            f"SELECT {lay.ref('id', 'e')}, {lay.ref('state', 'e')}, {lay.ref('deleted', 'e')} FROM {sql.E} AS e "
            f"WHERE {f.in_ids(lay.ref('id', 'e'), 'ids')}"
        )
        self._ticks = (
            f"SELECT seq, at, data FROM {sql.H} WHERE entity_id = {f.p('id')} ORDER BY seq DESC LIMIT {f.p('limit')}"
        )
        self.listing = ListingSql(store, live, self._base)
        self.activity_sql = ActivitySql(store, live, self._base, claim_events or {})
        self.counts_cache: Recomputed[dict[str, dict[str, int]]] = Recomputed(self._count, floor=count_every)
        self.activity_cache: Recomputed[Activity] = Recomputed(self._activity, floor=max(count_every, 2.0))
        self.flags_cache: Recomputed[Flags] = Recomputed(self._flags, floor=min(count_every, 2.0))
        self.holders_cache: Recomputed[list[Holder]] = Recomputed(
            lambda: self.activity_sql.holders(self.leased_pairs()), floor=min(count_every, 2.0)
        )

    def now(self) -> datetime:
        return self.store.now()

    def _count(self) -> dict[str, dict[str, int]]:
        found: dict[str, dict[str, int]] = {}
        for kind, state, n in self.store._run(self._counts, self._base):
            found.setdefault(str(kind), {})[str(state)] = int(n)
        return found

    def counts(self) -> Cached[dict[str, dict[str, int]]]:
        """``{kind: {state: n}}`` of live entities (the reaper's reserved rows left out), cached."""
        return self.counts_cache.get()

    def pairs(self, kind: str = "", state: str = "") -> list[tuple[str, str]]:
        """The (kind, state) pairs to walk: every pair counted or declared, narrowed by the filters."""
        known = {(k, s) for k, states in self.counts().value.items() for s in states}
        known |= {(k, s) for k, states in self.leaves.items() for s in states}
        if kind and state:
            return [(kind, state)]
        return sorted((k, s) for k, s in known if (not kind or k == kind) and (not state or s == state))

    def leased_pairs(self, kind: str = "", state: str = "") -> list[tuple[str, str]]:
        """The pairs whose rows may hold a lease: a final state's never do (a final transition
        clears the lease), so its rows, most of a big store, are never walked for leases."""
        return [(k, s) for k, s in self.pairs(kind, state) if s not in self.finals.get(k, ())]

    def flags(self) -> Cached[Flags]:
        """Expired leases and work waiting for a worker, per kind (cached like the holders)."""
        return self.flags_cache.get()

    def _flags(self) -> Flags:
        """Walks of the lease index over the non-final pairs, each stopping after
        :data:`FLAG_CAP` matches (never a count of the store)."""
        f, ref = self._f, self._ref
        exp, owner = ref("lease_expires_at", "e"), ref("lease_owner", "e")
        params: dict[str, Any] = dict(self._base)
        now = self.store._now()
        if now is not None:
            params["now"] = f.time(now)
        parts, labels = [], []
        pairs = self.leased_pairs()
        for i, (kind, state) in enumerate(pairs):
            params[f"k{i}"], params[f"s{i}"] = kind, state
            where = f"{ref('kind', 'e')} = {f.p(f'k{i}')} AND {ref('state', 'e')} = {f.p(f's{i}')} AND {self._live}"
            parts.append(f"{where} AND {owner} IS NOT NULL AND {exp} IS NOT NULL AND {exp} < {f.now}")
            labels.append(("expired", kind, state))
            if state in self.resumes.get(kind, ()):
                parts.append(f"{where} AND {owner} IS NULL")  # a reclaim keeps a backstop expiry
                labels.append(("waiting", kind, state))
        if not parts:
            return Flags({}, {})
        params["cap"] = FLAG_CAP
        sql = " UNION ALL ".join(
            f"SELECT {i}, COUNT(*) FROM (SELECT 1 AS one FROM {self._E} AS e WHERE {w} LIMIT {f.p('cap')}) AS c{i}"
            for i, w in enumerate(parts)
        )
        expired: dict[str, int] = {}
        waiting: dict[str, dict[str, int]] = {}
        for i, n in self.store._run(sql, params):
            what, kind, state = labels[int(i)]
            if not n:
                continue
            if what == "expired":
                expired[kind] = min(FLAG_CAP, expired.get(kind, 0) + int(n))
            else:
                waiting.setdefault(kind, {})[state] = int(n)
        return Flags(expired, waiting)

    def entities(self, filters: Filters) -> Listed:
        """One page of live entities matching ``filters`` (:mod:`fsm.inspect.listing`).

        A holder's entities come from the cached holders (what it held then, re-read by
        primary key and kept only while it still holds them); a holder the cache does not
        know yet is looked for by a walk of the lease index."""
        if filters.holder and not filters.expired and not filters.text and not filters.data_path:
            known = {h.owner: h for h in self.holders().value}.get(filters.holder)
            if known is not None:
                return self.listing.held(
                    known.all_ids, filters.holder, filters.limit, self.leased_pairs(filters.kind, filters.state)
                )
        leases = filters.expired or filters.holder
        return self.listing.run(
            self.leased_pairs(filters.kind, filters.state) if leases else self.pairs(filters.kind, filters.state),
            limit=filters.limit,
            prefix=filters.text,
            holder=filters.holder,
            expired=filters.expired,
            data_path=filters.data_path,
            data_value=filters.data_value,
            after=self._after(filters.after),
        )

    def _after(self, after: tuple[str, str] | None) -> tuple[Any, str] | None:
        if after is None:
            return None
        at, entity_id = after
        if not at:
            return ("", entity_id)
        when = datetime.fromisoformat(at)
        return (self._f.time(when), entity_id)

    def _activity(self) -> Activity:
        return self.activity_sql.activity(self.pairs(), self.store.now())

    def activity(self) -> Cached[Activity]:
        return self.activity_cache.get()

    def holders(self) -> Cached[list[Holder]]:
        """The owners holding leases (cached like the charts: it reads every leased row)."""
        return self.holders_cache.get()

    def last_failures(self, snaps: list[Snapshot]) -> dict[str, HistoryRecord]:
        """For the listed entities that failed or retried: their latest transition that records
        a reason or an error (primary key reads of those entities' history only)."""
        ids = [s.id for s in snaps if s.state == "failed" or s.attempt > 1]
        if not ids:
            return {}
        f = self._f
        cols = ", ".join(f"h.{c}" for c in HISTORY_COLUMNS)
        rows = self.store._run(
            f"SELECT {cols} FROM {self._H} AS h WHERE {f.in_ids('h.entity_id', 'ids')} ORDER BY h.entity_id, h.seq",
            {"ids": f.ids(ids)},
        )
        found: dict[str, HistoryRecord] = {}
        for row in rows:
            try:
                h = history_of(row)
            except MalformedRow:
                continue
            error = h.error or (h.data.get("error") if isinstance(h.data, dict) else None)
            if h.reason or error:
                found[h.entity_id] = h
        return found

    def entity(self, entity_id: str) -> Snapshot:
        return self.store.get(entity_id, include_deleted=True)

    def history(self, entity_id: str) -> list[HistoryRecord]:
        return self.store.history(entity_id)

    def children(self, entity_id: str, limit: int) -> list[Snapshot]:
        """The entity's first ``limit`` children, by id."""
        return self.store.children(entity_id, limit=limit)

    def limit_wait(self, lifecycle: Any, snap: Snapshot) -> str | None:
        """What limit holds a waiting entity back (:func:`fsm.coordination.limit_wait`)."""
        from fsm.engine.held_back import limit_wait

        return limit_wait(lifecycle, snap, self.store)

    def effects(self, entity_id: str) -> tuple[list[EffectRecord], EffectRecord | None]:
        """The entity's recorded effects, and its keeper's progress row (renewals) if any."""
        every = self.store.effects(entity_id)
        return [e for e in every if e.key != PROGRESS_KEY], next((e for e in every if e.key == PROGRESS_KEY), None)

    def renewals(self, entity_id: str) -> RenewalLog:
        """The entity's lease renewal log (a damaged one is reported, not raised)."""
        record = self.store.effect(entity_id, RENEWALS_KEY)
        if record is None:
            return RenewalLog([])
        try:
            return RenewalLog(renewals_of(entity_id, record), record.attempts)
        except MalformedRow as err:
            return RenewalLog([], record.attempts, problem=err.reason)

    def schedules(self, shown: int = SCHEDULES_SHOWN) -> ScheduleList:
        """The stored schedules, active and paused (at most ``shown`` of each), by lifecycle
        and id, with the state of each one's last run: one walk of the ``(kind, state)``
        index per state (``Store.candidates``, the read the reaper does at each tick) and
        one primary key read of the last runs.  Read as stored, never re-validated: a
        damaged row still shows, with what is wrong with it."""
        rows: list[ScheduleRow] = []
        more = False
        try:
            for state in (SCHEDULE_ACTIVE, SCHEDULE_PAUSED):
                found: list[Snapshot] = self.store.candidates(SCHEDULE_KIND, state, (), limit=shown + 1)
                more = more or len(found) > shown
                rows += [schedule_row(snap) for snap in found[:shown]]
        except MalformedRow as err:
            return ScheduleList([], problem=f"a schedule row cannot be read: {err}")
        rows.sort(key=lambda r: (r.kind, r.schedule_id, r.row_id))
        ids = sorted({r.last_run for r in rows if r.last_run is not None})
        runs: dict[str, tuple[str, bool]] = {}
        if ids:
            for entity_id, state, deleted in self.store._run(self._runs, {"ids": self._f.ids(ids)}):
                runs[str(entity_id)] = (str(state), bool(deleted))
        return ScheduleList(rows, runs, more)

    def reaper_ticks(self, limit: int = 60) -> list[ReaperTick]:
        """The reaper's latest recorded ticks (its tick log, :mod:`fsm.reaping.ticklog`), newest
        first: a primary key walk of one reserved entity's history."""
        found = []
        for seq, at, data in self.store._run(self._ticks, {"id": TICKS_ID, "limit": limit}):
            try:
                summary = json.loads(data) if isinstance(data, str) else data
                found.append(ReaperTick(int(seq), decode_time(at), summary if isinstance(summary, dict) else {}))
            except (ValueError, TypeError):
                continue
        return found


__all__ = [
    "FLAG_CAP",
    "LEADER_KIND",
    "RESERVED_KINDS",
    "SCHEDULES_SHOWN",
    "TICKS_ID",
    "TICKS_KIND",
    "BadInput",
    "Filters",
    "Flags",
    "InspectorData",
    "ReaperTick",
    "RenewalLog",
    "ScheduleList",
    "ScheduleRow",
    "check_param",
    "schedule_row",
]
