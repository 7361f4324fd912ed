"""Reading entities through the engine: checked to belong to its lifecycle."""

from __future__ import annotations

from fsm.engine.arguments import text
from fsm.engine.base import EngineBase
from fsm.engine.judge import choose
from fsm.errors import FsmError, InvalidArgument, MalformedRow, UnknownEntity
from fsm.history import kept_memory, resolve
from fsm.records import Actor, HistoryRecord, Snapshot
from fsm.table import Branch


class EngineReads(EngineBase):
    """``get``, ``history``, ``configuration``, ``allowed_events`` and ``would_fire``."""

    _join_events: dict[str, tuple[str, str]]
    """The events only the engine fires (:func:`fsm.engine.parallel.reserved_events`)."""

    def get(self, entity_id: str) -> Snapshot:
        """The entity, checked to belong to this lifecycle and to be in a known state."""
        return self._checked(self.store.get(text("entity_id", entity_id)))

    def history(self, entity_id: str) -> list[HistoryRecord]:
        self.get(entity_id)
        return self.store.history(entity_id)

    def configuration(self, entity: Snapshot | str) -> tuple[str, ...]:
        """Every active state of the entity, outermost first: ``("active", "finalizing")``.

        A snapshot of another lifecycle is ``UnknownEntity`` (as :meth:`get` says of its
        id); one whose state is not a leaf of this lifecycle (``'bogus'``, ``None``, the
        compound ``'active'``) is ``MalformedRow``; anything but an id or a ``Snapshot`` is
        ``InvalidArgument``.
        """
        snap = self._entity("configuration", entity)
        return self.table.configurations[snap.state]

    def allowed_events(self, entity: Snapshot | str, actor: Actor = Actor.WORKER) -> list[str]:
        """Events with at least one branch for ``actor`` from the entity's state (guards not
        evaluated); the entity is checked as :meth:`configuration` checks it."""
        snap = self._entity("allowed_events", entity)
        reserved = self._join_events  # the join and a region's exit: the engine's, refused to callers
        return [
            e
            for e in self.table.events
            if e not in reserved and any(b.actor is actor for b in self.table.branches_for(snap.state, e))
        ]

    def would_fire(self, entity: Snapshot, event: str, actor: Actor = Actor.WORKER) -> Branch | None:
        """The branch ``event`` would take from ``entity`` now, or None if refused.

        Side-effect free (guards are judged on the snapshot; nothing is written), for dry
        runs and previews; the real ``fire`` re-checks everything at commit.  A snapshot in
        a state the lifecycle lacks is refused (None); a non-snapshot is ``InvalidArgument``.
        """
        if not isinstance(entity, Snapshot):
            raise InvalidArgument(f"would_fire takes a Snapshot, not {type(entity).__name__}")
        if (
            not isinstance(event, str)
            or (event not in self._events and not (event.isascii() and self.table.knows(event)))
            or not isinstance(entity.state, str)
            or entity.state not in self.table.configurations
        ):
            return None
        try:
            branch = choose(self.table, self.policy, self.clock, self.store, entity, event, actor, None)
            return resolve(branch, kept_memory(entity.memory, self.table.remembered), entity.state)
        except FsmError:
            return None

    def _entity(self, method: str, entity: object) -> Snapshot:
        """``entity`` as a checked snapshot: read by id, or the caller's own snapshot."""
        if isinstance(entity, str):
            return self.get(entity)
        if not isinstance(entity, Snapshot):
            raise InvalidArgument(f"{method} takes an entity id or a Snapshot, not {type(entity).__name__}")
        return self._checked(entity)

    def _checked(self, snap: Snapshot) -> Snapshot:
        """``snap`` if it is of this lifecycle and in one of its leaf states."""
        shown = snap.id if isinstance(snap.id, str) else repr(snap.id)
        if snap.kind != self.kind:
            raise UnknownEntity(shown, kind=self.kind, found_kind=str(snap.kind))
        state = snap.state
        # a str check first: an unhashable state (a list) must not reach the dict lookup
        if not isinstance(state, str) or state not in self.table.configurations:
            leaves = ", ".join(self.table.configurations)
            raise MalformedRow(
                shown, reason=f"unknown state {state!r} for lifecycle {self.kind!r} (its leaf states: {leaves})"
            )
        return snap


__all__ = ["EngineReads"]
