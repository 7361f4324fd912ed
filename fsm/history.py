"""History states, persisted: where a compound state was left, and entering it there again.

A python-statemachine ``HistoryState`` inside a compound state ``P`` stands for "where
``P`` was when it was last left": a transition targeting it re-enters the leaf ``P`` was in
(``type="deep"``), or the child of ``P`` that held that leaf, entered at its own initial
state (shallow, the default).  Before ``P`` was ever left it takes its default transition
(``h.to(state)``), or enters ``P``'s initial state.

The engine keeps the memory on the entity (:attr:`fsm.records.Snapshot.memory`):
``{compound id: leaf id}``, one entry per compound with a history state that the entity
has left.  Both kinds need only the leaf: a deep history restores it, a shallow one the
child of ``P`` on its path.  The table compiles everything else once:

- each branch knows which compounds with a history state it leaves
  (:attr:`fsm.table.Branch.remembers`): its write records the source leaf for each of them,
  in the same compare-and-set as the transition (:func:`remember`);
- a branch targeting a history state (:attr:`fsm.table.Branch.restores`) carries one
  concrete branch per leaf the memory may hold (:attr:`fsm.table.Branch.variants`), each
  with its own target, lease effect, timer effect and memory updates; the engine picks one
  by the entity's memory (:func:`resolve`) after the guards passed (they are the same for
  every variant).

Writes that do not run through a caller's fire cannot read the memory (the reaper's
set-based batch, a claim's start): a lifecycle in which one of them would leave a compound
with a history state (other than into a final state, after which nothing reads it) or
enter a history state is refused at class creation (:func:`check_history`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from statemachine import HistoryState, State
from statemachine.transition import Transition

from fsm.errors import InvalidDefinition
from fsm.records import Actor, LeaseChange

if TYPE_CHECKING:
    from fsm.table import Branch, CompiledTable


def history_of(state: State) -> HistoryState | None:
    """``state`` as a history pseudo-state, or ``None``."""
    return state if isinstance(state, HistoryState) else None


def _path(state: State) -> list[State]:
    """``state`` and its ancestors, innermost first."""
    chain = [state]
    while chain[-1].parent is not None:
        chain.append(chain[-1].parent)
    return chain


def default_entry(name: str, history: HistoryState) -> State:
    """The state a history state enters before its compound was ever left: its default
    transition's target, or the compound itself (entered at its initial state)."""
    parent = history.parent
    assert parent is not None  # python-statemachine declares history states inside a compound
    defaults = [t for t in history.transitions if t.targets]
    if len(defaults) > 1 or any(len(t.targets) != 1 for t in defaults):
        raise InvalidDefinition(
            f"{name}: history state {history.id!r} of {parent.id!r} declares more than one default transition; "
            "declare one (h.to(state))"
        )
    if not defaults:
        return parent
    target = defaults[0].targets[0]
    if target.is_history or parent not in _path(target)[1:]:
        raise InvalidDefinition(
            f"{name}: the default transition of history state {history.id!r} targets {target.id!r}, which is not "
            f"a state inside {parent.id!r}; a history state's default must enter its own compound"
        )
    if list(defaults[0].cond) or list(defaults[0].validators):
        raise InvalidDefinition(
            f"{name}: the default transition of history state {history.id!r} has guards; a history state's default "
            "is taken unconditionally: remove them"
        )
    entered: State = target
    return entered


def child_on_path(compound: State, leaf: State) -> State | None:
    """The child of ``compound`` that holds ``leaf`` (``leaf`` itself when a direct child)."""
    path = _path(leaf)
    for inner, outer in itertools.pairwise(path):
        if outer is compound:
            return inner
    return None


def exited(transition: Transition, source_leaf: State, entered: State) -> list[State]:
    """The states a transition from ``source_leaf`` leaves, given the state it enters
    (``entered``: its target, or what a history target stands for), innermost first: the
    active states below the transition's domain, as python-statemachine computes it (an
    internal transition into its own compound source, or to its own atomic source, stays
    inside it; otherwise the least common compound ancestor of its source and ``entered``)."""
    source = transition.source
    target_path = _path(entered)[1:]
    domain: State | None
    if transition.internal and (
        (source.is_compound and source in target_path) or (source is entered and not entered.is_compound)
    ):
        domain = source
    else:
        domain = next((s for s in _path(source)[1:] if s.is_compound and s in target_path), None)
    active = _path(source_leaf)
    return active if domain is None else active[: active.index(domain)]


def remembering(states: Iterable[State]) -> tuple[str, ...]:
    """The ids of ``states`` that have a history state (their memory is written on exit)."""
    return tuple(s.id for s in states if any(isinstance(c, HistoryState) for c in s.history))


