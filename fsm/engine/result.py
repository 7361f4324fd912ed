"""What a fire returns: the committed snapshot and its history row."""

from __future__ import annotations

from dataclasses import dataclass

from fsm.records import HistoryRecord, Lease, Snapshot


@dataclass(frozen=True, slots=True)
class FireResult:
    """What :meth:`Engine.fire` returns.

    ``record`` is the history row of the transition; on a replay (same idempotency key)
    it is the row the first call wrote, ``replayed`` is true and ``snapshot`` is the
    entity as it is now.
    """

    snapshot: Snapshot
    record: HistoryRecord
    replayed: bool = False
    automatic: tuple[HistoryRecord, ...] = ()
    """The history rows of the eventless and completion transitions the event took by
    itself, in the same commit (:mod:`fsm.chains`); ``snapshot`` is where they left it."""

    @property
    def state(self) -> str:
        return self.snapshot.state

    @property
    def lease(self) -> Lease | None:
        return self.snapshot.lease


__all__ = ["FireResult"]
