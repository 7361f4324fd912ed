"""Lifecycle class (and optionally one stored entity) -> :class:`~fsm.diagram.model.Diagram`.

The states come from python-statemachine's own tree (so the compound ``active`` state and
its children are drawn as declared); the edges come from the compiled table, the same
branches the engine runs, so a diagram can never show a transition the engine does not
have, or miss a guarded branch the engine would try.

A transition declared on a compound state is compiled into one branch per leaf inside it;
the diagram folds those back into the one edge that was declared, drawn from the compound.

A timed transition (``reaper(..., after=timedelta(hours=24))``) is drawn ``after 24h``
(:attr:`~fsm.diagram.model.Edge.after`); its generated guard (``after_24h``) is not listed
among the edge's guards nor in the legend's, which keep the guards a reader declared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from statemachine import State

from fsm.diagram.model import Diagram, Edge, HistoryRow, Node, Overlay
from fsm.diagram.pending import other_guards, pending_timers
from fsm.diagram.refs import ref_of
from fsm.engine import Engine
from fsm.lifecycle import Lifecycle
from fsm.records import Snapshot
from fsm.regions import exit_event
from fsm.table import Branch
from stores.base import Store

DEFAULT_LAST = 5
"""How many of an entity's transitions an overlay lists by default."""


def _nodes(states: Iterable[State]) -> tuple[Node, ...]:
    nodes: list[Node] = []
    for s in states:
        histories = list(s.history) if s.is_compound else []
        nested = bool(s.is_compound or s.parallel)
        nodes.append(
            Node(
                id=s.id,
                parent=s.parent.id if s.parent is not None else None,
                compound=nested,
                initial=bool(s.initial),
                final=bool(s.final),
                children=(*(c.id for c in s.states), *(h.id for h in histories)) if nested else (),
                parallel=bool(s.parallel),
                region=s.parent is not None and bool(s.parent.parallel),
            )
        )
        # a history state is drawn inside its compound: H (shallow) or H* (deep)
        nodes += [Node(id=h.id, parent=s.id, history=h.type.value) for h in histories]
    return tuple(nodes)


def _edges(branches: Iterable[Branch]) -> tuple[Edge, ...]:
    """One edge per declared (transition, event); per-leaf copies of a compound's
    transition are folded into it, their leaves collected in ``Edge.leaves``."""
    folded: dict[tuple[int, str, str], list[Branch]] = {}
    for b in branches:
        folded.setdefault((b.order, b.event, b.declared_on), []).append(b)
    edges: list[Edge] = []
    for copies in folded.values():
        b = copies[0]
        edges.append(
            Edge(
                event=b.event,
                source=b.declared_on,
                target=b.declared_target,
                actor=b.actor,
                guards=other_guards(b),
                reason=b.reason,
                lease=b.lease_effect,
                bump_attempt=b.bump_attempt,
                bump_reclaims=b.bump_reclaims,
                leaves=tuple(c.source for c in copies),
                to_final=b.to_final,
                order=len(edges),
                override=b.override,
                changes=tuple(f"{c.key}.{c.field} {'/'.join(map(str, c.when))}->{c.value}" for c in b.changes),
                after=b.after,
            )
        )
    return tuple(edges)


def extract(
    lifecycle: type[Lifecycle],
    *,
    store: Store | None = None,
    entity_id: str | None = None,
    last: int = DEFAULT_LAST,
) -> Diagram:
    """The diagram of ``lifecycle``; with ``store`` and ``entity_id``, that entity's
    current state highlighted and its ``last`` transitions listed."""
    if not isinstance(lifecycle, type) or not issubclass(lifecycle, Lifecycle) or not hasattr(lifecycle, "table"):
        raise TypeError(f"extract needs a Lifecycle subclass with states, got {lifecycle!r}")
    table = lifecycle.table
    # eventless transitions are drawn as the edges they are, labelled "(automatic)"; each
    # region's transitions are its own lifecycle's (fsm.regions), drawn inside the region
    tables = [table, *(cls.table for regions in lifecycle.regions.values() for cls in regions.values())]
    exits = {exit_event(parallel) for parallel in table.parallel}
    drawn = tuple(
        b
        for t in tables
        for b in (*t.declared, *(b for found in t.automatic.values() for b in found))
        if b.event not in exits  # a region's exit is the engine's, drawn as the event that leaves
    )
    edges = _edges(drawn)
    used: list[str] = []
    for branch in drawn:
        for g, _expected in branch.guards:
            if g.after is None:  # a timer's own guard is drawn "after 24h"
                used += [name for name in g.names if name not in used]  # an expression: its guards
    known = {
        **lifecycle.guards,
        **{n: g for t in lifecycle.regions.values() for c in t.values() for n, g in c.guards.items()},
    }
    guards = tuple((name, known[name].description) for name in used)
    diagram = Diagram(
        name=lifecycle.__name__,
        ref=ref_of(lifecycle),
        kind=lifecycle.kind,
        nodes=_nodes(lifecycle.states_map.values()),
        edges=edges,
        guards=guards,
    )
    if store is None and entity_id is None:
        return diagram
    if store is None or entity_id is None:
        raise ValueError("an entity overlay needs both a store and an entity id")
    return diagram.with_overlay(entity_overlay(lifecycle, store, entity_id, last=last))


def entity_overlay(lifecycle: type[Lifecycle], store: Store, entity_id: str, *, last: int = DEFAULT_LAST) -> Overlay:
    """The entity's current leaf state, its ``last`` transitions (oldest first) and the
    timers its leaf is waiting out.

    Raises ``UnknownEntity`` when there is no such live entity, or it belongs to another
    lifecycle; ``MalformedRow`` when its stored state is not one of the lifecycle's.
    """
    if last < 0:
        raise ValueError(f"last must be >= 0, got {last}")
    engine = Engine(lifecycle, store)
    snap = engine.get(entity_id)
    records = engine.history(entity_id)
    shown = records[-last:] if last else []
    rows = tuple(HistoryRow(r.seq, r.event, r.source, r.target, r.actor, r.reason, r.at) for r in shown)
    timers = tuple(pending_timers(lifecycle.table, snap))
    return Overlay(
        entity_id=snap.id,
        state=snap.state,
        version=snap.version,
        history=rows,
        total=len(records),
        timers=timers,
        family=family_lines(store, snap),
    )


FAMILY_SAMPLE = 1000
"""The most children a diagram counts (it says so when there are more)."""


def family_lines(store: Store, snap: Snapshot) -> tuple[str, ...]:
    """``parent: ID`` and ``children: N: n1 state1, n2 state2`` for the overlay."""
    lines: list[str] = []
    if snap.parent_id is not None:
        lines.append(f"parent: {snap.parent_id}")
    kids = store.children(snap.id, limit=FAMILY_SAMPLE + 1)
    if kids:
        counts = Counter(k.state for k in kids[:FAMILY_SAMPLE])
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda i: (-i[1], i[0])))
        many = f"first {FAMILY_SAMPLE}" if len(kids) > FAMILY_SAMPLE else str(len(kids))
        lines.append(f"children: {many}: {states}")
    return tuple(lines)


__all__ = ["DEFAULT_LAST", "FAMILY_SAMPLE", "entity_overlay", "extract", "family_lines"]
