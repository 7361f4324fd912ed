"""Declaring a lifecycle: a python-statemachine ``StateChart`` with actors and guards.

::

    class Deploy(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        done = State(final=True)
        failed = State(final=True)

        start = worker(queued.to(active))
        finish = worker(active.running.to(active.finalizing), lease=LeaseChange.ACQUIRE)
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))
        expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")

At class creation the framework refuses every python-statemachine feature the compiled
table would not run as python-statemachine does (callbacks, history states, parallel
states: :mod:`fsm.unsupported`, :mod:`fsm.table`), checks the rules a reaper depends
on (``finalizing`` is a sub-state of a compound active state; no reaper transition leaves
``finalizing`` without the ``lease_stale`` guard), resolves every guard name, and compiles
the class once into a :class:`~fsm.table.CompiledTable` that the engine runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel
from statemachine import State, StateChart
from statemachine.callbacks import CallbackPriority
from statemachine.event import Event
from statemachine.exceptions import InvalidDefinition as SmInvalidDefinition
from statemachine.factory import StateMachineMetaclass
from statemachine.state import NestedStateFactory
from statemachine.transition import Transition
from statemachine.transition_list import TransitionList

from fsm.builders import Transitions, transition_list
from fsm.chains import check_chains
from fsm.coordination import Limits
from fsm.definition_rules import check_definition
from fsm.errors import InvalidDefinition
from fsm.evolution.declare import Declaration, Migrations, check_migrations
from fsm.guards import BUILTIN_GUARDS, LEASE_STALE, Guard, GuardContext, Invalid
from fsm.history import check_history, restore_memory
from fsm.policy import Policy
from fsm.records import Actor, DataChange, LeaseChange
from fsm.regions import check_parallel, check_parallel_table, region_lifecycles
from fsm.table import META_ATTR, CompiledTable, TransitionMeta, compile_table, meta_of
from fsm.timers import check_after, format_delay, timer_guard, timer_guard_name
from fsm.unsupported import declared_delays, refuse_unsupported

FINALIZING = "finalizing"


def _tag(transitions: Transitions, meta: TransitionMeta, builder: str) -> TransitionList:
    tl = transition_list(transitions, builder)
    for t in tl:
        setattr(t, META_ATTR, meta)
    return tl


def worker(
    transitions: Transitions,
    *,
    reason: str | None = None,
    lease: LeaseChange = LeaseChange.KEEP,
    counts_attempt: bool = False,
    changes: Iterable[DataChange] = (),
) -> TransitionList:
    """Mark transitions as fired by the worker that owns the entity.

    ``lease=LeaseChange.ACQUIRE`` makes the transition take the lease for the caller
    (token + 1); ``counts_attempt`` increments the entity's attempt counter; ``changes``
    (:class:`~fsm.records.SetItems`) are applied to the entity's data in the same write.
    """
    meta = TransitionMeta(Actor.WORKER, reason, LeaseChange(lease), counts_attempt, False, tuple(changes))
    return _tag(transitions, meta, "worker")


def reaper(
    transitions: Transitions,
    *,
    reason: str | None = None,
    lease: LeaseChange = LeaseChange.CLEAR,
    counts_reclaim: bool = False,
    changes: Iterable[DataChange] = (),
    after: timedelta | float | None = None,
) -> TransitionList:
    """Mark transitions as fired by the reaper; ``reason`` is recorded in history.

    By default a reaper transition clears the lease; ``lease=LeaseChange.ACQUIRE`` with
    ``counts_reclaim`` is a reclaim: the lease passes to a new owner, token + 1.
    ``changes`` are applied to each moved entity's data in the same write, by the reaper's
    set-based batch as by the engine (``SetItems("steps", "status", ("running",), "failed")``).

    ``after`` makes it a *timed* transition: it fires once the entity has stayed that long
    in the source state (a ``timedelta``, or seconds), unless another transition left the
    state first; a timer on a compound state counts from entering it, whatever moves
    happen between its children (:mod:`fsm.timers`)::

        timeout = reaper(waiting.to(failed), after=timedelta(hours=24), reason="timed out")
    """
    delay = check_after(after, "reaper(after=...)") if after is not None else None
    meta = TransitionMeta(Actor.REAPER, reason, LeaseChange(lease), False, counts_reclaim, tuple(changes), after=delay)
    found = _tag(transitions, meta, "reaper")
    if delay is not None:
        for t in found:
            # the generated guard, in the chart itself: python-statemachine runs it too
            t.cond.add(timer_guard_name(delay), priority=CallbackPriority.INLINE, expected_value=True)
    return found


# -- the durable-work declarations, in one line each -----------------------------------------


def starts(transitions: Transitions) -> TransitionList:
    """The worker's way out of the queue: the transition a claim fires.  It takes the lease
    for the claiming worker (token + 1) and counts an attempt::

        start = starts(queued.to(active))
    """
    return worker(transitions, lease=LeaseChange.ACQUIRE, counts_attempt=True)


def retries(*, queued: State, running: State, finalizing: State | None = None) -> TransitionList:
    """The worker's ``retry`` event (declare it as ``retry = retries(...)``): a handler error
    that the policy retries sends ``running`` back to ``queued``, and a ``finalizing``
    entity back to itself, both giving the lease back; the entity is due again after the
    backoff, and a resumed finalizer replays its recorded effects.  The error is kept in
    the history row.  See :class:`~fsm.policy.RetryPolicy`::

        retry = retries(queued=queued, running=active.running, finalizing=active.finalizing)
    """
    found = worker(running.to(queued, cond="holds_lease"), lease=LeaseChange.CLEAR)
    if finalizing is not None:
        found = found | worker(
            finalizing.to.itself(cond="holds_lease"),  # type: ignore[no-untyped-call]
            lease=LeaseChange.CLEAR,
        )
    return found


class Recovery(NamedTuple):
    """The reaper's two events of :func:`recovery`: ``expire, reclaim = recovery(...)``."""

    expire: TransitionList
    reclaim: TransitionList


