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


_new = object.__new__
_set_snapshot = FireResult.snapshot.__set__  # type: ignore[attr-defined,misc]  # the slots' member descriptors
_set_record = FireResult.record.__set__  # type: ignore[attr-defined,misc]
_set_replayed = FireResult.replayed.__set__  # type: ignore[attr-defined,misc]


def fire_result(snapshot: Snapshot, record: HistoryRecord) -> FireResult:
    """``FireResult(snapshot, record)`` for the engine's hot paths: the frozen dataclass's
    ``__init__`` sets each slot through ``object.__setattr__`` looked up per field; its
    slots' own descriptors set them directly (every fire returns one)."""
    result: FireResult = _new(FireResult)
    _set_snapshot(result, snapshot)
    _set_record(result, record)
    _set_replayed(result, False)
    return result


__all__ = ["ChainedResult", "FireResult", "fire_result"]
