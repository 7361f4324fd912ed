"""Judging an event: which branch of the compiled table the entity takes, if any."""

from __future__ import annotations

from fsm.clock import Clock
from fsm.engine.base import StoreClock
from fsm.errors import EntityMovedOn, Fenced, GuardRejected, LeaseLost, TransitionNotAllowed, ValidationFailed
from fsm.guards import GuardContext, Invalid
from fsm.policy import Policy
from fsm.records import Actor, Lease, Snapshot
from fsm.table import Branch, CompiledTable
from stores.base import Store


def choose(
    table: CompiledTable,
    policy: Policy,
    clock: Clock,
    store: Store,
    snap: Snapshot,
    event: str,
    actor: Actor,
    lease: Lease | None,
) -> Branch:
    """The first branch of ``event`` from the entity's state that ``actor`` may take now.

    Guards are judged on ``snap`` (the store re-checks the time- and row-dependent ones at
    commit), against the store's clock whatever ``clock`` is: staleness is the store's call.
    Raises ``TransitionNotAllowed``, ``GuardRejected``, or ``LeaseLost`` when the only thing
    refused is holding the lease.
    """
    branches = table.branches_for(snap.state, event)
    if not branches:
        if snap.state in table.finals:
            detail = f"{snap.state!r} is final"
        else:
            allowed = [e for e in table.events if table.branches_for(snap.state, e)]
            detail = f"events from {snap.state!r}: {', '.join(allowed) or 'none'}"
        raise TransitionNotAllowed(entity_id=snap.id, event=event, state=snap.state, actor=actor.value, detail=detail)
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
        # time guards follow the store's clock, the one it re-checks them with at commit: an
        # application clock behind the database must never refuse what the store would accept
        # (a dead finalizer left unreaped breaks I2), nor one ahead accept what it refuses
        clock=clock if isinstance(clock, StoreClock) else StoreClock(store),
        lease=lease,
        policy=policy,
        newer_sibling=lambda: store.has_newer_sibling(snap.id),
    )
    failed: dict[str, list[str]] = {}
    for branch in mine:
        try:
            refused = [
                g.name if expected else f"not {g.name}"
                for g, expected in branch.guards
                if bool(g.check(ctx)) is not expected
            ]
        except Invalid as invalid:  # a validator raised: the event is refused, as python-statemachine does
            raise ValidationFailed(
                entity_id=snap.id,
                event=event,
                state=snap.state,
                branch=branch.label,
                validator=invalid.name,
                reason=str(invalid.error) or type(invalid.error).__name__,
            ) from invalid.error
        if not refused:
            return branch
        failed[branch.label] = refused
    if lease is not None and all(r == ["holds_lease"] for r in failed.values()):
        raise LeaseLost(snap.id, expected_token=lease.token, found_token=snap.lease_token, owner=lease.owner)
    raise GuardRejected(entity_id=snap.id, event=event, state=snap.state, failed=failed)


def fenced(snap: Snapshot, lease: Lease) -> Fenced | None:
    """Why a caller presenting ``lease`` no longer owns the entity, or ``None`` if it does.

    A holder whose lease was taken over (another owner or token) gets ``LeaseLost``; one
    whose entity the reaper moved away (expired, requeued, reclaimed: the owner cleared
    or the token bumped with nobody holding it) gets ``EntityMovedOn``.  Both are
    :class:`~fsm.errors.Fenced`, so a worker stops on either.
    """
    if snap.lease_owner == lease.owner and snap.lease_token == lease.token:
        return None
    if snap.lease_owner is None:
        return EntityMovedOn(
            snap.id, state=snap.state, token=lease.token, found_token=snap.lease_token, owner=lease.owner
        )
    return LeaseLost(
        snap.id,
        expected_token=lease.token,
        found_token=snap.lease_token,
        owner=lease.owner,
        detail=f"now held by {snap.lease_owner}" if snap.lease_owner != lease.owner else "",
    )


__all__ = ["choose", "fenced"]
