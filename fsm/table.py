"""The compiled transition table: what the engine runs instead of a StateChart.

A python-statemachine ``StateChart`` costs tens of microseconds per ``send``; a persisted
transition must not.  Each Lifecycle class is therefore compiled once into
``(leaf state, event) -> branches``: the transitions declared on the leaf and on each of
its ancestors, in the order the statechart itself would try them (deepest state first,
then document order).  A property test (I7) proves the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from statemachine import State
from statemachine.transition import Transition

from fsm.errors import InvalidDefinition
from fsm.guard_expr import expression_guard, read_cond
from fsm.guards import HOLDS_LEASE, Guard
from fsm.history import child_on_path, default_entry, exited, history_of, remembering
from fsm.policy import Policy
from fsm.records import (
    Actor,
    Condition,
    CounterAtLeast,
    CounterBelow,
    DataChange,
    LeaseChange,
    Owned,
    TimerMode,
    Unclaimed,
)
from fsm.timers import timed_scopes, timer_mode


@dataclass(frozen=True, slots=True)
class TransitionMeta:
    """What the framework adds to a python-statemachine transition."""

    actor: Actor = Actor.WORKER
    reason: str | None = None
    lease: LeaseChange = LeaseChange.KEEP
    bump_attempt: bool = False
    bump_reclaims: bool = False
    changes: tuple[DataChange, ...] = ()
    """Data changes applied in the transition's write (:class:`~fsm.records.SetItems`)."""
    override: bool = False
    """An operator override (:func:`fsm.definition_rules.operator_override`): a worker
    transition allowed to leave ``finalizing`` without holding the lease."""
    after: timedelta | None = None
    """A timed transition (:mod:`fsm.timers`): it fires once the entity has stayed this
    long in the source state."""


META_ATTR = "_fsm_meta"


def meta_of(transition: Transition) -> TransitionMeta:
    meta = getattr(transition, META_ATTR, None)
    return meta if isinstance(meta, TransitionMeta) else TransitionMeta()


