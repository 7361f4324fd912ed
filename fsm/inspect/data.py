"""What the inspector reads: counts, filtered entity lists, one entity's story, the reaper's
recent moves.  Read-only SQL over the store's own tables (names from its layout), every
value a bound parameter; the rows decode through the store's own decoders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsm.errors import FsmError, MalformedRow
from fsm.limits import text_problem
from fsm.records import PROGRESS_KEY, RENEWALS_KEPT, RENEWALS_KEY, EffectRecord, HistoryRecord, LeaseRenewal, Snapshot
from stores.ledger import renewals_of
from stores.sql import SqlStore
from stores.sql.rows import snapshot_of
from stores.sql.schema import decode_time

LEADER_KIND = "fsm.leader"
TICKS_KIND = "fsm.reaper"
TICKS_ID = "fsm-reaper-ticks"
MAX_ROWS = 500


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
    """A substring of the id or of the lease holder."""
    limit: int = 100
    expired: bool = False
    """Only entities whose holder's lease has expired (stuck until the reaper moves them)."""

    @classmethod
    def of(cls, query: Any) -> Filters:
        """The filters of a query string; :class:`BadInput` for one no store could take."""
        raw = str(query.get("limit", "") or "100")
        if not raw.isdigit() or len(raw) > 6:
            raise BadInput(f"limit must be a whole number from 1 to {MAX_ROWS}, not {raw[:20]!r}")
        return cls(
            kind=check_param("kind", str(query.get("kind", ""))),
            state=check_param("state", str(query.get("state", ""))),
            text=check_param("q", str(query.get("q", ""))),
            limit=max(1, min(int(raw), MAX_ROWS)),
            expired=query.get("expired", "") == "1",
        )


@dataclass(frozen=True)
class ReaperMove:
    entity_id: str
    kind: str
    event: str
    source: str
    target: str
    reason: str | None
    at: datetime


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


class InspectorData:
    """The inspector's reads over one :class:`stores.sql.SqlStore` (opened read-only)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        sql = store._sql
        lay, f = sql.L, store._f
        self._f = f
        self._E, self._H = sql.E, sql.H
        self._ref = lay.ref
        self._cols = sql.cols_e
        kind = lay.ref("kind", "e")
        live = f"NOT {lay.ref('deleted', 'e')} AND {kind} <> {f.p('leader')} AND {kind} <> {f.p('ticks')}"
        self._live = live
        self._counts = (
            f"SELECT {lay.ref('kind', 'e')}, {lay.ref('state', 'e')}, COUNT(*) FROM {sql.E} AS e "
            f"WHERE {live} GROUP BY {lay.ref('kind', 'e')}, {lay.ref('state', 'e')}"
        )
        exp = lay.ref("lease_expires_at", "e")
        self._stale = (
            f"SELECT {lay.ref('kind', 'e')}, COUNT(*) FROM {sql.E} AS e WHERE {live} "
            f"AND {lay.ref('lease_owner', 'e')} IS NOT NULL AND {exp} < {f.now} GROUP BY {lay.ref('kind', 'e')}"
        )
        self._ticks = (
            f"SELECT seq, at, data FROM {sql.H} WHERE entity_id = {f.p('id')} ORDER BY seq DESC LIMIT {f.p('limit')}"
        )
        self._moves = (
            f"SELECT h.entity_id, {lay.ref('kind', 'e')}, h.event, h.source, h.target, h.reason, h.at "
            f"FROM {sql.H} AS h JOIN {sql.E} AS e ON {lay.ref('id', 'e')} = h.entity_id "
            f"WHERE h.actor = 'reaper' ORDER BY h.at DESC, h.entity_id LIMIT {f.p('limit')}"
        )

    def now(self) -> datetime:
        return self.store.now()

    def counts(self) -> dict[str, dict[str, int]]:
        """``{kind: {state: n}}`` of live entities (the reaper's leader row left out)."""
        found: dict[str, dict[str, int]] = {}
        for kind, state, n in self.store._run(self._counts, {"leader": LEADER_KIND, "ticks": TICKS_KIND}):
            found.setdefault(str(kind), {})[str(state)] = int(n)
        return found

    def expired_leases(self) -> dict[str, int]:
        """``{kind: n}`` of entities whose holder's lease expired: stuck until the reaper moves them."""
        params: dict[str, Any] = {"leader": LEADER_KIND, "ticks": TICKS_KIND}
        now = self.store._now()
        if now is not None:
            params["now"] = self._f.time(now)
        return {str(kind): int(n) for kind, n in self.store._run(self._stale, params)}

    def entities(self, filters: Filters) -> list[Snapshot]:
        """Live entities matching ``filters``, most recently updated first."""
        f, ref = self._f, self._ref
        where = self._live
        params: dict[str, Any] = {"leader": LEADER_KIND, "ticks": TICKS_KIND, "limit": filters.limit}
        if filters.kind:
            where += f" AND {ref('kind', 'e')} = {f.p('kind')}"
            params["kind"] = filters.kind
        if filters.state:
            where += f" AND {ref('state', 'e')} = {f.p('state')}"
            params["state"] = filters.state
        if filters.expired:
            where += f" AND {ref('lease_owner', 'e')} IS NOT NULL AND {ref('lease_expires_at', 'e')} < {f.now}"
            now = self.store._now()
            if now is not None:
                params["now"] = f.time(now)
        if filters.text:
            pattern = "%" + filters.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where += (
                f" AND ({ref('id', 'e')} LIKE {f.p('text')} ESCAPE '\\' "
                f"OR {ref('lease_owner', 'e')} LIKE {f.p('text')} ESCAPE '\\')"
            )
            params["text"] = pattern
        sql = (
            f"SELECT {self._cols} FROM {self._E} AS e WHERE {where} "
            f"ORDER BY {ref('updated_at', 'e')} DESC, {ref('id', 'e')} LIMIT {f.p('limit')}"
        )
        found = []
        for row in self.store._run(sql, params):
            try:
                found.append(snapshot_of(row))
            except Exception:  # a malformed row is shown in the counts, not in the table
                continue
        return found

    def entity(self, entity_id: str) -> Snapshot:
        return self.store.get(entity_id, include_deleted=True)

    def history(self, entity_id: str) -> list[HistoryRecord]:
        return self.store.history(entity_id)

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

    def reaper_ticks(self, limit: int = 20) -> list[ReaperTick]:
        """The reaper's latest recorded ticks (its tick log, :mod:`fsm.reaping.ticklog`), newest first."""
        found = []
        for seq, at, data in self.store._run(self._ticks, {"id": TICKS_ID, "limit": limit}):
            try:
                summary = json.loads(data) if isinstance(data, str) else data
                found.append(ReaperTick(int(seq), decode_time(at), summary if isinstance(summary, dict) else {}))
            except (ValueError, TypeError):
                continue
        return found

    def reaper_moves(self, limit: int = 50) -> list[ReaperMove]:
        """The reaper's latest transitions (from history: what the store records of it)."""
        rows = self.store._run(self._moves, {"limit": limit})
        return [ReaperMove(str(r[0]), str(r[1]), r[2], r[3], r[4], r[5], decode_time(r[6])) for r in rows]


__all__ = [
    "LEADER_KIND",
    "TICKS_ID",
    "TICKS_KIND",
    "BadInput",
    "Filters",
    "InspectorData",
    "ReaperMove",
    "ReaperTick",
    "RenewalLog",
    "check_param",
]