def recovery(*, queued: State, running: State, finalizing: State, failed: State) -> Recovery:
    """ "Requeue from running, reclaim from finalizing", as the built-in ``JobLifecycle``
    recovers; declare it as ``expire, reclaim = recovery(...)``.

    - a dead holder (its lease lapsed while it held one) in ``running`` is requeued while
      ``Policy.max_attempts`` starts remain, else failed (reason ``expired``);
    - a dead holder in ``finalizing`` is reclaimed (token + 1, the lease left free for a
      claim; recorded effects replay) while ``Policy.max_reclaims`` remain, else failed;
    - an entity waiting, with no owner, for a worker (reclaimed, released at a stop,
      retried) is never failed for waiting, however busy the workers are; only the
      backstop ``Policy.max_wait`` fails it (reason ``unclaimed``).

    Reclaims therefore count deaths, not idle claim windows.  Nothing leaves
    ``finalizing`` while its lease is fresh (every branch requires ``lease_stale``).
    """
    expire = (
        reaper(running.to(queued, cond=["lease_stale", "owned", "attempts_left"]), reason="expired")
        | reaper(running.to(failed, cond=["lease_stale", "owned"]), reason="expired")
        | reaper(running.to(failed, cond=["lease_stale", "unclaimed"]), reason="unclaimed")
        | reaper(finalizing.to(failed, cond=["lease_stale", "owned", "reclaims_exhausted"]), reason="expired")
        | reaper(finalizing.to(failed, cond=["lease_stale", "unclaimed"]), reason="unclaimed")
    )
    reclaim = reaper(
        finalizing.to.itself(cond=["lease_stale", "owned", "reclaims_left"]),  # type: ignore[no-untyped-call]
        reason="reclaimed",
        lease=LeaseChange.ACQUIRE,
        counts_reclaim=True,
    )
    return Recovery(expire, reclaim)