@dataclass(frozen=True, slots=True)
class Branch:
    """One guarded way an event can leave one leaf state."""

    event: str
    source: str
    """The leaf state this branch applies to."""
    declared_on: str
    """The state the transition is declared on (the leaf itself or an ancestor)."""
    target: str
    """The leaf state entered (a compound target resolves to its initial leaf)."""
    declared_target: str
    actor: Actor
    guards: tuple[tuple[Guard, bool], ...]
    """``(guard, expected)`` pairs: ``cond`` expects True, ``unless`` expects False."""
    reason: str | None
    lease: LeaseChange
    bump_attempt: bool
    bump_reclaims: bool
    to_final: bool
    order: int
    """Declaration order of the underlying transition, for stable exports."""
    holds_lease: bool = False
    """The actor must hold the lease: the write carries the fencing token."""
    lease_effect: LeaseChange = LeaseChange.KEEP
    """What the write does to the lease (entering a final state always clears it)."""
    rechecked: bool = False
    """Some guard has a store-side condition to re-check at commit."""
    actor_name: str = "worker"
    """``actor.value``, precomputed for the hot path."""
    override: bool = False
    """Declared with ``operator_override``: may fail a live finalizer on purpose."""
    changes: tuple[DataChange, ...] = ()
    """Data changes applied in the same write, by the engine and the reaper's batch."""
    after: timedelta | None = None
    """A timed transition's delay (:mod:`fsm.timers`), drawn as ``after 24h``."""
    timer: TimerMode = TimerMode.KEEP
    """What the write does to the entity's timer clock: computed here, once."""
    matched: str | None = None
    """For an event a dotted or wildcard descriptor takes (:func:`matches`), the descriptor
    the transition was declared with (``event`` is the one sent); ``None``: declared."""
    remembers: tuple[str, ...] = ()
    """The compound states with a history state this branch leaves: its write records the
    source leaf as where each was left (:mod:`fsm.history`)."""
    restores: str | None = None
    """The compound whose history state the transition targets (``declared_target``), or
    ``None``.  ``target`` is then the default (the compound never left); :attr:`variants`
    hold the others (each with ``restores`` set and no variants of its own)."""
    variants: tuple[tuple[str, Branch], ...] = field(default=(), compare=False, repr=False)

    """For a branch that :attr:`restores`: the leaf the memory may hold -> the concrete
    branch taken then (:func:`fsm.history.resolve`)."""

    @property
    def guard_names(self) -> list[str]:
        return [g.name if expected else f"not {g.name}" for g, expected in self.guards]

    @property
    def label(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def targets(self) -> tuple[str, ...]:
        """Every leaf the branch may enter: its target, and for a history target each leaf
        the memory may restore."""
        if not self.variants:
            return (self.target,)
        return tuple(dict.fromkeys((self.target, *(b.target for _, b in self.variants))))

    @property
    def target_name(self) -> str:
        """The target as declared for display: a leaf, or ``compound.history``."""
        return self.target if self.restores is None else f"{self.restores}.{self.declared_target}"


@dataclass(frozen=True, slots=True)
class CompiledTable:
    """The lifecycle as data: leaves, their full configurations, and the branch table."""

    name: str
    initial: str
    leaves: tuple[str, ...]
    finals: frozenset[str]
    events: tuple[str, ...]
    configurations: dict[str, tuple[str, ...]]
    """Leaf -> every active state id, outermost first (``("active", "finalizing")``)."""
    branches: dict[tuple[str, str], tuple[Branch, ...]]
    declared: tuple[Branch, ...]
    """Every branch of every leaf, in declaration order (for diagrams and checks)."""
    timed: dict[str, str | None] = field(default_factory=dict)
    """Leaf -> the timed state on its path (``None``: no timer counts there).  Empty when
    the lifecycle has no timed transitions."""
    by_leaf: dict[str, tuple[tuple[int, Branch], ...]] = field(default_factory=dict)
    """Leaf -> every branch an event in it may take, in the order the statechart tries them,
    each with its transition's declaration order (:func:`matches`: a dotted or wildcard
    descriptor takes events it was not declared for)."""
    automatic: dict[str, tuple[Branch, ...]] = field(default_factory=dict)
    """Leaf -> its eventless transitions (their ``event`` is :data:`AUTOMATIC`), in the order
    the statechart tries them: taken by themselves once their guards hold."""
    completion: dict[str, str] = field(default_factory=dict)
    """A final state nested in a compound -> the completion event entering it raises
    (``done.state.<compound>``)."""
    wide: bool = False
    """Some descriptor takes an undotted event it does not name (``*``, ``x.*``, ``x.``)."""
    chain_heads: frozenset[str] = frozenset()
    """The leaves whose entry may take more transitions by itself (eventless ones, or a
    completion event's): a write into one carries its microsteps (:mod:`fsm.chains`)."""
    remembered: dict[str, frozenset[str]] = field(default_factory=dict)
    """The compound states with a history state (:mod:`fsm.history`), each with the leaves
    inside it (what its memory may hold); empty for most lifecycles, whose writes then
    never carry a memory."""
    parallel: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Each parallel state -> its regions' ids (:mod:`fsm.regions`).  The entity's own row
    rests in the parallel state as in a leaf while its regions run, each region in a row
    of its own; empty for most lifecycles."""
    chart_leaves: frozenset[str] = frozenset()
    """The non-final leaves of the whole declared chart, its regions' included: what a
    shared :class:`~fsm.policy.Policy` may name (a region's lifecycle gets its chart's)."""
    _matched: dict[tuple[str, str], tuple[Branch, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_timers(self) -> bool:
        return any(scope is not None for scope in self.timed.values())

    def arms_on_create(self) -> bool:
        """Whether a new entity (in the initial leaf) starts its timer clock."""
        return self.timed.get(self.initial) is not None

    def timers(self) -> tuple[Branch, ...]:
        """The timed branches, one per leaf they apply to."""
        return tuple(b for b in self.declared if b.after is not None)

    def branches_for(self, leaf: str, event: str) -> tuple[Branch, ...]:
        """The branches ``event`` may take from ``leaf``, in the order they are tried: the
        branches declared for it, and those whose descriptor matches it (``error`` matches
        ``error.timeout``; ``*`` matches every event: :func:`matches`)."""
        found = self.branches.get((leaf, event))
        if found is not None:
            return found
        if "." not in event and not self.wide:
            return ()  # no descriptor but the event itself can match an undotted name
        key = (leaf, event)
        found = self._matched.get(key)
        if found is None:
            found = matching_branches(self.by_leaf.get(leaf, ()), event)
            if len(self._matched) < MAX_MATCHED:  # events are callers' input: the memo is bounded
                self._matched[key] = found
        return found

    def knows(self, event: str) -> bool:
        """Whether ``event`` is declared or matched by a declared descriptor."""
        return event in self.events or any(matches(d, event) for d in self.events)

    def select(
        self, leaf: str, event: str, passes: Callable[[Branch], bool], actor: Actor | None = None
    ) -> Branch | None:
        """The first branch (for ``actor``, or any actor) whose guards ``passes`` accepts."""
        for branch in self.branches_for(leaf, event):
            if (actor is None or branch.actor is actor) and passes(branch):
                return branch
        return None


def negate_condition(condition: Condition) -> Condition | None:
    """The store condition meaning "not ``condition``", where one exists (counters, owner)."""
    if isinstance(condition, CounterBelow):
        return CounterAtLeast(condition.counter, condition.limit)
    if isinstance(condition, CounterAtLeast):
        return CounterBelow(condition.counter, condition.limit)
    if isinstance(condition, Owned):
        return Owned(not condition.held)
    return None


def exclusive(a: tuple[Condition, ...], b: tuple[Condition, ...]) -> bool:
    """Whether no row can meet both ``a`` and ``b`` (one requires an owner, the other none)."""
    owner_a = {c.held for c in a if isinstance(c, Owned)} | {False for c in a if isinstance(c, Unclaimed)}
    owner_b = {c.held for c in b if isinstance(c, Owned)} | {False for c in b if isinstance(c, Unclaimed)}
    return any(x is not y for x in owner_a for y in owner_b)


def branch_conditions(branch: Branch, policy: Policy) -> tuple[Condition, ...]:
    """The store-side conditions of a branch's guards: each ``cond`` guard's condition, and
    the negation of each ``unless`` guard's (definitions refuse an ``unless`` on a guard
    whose condition has no negation)."""
    found: list[Condition] = []
    for g, expected in branch.guards:
        if g.condition is None:
            continue
        condition = g.condition(policy)
        negated = condition if expected else negate_condition(condition)
        if negated is not None:
            found.append(negated)
    return tuple(found)


AUTOMATIC = "(automatic)"
"""The event an eventless transition's history row records (python-statemachine's has none)."""

MAX_MATCHED = 4096
"""How many (leaf, undeclared event) answers :meth:`CompiledTable.branches_for` keeps."""


def matches(descriptor: str, event: str) -> bool:
    """Whether a transition declared for ``descriptor`` takes ``event``, as python-statemachine
    matches them: ``*`` takes every event; otherwise the descriptor (without a trailing ``.``
    or ``.*``) is the event or a prefix of it at a dot (``error`` takes ``error`` and
    ``error.timeout``, not ``errors``)."""
    if descriptor == "*":
        return True
    if descriptor.endswith(".*"):
        descriptor = descriptor[:-2]
    elif descriptor.endswith("."):
        descriptor = descriptor[:-1]
    return event == descriptor or event.startswith(descriptor + ".") or not descriptor


def matching_branches(ordered: Iterable[tuple[int, Branch]], event: str) -> tuple[Branch, ...]:
    """The branches of ``ordered`` (one leaf's, in the order they are tried) whose descriptor
    takes ``event``: one per transition, named for ``event`` (what its history row records)."""
    found: list[Branch] = []
    taken: set[int] = set()
    for rank, branch in ordered:
        if rank in taken or not matches(branch.event, event):
            continue
        taken.add(rank)
        found.append(branch if branch.event == event else replace(branch, event=event, matched=branch.event))
    return tuple(found)


def _initial_leaf(state: State) -> State:
    while state.is_compound and not state.parallel:  # a parallel state is its entity row's leaf
        children = list(state.states)
        state = next((c for c in children if c.initial), children[0])
    return state


def _ancestors(state: State) -> list[State]:
    chain: list[State] = []
    parent = state.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain


def _holders(leaf: State) -> list[State]:
    """The states whose transitions an event in ``leaf`` may take, in the order the
    statechart tries them: the leaf first, then each ancestor outwards (a transition
    declared on a sub-state overrides one declared on its parent)."""
    return [leaf, *_ancestors(leaf)]


def _guards_of(
    transition: Transition, guards: dict[str, Guard], where: str, states: dict[str, frozenset[str]]
) -> tuple[tuple[Guard, bool], ...]:
    found: list[tuple[Guard, bool]] = []
    for spec in transition.validators:  # python-statemachine runs them before the conditions
        named = spec.func
        g = guards.get(named) if isinstance(named, str) else None
        if g is None or not g.validates:
            raise InvalidDefinition(
                f"{where}: validators={named!r} must name a validator declared on the class with @validator "
                "(a function taking a GuardContext that raises to refuse, its message the reason)"
            )
        found.append((g, True))
    for spec in transition.cond:
        func: Any = spec.func
        if not isinstance(func, str):
            raise InvalidDefinition(
                f"{where}: guards must be named (cond='name'), so they can be persisted, re-checked and drawn; "
                f"got {func!r}"
            )
        for item in read_cond(func, unless=not spec.expected_value, where=where):
            if not isinstance(item, tuple):
                found.append((expression_guard(item, guards, states, where), True))
                continue
            name, expected = item
            if name not in guards:
                known = ", ".join(sorted(guards))
                raise InvalidDefinition(
                    f"{where}: unknown guard {name!r} (known guards: {known}); declare it on the class as a "
                    "function decorated with @guard taking a GuardContext (a plain method is not a guard: the "
                    "engine judges guards on the stored entity, never on a chart instance)"
                )
            g = guards[name]
            if g.validates:
                raise InvalidDefinition(
                    f"{where}: {name!r} is a validator (it refuses by raising): name it in validators=, "
                    "not in a condition"
                )
            if not expected and g.condition is not None and negate_condition(g.condition(Policy())) is None:
                raise InvalidDefinition(
                    f"{where}: unless={name!r} (or 'not {name}') cannot be re-checked by the store at commit (only "
                    "its positive form can); guard the transition positively (e.g. cond='holds_lease')"
                )
            found.append((g, expected))
    return tuple(found)


def describe(transition: Transition) -> str:
    target = transition.target.id if transition.target is not None else "?"
    return f"transition {transition.event!r} from {transition.source.id!r} to {target!r}"


def compile_table(name: str, states: Iterable[State], guards: dict[str, Guard]) -> CompiledTable:
    """Compile a StateChart's states into a :class:`CompiledTable`; refuses what a leaf id
    cannot represent (multi-target transitions).  History states, callbacks and event forms
    the table does not match are refused before, by :func:`fsm.unsupported.refuse_unsupported`.

    A parallel state is compiled as a leaf of the entity's own row, and what is inside it is
    left out: each region is a lifecycle of its own (:mod:`fsm.regions`)."""
    given = list(states)
    regions = {s.id: tuple(r.id for r in s.states) for s in given if s.parallel}
    all_states = [s for s in given if not any(a.parallel for a in _ancestors(s))]
    by_id = {s.id: s for s in all_states}
    leaves = [s for s in all_states if not s.is_compound or s.parallel]
    roots = [s for s in all_states if s.parent is None]
    initial_root = next((s for s in roots if s.initial), roots[0])
    order: dict[int, int] = {}
    for s in all_states:
        for t in s.transitions:
            order.setdefault(id(t), len(order))

    states_under = {
        s.id: frozenset(x.id for x in leaves if s is x or any(a is s for a in _ancestors(x))) for s in all_states
    }
    timed = {s.id for s in all_states for t in s.transitions if meta_of(t).after is not None}
    scopes = timed_scopes(name, all_states, timed) if timed else {}
    branches: dict[tuple[str, str], list[Branch]] = {}
    events: list[str] = []
    order_of: dict[int, int] = {}  # id(branch) -> the rank its transition is tried at from its leaf
    top_finals = {s.id for s in leaves if s.final and s.parent is None}
    remembered = {compound: states_under[compound] for compound in remembering(all_states)}

    def branch_of(t: Transition, event: str, leaf: State, holder: State, where: str) -> Branch:
        history = history_of(t.targets[0])
        if history is None:
            return concrete(t, event, leaf, holder, where, t.targets[0], _initial_leaf(t.targets[0]))
        # a history target: the default, and one concrete branch per leaf the memory may hold
        compound = history.parent
        assert compound is not None
        entry = default_entry(name, history)
        made = concrete(t, event, leaf, holder, where, entry, _initial_leaf(entry))
        deep = history.type.is_deep
        variants: list[tuple[str, Branch]] = []
        for held in (s for s in leaves if s.id in states_under[compound.id]):
            child = child_on_path(compound, held)
            assert child is not None
            restored = held if deep else _initial_leaf(child)
            variant = concrete(t, event, leaf, holder, where, child, restored)
            variants.append((held.id, replace(variant, restores=compound.id)))
        return replace(made, restores=compound.id, variants=tuple(variants))

    def concrete(
        t: Transition, event: str, leaf: State, holder: State, where: str, entered: State, target_leaf: State
    ) -> Branch:
        meta = meta_of(t)
        gs = _guards_of(t, guards, where, states_under)
        if meta.actor is Actor.REAPER and any(g.validates for g, _ in gs):
            raise InvalidDefinition(
                f"{where}: a reaper transition cannot have validators: the reaper fires it with no caller to "
                "tell why it was refused; use a guard"
            )
        # a final state nested in a compound is where the compound completes, not the end
        ends = target_leaf.id in top_finals
        return Branch(
            event=event,
            source=leaf.id,
            declared_on=holder.id,
            target=target_leaf.id,
            declared_target=t.targets[0].id,
            actor=meta.actor,
            guards=gs,
            reason=meta.reason,
            lease=meta.lease,
            bump_attempt=meta.bump_attempt,
            bump_reclaims=meta.bump_reclaims,
            to_final=ends,
            order=order[id(t)],
            holds_lease=any(g is HOLDS_LEASE and expected for g, expected in gs),
            lease_effect=LeaseChange.CLEAR if ends else meta.lease,
            rechecked=any(g.condition is not None for g, _ in gs),
            actor_name=meta.actor.value,
            override=meta.override,
            changes=meta.changes,
            after=meta.after,
            timer=timer_mode(t, leaf.id, target_leaf, scopes) if scopes else TimerMode.KEEP,
            remembers=remembering(exited(t, leaf, entered)) if remembered else (),
        )

    automatic: dict[str, list[Branch]] = {}
    for leaf in leaves:
        rank = 0
        for holder in _holders(leaf):
            for t in holder.transitions:
                rank += 1
                if t.initial:
                    continue
                where = f"{name}: {describe(t)}"
                if len(t.targets) != 1:
                    raise InvalidDefinition(f"{where}: a transition needs exactly one target")
                if t.is_eventless:  # taken by itself once its guards hold (fsm.chains)
                    made = branch_of(t, AUTOMATIC, leaf, holder, where)
                    if any(g.validates for g, _ in made.guards):
                        raise InvalidDefinition(f"{where}: an eventless transition cannot have validators; use a guard")
                    automatic.setdefault(leaf.id, []).append(made)
                    continue
                for event in (str(e) for e in t.events):
                    if event not in events:
                        events.append(event)
                    branches.setdefault((leaf.id, event), []).append(branch_of(t, event, leaf, holder, where))
                    order_of[id(branches[(leaf.id, event)][-1])] = rank
    declared = sorted((b for bs in branches.values() for b in bs), key=lambda b: (b.order, list(by_id).index(b.source)))
    by_leaf: dict[str, list[tuple[int, Branch]]] = {}
    for (leaf_id, _event), found in branches.items():
        by_leaf.setdefault(leaf_id, []).extend((order_of[id(b)], b) for b in found)
    ordered = {leaf_id: tuple(sorted(pairs, key=lambda p: (p[0], p[1].event))) for leaf_id, pairs in by_leaf.items()}
    if any(("." in e or "*" in e) for e in events):
        # a descriptor matching other events (``error`` matches ``error.timeout``): each
        # declared event takes every branch whose descriptor matches it, in statechart order
        for leaf_id, pairs in ordered.items():
            for event in events:
                if not event.endswith(("*", ".")):
                    merged = matching_branches(pairs, event)
                    if merged:
                        branches[(leaf_id, event)] = list(merged)
    configurations = {leaf.id: tuple(s.id for s in reversed([leaf, *_ancestors(leaf)])) for leaf in leaves}
    completion = {
        s.id: f"done.state.{s.parent.id}" for s in leaves if s.final and s.parent is not None and not s.parent.parallel
    }
    return CompiledTable(
        name=name,
        initial=_initial_leaf(initial_root).id,
        leaves=tuple(s.id for s in leaves),
        finals=frozenset(top_finals),
        events=tuple(events),
        configurations=configurations,
        branches={k: tuple(v) for k, v in branches.items()},
        declared=tuple(declared),
        timed=scopes,
        by_leaf=ordered,
        automatic={leaf_id: tuple(found) for leaf_id, found in automatic.items()},
        completion=completion,
        chain_heads=frozenset(automatic) | frozenset(completion),
        wide=any(e == "*" or e.endswith((".", ".*")) for e in events),
        remembered=remembered,
        parallel=regions,
        chart_leaves=frozenset(s.id for s in given if not s.is_compound and not s.final),
    )


__all__ = [
    "AUTOMATIC",
    "Branch",
    "CompiledTable",
    "TransitionMeta",
    "branch_conditions",
    "compile_table",
    "exclusive",
    "matches",
    "matching_branches",
    "meta_of",
    "negate_condition",
]
