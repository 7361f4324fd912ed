"""Firing by id without a read, where the store can judge the branch.

Which fires qualify is derived once from the compiled table (:func:`id_plans`): for an
event, an actor and whether the caller presents a lease, every source leaf whose first
branch for the actor has no guard (or only ``holds_lease``, with a lease: the statement
requires the caller's lease on the row) is a *move* ``source -> target``; a leaf whose
first branch has any other guard, or a data change computed from the row's data, is left
out (a row there is refused by the statement and judged on a read).  The moves must share
one write shape (lease change, counters, reason, lease holding).

The store's statement then chooses the move from the row's state and writes it
(:class:`~fsm.id_write.IdWrite`).  When it moves nothing, the engine reads the row and
fires the read-first way: the refusal is that path's (``UnknownEntity``,
``TransitionNotAllowed`` with the current state, ``GuardRejected``, ``LeaseLost``...), and
a row that moved into a source in between is simply fired.  Fires that pass ``data``, an
idempotency key or a held snapshot keep their own paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fsm.guards import HOLDS_LEASE
from fsm.id_write import IdWrite
from fsm.policy import Policy
from fsm.records import Actor, HistoryRecord, Lease, LeaseChange, Snapshot, TimerMode
from fsm.table import Branch, CompiledTable

PlanKey = tuple[str, Actor, bool]
"""``(event, actor, with a lease)``."""

ApplyById = Callable[[IdWrite], "tuple[Snapshot, HistoryRecord] | None"]


@dataclass(frozen=True, slots=True)
class IdPlan:
    """The moves one ``(event, actor, lease or not)`` may make, judged by the store."""

    moves: tuple[tuple[str, str], ...]
    branches: dict[str, Branch]
    """Source leaf -> the branch taken from it (announced with the transition)."""
    shape: Branch
    """Any of the branches: they share lease change, counters, reason and lease holding."""
    holds: bool
    """The branches require holding the lease (and the caller presents one)."""


def _judgeable(branch: Branch, with_lease: bool) -> bool:
    if branch.changes:  # a data change computed from the row's data needs the row
        return False
    if branch.timer is not TimerMode.KEEP:  # the timer clock is set by the judged write
        return False
    return not branch.guards or (with_lease and branch.guards == ((HOLDS_LEASE, True),))


def id_plan(table: CompiledTable, event: str, actor: Actor, with_lease: bool) -> IdPlan | None:
    """The store-judged plan of ``event`` fired by ``actor``, or ``None`` (read first)."""
    if table.has_timers:
        return None  # the timer clock the write keeps or sets is read back with the row
    chosen: dict[str, Branch] = {}
    for leaf in table.leaves:
        mine = [b for b in table.branches_for(leaf, event) if b.actor is actor]
        # the first branch is the one a read-first fire takes when its guards pass; with a
        # later branch behind a refusing guard, only a read can tell which applies
        if mine and _judgeable(mine[0], with_lease):
            chosen[leaf] = mine[0]
    if not chosen:
        return None
    shapes = {
        (b.lease_effect, b.bump_attempt, b.bump_reclaims, b.reason, b.holds_lease, b.actor_name)
        for b in chosen.values()
    }
    if len(shapes) != 1:
        return None
    first = next(iter(chosen.values()))
    return IdPlan(
        moves=tuple((s, b.target) for s, b in chosen.items()),
        branches=chosen,
        shape=first,
        holds=first.holds_lease and with_lease,
    )


def id_plans(table: CompiledTable) -> dict[PlanKey, IdPlan]:
    """Every store-judged plan of ``table`` (see the module)."""
    plans: dict[PlanKey, IdPlan] = {}
    for event in table.events:
        for actor in Actor:
            for with_lease in (False, True):
                plan = id_plan(table, event, actor, with_lease)
                if plan is not None:
                    plans[(event, actor, with_lease)] = plan
    return plans


def id_write(
    plan: IdPlan,
    kind: str,
    policy: Policy,
    default_owner: str,
    entity_id: str,
    lease: Lease | None,
    reason: str | None,
    owner: str | None,
    extra: tuple[dict[str, Any] | None, timedelta | None] | None,
) -> IdWrite:
    """The write of ``plan``, as :func:`fsm.engine.writes.write_for` would build each move's."""
    b = plan.shape
    change = b.lease_effect
    new_owner: str | None = None
    ttl: timedelta | None = None
    if change is LeaseChange.ACQUIRE and b.actor_name == "reaper":
        ttl = policy.lease_ttl  # the reaper fences (token + 1) and leaves the lease free for a claim
    elif change is LeaseChange.ACQUIRE:
        new_owner = owner or (lease.owner if lease is not None else default_owner)
        ttl = policy.lease_ttl
    error, due = (None, None) if extra is None else extra
    return IdWrite(
        entity_id, kind, b.event, b.actor_name, plan.moves,
        None if lease is None else lease.owner, None if lease is None else lease.token,
        change, new_owner, ttl, b.bump_attempt, b.bump_reclaims,
        reason if reason is not None else b.reason, plan.holds, due, error,
    )  # fmt: skip


def by_id_of(store: object) -> ApplyById | None:
    """The store's ``apply_by_id`` (its ``apply_by_id_checked`` when it has one: the engine
    checked every argument), or ``None`` when the store does not judge fires by id.

    Only the class that defines the store's ``apply`` may also answer by id: a subclass or
    wrapper that overrides ``apply`` sees every transition through it, as before."""
    if getattr(store, "judges_by_id", False) is not True:
        return None
    cls = type(store)
    owner = next((k for k in cls.__mro__ if "apply" in vars(k)), None)
    if owner is None or "apply_by_id" not in vars(owner):
        return None
    found: ApplyById | None = getattr(store, "apply_by_id_checked", None) or getattr(store, "apply_by_id", None)
    return found


__all__ = ["IdPlan", "by_id_of", "id_plan", "id_plans", "id_write"]
