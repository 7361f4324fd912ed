"""The engine: fires a lifecycle's events on stored entities through a store.

The engine never builds a StateChart: it looks the event up in the lifecycle's compiled
table, evaluates the guards on the snapshot it read, and hands the store one
compare-and-set write (version, plus the lease token where the actor must hold the lease,
plus the store-side conditions of time- and row-dependent guards).  Signals go out after
the commit.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

import signals
from fsm.clock import Clock, new_owner_id
from fsm.errors import (
    ConditionFailed,
    FsmError,
    GuardRejected,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidData,
    LeaseLost,
    MalformedRow,
    StaleVersion,
    TransitionNotAllowed,
    UnknownEntity,
    UnknownEvent,
)
from fsm.guards import GuardContext
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.records import (
    Actor,
    Condition,
    HistoryRecord,
    Lease,
    LeaseChange,
    NewEntity,
    Snapshot,
    TransitionWrite,
)
from fsm.table import Branch, branch_conditions
from signals import LeasePayload, TransitionPayload
from stores.base import Store


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
    def state(self) -> str:
        return self.snapshot.state

    @property
    def lease(self) -> Lease | None:
        return self.snapshot.lease


def announce(kind: str, snap: Snapshot, record: HistoryRecord, branch: Branch) -> None:
    """Send the signals of one committed transition (the engine's and the reaper's)."""
    if not (
        signals.transitioned.receivers
        or signals.expired.receivers
        or signals.reclaimed.receivers
        or signals.lease_acquired.receivers
    ):
        return  # nobody listens: an unobserved transition pays nothing for signals

    def transition_payload() -> TransitionPayload:
        return TransitionPayload.of(kind, snap, record)

    signals.send(signals.transitioned, kind, transition_payload)
    if branch.event == "expire":
        signals.send(signals.expired, kind, transition_payload)
    elif branch.event == "reclaim":
        signals.send(signals.reclaimed, kind, transition_payload)
    if branch.lease_effect is LeaseChange.ACQUIRE:
        signals.send(signals.lease_acquired, kind, lambda: LeasePayload.of(kind, snap))


_ACTORS = tuple(a.value for a in Actor)


def _check_arguments(reason: object, idempotency_key: object, data: object) -> None:
    """Refuse ill-typed arguments before anything is read or written (I10)."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string, not {type(reason).__name__}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise InvalidArgument(f"idempotency_key must be a non-empty string, not {idempotency_key!r}")
    if data is not None and not isinstance(data, Mapping):
        raise InvalidArgument(f"data must be a mapping (a patch of top-level keys), not {type(data).__name__}")


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty string, not {value!r}")
    return value


def _lease(value: object) -> Lease:
    if not isinstance(value, Lease):
        raise InvalidArgument(f"expected a Lease (from a FireResult or acquire_lease), not {value!r}")
    return value


def _check_ttl(ttl: timedelta | None) -> None:
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta()):
        raise InvalidArgument(f"ttl must be a positive timedelta, not {ttl!r}")


class _StoreClock:
    def __init__(self, store: Store) -> None:
        self._store = store

    def now(self) -> Any:
        return self._store.now()


