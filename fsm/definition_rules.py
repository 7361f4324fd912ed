"""Definition rules that keep live work alive, checked when a Lifecycle class is created.

:mod:`fsm.lifecycle` checks the shape a reaper depends on (``finalizing`` is a sub-state of
a compound active state; no *reaper* transition leaves it without ``lease_stale``).  These
rules close the remaining ways a definition lets live work be killed or silently mislabelled:

- every transition names its actor: wrapped in :func:`~fsm.lifecycle.worker`,
  :func:`~fsm.lifecycle.reaper` or :func:`operator_override` (an unwrapped one would be
  fired by "the worker" without saying so);
- a *worker* transition leaving ``finalizing`` (also one declared on the compound parent),
  or one that takes or clears its lease, must carry ``holds_lease``: otherwise any caller
  could fail (or take over) a live finalizer.  Failing a
  live finalizer on purpose (an operator's abort) is declared with
  :func:`operator_override`, which diagrams draw apart;
- the policy's ``renewal_budget`` names only non-final leaf states of the lifecycle (a
  misspelt ``"finalising"`` would silently leave ``finalizing`` with the default budget).

Every refusal is an ``InvalidDefinition`` naming the lifecycle and the transition.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from statemachine.transition_list import TransitionList

from fsm.builders import Transitions, transition_list
from fsm.errors import InvalidDefinition
from fsm.guards import LEASE_STALE
from fsm.policy import Policy
from fsm.records import Actor, DataChange, LeaseChange
from fsm.table import META_ATTR, CompiledTable, TransitionMeta, describe, negate_condition


def operator_override(
    transitions: Transitions,
    *,
    reason: str | None = "operator",
    lease: LeaseChange = LeaseChange.KEEP,
    changes: Iterable[DataChange] = (),
) -> TransitionList:
    """Mark transitions as an operator's override: fired like a worker transition (by a
    person or an admin tool, ``actor="worker"``), but allowed to leave ``finalizing``
    without holding the lease, so it fails or moves a finalizer that may be alive.

    Use it for an explicit abort; the name says what it does, history records ``reason``
    (``"operator"`` by default), and diagrams draw it apart (``(operator override)``).
    A plain ``worker(...)`` transition leaving ``finalizing`` without ``holds_lease`` is
    refused at class creation.  ``changes`` are data changes applied in the override's
    write, as :func:`~fsm.lifecycle.worker`'s are (a cancelled pipeline's running steps fail).
    """
    tl = transition_list(transitions, "operator_override")
    meta = TransitionMeta(Actor.WORKER, reason, LeaseChange(lease), False, False, tuple(changes), True)
    for t in tl:
        setattr(t, META_ATTR, meta)
    return tl


def check_definition(name: str, cls: Any) -> None:
    """Every rule of this module on a freshly created Lifecycle class ``cls``."""
    check_actors_declared(name, cls.states_map.values())
    check_finalizer_fenced(name, cls.table, cls.finalizing_state)
    check_policy_states(name, cls.table, cls.policy, InvalidDefinition)


def check_actors_declared(name: str, states: Any) -> None:
    """Refuse a transition not wrapped in ``worker()``, ``reaper()`` or ``operator_override()``."""
    for state in states:
        for t in state.transitions:
            if t.initial:
                continue
            meta = getattr(t, META_ATTR, None)
            if t.is_eventless and isinstance(meta, TransitionMeta) and meta.actor is Actor.REAPER:
                raise InvalidDefinition(
                    f"{name}: eventless {describe(t)} is declared with reaper(...): an eventless transition is "
                    "taken within the fire that led to it, by that caller; declare it with worker(...)"
                )
            if not isinstance(meta, TransitionMeta):
                raise InvalidDefinition(
                    f"{name}: {describe(t)} does not name its actor; wrap it in worker(...) (the entity's "
                    "owner fires it), reaper(...) (the reaper fires it) or operator_override(...)"
                )


def check_finalizer_fenced(name: str, table: CompiledTable, finalizing: str) -> None:
    """Refuse a worker transition leaving ``finalizing`` without ``holds_lease`` (unless it
    is declared an operator override); an eventless one too, taken in a caller's fire."""
    for branch in (*table.declared, *(b for found in table.automatic.values() for b in found)):
        if branch.source != finalizing or branch.actor is not Actor.WORKER or branch.holds_lease:
            continue
        if branch.target == finalizing and branch.lease_effect is LeaseChange.KEEP:
            continue  # stays in finalizing and leaves the lease alone: kills nothing
        if branch.override:
            continue
        on = f" (declared on {branch.declared_on!r})" if branch.declared_on != branch.source else ""
        raise InvalidDefinition(
            f"{name}: worker transition {branch.event!r} from {finalizing!r} to {branch.target!r}{on} lacks "
            f"the 'holds_lease' guard: any caller could fail a live finalizer. Add cond='holds_lease', "
            f"declare it from the state before {finalizing!r} only, or, to abort a live finalizer on "
            "purpose, declare it with operator_override(...)"
        )


