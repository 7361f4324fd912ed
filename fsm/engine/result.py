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

    @property
    def automatic(self) -> tuple[HistoryRecord, ...]:
        """The history rows of the eventless and completion transitions the event took by
        itself, in the same commit (:mod:`fsm.chains`); ``snapshot`` is where they left it."""
        return ()

    @property
    def state(self) -> str:
        return self.snapshot.state

    @property
    def lease(self) -> Lease | None:
        return self.snapshot.lease


@dataclass(frozen=True, slots=True)
class ChainedResult(FireResult):
    """A :class:`FireResult` whose event took eventless or completion steps (a class of its
    own, so the common fire builds no field it never uses)."""

    steps: tuple[HistoryRecord, ...] = ()

    @property
    def automatic(self) -> tuple[HistoryRecord, ...]:
        return self.steps


__all__ = ["ChainedResult", "FireResult"]
