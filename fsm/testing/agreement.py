"""I7 as a reusable check: does a lifecycle's compiled table run as python-statemachine does?

:func:`check_agreement` sends one event sequence through both, the compiled table the
engine fires through and a live python-statemachine ``StateChart`` of the same class, with
every guard answering the same value on both sides.  After every step they must agree on
whether the event was accepted, and on the active configuration; and a StateChart restored
from what the engine persists (the leaf, and the history memory) must be in that
configuration too.  One place python-statemachine leaves undefined ends a sequence instead:
a history state entered before its compound was ever left, with no default transition
(python-statemachine then enters no state at all; the engine, the compound's initial state).

No hypothesis here: the sequences can come from anywhere (:mod:`fsm.testing.lifecycles`
draws them at random).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed

from fsm.chains import settle
from fsm.guards import Invalid
from fsm.history import remember, resolve
from fsm.lifecycle import Lifecycle
from fsm.table import Branch, CompiledTable


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


def advance(
    table: CompiledTable,
    event: str,
    leaf: str,
    memory: dict[str, str],
    branch: Branch,
    values: Mapping[str, bool],
) -> tuple[str, dict[str, str]]:
    """Where the engine's entity rests after ``branch`` (chosen for ``event`` from ``leaf``)
    and the steps it takes by itself, and its history memory then."""
    return _rest(table, event, leaf, memory, values, branch)


def created(table: CompiledTable, values: Mapping[str, bool]) -> tuple[str, dict[str, str]]:
    """Where a new entity rests once its create took the steps its initial state takes by
    itself (python-statemachine takes them when the chart starts), and its memory then."""
    return _rest(table, "create", table.initial, {}, values, None)


def _rest(
    table: CompiledTable,
    event: str,
    leaf: str,
    memory: dict[str, str],
    values: Mapping[str, bool],
    branch: Branch | None,
) -> tuple[str, dict[str, str]]:
    state = {"leaf": leaf}

    def take(step: Branch) -> None:
        nonlocal memory
        step = resolve(step, memory, state["leaf"])  # a no-op on a step settle resolved
        if step.remembers:
            memory = remember(step, memory, state["leaf"])
        state["leaf"] = step.target

    if branch is not None:
        take(branch)
    # the eventless and completion transitions python-statemachine takes by itself
    settle(table, "agreement", event, state["leaf"], _passes(values), take, lambda b: resolve(b, memory, state["leaf"]))
    return state["leaf"], memory


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
    # the chart starts (and a new entity is created) with the first step's guard answers
    values: dict[str, bool] = dict(steps[0][1]) if steps else {}
    memory: dict[str, str] = {}  # the history memory the engine would persist
    reference = lifecycle.restore(table.initial if start is None else start, values)  # guards read `values` live
    if start is None:  # a new entity takes its initial state's steps in its create
        leaf, memory = created(table, values)
    else:
        leaf = start
    if _active(reference) != set(table.configurations[leaf]):
        raise Disagreement(
            f"{lifecycle.__name__} starts: python-statemachine is in {_active(reference)}, the table in {leaf!r}"
        )
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
            if not _active(reference) and branch.restores is not None and branch.restores not in memory:
                # python-statemachine enters nothing for a history state with no memory and
                # no default transition (SCXML requires the default); the engine enters the
                # compound's initial state.  Nothing after this step can be compared.
                return
            leaf, memory = advance(table, event, leaf, memory, branch, outcome)
        expected = set(table.configurations[leaf])
        if _active(reference) != expected:
            raise Disagreement(f"{where}: python-statemachine is in {_active(reference)}, the table in {expected}")
        restored = _active(lifecycle.restore(leaf, values, memory))
        if restored != expected:
            raise Disagreement(f"{where}: restored from {leaf!r}, python-statemachine is in {restored}")


__all__ = ["Disagreement", "advance", "check_agreement", "created"]
