"""The reaper's tick log: one small history row per tick, kept by the store itself.

What a tick did (moved per ``kind.event``, lost races, refused, bad rows, errors, how long)
lives only in its :class:`~fsm.reaping.ReapResult` and the ``reaper_tick`` signal; nothing
in the store tells *later* what the reaper saw.  So that ``fsm inspect`` (another process,
perhaps another machine) can show the reaper's recent ticks, the reaper records each tick
as a transition ``tick: ticking -> ticking`` of one reserved entity (id
:data:`TICKS_ID`, kind :data:`TICKS_KIND`, the way the leader lease keeps its reserved
row), the tick's counts as the history row's data.  Why there, not a table of its own: it
needs no schema change or migration, works on every store (memory, SQLite, PostgreSQL),
and the history is append-only and ordered already.  Cost: one guarded write per tick.
Several reapers share the row; a lost compare-and-set is retried.

``fsm reaper`` records every live tick (``--no-tick-log`` turns it off); an application
running ``Reaper.run_once`` itself calls ``TickLog(store).record(result, reaper.owner)``.
A failure to record is logged and never raised: a tick never raises (I9).

The log keeps a bounded window of its own: the last ``keep`` ticks (default
:data:`TICKS_KEPT`, a few days at the default 5-minute interval; about 8 minutes at 0.5 s).
Every :data:`TRIM_EVERY` ticks the older rows are cut (:meth:`stores.Store.trim_history`),
so the log holds between ``keep`` and ``keep + TRIM_EVERY - 1`` rows and a trim costs one
statement per ``TRIM_EVERY`` ticks.  The log row's history is then gap-free from its first
kept row, not from seq 1 (the one exception to I6, for a log that is not a lifecycle).
"""

from __future__ import annotations

import logging

from fsm.errors import ConfigError, EntityExists, FsmError, StaleVersion, UnknownEntity
from fsm.reaping.config import ReapResult
from fsm.records import NewEntity, TransitionWrite
from stores.base import Store

log = logging.getLogger("fsm.reaper")

TICKS_KIND = "fsm.reaper"
TICKS_ID = "fsm-reaper-ticks"
TICKING = "ticking"
ATTEMPTS = 5
TICKS_KEPT = 1000
"""Ticks the log keeps by default (the newest)."""
TRIM_EVERY = 100
"""The log is trimmed back to ``keep`` rows once every this many ticks."""


def tick_summary(result: ReapResult, owner: str) -> dict[str, object]:
    """What is recorded of a tick (the history row's data)."""
    return {
        "owner": owner,
        "moved": dict(sorted(result.moved.items())),
        "lost_races": result.lost_races,
        "refused": result.refused,
        "bad_rows": result.bad_rows,
        "errors": result.errors,
        "duration_ms": round(result.duration_s * 1000, 1),
        "leading": result.leading,
        "standby": list(result.standby),
        "enabled": result.enabled,
        "scheduled": dict(sorted(result.scheduled.items())),
        "delayed": dict(sorted(result.delayed.items())),
    }


class TickLog:
    """Records reaper ticks in ``store`` (see the module docstring)."""

    def __init__(self, store: Store, *, keep: int = TICKS_KEPT) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= 10_000_000:
            raise ConfigError(f"keep must be an integer from 1 to 10000000, not {keep!r:.80}")
        self.store = store
        self.keep = keep

    def record(self, result: ReapResult, owner: str) -> bool:
        """Record one tick; dry runs are not recorded.  Returns whether it was recorded."""
        if result.dry_run:
            return False
        summary = tick_summary(result, owner)
        moved = sum(result.moved.values())
        reason = f"moved {moved}" + (f", {result.errors} errors" if result.errors else "")
        try:
            for _ in range(ATTEMPTS):
                try:
                    snap = self.store.get(TICKS_ID)
                except UnknownEntity:
                    try:
                        snap = self.store.create(NewEntity(id=TICKS_ID, kind=TICKS_KIND, state=TICKING, data={}))
                    except EntityExists:
                        continue
                write = TransitionWrite(
                    TICKS_ID, "tick", TICKING, TICKING, "reaper", snap.version, data_patch=summary, reason=reason
                )
                try:
                    after, _ = self.store.apply(write)
                except StaleVersion:
                    continue  # another reaper recorded its tick first
                if after.version % TRIM_EVERY == 0 and after.version > self.keep:
                    self._trim()
                return True
            log.warning("reaper tick not recorded: the tick log row stayed contended")
        except FsmError as err:
            log.warning("reaper tick not recorded: %s", err)
        return False

    def _trim(self) -> None:
        """Cut the log back to its window; a failure is logged (the next trim catches up)."""
        trim = getattr(self.store, "trim_history", None)
        if trim is None:  # a store of the application's own without retention
            return
        try:
            removed = trim(TICKS_ID, self.keep)
            log.debug("reaper tick log trimmed: %d old ticks removed, %d kept", removed, self.keep)
        except FsmError as err:
            log.warning("reaper tick log not trimmed: %s", err)


__all__ = ["TICKING", "TICKS_ID", "TICKS_KEPT", "TICKS_KIND", "TRIM_EVERY", "TickLog", "tick_summary"]
