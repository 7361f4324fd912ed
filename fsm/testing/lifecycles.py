"""Random Lifecycle classes and event sequences, as hypothesis strategies.

A generated lifecycle uses every feature the compiled table accepts, so comparing it with
python-statemachine (:mod:`fsm.testing.agreement`) tests the table on charts nobody wrote
by hand:

- compound states nested at several depths, with an explicit or document-order initial
  child, ``finalizing`` somewhere inside one of them; two top-level final states;
- the same event declared on a leaf and on its ancestors, several guarded branches of one
  event on one state, self-loops, internal transitions, transitions into and out of
  compounds and back to an ancestor;
- guards as one name, a list, ``"a and b"`` and ``"a ^ b"``, ``unless=``, built-in and
  user guards, worker and reaper transitions;
- events declared as the attribute name, through ``event="a b"``, and both;
- custom state values (``State(value=...)``).

A lifecycle is first drawn as a plain :class:`LifecycleSpec` (readable in a failing
example), then :func:`build` turns it into a class with python-statemachine's own syntax.
The spec always satisfies python-statemachine's structural checks (every state reachable,
a path to a final state from each) and the framework's rules (``finalizing`` in a
compound, reaper transitions carry ``lease_stale``).

This module imports hypothesis: a test dependency, never imported by fsm itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hypothesis import strategies as st
from statemachine import State
from statemachine.state import NestedStateFactory

from fsm.definition_rules import operator_override
from fsm.guards import Guard
from fsm.lifecycle import Lifecycle, reaper, worker

EVENTS = ("e0", "e1", "e2")
"""A small pool, so one event often lands on a leaf and on its parent."""
UNDECLARED_EVENT = "e_undeclared"
USER_GUARDS = ("g0", "g1")
COND_GUARDS = (*USER_GUARDS, "holds_lease")
UNLESS_GUARDS = (*USER_GUARDS, "holds_lease")  # built-in time guards cannot be negated at commit
FINALS = ("done", "failed")

Shape = tuple["Shape", ...]
"""A state's shape: ``()`` is a leaf, otherwise the shapes of its children."""
EventForm = Literal["attribute", "keyword", "both"]
CondForm = Literal["list", "and", "caret"]


@dataclass(frozen=True)
class StateSpec:
    """One state: its id, optional custom value, children (empty for a leaf)."""

    id: str
    value: str | int | None = None
    children: tuple[StateSpec, ...] = ()
    initial_child: int | None = None
    """Index of the child marked ``initial=True``; ``None`` leaves it to document order."""

    def walk(self) -> Iterator[StateSpec]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class TransitionSpec:
    """One declared transition."""

    source: str
    target: str
    events: tuple[str, ...]
    form: EventForm
    cond: tuple[str, ...] = ()
    cond_form: CondForm = "list"
    unless: tuple[str, ...] = ()
    internal: bool = False
    reaper: bool = False


@dataclass(frozen=True)
class LifecycleSpec:
    """A whole lifecycle: top-level states (the first is initial) and transitions in
    declaration order."""

    roots: tuple[StateSpec, ...]
    transitions: tuple[TransitionSpec, ...]

    def states(self) -> Iterator[StateSpec]:
        for root in self.roots:
            yield from root.walk()

    def parents(self) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for root in self.roots:
            found[root.id] = None
            for s in root.walk():
                for c in s.children:
                    found[c.id] = s.id
        return found


_SHAPES: st.SearchStrategy[Shape] = st.recursive(
    st.just(()),
    lambda kids: st.lists(kids, min_size=1, max_size=3).map(tuple),
    max_leaves=6,
)
_VALUE_KINDS = st.sampled_from(("id", "id", "str", "int"))
_BOOLS = st.booleans()


