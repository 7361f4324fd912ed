"""Building the one compare-and-set write a transition makes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fsm.history import remember
from fsm.policy import Policy
from fsm.records import Condition, Lease, LeaseChange, Snapshot, TransitionWrite
from fsm.table import Branch, branch_conditions


def write_for(
    policy: Policy,
    default_owner: str,
    snap: Snapshot,
    branch: Branch,
    lease: Lease | None,
    idempotency_key: str | None,
    reason: str | None,
    new_data: dict[str, Any] | None,
    patch: dict[str, Any] | None,
    owner: str | None,
) -> TransitionWrite:
    """The compare-and-set write of ``branch`` from ``snap``: what the store must re-check."""
    holds = branch.holds_lease and lease is not None
    require: tuple[Condition, ...] = ()
    if branch.rechecked:
        require = branch_conditions(branch, policy)
    change = branch.lease_effect
    new_owner: str | None = None
    ttl: timedelta | None = None
    if change is LeaseChange.ACQUIRE and branch.actor_name == "reaper":
        ttl = policy.lease_ttl  # the reaper fences (token + 1) and leaves the lease free for a claim
    elif change is LeaseChange.ACQUIRE:
        new_owner = owner or (lease.owner if lease is not None else default_owner)
        ttl = policy.lease_ttl
    # positional: this runs once per transition and keyword calls cost twice as much
    write = TransitionWrite(
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
        snap,
        None,
        None,
        branch.timer,
    )
    if branch.remembers:  # it leaves a compound with a history state: where it was left
        write.memory = remember(branch, snap.memory, snap.state)
    return write


__all__ = ["write_for"]
