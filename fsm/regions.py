"""Parallel regions, persisted: a row per region, each with its own leaf and lease.

A parallel state runs its regions side by side (python-statemachine's ``State.Parallel``)::

    class Release(Lifecycle):
        queued = State(initial=True)

        class checks(State.Parallel):
            class build(State.Compound):
                ...                      # its own states, a finalizer, its own reaper rules
            class tests(State.Compound):
                ...

        shipped = State(final=True)

        begin = worker(queued.to(checks))
        done_state_checks = worker(checks.to(shipped))   # the join

How it is stored, and why:

- **The entity's own row rests in the parallel state** (``checks``) as in a leaf, with no
  lease: it waits for its regions.
- **Each region is a row of its own**, a child of the entity (``release-7/build``), of a
  lifecycle generated from the region (kind ``release.build``: its states, transitions,
  guards, policy and data model).  So each region has its own leaf, version, lease and
  fencing token, visible to SQL: a worker per region claims it, the reaper's set-based
  rules reap it, a region's ``running`` can be reaped while its sibling finalizes, and a
  ``finalizing`` region is never expired while its lease is fresh, as any finalizer.
  ``Engine.region("build")`` is the region's engine.
- **Entering the parallel state** writes the entity's transition and creates (or, on a
  later visit, restarts at its initial state with fresh counters) every region's row in
  one transaction (:meth:`stores.Store.apply_group`): no one ever sees the entity inside
  without its regions.  A region starts with the entity's data and concurrency key.
- **The join.**  When a region's row enters one of its final states, the engine that wrote
  it looks, right after that commit, whether every region is final, and if so fires
  ``done.state.<parallel>`` on the entity (a compare-and-set on its row: of two regions
  finishing at once, the later commit sees both final, and a second join finds the entity
  moved and does nothing).  The reaper's set-based move of a region into a final state,
  and a crash between a region's commit and its join, are healed by the reaper, which
  joins every entity whose regions are all final on each tick.
- **Leaving it by an event** moves each running region's row to ``left_<parallel>`` (a
  final state of the region's lifecycle) in the same commit; a region finalizing under a
  fresh lease refuses it (checked in the statement too), unless the transition is an
  operator override.  Into another parallel state, that state's regions start in the
  same commit; into itself (internal or not: SCXML exits and enters the regions either
  way), every region restarts at its initial state, under the same rule.

A lifecycle may start in its parallel state: its create inserts the entity and every
region's row in one transaction.  A region without a final state never completes, so its
parallel state is never joined (as python-statemachine has it).

A parallel state may sit inside compounds: their transitions enter it (into a compound
whose initial state it is) and leave it (one declared on a compound holding it) as its
own do, under the same rules.

What is refused at class creation, each with its reason: a history state on a compound
holding a parallel state, a region that is not a compound state, a transition crossing a region's border
(enter the parallel state itself, leave it by its join or an event declared on it), an
event shared by two regions, a region's own completion event, a reaper transition or a
claim's start into the parallel state, a reaper or eventless transition leaving it (its
own or a holding compound's), a
join requiring ``holds_lease``, a migration into it, a region starting in a state that
takes steps by itself, and a history state inside a region.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from statemachine import HistoryState, State
from statemachine.transition import Transition
from statemachine.transition_list import TransitionList

from fsm.errors import InvalidDefinition
from fsm.guards import BUILTIN_GUARDS
from fsm.ids import joined_id
from fsm.records import Actor, LeaseChange
from fsm.table import AUTOMATIC, META_ATTR, TransitionMeta, meta_of

if TYPE_CHECKING:
    from fsm.records import Snapshot

log = logging.getLogger("fsm.regions")

REGION_TABLE_PREFIX = "done.state."


def join_event(parallel: str) -> str:
    """The completion event the entity takes once every region of ``parallel`` is final."""
    return f"{REGION_TABLE_PREFIX}{parallel}"


def region_row_id(entity_id: str, region: str) -> str:
    """The id of a region's row: the entity's id and the region's (``release-7/build``),
    shortened with a digest as a child's id is when too long."""
    return joined_id(entity_id, region)


def _inside(state: State, ancestor: State) -> bool:
    parent = state.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def _subtree(state: State) -> list[State]:
    found = [state]
    for child in state.states:
        found += _subtree(child)
    return found


def _ancestry(state: State) -> list[State]:
    """``state`` and every compound holding it, innermost first."""
    found = [state]
    while found[-1].parent is not None:
        found.append(found[-1].parent)
    return found


