"""I7 as a reusable check: does a lifecycle's compiled table run as python-statemachine does?

:func:`check_agreement` sends one event sequence through both, the compiled table the
engine fires through and a live python-statemachine ``StateChart`` of the same class, with
every guard answering the same value on both sides.  After every step they must agree on
whether the event was accepted, and on the active configuration; and a StateChart restored
from the leaf alone (all the engine persists) must be in that configuration too.

No hypothesis here: the sequences can come from anywhere (:mod:`fsm.testing.lifecycles`
draws them at random).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed

from fsm.chains import settle
from fsm.guards import Invalid
from fsm.lifecycle import Lifecycle
from fsm.table import Branch


class Disagreement(AssertionError):
    """The compiled table and python-statemachine parted ways; the message says where."""


def _passes(values: Mapping[str, bool]) -> Callable[[Branch], bool]:
    def answer(name: str) -> bool:
        return bool(values.get(name, False))

    def passes(branch: Branch) -> bool:
        return all(
            (answer(g.name) if g.evaluate is None else g.evaluate(answer, branch.source)) is expected
            for g, expected in branch.guards
        )

    return passes


def _chosen(branches: Sequence[Branch], values: Mapping[str, bool]) -> Branch | None:
    """The branch taken under ``values``: the first whose guards pass, unless a validator of
    a branch tried before it refuses the whole event (python-statemachine's order)."""
    passes = _passes(values)
    for branch in branches:
        if any(g.validates and not values.get(g.name, False) for g, _ in branch.guards):
            return None
        if passes(branch):
            return branch
    return None


def _active(machine: Lifecycle) -> set[str]:
    # ids, not configuration_values: a state declared with State(value=...) reports its value
    return {s.id for s in machine.configuration}


def check_agreement(
    lifecycle: type[Lifecycle],
    steps: Sequence[tuple[str, Mapping[str, bool]]],
    start: str | None = None,
) -> None:
    """Raise :class:`Disagreement` at the first step where the table and python-statemachine
    differ (accepted vs refused, or the active states).  Both start in the leaf ``start``
    (default: the initial one)."""
    table = lifecycle.table
    values: dict[str, bool] = {}
    leaf = table.initial if start is None else start
    reference = lifecycle.restore(leaf, values)  # its guards read `values` live
    for n, (event, outcome) in enumerate(steps, 1):
        values.clear()
        values.update(outcome)
        where = f"{lifecycle.__name__} step {n}: {event!r} from {leaf!r} with guards {dict(outcome)}"
        branch = _chosen(table.branches_for(leaf, event), outcome)
        try:
            reference.send(event)
            accepted = True
        except (SmNotAllowed, Invalid):  # not allowed, or a validator refused it
            accepted = False
        if accepted != (branch is not None):
            taken = "took" if accepted else "refused"
            raise Disagreement(f"{where}: python-statemachine {taken} it, the table chose {branch}")
        if branch is not None:
            leaf = branch.target
            # the eventless and completion transitions python-statemachine takes by itself
            chain = settle(table, "agreement", event, leaf, _passes(outcome), lambda step: None)
            if chain:
                leaf = chain[-1].target
        expected = set(table.configurations[leaf])
        if _active(reference) != expected:
            raise Disagreement(f"{where}: python-statemachine is in {_active(reference)}, the table in {expected}")
        restored = _active(lifecycle.restore(leaf, values))
        if restored != expected:
            raise Disagreement(f"{where}: restored from {leaf!r}, python-statemachine is in {restored}")


__all__ = ["Disagreement", "check_agreement"]