class Engine:
    """Runs one lifecycle over one store.

    ``clock`` is used to pre-evaluate time guards (default: the store's own clock); the
    store re-checks them at commit with its clock either way.  ``owner`` is this engine's
    owner id for leases, unique per process run unless given.
    """

    def __init__(
        self,
        lifecycle: type[Lifecycle],
        store: Store,
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        owner: str | None = None,
    ) -> None:
        if not isinstance(lifecycle, type) or not issubclass(lifecycle, Lifecycle) or not hasattr(lifecycle, "table"):
            raise TypeError(f"Engine needs a Lifecycle subclass with states, got {lifecycle!r}")
        self.lifecycle = lifecycle
        self.kind: str = lifecycle.kind
        self.table = lifecycle.table
        self.store = store
        self.clock: Clock = clock or _StoreClock(store)
        self.policy: Policy = policy or lifecycle.policy
        self.owner: str = owner or new_owner_id()
        self._events = frozenset(self.table.events)

    # -- reading -------------------------------------------------------------------------

    def get(self, entity_id: str) -> Snapshot:
        """The entity, checked to belong to this lifecycle and to be in a known state."""
        snap = self.store.get(_text("entity_id", entity_id))
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
            return self._choose(entity, event, actor, None)
        except FsmError:
            return None

    # -- creating ------------------------------------------------------------------------

    def create(
        self,
        entity_id: str | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
    ) -> Snapshot:
        """Create an entity in the lifecycle's initial state; ``data`` is validated first."""
        entity_id = uuid.uuid4().hex if entity_id is None else _text("entity_id", entity_id)
        if concurrency_key is not None:
            _text("concurrency_key", concurrency_key)
        _check_arguments(None, None, data)
        clean = self._validate({} if data is None else dict(data), entity_id=None)
        return self.store.create(
            NewEntity(
                id=entity_id, kind=self.kind, state=self.table.initial, concurrency_key=concurrency_key, data=clean
            )
        )

    def _validate(self, data: dict[str, Any], entity_id: str | None) -> dict[str, Any]:
        model = self.lifecycle.data_model
        if model is not None:
            try:
                data = model.model_validate(data).model_dump(mode="json")
            except ValidationError as err:
                raise InvalidData(
                    lifecycle=self.kind, entity_id=entity_id, errors=[dict(e) for e in err.errors()]
                ) from None
        try:  # every store keeps JSON: refuse here what a SQL store would refuse, on every store
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise InvalidData(
                lifecycle=self.kind, entity_id=entity_id, errors=[{"loc": (), "msg": f"not JSON: {err}"}]
            ) from None
        return data

    # -- firing --------------------------------------------------------------------------

    def fire(
        self,
        entity_id: str,
        event: str,
        *,
        lease: Lease | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        data: Mapping[str, Any] | None = None,
        actor: Actor | str = Actor.WORKER,
        owner: str | None = None,
    ) -> FireResult:
        """Fire ``event`` on the entity as ``actor``; one compare-and-set write.

        ``lease`` is the caller's lease for transitions that require holding it.
        ``data`` is a patch merged into the entity's data (top-level keys) and validated
        against the lifecycle's data model; guards judge the merged data.  ``owner`` is who takes the lease on a
        transition that acquires one (default: this engine's owner id).  Firing again with
        the same ``idempotency_key`` returns the first result and writes nothing.

        Raises ``UnknownEvent``, ``UnknownEntity``, ``TransitionNotAllowed``,
        ``GuardRejected``, ``LeaseLost``, ``StaleVersion``, ``ConditionFailed``,
        ``InvalidData`` or ``IdempotencyKeyReused``; a raise means nothing was written.
        """
        if event not in self._events:
            raise UnknownEvent(event, lifecycle=self.kind, known=list(self.table.events))
        if actor.__class__ is not Actor:
            if actor not in _ACTORS:
                raise InvalidArgument(f"actor must be one of {', '.join(_ACTORS)}, not {actor!r}")
            actor = Actor(actor)
        _check_arguments(reason, idempotency_key, data)
        _text("entity_id", entity_id)
        if lease is not None and not isinstance(lease, Lease):
            raise InvalidArgument(f"lease must be a Lease (from a FireResult or acquire_lease), not {lease!r}")
        if owner is not None:
            _text("owner", owner)
        try:
            if idempotency_key is None:
                return self._fire(entity_id, event, actor, lease, None, reason, data, owner)
            replay = self._replay(entity_id, event, idempotency_key)
            if replay is not None:
                return replay
            try:
                return self._fire(entity_id, event, actor, lease, idempotency_key, reason, data, owner)
            except (TransitionNotAllowed, GuardRejected, LeaseLost, StaleVersion, ConditionFailed):
                # a concurrent call with the same key (a retried webhook) may have committed
                # between our lookup and our read: then this is a replay, not a refusal
                replay = self._replay(entity_id, event, idempotency_key)
                if replay is not None:
                    return replay
                raise
        except LeaseLost as err:
            if lease is not None:
                self._lease_lost(lease, err)
            raise

    def _fire(
        self,
        entity_id: str,
        event: str,
        actor: Actor,
        lease: Lease | None,
        idempotency_key: str | None,
        reason: str | None,
        data: Mapping[str, Any] | None,
        owner: str | None,
    ) -> FireResult:
        snap = self.store.get(entity_id)
        if snap.kind != self.kind or snap.state not in self.table.configurations:
            snap = self.get(entity_id)  # raises the precise error
        patch: dict[str, Any] | None = None
        new_data: dict[str, Any] | None = None
        judged = snap
        if data is not None:  # guards judge the entity as the event would leave its data
            patch = copy.deepcopy(dict(data))  # the caller may reuse its dict; history must not change
            new_data = self._validate({**snap.data, **patch}, entity_id=snap.id)
            judged = snap._replace(data=new_data)
        branch = self._choose(judged, event, actor, lease)
        write = self._write_for(snap, branch, lease, idempotency_key, reason, new_data, patch, owner)
        try:
            new, record = self.store.apply(write)
        except IdempotencyKeyReused:
            assert idempotency_key is not None
            replay = self._replay(entity_id, event, idempotency_key)
            if replay is None:  # pragma: no cover - the store said the key exists
                raise
            return replay
        self._announce(new, record, branch)
        return FireResult(new, record)

    def _replay(self, entity_id: str, event: str, key: str) -> FireResult | None:
        recorded = self.store.find_transition(entity_id, key)
        if recorded is None:
            return None
        if recorded.event != event:
            raise IdempotencyKeyReused(entity_id, key=key, recorded_event=recorded.event, event=event)
        return FireResult(self.get(entity_id), recorded, replayed=True)

    def _choose(self, snap: Snapshot, event: str, actor: Actor, lease: Lease | None) -> Branch:
        branches = self.table.branches_for(snap.state, event)
        if not branches:
            if snap.state in self.table.finals:
                detail = f"{snap.state!r} is final"
            else:
                allowed = [e for e in self.table.events if self.table.branches_for(snap.state, e)]
                detail = f"events from {snap.state!r}: {', '.join(allowed) or 'none'}"
            raise TransitionNotAllowed(
                entity_id=snap.id, event=event, state=snap.state, actor=actor.value, detail=detail
            )
        mine = [b for b in branches if b.actor is actor]
        if mine and not mine[0].guards:
            return mine[0]  # the common worker case: nothing to evaluate
        if not mine:
            others = sorted({b.actor.value for b in branches})
            raise TransitionNotAllowed(
                entity_id=snap.id,
                event=event,
                state=snap.state,
                actor=actor.value,
                detail=f"{event!r} is a {'/'.join(others)} transition",
            )
        ctx = GuardContext(
            snapshot=snap,
            clock=self.clock,
            lease=lease,
            policy=self.policy,
            newer_sibling=lambda: self.store.has_newer_sibling(snap.id),
        )
        failed: dict[str, list[str]] = {}
        for branch in mine:
            refused = [
                g.name if expected else f"not {g.name}"
                for g, expected in branch.guards
                if bool(g.check(ctx)) is not expected
            ]
            if not refused:
                return branch
            failed[branch.label] = refused
        if lease is not None and all(r == ["holds_lease"] for r in failed.values()):
            raise LeaseLost(snap.id, expected_token=lease.token, found_token=snap.lease_token, owner=lease.owner)
        raise GuardRejected(entity_id=snap.id, event=event, state=snap.state, failed=failed)

    def _write_for(
        self,
        snap: Snapshot,
        branch: Branch,
        lease: Lease | None,
        idempotency_key: str | None,
        reason: str | None,
        new_data: dict[str, Any] | None,
        patch: dict[str, Any] | None,
        owner: str | None,
    ) -> TransitionWrite:
        holds = branch.holds_lease and lease is not None
        require: tuple[Condition, ...] = ()
        if branch.rechecked:
            require = branch_conditions(branch, self.policy)
        change = branch.lease_effect
        new_owner: str | None = None
        ttl: timedelta | None = None
        if change is LeaseChange.ACQUIRE:
            new_owner = owner or (lease.owner if lease is not None else self.owner)
            ttl = self.policy.lease_ttl
        # positional: this runs once per transition and keyword calls cost twice as much
        return TransitionWrite(
            snap.id,
            branch.event,
            snap.state,
            branch.target,
            branch.actor_name,
            snap.version,
            lease.owner if holds and lease is not None else None,
            lease.token if holds and lease is not None else None,
            require,
            change,
            new_owner,
            ttl,
            branch.bump_attempt,
            branch.bump_reclaims,
            new_data,
            patch,
            reason if reason is not None else branch.reason,
            idempotency_key,
        )

    def _announce(self, snap: Snapshot, record: HistoryRecord, branch: Branch) -> None:
        announce(self.kind, snap, record, branch)

    # -- leases --------------------------------------------------------------------------

    def acquire_lease(self, entity_id: str, *, owner: str | None = None, ttl: timedelta | None = None) -> Lease:
        """Take the lease of a non-final entity whose lease is free or expired (token + 1).

        Not a transition: no version bump, no history row.  Raises ``LeaseLost`` when a
        live lease is held by someone else.
        """
        _check_ttl(ttl)
        if owner is not None:
            _text("owner", owner)
        snap = self.get(entity_id)
        if snap.state in self.table.finals:
            raise TransitionNotAllowed(
                entity_id=entity_id,
                event="acquire_lease",
                state=snap.state,
                actor="worker",
                detail=f"{snap.state!r} is final",
            )
        new = self.store.acquire_lease(
            entity_id,
            owner=owner or self.owner,
            ttl=ttl or self.policy.lease_ttl,
            budget=self.policy.budget_for(snap.state),
            expect_version=snap.version,
        )
        signals.send(signals.lease_acquired, self.kind, lambda: LeasePayload.of(self.kind, new))
        lease = new.lease
        assert lease is not None
        return lease

    def renew_lease(self, lease: Lease, *, ttl: timedelta | None = None) -> Lease:
        """Extend a live lease; never past the state's renewal budget.

        Raises ``LeaseLost`` (and sends ``lease_lost``) when the lease is no longer
        current: taken over, expired, or out of budget.  The holder must stop.
        """
        _check_ttl(ttl)
        snap = self.get(_lease(lease).entity_id)
        try:
            new = self.store.renew_lease(
                lease.entity_id,
                owner=lease.owner,
                token=lease.token,
                ttl=ttl or self.policy.lease_ttl,
                budget=self.policy.budget_for(snap.state),
            )
        except LeaseLost as err:
            self._lease_lost(lease, err)
            raise
        renewed = new.lease
        assert renewed is not None
        return renewed

    def release_lease(self, lease: Lease) -> Snapshot:
        """Give a lease up (owner and expiry cleared); raises ``LeaseLost`` if not current."""
        self.get(_lease(lease).entity_id)
        try:
            return self.store.release_lease(lease.entity_id, owner=lease.owner, token=lease.token)
        except LeaseLost as err:
            self._lease_lost(lease, err)
            raise

    def _lease_lost(self, lease: Lease, err: LeaseLost) -> None:
        """Tell ``lease_lost`` receivers that a holder found its lease gone (after the refusal)."""
        if not signals.lease_lost.receivers:
            return
        try:
            snap = self.store.get(lease.entity_id)
        except FsmError:
            return
        detail = str(err)
        signals.send(
            signals.lease_lost, self.kind, lambda: LeasePayload.of(self.kind, snap, lease=lease, detail=detail)
        )


__all__ = ["Engine", "FireResult", "announce"]