def check_policy_states(
    name: str, table: CompiledTable, policy: Policy, error: type[Exception] = InvalidDefinition
) -> None:
    """Refuse a ``renewal_budget`` or ``retry`` naming a state that is not a non-final leaf
    of ``table``."""
    states = [s for s in table.leaves if s not in table.finals]
    # a policy shared with parallel regions (fsm.regions) may name any region's states
    states += sorted(table.chart_leaves - set(states))
    named = [("renewal_budget", k, "budgets") for k in policy.renewal_budget]
    named += [("retry", k, "retries") for k in policy.retry]
    for field, key, what_for in named:
        if key in states:
            continue
        close = difflib.get_close_matches(key, states, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        what = "a final state (a final state holds no lease)" if key in table.finals else "not a state of it"
        raise error(f"{name}: {field} names {key!r}, {what}{hint} (states with {what_for}: {', '.join(states)})")


def leased_states(table: CompiledTable) -> set[str]:
    """Non-final states an entity can be in while a lease is held: entered by a transition
    that acquires one, or by one that keeps it from a leased state (a fixed point)."""
    leased = {b.target for b in table.declared if b.lease_effect is LeaseChange.ACQUIRE}
    leased |= {b.source for b in table.declared if b.holds_lease}
    while True:
        more = {b.target for b in table.declared if b.source in leased and b.lease_effect is LeaseChange.KEEP}
        if more <= leased:
            return leased - table.finals
        leased |= more


def unreaped_states(table: CompiledTable, policy: Policy | None = None) -> tuple[str, ...]:
    """The states an entity can hold a lease in (:func:`leased_states`) that the reaper
    cannot free once the holder dies there: no timed reaper transition leaves it, and no
    reaper transition guarded by ``lease_stale`` takes a dead holder's entity whatever its
    counters (one with no other narrowing guard, or two whose narrowing guards complete each
    other, as ``recovery``'s ``reclaims_left`` and ``reclaims_exhausted`` do).  Such an
    entity stays there for good, a zombie.  Declaration order."""
    policy = policy or Policy()
    leased = leased_states(table)
    return tuple(s for s in table.leaves if s in leased and not _freed(table, s, policy))


def _freed(table: CompiledTable, state: str, policy: Policy) -> bool:
    narrowed: list[Any] = []
    for branch in table.declared:
        if branch.source != state or branch.actor is not Actor.REAPER:
            continue
        if branch.after is not None:
            return True  # a timer leaves the state whoever holds it
        if (LEASE_STALE, True) not in branch.guards:
            continue
        rest = [(g, e) for g, e in branch.guards if g is not LEASE_STALE and not (g.name == "owned" and e)]
        if any(g.name == "unclaimed" and e for g, e in rest):
            continue  # it takes an entity nobody holds: not a dead holder's
        if not rest:
            return True
        if len(rest) == 1:
            narrowed.append(_meaning(*rest[0], policy))
    return any(_complete(a, b) for a in narrowed for b in narrowed)


def _meaning(guard: Any, expected: bool, policy: Policy) -> Any:
    """What a narrowing guard requires: its store condition (negated for ``unless``), else
    its name and expected value."""
    condition = guard.condition(policy) if guard.condition is not None else None
    if condition is not None and not expected:
        condition = negate_condition(condition)
    return condition if condition is not None else (guard.name, expected)


def _complete(a: Any, b: Any) -> bool:
    """Whether every row meets ``a`` or ``b`` (one is the other's negation)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0] and a[1] is not b[1]
    return not isinstance(a, tuple) and negate_condition(a) == b


__all__ = [
    "check_actors_declared",
    "check_definition",
    "check_finalizer_fenced",
    "check_policy_states",
    "leased_states",
    "operator_override",
    "unreaped_states",
]
