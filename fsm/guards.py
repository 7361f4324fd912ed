"""Guards: named predicates on a transition, evaluated against one entity.

A guard is referenced by name in a transition's ``cond`` (python-statemachine's own
syntax), so the declaration stays a plain StateChart.  The engine evaluates guards on the
snapshot it read; a guard whose truth can change without a version bump (time, other
rows) also names a store *condition*, re-checked by the store at the commit point, so a
renewal that lands between read and write wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fsm.clock import Clock
from fsm.errors import InvalidDefinition
from fsm.policy import Policy
from fsm.records import (
    Condition,
    CounterAtLeast,
    CounterBelow,
    Lease,
    LeaseStale,
    NewerSibling,
    Owned,
    Snapshot,
    Unclaimed,
)


@dataclass(slots=True)
class GuardContext:
    """What a guard may look at: the entity as read, the time, the caller's lease, the
    lifecycle's policy, and (lazily) whether a newer sibling exists.

    ``now`` is read from ``clock`` on first use only: a store clock may cost a round trip,
    which a transition guarded by ``holds_lease`` alone should not pay.
    """

    snapshot: Snapshot
    clock: Clock
    lease: Lease | None
    policy: Policy
    newer_sibling: Callable[[], bool] | None = None
    _now: datetime | None = None

    @property
    def now(self) -> datetime:
        if self._now is None:
            self._now = self.clock.now()
        return self._now

    @property
    def data(self) -> dict[str, Any]:
        return self.snapshot.data


GuardCheck = Callable[[GuardContext], bool]
ConditionFactory = Callable[[Policy], Condition]
"""Builds the store-side re-check of a guard from the lifecycle's policy."""


@dataclass(frozen=True, slots=True)
class Guard:
    """A named predicate.  ``condition`` builds the store-side re-check, when there is one."""

    name: str
    check: GuardCheck
    description: str = ""
    condition: ConditionFactory | None = None
    after: timedelta | None = None
    """Set on a timed transition's generated guard (:mod:`fsm.timers`): its delay."""
    validates: bool = False
    """A validator (:func:`validator`): ``check`` returns True or raises :class:`Invalid`."""
    members: tuple[str, ...] = ()
    """A guard expression's (:mod:`fsm.guard_expr`): the guard names it combines."""
    evaluate: Callable[[Callable[[str], bool], str], bool] | None = None
    """A guard expression's truth from each member's answer (``lookup(name) -> bool``) and
    the entity's leaf state: how a test judges it from guard values instead of an entity."""

    @property
    def names(self) -> tuple[str, ...]:
        """The declared guards this one stands for: an expression's members (maybe none:
        ``In('x')``), or its own name."""
        return self.members if self.evaluate is not None else (self.name,)


def _check_decorated(decorator: str, fn: object) -> None:
    """``@guard`` and ``@validator`` take a named function, whose name becomes the guard's."""
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not isinstance(name, str) or not name.isidentifier():
        raise InvalidDefinition(f"@{decorator} decorates a function taking a GuardContext, not {fn!r}")


def guard(fn: GuardCheck | None = None, *, description: str | None = None) -> Any:
    """Declare a guard on a Lifecycle class; the function's name is the guard's name.

    ::

        class Deploy(Lifecycle):
            ...
            promote = worker(active.running.to(active.finalizing, cond="tests_green"))

            @guard
            def tests_green(ctx: GuardContext) -> bool:
                "every test step passed"
                return all(s["status"] == "passed" for s in ctx.data["steps"])

    A user guard should depend only on the entity's row (state, data, counters): the
    version compare-and-set then guarantees it still holds at commit.
    """

    def make(check: GuardCheck) -> Guard:
        _check_decorated("guard", check)
        doc = description if description is not None else (check.__doc__ or "").strip()
        return Guard(name=check.__name__, check=check, description=doc)

    if fn is not None:
        return make(fn)
    return make


class Invalid(Exception):  # an internal signal: the engine raises ValidationFailed for it
    """Raised by a validator's check: ``name`` refused, ``error`` says why."""

    def __init__(self, name: str, error: Exception) -> None:
        super().__init__(name, error)
        self.name = name
        self.error = error


