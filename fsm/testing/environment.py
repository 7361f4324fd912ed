"""Run a worker handler outside a worker, as Temporal's ``ActivityEnvironment`` runs an
activity: a memory store, a manual clock, an entity already in the handler's state under
a held lease, progress captured, and the lease lost on demand.

::

    env = HandlerEnvironment(JobLifecycle, state="finalizing")
    outcome = env.run(finalize)                # -> "complete"
    assert env.effects() == {"security": ...}  # what the ledger recorded
    env.lose_lease()                           # the reaper took it over
    with pytest.raises(Fenced):
        env.run(finalize)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm.clock import ManualClock
from fsm.engine import Engine
from fsm.errors import EntityMovedOn, FsmError
from fsm.lifecycle import Lifecycle
from fsm.records import Actor
from fsm.testing.paths import replay, shortest_paths
from fsm.work.keeper import KeeperCore
from fsm.work.worker import Handler, Job, Outcome
from stores.memory import MemoryStore


class HandlerEnvironment:
    """An entity in ``state`` under a lease, and a :class:`~fsm.work.Job` for a handler."""

    def __init__(
        self,
        lifecycle: type[Lifecycle],
        *,
        state: str,
        data: Mapping[str, Any] | None = None,
        entity_id: str = "entity-1",
    ) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(clock=self.clock)
        self.engine = Engine(lifecycle, self.store, clock=self.clock, owner="handler-under-test")
        paths = shortest_paths(lifecycle)
        if state not in paths.states:
            raise FsmError(f"{lifecycle.__name__} cannot reach {state!r}")
        snap = replay(paths.states[state], self.engine, self.clock, entity_id)
        if data:
            self.store._rows[entity_id] = snap._replace(data={**snap.data, **dict(data)})
        if snap.lease is None or snap.lease.owner != self.engine.owner:
            self.engine.acquire_lease(entity_id)
        snap = self.engine.get(entity_id)
        assert snap.lease is not None
        self.core = KeeperCore(self.engine, snap.lease)
        self.progress: list[Any] = []
        """Every ``job.progress(...)`` the handler reported, in order."""
        self.fired: list[str] = []

    @property
    def job(self) -> Job:
        env = self

        class _Job(Job):
            def progress(self, details: Any) -> None:
                env.progress.append(details)
                super().progress(details)

        return _Job(self.engine, self.engine.get(self.core.held.entity_id), self.core.held)

    def run(self, handler: Handler) -> Outcome:
        """Call ``handler`` with a job and return its outcome (the event is not fired)."""
        return handler(self.job)

    def renew(self) -> bool:
        """One keeper renewal (carrying the last progress); False once the lease is lost."""
        return self.core.renew().renewed

    def lose_lease(self) -> None:
        """The reaper fenced the holder: its next ledger write or fire raises ``Fenced``."""
        held = self.core.held
        snap = self.store.get(held.entity_id)
        self.store._rows[snap.id] = snap._replace(lease_owner=None, lease_token=snap.lease_token + 1)
        held._lose(
            EntityMovedOn(
                snap.id,
                state=snap.state,
                token=held.lease.token,
                found_token=snap.lease_token + 1,
                owner=held.lease.owner,
            )
        )

    def effects(self) -> dict[str, Any]:
        """The recorded results by key."""
        return {e.key: e.result for e in self.engine.effects(self.core.held.entity_id)}

    def allowed(self, outcome: Outcome) -> bool:
        """Whether the worker may fire the handler's outcome event from the entity's state."""
        event = outcome if isinstance(outcome, str) else (outcome[0] if outcome else None)
        snap = self.engine.get(self.core.held.entity_id)
        return event is not None and event in self.engine.allowed_events(snap, Actor.WORKER)


__all__ = ["HandlerEnvironment"]