def _name(draw: st.DrawFn, shape: Shape, ids: Iterator[str], finalizing: int, leaf_no: list[int]) -> StateSpec:
    """Ids in document order; the ``finalizing``-th nested leaf is named ``finalizing``."""
    sid = next(ids)
    kind = draw(_VALUE_KINDS)
    value = None if kind == "id" else f"{sid}-value" if kind == "str" else 100 + int(sid[1:])
    if not shape:
        return StateSpec(sid, value)
    children: list[StateSpec] = []
    for child in shape:
        if not child:
            leaf_no[0] += 1
            if leaf_no[0] == finalizing:
                children.append(StateSpec("finalizing", "fin-value" if draw(_BOOLS) else None))
                continue
        children.append(_name(draw, child, ids, finalizing, leaf_no))
    initial = draw(st.integers(0, len(children) - 1)) if draw(_BOOLS) else None
    return StateSpec(sid, value, tuple(children), initial)


def _nested_leaves(shape: Shape) -> int:
    return sum(1 if not c else _nested_leaves(c) for c in shape)


@st.composite
def _tree(draw: st.DrawFn) -> tuple[StateSpec, ...]:
    shapes = draw(st.lists(_SHAPES, min_size=1, max_size=3))
    if all(not s for s in shapes):
        shapes[draw(st.integers(0, len(shapes) - 1))] = ((),)  # finalizing needs a compound parent
    nested = sum(_nested_leaves(s) for s in shapes if s)
    finalizing = draw(st.integers(1, nested))
    ids = (f"s{i}" for i in range(1000))
    leaf_no = [0]
    roots = tuple(_name(draw, s, ids, finalizing, leaf_no) for s in shapes)
    return (*roots, *(StateSpec(f) for f in FINALS))


def _entered(spec: StateSpec) -> list[str]:
    """``spec`` and the initial descendants entering it enters."""
    found = [spec.id]
    while spec.children:
        spec = spec.children[spec.initial_child or 0]
        found.append(spec.id)
    return found


# drawn thousands of times per run: built once, since hypothesis validates each new strategy
_EVENT_SETS = st.lists(st.sampled_from(EVENTS), min_size=1, max_size=2, unique=True).map(tuple)
_ONE_FORM: st.SearchStrategy[EventForm] = st.just("attribute")
_ANY_FORM: st.SearchStrategy[EventForm] = st.sampled_from(get_args(EventForm))
_REAPER = st.integers(0, 4).map(lambda n: n == 0)
_CONDS = st.lists(st.sampled_from(COND_GUARDS), max_size=2, unique=True).map(tuple)
_COND_FORMS: st.SearchStrategy[CondForm] = st.sampled_from(get_args(CondForm))
_UNLESS = st.lists(st.sampled_from(UNLESS_GUARDS), max_size=1).map(tuple)


def _transition(draw: st.DrawFn, source: str, target: str, internal_ok: bool) -> TransitionSpec:
    events: tuple[str, ...] = draw(_EVENT_SETS)
    form: EventForm = draw(_ANY_FORM if len(events) > 1 else _ONE_FORM)
    is_reaper: bool = draw(_REAPER)
    cond: tuple[str, ...] = draw(_CONDS)
    if is_reaper and "lease_stale" not in cond:
        cond = ("lease_stale", *cond)  # the framework's rule for anything a reaper may fire
    return TransitionSpec(
        source=source,
        target=target,
        events=events,
        form=form,
        cond=cond,
        cond_form=draw(_COND_FORMS),
        unless=draw(_UNLESS),
        internal=internal_ok and draw(_BOOLS),
        reaper=is_reaper,
    )


@st.composite
def lifecycle_specs(draw: st.DrawFn) -> LifecycleSpec:
    """A random :class:`LifecycleSpec` (see the module docstring for what it covers)."""
    roots = draw(_tree())
    spec = LifecycleSpec(roots, ())
    by_id = {s.id: s for s in spec.states()}
    parents = spec.parents()

    def ancestors(sid: str) -> list[str]:
        chain: list[str] = []
        parent = parents[sid]
        while parent is not None:
            chain.append(parent)
            parent = parents[parent]
        return chain

    def internal_ok(source: str, target: str) -> bool:
        # python-statemachine allows an internal transition to the source or a descendant
        return target == source or source in ancestors(target)

    transitions: list[TransitionSpec] = []
    reached = set(_entered(roots[0]))
    order = [s.id for s in spec.states()]
    for sid in order:
        # a spine in document order: every state is entered by some transition from a
        # state reached before it, so python-statemachine finds no unreachable state
        if sid in reached:
            continue
        source = draw(st.sampled_from(tuple(sorted(s for s in reached if s not in FINALS))))
        transitions.append(_transition(draw, source, sid, internal_ok(source, sid)))
        reached |= {sid, *ancestors(sid), *_entered(by_id[sid])}
    non_final = tuple(s for s in order if s not in FINALS)
    for _ in range(draw(st.integers(0, 8))):
        source = draw(st.sampled_from(non_final))
        target = draw(st.sampled_from((source, *ancestors(source), *order)))
        transitions.append(_transition(draw, source, target, internal_ok(source, target)))
    for root in roots:
        if root.id not in FINALS:
            # every top-level state leaves for a final one: no trap state, a path to a final
            transitions.append(_transition(draw, root.id, draw(st.sampled_from(FINALS)), False))
    order_of = draw(st.permutations(range(len(transitions))))
    return LifecycleSpec(roots, tuple(transitions[i] for i in order_of))