def _region_of(state: State) -> State | None:
    """The region (a child of a parallel state) ``state`` is in, or ``None``."""
    while state.parent is not None:
        if state.parent.parallel:
            return state
        state = state.parent
    return None


def check_parallel(name: str, states: Iterable[State]) -> None:
    """Refuse the parallel charts this module cannot persist (see the module doc)."""
    all_states = list(states)
    events_of: dict[str, str] = {}  # event -> the region (or "" outside) declaring it
    region_done = {  # a region's completion event -> its parallel state
        join_event(r.id): s.id for s in all_states if s.parallel for r in s.states
    }
    for s in all_states:
        if s.parallel:
            for holder in _ancestry(s)[1:]:  # the compounds holding it: left with it, re-entered into it
                if any(isinstance(h, HistoryState) for h in holder.history):
                    raise InvalidDefinition(
                        f"{name}: compound {holder.id!r} holds parallel state {s.id!r} and has a history state; "
                        "a history state cannot restore a parallel state's regions"
                    )
            for region in s.states:
                if region.parallel or not region.is_compound:
                    raise InvalidDefinition(
                        f"{name}: region {region.id!r} of parallel state {s.id!r} must be a compound state "
                        f"(class {region.id}(State.Compound))"
                    )
                for inner in _subtree(region):
                    if inner is not region and inner.parallel:
                        raise InvalidDefinition(
                            f"{name}: parallel state {inner.id!r} is nested in region {region.id!r}; regions "
                            "cannot hold parallel states"
                        )
                    if any(isinstance(h, HistoryState) for h in inner.history):
                        raise InvalidDefinition(
                            f"{name}: state {inner.id!r} in region {region.id!r} has a history state; history "
                            "states inside a region are not supported"
                        )
        within = _region_of(s)
        for t in s.transitions:
            if t.initial:
                continue
            where = f"{name}: transition {' '.join(str(e) for e in t.events) or '(eventless)'} from {s.id!r}"
            targets = list(t.targets)
            if within is not None:
                if s is within:
                    raise InvalidDefinition(
                        f"{where}: declared on region {within.id!r} itself; declare it on a state inside the region"
                    )
                if any(not _inside(x, within) for x in targets):
                    outer = within.parent.id if within.parent is not None else ""
                    raise InvalidDefinition(
                        f"{where}: its target leaves region {within.id!r}; a region's transitions stay inside it "
                        f"(the entity leaves the parallel state by its join, {join_event(outer)})"
                    )
            else:
                for x in targets:
                    entered = _region_of(x)
                    if entered is not None:
                        outer = entered.parent.id if entered.parent is not None else ""
                        raise InvalidDefinition(
                            f"{where}: its target {x.id!r} is inside a region; target the parallel state "
                            f"{outer!r} itself (each region starts at its initial state)"
                        )
                if s.parallel:
                    _check_exit(name, where, s, t)
                # a transition entering a parallel state (straight, or through a compound whose
                # initial state it is) is judged on the compiled table: check_parallel_table
            owner = "" if within is None else within.id
            for event in (str(e) for e in t.events):
                if event in region_done:
                    raise InvalidDefinition(
                        f"{where}: event {event!r} is a region's own completion; only the parallel state's "
                        f"({join_event(region_done[event])}) is delivered, to its join"
                    )
                other = events_of.setdefault(event, owner)
                if other != owner:
                    places = " and ".join(repr(p) if p else "outside the regions" for p in sorted({other, owner}))
                    raise InvalidDefinition(
                        f"{name}: event {event!r} is declared in region {places}; an event is fired on one row, "
                        "so each region names its own events (build_finish, tests_finish)"
                    )


def _check_exit(name: str, where: str, parallel: State, t: Transition) -> None:
    meta = meta_of(t)

    if t.is_eventless:
        raise InvalidDefinition(
            f"{where}: an eventless transition leaving parallel state {parallel.id!r} is not supported; leave it by "
            f"its join ({join_event(parallel.id)}) or by an event"
        )
    if meta.actor is not Actor.WORKER or meta.lease is LeaseChange.ACQUIRE:
        raise InvalidDefinition(
            f"{where}: a transition leaving parallel state {parallel.id!r} moves every region's row in its own "
            "write, which the reaper's set-based batch cannot do; declare it with worker(...) (an event a caller "
            "fires, or the join), taking no lease"
        )


def restart_reason(parallel: str) -> str:
    """The reason of a region row's history row that restarts it at its initial state (its
    entity entered ``parallel`` again): each such row begins a new visit of the region."""
    return f"entered {parallel} again"


