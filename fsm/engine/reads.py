"""Reading entities through the engine: checked to belong to its lifecycle."""

from __future__ import annotations

from fsm.engine.arguments import text
from fsm.engine.base import EngineBase
from fsm.engine.judge import choose
from fsm.errors import FsmError, MalformedRow, UnknownEntity
from fsm.records import Actor, HistoryRecord, Snapshot
from fsm.table import Branch


class EngineReads(EngineBase):
    """``get``, ``history``, ``configuration``, ``allowed_events`` and ``would_fire``."""

    def get(self, entity_id: str) -> Snapshot:
        """The entity, checked to belong to this lifecycle and to be in a known state."""
        snap = self.store.get(text("entity_id", entity_id))
        if snap.kind != self.kind:
            raise UnknownEntity(entity_id, kind=self.kind, found_kind=snap.kind)
        if snap.state not in self.table.configurations:
            raise MalformedRow(entity_id, reason=f"unknown state {snap.state!r} for lifecycle {self.kind!r}")
        return snap

    def history(self, entity_id: str) -> list[HistoryRecord]:
        self.get(entity_id)
        return self.store.history(entity_id)

    def configuration(self, entity: Snapshot | str) -> tuple[str, ...]:
        """Every active state of the entity, outermost first: ``("active", "finalizing")``."""
        snap = self.get(entity) if isinstance(entity, str) else entity
        return self.table.configurations[snap.state]

    def allowed_events(self, entity: Snapshot | str, actor: Actor = Actor.WORKER) -> list[str]:
        """Events with at least one branch for ``actor`` from the entity's state (guards not evaluated)."""
        snap = self.get(entity) if isinstance(entity, str) else entity
        return [e for e in self.table.events if any(b.actor is actor for b in self.table.branches_for(snap.state, e))]

    def would_fire(self, entity: Snapshot, event: str, actor: Actor = Actor.WORKER) -> Branch | None:
        """The branch ``event`` would take from ``entity`` now, or None if refused.

        Side-effect free (guards are judged on the snapshot; nothing is written), for dry
        runs and previews; the real ``fire`` re-checks everything at commit.
        """
        if event not in self._events:
            return None
        try:
            return choose(self.table, self.policy, self.clock, self.store, entity, event, actor, None)
        except FsmError:
            return None


__all__ = ["EngineReads"]
