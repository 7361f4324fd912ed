"""Cancelling a parent cancels its live children: a documented cascade.

``Engine.cancel(parent_id)`` fires the lifecycle's ``cancel`` on the parent, then on each
of its live children (and theirs, and so on), each by its own lifecycle's ``cancel``: a
child in a state its lifecycle cannot cancel from (a live finalizer: no built-in
lifecycle cancels one) is left to finish, and reported.  A child of another lifecycle is
cancelled by that lifecycle's engine, found among the lifecycle classes imported in this
process (``lifecycles=`` names them when the kind is ambiguous or not imported).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from fsm.errors import FsmError, InvalidArgument
from fsm.records import Snapshot

if TYPE_CHECKING:
    from fsm.engine.engine import Engine
    from fsm.engine.result import FireResult

log = logging.getLogger("fsm.engine")

MAX_DEPTH = 32
"""How deep a cascade follows children of children."""


class Cancelled(NamedTuple):
    """What ``Engine.cancel`` did: the parent's fire, the descendants it cancelled, and the
    live ones it left (id and why)."""

    result: FireResult
    children: tuple[str, ...]
    left: tuple[tuple[str, str], ...]


def lifecycle_for(kind: str, given: Iterable[Any]) -> Any:
    """The lifecycle class of ``kind``: among ``given``, else the imported subclasses of
    :class:`fsm.Lifecycle` (``None`` when none or several claim it)."""
    from fsm.lifecycle import Lifecycle

    for cls in given:
        if getattr(cls, "kind", None) == kind:
            return cls
    found: set[type[Any]] = set()
    pending: list[type[Any]] = [Lifecycle]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            pending.append(sub)
            if sub.__dict__.get("kind") == kind and hasattr(sub, "table"):
                found.add(sub)
    return found.pop() if len(found) == 1 else None


PAGE = 1000
"""Children read per page."""


def children_of(store: Any, parent_id: str) -> dict[str, Snapshot]:
    """Every live child of the parent, by id (paged through the store)."""
    found: dict[str, Snapshot] = {}
    after: str | None = None
    while True:
        page = store.children(parent_id, limit=PAGE, after_id=after)
        found.update((s.id, s) for s in page)
        if len(page) < PAGE:
            return found
        after = page[-1].id


def cascade(
    engine: Engine, parent_id: str, given: tuple[Any, ...], depth: int
) -> tuple[list[str], list[tuple[str, str]]]:
    """Cancel the live children of ``parent_id`` (and theirs)."""
    from fsm.engine.engine import Engine

    cancelled: list[str] = []
    left: list[tuple[str, str]] = []
    if depth >= MAX_DEPTH:
        return cancelled, [(parent_id, f"children deeper than {MAX_DEPTH} levels")]
    for child in children_of(engine.store, parent_id).values():
        if child.kind == engine.kind:
            child_engine: Engine | None = engine
        else:
            cls = lifecycle_for(child.kind, given)
            child_engine = None if cls is None else Engine(cls, engine.store, clock=engine.clock, owner=engine.owner)
        if child_engine is None:
            left.append((child.id, f"lifecycle {child.kind!r} is not imported here (pass lifecycles=)"))
            continue
        if child.state in child_engine.table.finals:
            continue
        try:
            child_engine.fire(child, "cancel", reason=f"parent {parent_id} cancelled")
            cancelled.append(child.id)
        except FsmError as err:  # a live finalizer, a lifecycle without cancel, a race
            left.append((child.id, f"{type(err).__name__}: {err}"))
            log.info("cancelling %s left child %s: %s", parent_id, child.id, err)
        more, kept = cascade(child_engine, child.id, given, depth + 1)
        cancelled += more
        left += kept
    return cancelled, left


def check_lifecycles(value: object) -> tuple[Any, ...]:
    """``cancel``'s ``lifecycles=``: lifecycle classes."""
    from fsm.lifecycle import Lifecycle

    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"lifecycles must be a collection of Lifecycle classes, not {type(value).__name__}")
    found = tuple(value)
    for cls in found:
        if not (isinstance(cls, type) and issubclass(cls, Lifecycle)):
            raise InvalidArgument(f"lifecycles must hold Lifecycle classes, not {cls!r}"[:120])
    return found


__all__ = ["MAX_DEPTH", "PAGE", "Cancelled", "cascade", "check_lifecycles", "children_of", "lifecycle_for"]