def exit_event(parallel: str) -> str:
    """The region's event the engine takes to move its row to :func:`exit_state` (fired by
    the engine only, in the write that leaves the parallel state)."""
    return f"exit_{parallel}"


def exit_state(parallel: str) -> str:
    """The final state a region's row is moved to when its parallel state is left by an
    event while the region runs (python-statemachine exits the region: a row must rest
    somewhere, and a final state is where no worker claims it)."""
    return f"left_{parallel}"


def check_parallel_table(name: str, table: Any, migrations: Any) -> None:
    """What the compiled table shows: a transition leaving a parallel state that requires
    ``holds_lease`` (the entity's row holds no lease there: it could never fire), and a
    lifecycle migration moving rows into a parallel state (its regions' rows are created by
    the transition that enters it, which ``migrate_rows`` does not take).

    A parallel state nested in compounds is entered and left by their transitions too (a
    transition into a compound whose initial state it is, one from a compound holding it):
    what :func:`check_parallel` refuses of a transition declared on the parallel state
    itself is refused of those as well, from the compiled branches."""
    automatic = [b for found in table.automatic.values() for b in found]
    for branch in (*table.declared, *automatic):  # an eventless transition enters it too
        event = "(eventless)" if branch.event in ("", AUTOMATIC) else branch.event
        where = f"{name}: transition {event} from {branch.source!r}"
        if branch.target in table.parallel and branch.source not in table.parallel:
            if branch.actor is Actor.REAPER:
                raise InvalidDefinition(
                    f"{where}: a reaper transition enters parallel state {branch.target!r}; the reaper's "
                    "set-based batch does not create regions: enter it with a worker transition"
                )
            if branch.lease_effect is LeaseChange.ACQUIRE:
                raise InvalidDefinition(
                    f"{where}: enters parallel state {branch.target!r} taking a lease; the entity's row holds no "
                    "lease while its regions run (each region's row has its own)"
                )
        if branch.source in table.parallel and branch.event != join_event(branch.source):
            if branch.event.startswith(REGION_TABLE_PREFIX):
                continue  # a holding compound's completion: it never fires while the parallel state runs
            if branch.actor is not Actor.WORKER or branch.lease_effect is LeaseChange.ACQUIRE:
                raise InvalidDefinition(
                    f"{where}: a transition leaving parallel state {branch.source!r} moves every region's row in "
                    "its own write, which the reaper's set-based batch cannot do; declare it with worker(...) "
                    "(an event a caller fires, or the join), taking no lease"
                )
    for source in table.parallel:
        if table.automatic.get(source):
            raise InvalidDefinition(
                f"{name}: an eventless transition leaves parallel state {source!r} (declared on a compound "
                f"holding it); leave it by its join ({join_event(source)}) or by an event"
            )
    for branch in table.declared:
        if branch.source in table.parallel and branch.holds_lease:
            raise InvalidDefinition(
                f"{name}: {branch.event!r} from parallel state {branch.source!r} requires holds_lease, but the "
                "entity's row holds no lease while its regions run (each region's row has its own): it could "
                "never fire"
            )
    for _, move in migrations.moves:
        into = getattr(move, "into", None)
        targets = into if isinstance(into, tuple) else (getattr(move, "new", None) or into,)
        for target in targets:
            if target in table.parallel:
                raise InvalidDefinition(
                    f"{name}: migration {move!r} moves rows into parallel state {target!r}; its regions' rows are "
                    "created by the transition that enters it: move them into a state before it"
                )


# -- the generated lifecycle of each region ---------------------------------------------------


def _copy_state(old: State, copies: dict[int, State]) -> State:
    children = [_copy_state(c, copies) for c in old.states]
    new = State(name=old.name, value=old.value, initial=old.initial, final=old.final, states=children)
    new._set_id(old.id)
    copies[id(old)] = new
    return new


def _copy_transitions(old: State, copies: dict[int, State]) -> None:
    for t in old.transitions:
        if t.initial:
            continue
        source = copies[id(t.source)]
        made = Transition(source, [copies[id(x)] for x in t.targets], internal=t.internal)
        made._events = t._events  # the same event ids
        for attr in ("_specs", "validators", "before", "on", "after", "cond"):
            setattr(made, attr, getattr(t, attr))
        setattr(made, META_ATTR, getattr(t, META_ATTR, None))
        source.transitions.add_transitions(TransitionList([made]))
    for child in old.states:
        _copy_transitions(child, copies)