class LifecycleMeta(StateMachineMetaclass):
    """Collects guards, checks the framework's rules and compiles the table."""

    def __new__(mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> LifecycleMeta:
        compiled = [b.__name__ for b in bases if getattr(b, "table", None) is not None]
        declares = [
            k
            for k, v in attrs.items()
            if isinstance(v, State | TransitionList | Transition | Event | NestedStateFactory)
        ]
        if compiled and declares:
            # python-statemachine shares inherited State objects: a transition declared here
            # was appended to the parent's states when its line ran; take it back out, so the
            # refusal leaves the parent as it was
            for base in bases:
                for state, declared in getattr(base, "_declared_transitions", {}).values():
                    state.transitions.transitions[:] = declared
            raise InvalidDefinition(
                f"{name}: subclassing {', '.join(compiled)} may change kind, policy, data_model and guards, "
                f"not declare states or transitions ({', '.join(declares)}); declare a new Lifecycle instead"
            )
        own_guards = {k: attrs.pop(k) for k in [k for k, v in attrs.items() if isinstance(v, Guard)]}
        shadowing = sorted(g.name for g in own_guards.values() if g.name in BUILTIN_GUARDS)
        if shadowing:
            # the engine fences and re-checks built-in guards by identity: a look-alike would
            # silently drop the fencing token or the store-side re-check
            raise InvalidDefinition(
                f"{name}: guard name(s) {', '.join(shadowing)} are built in and cannot be redefined; "
                "give your guard another name"
            )
        cls = super().__new__(mcs, name, bases, attrs)
        inherited: dict[str, Guard] = {}
        for base in reversed(bases):
            inherited.update(getattr(base, "guards", {}))
        cls.guards = {**BUILTIN_GUARDS, **inherited, **{g.name: g for g in own_guards.values()}}
        return cls

    guards: dict[str, Guard]
    kind: str
    table: CompiledTable
    delays: dict[str, timedelta]
    evolution: Migrations
    regions: dict[str, dict[str, Any]]
    region_of: tuple[Any, str, str] | None

    def __init__(cls, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> None:  # noqa: N805
        try:
            super().__init__(name, bases, attrs)  # type: ignore[arg-type]
        except SmInvalidDefinition as err:
            raise InvalidDefinition(f"{name}: {err}") from err
        if not cls.states:
            return
        _add_timer_guards(name, cls)
        refuse_unsupported(name, cls, cls.guards, Lifecycle)
        for attr, wanted, what in (
            ("limits", (Limits, type(None)), "an fsm.Limits or None"),
            ("policy", Policy, "a Policy"),
        ):
            value = getattr(cls, attr, None)
            if not isinstance(value, wanted):
                raise InvalidDefinition(f"{name}: {attr} must be {what}, not {type(value).__name__}")
        if "kind" not in attrs and getattr(cls, "kind", None) is None:
            # a subclass of a compiled lifecycle (a new policy) keeps its kind: the rows are the same
            cls.kind = name.removesuffix("Lifecycle").lower() or name.lower()
        check_parallel(name, cls.states_map.values())
        cls.table = compile_table(name, cls.states_map.values(), cls.guards)
        if cls.region_of is not None:  # a region's lifecycle shares its chart's policy
            cls.table = replace(cls.table, chart_leaves=cls.region_of[0].table.chart_leaves)
        check_chains(name, cls.table)
        check_history(name, cls.table)
        cls.evolution = check_migrations(
            name, getattr(cls, "version", 1), getattr(cls, "migrations", ()), cls.table.leaves
        )
        if cls.table.parallel:
            check_parallel_table(name, cls.table, cls.evolution)
        cls.delays = declared_delays(cls)
        # what each (shared) State object held at creation: a refused subclass that appended
        # transitions to them is rolled back to this
        cls._declared_transitions = {
            id(state): (state, list(state.transitions.transitions)) for state in cls.states_map.values()
        }
        _check_finalizing_rules(name, cls)
        check_definition(name, cls)  # fsm.definition_rules: actors, fenced finalizers, policy states
        # each region of a parallel state is a lifecycle of its own (fsm.regions)
        cls.regions = region_lifecycles(cls) if cls.table.parallel else {}


def _add_timer_guards(name: str, cls: Any) -> None:
    """Register the generated guard of every timed transition (``after_24h``)."""
    for state in cls.states_map.values():
        for t in state.transitions:
            delay = meta_of(t).after
            if delay is None:
                continue
            g = timer_guard(delay)
            existing = cls.guards.get(g.name)
            if existing is not None and existing.after is None:
                raise InvalidDefinition(
                    f"{name}: guard {g.name!r} is the generated guard of a timer of {format_delay(delay)}; "
                    "give your guard another name"
                )
            cls.guards[g.name] = g


def _check_finalizing_rules(name: str, cls: Any) -> None:
    fin_id = cls.finalizing_state
    fin = next((s for s in cls.states_map.values() if s.id == fin_id), None)
    if fin is None and cls.region_of is not None:
        return  # a region without a finalizer (its lifecycle has one in another region)
    if fin is None:
        raise InvalidDefinition(
            f"{name}: a lifecycle declares an explicit {fin_id!r} state, a sub-state of a compound "
            "active state, so the reaper can tell a finalizer from a stuck worker"
        )
    if fin.parent is None or not fin.parent.is_compound:
        raise InvalidDefinition(
            f"{name}: {fin_id!r} must be a sub-state of a compound active state "
            f"(declare it inside `class active(State.Compound)`), not a top-level state"
        )
    if fin.is_compound:
        raise InvalidDefinition(f"{name}: {fin_id!r} must be a leaf state")
    table: CompiledTable = cls.table
    for branch in table.declared:
        if branch.source != fin_id or branch.actor is not Actor.REAPER:
            continue
        if (LEASE_STALE, True) not in branch.guards:
            raise InvalidDefinition(
                f"{name}: reaper transition {branch.event!r} from {fin_id!r} to {branch.target!r} "
                f"(declared on {branch.declared_on!r}) lacks the 'lease_stale' guard: the reaper "
                f"must never move a finalizer whose lease is fresh"
            )


class _GuardOracle:
    """A python-statemachine listener answering each guard name from a fixed mapping or a
    context, so a StateChart instance evaluates exactly what the engine evaluates."""

    def __init__(self, guards: Mapping[str, Guard], values: Mapping[str, bool] | GuardContext | None) -> None:
        for name, g in guards.items():
            setattr(self, name, self._answer(g, values))

    @staticmethod
    def _answer(g: Guard, values: Mapping[str, bool] | GuardContext | None) -> Any:
        if isinstance(values, GuardContext):
            ctx = values
            return lambda: g.check(ctx)  # a validator raises Invalid out of send()
        table = values if values is not None else {}
        if g.validates:

            def validate() -> None:
                if not table.get(g.name, False):
                    raise Invalid(g.name, ValueError(f"{g.name} answered False"))

            return validate
        return lambda: bool(table.get(g.name, False))


class Lifecycle(StateChart[Any], metaclass=LifecycleMeta):
    """Base of every lifecycle.  Subclass it and declare states and transitions with
    python-statemachine's syntax, wrapping transitions in :func:`worker` or :func:`reaper`.

    Class attributes a subclass may set:

    - ``kind``: the entity kind stored with each row (default: the class name, lowercased,
      without a ``Lifecycle`` suffix);
    - ``data_model``: a pydantic model the entity's data must satisfy;
    - ``policy``: the default :class:`~fsm.policy.Policy` (TTLs and budgets).
    """

    allow_event_without_transition = False  # an event with no transition is an error (I10)
    catch_errors_as_events = False

    kind: ClassVar[str]
    data_model: ClassVar[type[BaseModel] | None] = None
    policy: ClassVar[Policy] = Policy()
    finalizing_state: ClassVar[str] = FINALIZING
    guards: ClassVar[dict[str, Guard]]
    table: ClassVar[CompiledTable]
    limits: ClassVar[Limits | None] = None
    """How its workers share the work: concurrency and rate limits, and the starvation
    rule of priorities (:class:`fsm.coordination.Limits`); ``None``: none."""
    delays: ClassVar[dict[str, timedelta]] = {}
    """Events declared with python-statemachine's ``delay=`` (id -> delay): fired with
    ``Engine.fire_later``, whose default delay it is."""
    version: ClassVar[int] = 1
    """The definition's version (1 to 2**31-1).  Each entity records the version it was
    created, last claimed or last migrated under, and a worker never claims an entity a
    newer version wrote: raise it when a release changes what stored entities mean."""
    migrations: ClassVar[tuple[Declaration, ...]] = ()
    """What became of the states and data of older versions (:mod:`fsm.evolution`:
    ``Renamed``, ``Removed``, ``Split``, ``DataMigration``), carried out by ``fsm migrate-rows``."""
    evolution: ClassVar[Migrations]
    """The checked :attr:`migrations` (built at class creation)."""
    regions: ClassVar[dict[str, dict[str, Any]]] = {}
    """Each parallel state -> its regions' generated lifecycles, by region id
    (:mod:`fsm.regions`); empty without parallel states."""
    region_of: ClassVar[tuple[Any, str, str] | None] = None
    """For a region's generated lifecycle: ``(the lifecycle, the parallel state, the
    region)``; ``None`` for every declared lifecycle."""

    def __init__(
        self,
        model: Any = None,
        state_field: str = "state",
        start_value: Any = None,
        listeners: list[object] | None = None,
        *,
        guards: Mapping[str, bool] | GuardContext | None = None,
        **kwargs: Any,
    ) -> None:
        """A live python-statemachine chart of this lifecycle (the engine never builds one).

        Guard names are answered by ``guards``: a name -> bool mapping (a guard not named
        there is False) or a :class:`GuardContext` evaluated live.  ``JobLifecycle()``
        therefore works as a plain chart: unguarded transitions fire, guarded ones are
        refused until their guards are given as True.
        """
        if not any(isinstance(x, _GuardOracle) for x in listeners or ()):
            listeners = [*(listeners or ()), _GuardOracle(type(self).guards, guards)]
        super().__init__(model, state_field, start_value, listeners, **kwargs)

    @classmethod
    def restore(
        cls,
        leaf: str,
        guards: Mapping[str, bool] | GuardContext | None = None,
        memory: Mapping[str, str] | None = None,
    ) -> Lifecycle:
        """A live StateChart in the configuration a stored leaf state stands for.

        The full configuration (``active`` + ``finalizing``) is rebuilt from the leaf, so
        a transition declared on the compound parent works after the restore.  Guards
        answer from ``guards`` (a name -> bool mapping, or a context evaluated live).
        ``memory``: the entity's history memory (:attr:`fsm.records.Snapshot.memory`),
        restored into the chart's history states.
        """
        if leaf not in cls.table.configurations:
            raise InvalidDefinition(f"{cls.__name__} has no leaf state {leaf!r}")
        # the engine persists state ids; python-statemachine starts from a state *value*,
        # which differs from the id for a state declared with State(value=...)
        value = next(s.value for s in cls.states_map.values() if s.id == leaf)
        machine = cls(start_value=value, guards=guards)
        if memory:
            restore_memory(machine, memory)
        return machine


__all__ = ["FINALIZING", "Lifecycle", "Recovery", "reaper", "recovery", "retries", "starts", "worker"]
