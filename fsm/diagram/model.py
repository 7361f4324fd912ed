"""The neutral diagram model: what every renderer draws, and nothing about how.

:func:`fsm.diagram.extract` fills it from a Lifecycle class (and, optionally, from one
stored entity); :mod:`fsm.diagram.mermaid` and :mod:`fsm.diagram.dot` turn it into text.
Everything in it is ordered as the lifecycle declares it, so two exports of the same
lifecycle are byte-identical (which is what ``fsm diagram --check`` relies on).

One :class:`Edge` stands for one *declared* transition branch: a transition declared on
the compound ``active`` state is one edge leaving ``active``, not one per leaf inside it
(``Edge.leaves`` lists the leaves it applies to).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from fsm.diagram.pending import PendingTimer
from fsm.records import Actor, LeaseChange
from fsm.timers import format_delay


@dataclass(frozen=True, slots=True)
class Node:
    """A state.  ``parent`` is the enclosing compound state (``None`` at top level)."""

    id: str
    parent: str | None
    compound: bool = False
    initial: bool = False
    """The initial child of its parent (or the lifecycle's initial state at top level)."""
    final: bool = False
    children: tuple[str, ...] = ()
    highlight: bool = False
    """The overlaid entity's current (leaf) state."""
    history: str | None = None
    """A history state of its parent: ``"shallow"`` (drawn ``H``) or ``"deep"`` (``H*``)."""
    parallel: bool = False
    """A parallel state: its children are regions, run side by side (``compound`` too)."""
    region: bool = False
    """A region of a parallel state (its row is one of its own: :mod:`fsm.regions`)."""


@dataclass(frozen=True, slots=True)
class Edge:
    """One declared transition branch, drawn from the state it is declared on."""

    event: str
    source: str
    """The state the transition is declared on: a leaf, or a compound ancestor."""
    target: str
    """The declared target (a compound target is entered at its initial leaf)."""
    actor: Actor
    guards: tuple[str, ...] = ()
    """Guard names in declaration order; a negated guard (``unless=``) reads ``not name``.
    A timed transition's generated guard (``after_24h``) is not one of them: :attr:`after`
    draws it."""
    reason: str | None = None
    """What history records for this branch: ``expired``, ``duplicate``, ``reclaimed``..."""
    lease: LeaseChange = LeaseChange.KEEP
    """What the write does to the lease (entering a final state always clears it)."""
    bump_attempt: bool = False
    bump_reclaims: bool = False
    leaves: tuple[str, ...] = ()
    """The leaf states this branch applies to (more than one when declared on a compound)."""
    to_final: bool = False
    order: int = 0
    """Position among the lifecycle's declared branches (stable export order)."""
    override: bool = False
    """Declared with ``operator_override``: may fail a live finalizer; drawn apart."""
    changes: tuple[str, ...] = ()
    """The data changes the write applies, as read: ``steps.status running->failed``."""
    after: timedelta | None = None
    """A timed transition's delay (:mod:`fsm.timers`): the reaper fires it once the entity
    has stayed that long in :attr:`source`; labelled ``after 24h``."""

    @property
    def timer(self) -> str | None:
        """``after 24h`` on a timed transition, else ``None``."""
        return None if self.after is None else f"after {format_delay(self.after)}"

    @property
    def is_reaper(self) -> bool:
        return self.actor is Actor.REAPER

    @property
    def who(self) -> str:
        """``worker``, ``reaper`` or ``operator override``."""
        return "operator override" if self.override else self.actor.value

    @property
    def title(self) -> str:
        """``event [guard, guard] (actor)``: the first line of every label; a timed transition
        says its delay after the event: ``timeout after 24h (reaper)``."""
        timer = f" {self.timer}" if self.timer else ""
        guards = f" [{', '.join(self.guards)}]" if self.guards else ""
        return f"{self.event}{timer}{guards} ({self.who})"

    @property
    def effects(self) -> tuple[str, ...]:
        """What the branch records and does to the lease and counters, in a fixed order.

        Clearing the lease on the way into a final state is implied (it always happens)
        and is not repeated on every such edge; the legend says so.
        """
        out: list[str] = []
        if self.reason:
            out.append(f"reason={self.reason}")
        if self.lease is LeaseChange.ACQUIRE:
            out.append("acquires lease")
        elif self.lease is LeaseChange.CLEAR and not self.to_final:
            out.append("clears lease")
        if self.bump_attempt:
            out.append("attempt+1")
        if self.bump_reclaims:
            out.append("reclaims+1")
        out += self.changes
        return tuple(out)

    def label_lines(self) -> tuple[str, ...]:
        """The label, one or two lines: the title, then the effects if there are any."""
        effects = ", ".join(self.effects)
        return (self.title, effects) if effects else (self.title,)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One committed transition of the overlaid entity."""

    seq: int
    event: str
    source: str
    target: str
    actor: str
    reason: str | None
    at: datetime

    @property
    def short(self) -> str:
        """``v5 reclaim: finalizing -> finalizing (reaper, reclaimed)``."""
        who = f"{self.actor}, {self.reason}" if self.reason else self.actor
        return f"v{self.seq} {self.event}: {self.source} -> {self.target} ({who})"

    @property
    def text(self) -> str:
        """:attr:`short` and the time of the transition."""
        return f"{self.short} at {self.at.isoformat(timespec='seconds')}"


@dataclass(frozen=True, slots=True)
class Overlay:
    """A stored entity drawn on its lifecycle: its current leaf and its last transitions."""

    entity_id: str
    state: str
    version: int
    history: tuple[HistoryRow, ...] = ()
    """The last transitions, oldest first."""
    total: int = 0
    """How many transitions the entity has in all (``history`` may show only the last few)."""
    timers: tuple[PendingTimer, ...] = ()
    """The timers its current leaf is waiting out, soonest first (:mod:`fsm.diagram.pending`)."""
    family: tuple[str, ...] = ()
    """Its parent and children, one line each (``parent: build-7``, ``children: 50: 48
    completed, 2 running``)."""

    @property
    def title(self) -> str:
        return f"entity {self.entity_id}: {self.state} (version {self.version})"

    @property
    def history_title(self) -> str:
        if not self.history:
            return "no transitions yet"
        if len(self.history) < self.total:
            return f"last {len(self.history)} of {self.total} transitions"
        return f"{self.total} transition{'s' if self.total != 1 else ''}"


@dataclass(frozen=True, slots=True)
class Diagram:
    """A lifecycle as a diagram: states (declaration order), edges, guards, overlay."""

    name: str
    """The Lifecycle class name."""
    ref: str
    """``module:Class``, how ``fsm diagram`` and ``--check`` find the class again."""
    kind: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    guards: tuple[tuple[str, str], ...] = ()
    """``(name, description)`` of every guard the edges use, in first-use order."""
    overlay: Overlay | None = None
    _index: dict[str, Node] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({n.id: n for n in self.nodes})

    def node(self, node_id: str) -> Node:
        return self._index[node_id]

    @property
    def roots(self) -> tuple[Node, ...]:
        """Top-level states, in declaration order."""
        return tuple(n for n in self.nodes if n.parent is None)

    def children(self, node: Node) -> tuple[Node, ...]:
        return tuple(self._index[c] for c in node.children)

    def initial_leaf(self, node_id: str) -> str:
        """The leaf a transition into ``node_id`` ends in (compound states enter their initial child)."""
        node = self._index[node_id]
        while node.compound and node.children:
            kids = [k for k in self.children(node) if k.history is None]
            node = next((k for k in kids if k.initial), kids[0])
        return node.id

    def parent_of(self, node_id: str) -> str | None:
        return self._index[node_id].parent

    @property
    def timed(self) -> tuple[Edge, ...]:
        """The timed transitions (``after 24h``), in declaration order."""
        return tuple(e for e in self.edges if e.after is not None)

    def waited(self, edge: Edge) -> PendingTimer | None:
        """The overlaid entity's pending timer that ``edge`` draws, if it is waiting one out."""
        if self.overlay is None or edge.after is None:
            return None
        key = (edge.event, edge.source, edge.target, edge.after)
        return next((t for t in self.overlay.timers if (t.event, t.state, t.target, t.after) == key), None)

    def with_overlay(self, overlay: Overlay) -> Diagram:
        """The same diagram with ``overlay``'s (leaf) state highlighted."""
        if overlay.state not in self._index:
            raise KeyError(f"{self.name} has no state {overlay.state!r}")
        nodes = tuple(replace(n, highlight=n.id == overlay.state) for n in self.nodes)
        return Diagram(self.name, self.ref, self.kind, nodes, self.edges, self.guards, overlay)


__all__ = ["Diagram", "Edge", "HistoryRow", "Node", "Overlay"]