def _state(spec: StateSpec, initial: bool, made: dict[str, State]) -> State:
    kwargs: dict[str, Any] = {"initial": initial} if initial else {}
    if spec.value is not None:
        kwargs["value"] = spec.value
    if spec.id in FINALS:
        kwargs["final"] = True
    if not spec.children:
        state = State(**kwargs)
    else:
        body = {c.id: _state(c, i == spec.initial_child, made) for i, c in enumerate(spec.children)}
        # the class-body syntax `class s1(State.Compound): ...`, called as the metaclass it is
        state = NestedStateFactory(spec.id, (State.Compound,), body, **kwargs)
    made[spec.id] = state
    return state


def _cond(t: TransitionSpec) -> str | list[str] | None:
    if not t.cond:
        return None
    if t.cond_form == "and":
        return " and ".join(t.cond)
    if t.cond_form == "caret":
        return " ^ ".join(t.cond)
    return list(t.cond)


def build(spec: LifecycleSpec, name: str = "Generated") -> type[Lifecycle]:
    """The Lifecycle class ``spec`` describes, declared with python-statemachine's syntax."""
    made: dict[str, State] = {}
    attrs: dict[str, Any] = {r.id: _state(r, i == 0, made) for i, r in enumerate(spec.roots)}
    for g in USER_GUARDS:
        attrs[g] = Guard(g, lambda ctx: False, "generated")
    for t in spec.transitions:
        keyword = {"attribute": (), "keyword": t.events, "both": t.events[1:]}[t.form]
        declared = made[t.source].to(
            made[t.target],
            event=" ".join(keyword) or None,
            cond=_cond(t),
            unless=list(t.unless) or None,
            internal=t.internal,
        )
        if t.reaper:
            tagged = reaper(declared)
        elif "holds_lease" in t.cond:
            tagged = worker(declared)
        else:  # may leave finalizing without the lease: declared as the named override (issue 11)
            tagged = operator_override(declared, reason=None)
        if t.form != "keyword":
            attr = t.events[0]
            attrs[attr] = attrs[attr] | tagged if attr in attrs else tagged
    return type(name, (Lifecycle,), attrs)


def lifecycles() -> st.SearchStrategy[type[Lifecycle]]:
    """Random Lifecycle classes (built from :func:`lifecycle_specs`)."""
    return lifecycle_specs().map(build)


Step = tuple[str, dict[str, bool]]
"""An event to send, and the value every guard answers while it is handled."""


def steps(lifecycle: type[Lifecycle], max_size: int = 20) -> st.SearchStrategy[list[Step]]:
    """Random event sequences for ``lifecycle``, each event with random guard values; the
    events include one the lifecycle never declares (both sides must refuse it)."""
    names = sorted(lifecycle.guards)
    events = sorted({*lifecycle.table.events, *EVENTS, UNDECLARED_EVENT})
    values = st.fixed_dictionaries({n: st.booleans() for n in names})
    return st.lists(st.tuples(st.sampled_from(events), values), max_size=max_size)


__all__ = [
    "EVENTS",
    "LifecycleSpec",
    "StateSpec",
    "Step",
    "TransitionSpec",
    "build",
    "lifecycle_specs",
    "lifecycles",
    "steps",
]