def validator(fn: Callable[[GuardContext], object] | None = None, *, description: str | None = None) -> Any:
    """Declare a validator on a Lifecycle class, for python-statemachine's ``validators=``:
    it refuses a transition by raising, and its message is the reason the caller gets::

        class Payment(Lifecycle):
            ...
            charge = worker(pending.to(charged, validators="amount_positive"))

            @validator
            def amount_positive(ctx: GuardContext) -> None:
                "the amount is positive"
                if ctx.data.get("amount", 0) <= 0:
                    raise ValueError("the amount must be positive")

    The engine runs a branch's validators before its guards, on the entity as read; one
    that raises refuses the whole event with :class:`~fsm.errors.ValidationFailed` (no
    later branch is tried, as in python-statemachine) and nothing is written.  Like a
    guard, a validator should depend only on the entity's row.
    """

    def make(check: Callable[[GuardContext], object]) -> Guard:
        _check_decorated("validator", check)
        name = check.__name__

        def run(ctx: GuardContext) -> bool:
            try:
                check(ctx)
            except Exception as err:
                raise Invalid(name, err) from err
            return True

        doc = description if description is not None else (check.__doc__ or "").strip()
        return Guard(name=name, check=run, description=doc, validates=True)

    if fn is not None:
        return make(fn)
    return make


def _holds_lease(ctx: GuardContext) -> bool:
    lease, snap = ctx.lease, ctx.snapshot
    return lease is not None and snap.lease_owner == lease.owner and snap.lease_token == lease.token


def _lease_stale(ctx: GuardContext) -> bool:
    return ctx.snapshot.lease_is_stale(ctx.now, ctx.policy.stale_after)


def _superseded(ctx: GuardContext) -> bool:
    return ctx.newer_sibling is not None and ctx.newer_sibling()


def _attempts_left(ctx: GuardContext) -> bool:
    return ctx.snapshot.attempt < ctx.policy.max_attempts


def _reclaims_left(ctx: GuardContext) -> bool:
    return ctx.snapshot.reclaims < ctx.policy.max_reclaims


HOLDS_LEASE = Guard(
    "holds_lease",
    _holds_lease,
    "the caller holds the entity's current lease (owner and fencing token)",
)
LEASE_STALE = Guard(
    "lease_stale",
    _lease_stale,
    "the lease expired, or there is none and the entity is idle for stale_after",
    condition=lambda policy: LeaseStale(policy.stale_after),
)
SUPERSEDED = Guard(
    "superseded",
    _superseded,
    "a newer entity with the same concurrency key is in the same state",
    condition=lambda policy: NewerSibling(),
)
ATTEMPTS_LEFT = Guard(
    "attempts_left",
    _attempts_left,
    "attempt < max_attempts",
    condition=lambda policy: CounterBelow("attempt", policy.max_attempts),
)
RECLAIMS_LEFT = Guard(
    "reclaims_left",
    _reclaims_left,
    "reclaims < max_reclaims",
    condition=lambda policy: CounterBelow("reclaims", policy.max_reclaims),
)
RECLAIMS_EXHAUSTED = Guard(
    "reclaims_exhausted",
    lambda ctx: not _reclaims_left(ctx),
    "reclaims >= max_reclaims",
    condition=lambda policy: CounterAtLeast("reclaims", policy.max_reclaims),
)

OWNED = Guard(
    "owned",
    lambda ctx: ctx.snapshot.lease_owner is not None,
    "a holder has the lease (so its lapse is a death); a reclaimed or released entity nobody claimed has none",
    condition=lambda policy: Owned(True),
)
UNCLAIMED = Guard(
    "unclaimed",
    lambda ctx: ctx.snapshot.lease_owner is None and ctx.snapshot.idle_before(ctx.now - ctx.policy.max_wait),
    "no holder, and waiting for a worker longer than max_wait (the backstop)",
    condition=lambda policy: Unclaimed(policy.max_wait),
)

BUILTIN_GUARDS: dict[str, Guard] = {
    g.name: g
    for g in (
        HOLDS_LEASE,
        LEASE_STALE,
        SUPERSEDED,
        ATTEMPTS_LEFT,
        RECLAIMS_LEFT,
        RECLAIMS_EXHAUSTED,
        OWNED,
        UNCLAIMED,
    )
}

__all__ = [
    "ATTEMPTS_LEFT",
    "BUILTIN_GUARDS",
    "HOLDS_LEASE",
    "LEASE_STALE",
    "OWNED",
    "RECLAIMS_EXHAUSTED",
    "RECLAIMS_LEFT",
    "SUPERSEDED",
    "UNCLAIMED",
    "Guard",
    "GuardContext",
    "guard",
    "validator",
]