def region_states(region: State) -> list[State]:
    """Copies of the states inside ``region`` (its children become top-level states), with
    copies of their transitions: the chart of the region's own lifecycle.  Top-level
    copies first, then every nested one (what ``compile_table`` takes)."""
    copies: dict[int, State] = {}
    tops = [_copy_state(child, copies) for child in region.states]
    for child in region.states:
        _copy_transitions(child, copies)
    return [state for top in tops for state in _subtree(top)]


def region_lifecycles(cls: Any) -> dict[str, dict[str, Any]]:
    """The generated lifecycle class of every region of ``cls``: parallel id -> region id ->
    class (kind ``{cls.kind}.{region}``; the parent's policy, data model, limits, version
    and guards)."""
    from fsm.lifecycle import Lifecycle, LifecycleMeta

    made: dict[str, dict[str, Any]] = {}
    tables_events = {str(e) for s in cls.states_map.values() for t in s.transitions for e in t.events}
    for parallel, regions in cls.table.parallel.items():
        state = next(s for s in cls.states_map.values() if s.id == parallel)
        made[parallel] = {}
        for region in state.states:
            attrs: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}.{region.id}"}
            tops = [state for state in region_states(region) if state.parent is None]
            attrs.update((state.id, state) for state in tops)
            # the parallel state is left by its own transitions and by those of the compounds
            # holding it (each moves the entity out of every state inside them)
            exits = [
                t
                for holder in _ancestry(state)
                for t in holder.transitions
                if not t.initial and join_event(parallel) not in t.events
            ]
            if exits:  # the parallel state can be left by an event: each region's row then rests here
                left = exit_state(parallel)
                if left in cls.states_map or {left, exit_event(parallel)} & {*cls.table.events, *tables_events}:
                    raise InvalidDefinition(
                        f"{cls.__name__}: {left!r} is the name of the state a region's row rests in when "
                        f"{parallel!r} is left by an event; rename your state or event"
                    )
                attrs[left] = final = State(final=True)
                moves = TransitionList()
                for top in tops:
                    if not top.final:
                        moves.add_transitions(top.to(final))
                meta = TransitionMeta(Actor.WORKER, f"{parallel} left", LeaseChange.CLEAR, override=True)
                for t in moves:
                    setattr(t, META_ATTR, meta)
                attrs[exit_event(parallel)] = moves
            for guard_name, guard in cls.guards.items():
                if guard_name not in BUILTIN_GUARDS and guard.after is None:
                    attrs[f"_guard_{guard_name}"] = guard
            attrs.update(
                kind=f"{cls.kind}.{region.id}",
                policy=cls.policy,
                data_model=cls.data_model,
                limits=cls.limits,
                version=getattr(cls, "version", 1),
                finalizing_state=cls.finalizing_state,
                region_of=(cls, parallel, region.id),
            )
            try:
                made_cls = LifecycleMeta(f"{cls.__name__}.{region.id}", (Lifecycle,), attrs)
            except InvalidDefinition as err:
                if "names no state" in str(err):  # In('x') on a sibling's or the entity's state
                    raise InvalidDefinition(
                        f"{err}; a region's guards see its own row only: In(...) naming a state outside region "
                        f"{region.id!r} is not supported"
                    ) from None
                raise
            made[parallel][region.id] = made_cls
            if made_cls.table.initial in made_cls.table.chain_heads:
                raise InvalidDefinition(
                    f"{cls.__name__}: region {region.id!r} starts in {made_cls.table.initial!r}, which takes "
                    "eventless or completion transitions by itself; a region's row is created without them: "
                    "start the region in a state without them"
                )
        assert tuple(made[parallel]) == regions
    return made


def all_final(rows: dict[str, Snapshot | None], finals: dict[str, frozenset[str]]) -> bool:
    """Whether every region has ended: its row rests in one of its final states, or is gone
    (deleted, or pruned once it ended: entering creates every row in the entity's own
    commit, so a row the entity does not find while inside was removed, and never ends)."""
    return all(row is None or row.deleted or row.state in finals[r] for r, row in rows.items())


def region_rows(store: Any, entity_id: str, regions: Iterable[str]) -> dict[str, Snapshot | None]:
    """The entity's region rows, by region id (``None``: none)."""
    from fsm.errors import UnknownEntity

    found: dict[str, Snapshot | None] = {}
    for region in regions:
        try:
            found[region] = store.get(region_row_id(entity_id, region), include_deleted=True)
        except UnknownEntity:
            found[region] = None
    return found


__all__ = [
    "all_final",
    "check_parallel",
    "check_parallel_table",
    "exit_event",
    "exit_state",
    "join_event",
    "region_lifecycles",
    "region_row_id",
    "region_rows",
    "region_states",
    "restart_reason",
]