def remember(branch: Branch, memory: dict[str, str] | None, leaf: str) -> dict[str, str]:
    """The entity's memory once ``branch`` leaves ``leaf``: each compound it leaves that has a
    history state remembers ``leaf``."""
    new = dict(memory) if memory.__class__ is dict and memory else {}
    for compound in branch.remembers:
        new[compound] = leaf
    return new


def kept_memory(memory: object, remembered: Mapping[str, frozenset[str]]) -> dict[str, str] | None:
    """The entries of ``memory`` (a caller's held snapshot's: anything) that the lifecycle
    can hold: a compound with a history state and a leaf inside it; ``None`` when none is."""
    if memory.__class__ is not dict:
        return None
    kept = {
        compound: leaf
        for compound, leaf in memory.items()
        if compound.__class__ is str and leaf.__class__ is str and leaf in remembered.get(compound, ())
    }
    return kept or None


def resolve(branch: Branch, memory: dict[str, str] | None, leaf: str | None = None) -> Branch:
    """The concrete branch a history-targeting ``branch`` takes from ``leaf`` for the entity's
    ``memory`` (itself, its default, when the compound was never left or its memory names a
    leaf the compound no longer has).

    python-statemachine records the history of the states a transition leaves before it
    works out what to enter: a transition that leaves the very compound whose history it
    targets (``setup.to(setup.h)`` from inside) restores what it just recorded, ``leaf``."""
    if branch.restores is None:
        return branch
    first = _variant(branch, memory)
    if leaf is not None and branch.restores in first.remembers:
        second = _variant(branch, remember(first, memory, leaf))
        if second is not first:  # its target, and what the leaving records
            return replace(second, remembers=first.remembers)
    return first


def _variant(branch: Branch, memory: dict[str, str] | None) -> Branch:
    if memory.__class__ is not dict or not memory:
        return branch
    assert memory is not None
    leaf = memory.get(branch.restores)  # type: ignore[arg-type]
    if leaf is None:
        return branch
    found = next((b for held, b in branch.variants if held == leaf), None)
    if found is None:
        return branch
    if found.event != branch.event:  # the copy a dotted or wildcard descriptor took
        found = replace(found, event=branch.event, matched=branch.matched)
    return found


def restore_memory(machine: Any, memory: Mapping[str, str]) -> None:
    """Give a live python-statemachine chart the history ``memory`` records, in its own form
    (per history state: the states it restores)."""
    by_id = {s.id: s for s in machine.states_map.values()}
    for compound_id, leaf_id in memory.items():
        compound, leaf = by_id.get(compound_id), by_id.get(leaf_id)
        if compound is None or leaf is None or compound not in _path(leaf)[1:]:
            continue  # a memory the chart cannot hold (a renamed state): its default applies
        below = _path(leaf)
        below = below[: below.index(compound)]  # the leaf up to the child of the compound
        for history in compound.history:
            machine.history_values[history.id] = list(reversed(below)) if history.type.is_deep else [below[-1]]


def check_history(name: str, table: CompiledTable) -> None:
    """Refuse a reaper transition or a claim's start that would enter a history state or
    leave a compound with one (except into a final state): neither reads nor writes the
    memory (see the module)."""
    for branch in table.declared:
        for concrete in (branch, *(b for _, b in branch.variants)):
            _check_branch(name, concrete, branch.restores)


def _check_branch(name: str, branch: Branch, restores: str | None) -> None:
    if branch.actor is Actor.REAPER:
        who = f"reaper transition {branch.event!r} from {branch.source!r}"
        how = "the reaper's set-based batch"
    elif branch.lease_effect is LeaseChange.ACQUIRE and not branch.guards and branch.actor is Actor.WORKER:
        who = f"{branch.event!r} from {branch.source!r} (a claim's start)"
        how = "a claim"
    else:
        return
    if restores is not None:
        raise InvalidDefinition(
            f"{name}: {who} targets the history state of {restores!r}; {how} does not read the entity's history "
            "memory: target a state, or fire the event from the application"
        )
    if branch.remembers and not branch.to_final:
        raise InvalidDefinition(
            f"{name}: {who} leaves {', '.join(repr(c) for c in branch.remembers)}, which has a history state; "
            f"{how} does not record where it was left: move the history state, or let it enter a final state"
        )


__all__ = [
    "check_history",
    "child_on_path",
    "default_entry",
    "exited",
    "history_of",
    "kept_memory",
    "remember",
    "remembering",
    "resolve",
    "restore_memory",
]
