"""What a committed transition did to an entity's timers, read off the transition alone.

A live feed (``engine.watch``) carries transitions, not rows.  Each branch knows at
compile time whether it starts its target's timer clock, keeps it running or stops it
(:class:`~fsm.records.TimerMode`), so a feed consumer learns every timer's due time from
the entries themselves: :func:`timers_after` gives the timers a transition started (due at
the transition's time plus their delay), ``()`` for one that stopped them, and ``None`` for
one that kept them running (their due times are the ones announced when they started).
Timers started by a create are not in the feed (a create is not a transition): read
them from the entity (``fsm show``, :mod:`fsm.diagram.pending`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from fsm.records import HistoryRecord, TimerMode
from fsm.table import CompiledTable


class DueTimer(NamedTuple):
    """A timed transition a feed entry started: ``event`` fires at ``due`` (if the entity is
    still in ``state`` then, and its other guards hold)."""

    event: str
    due: datetime
    state: str
    after: timedelta


def timers_after(table: CompiledTable, record: HistoryRecord) -> tuple[DueTimer, ...] | None:
    """The timers ``record``'s transition started, ``()`` when it stopped them, ``None``
    when it kept them running (or its branch is not in ``table``: another definition)."""
    branch = next(
        (
            b
            for b in table.branches_for(record.source, record.event)
            if b.target == record.target and b.actor_name == record.actor
        ),
        None,
    )
    if branch is None or branch.timer is TimerMode.KEEP:
        return None
    if branch.timer is TimerMode.CLEAR:
        return ()
    scope = table.timed.get(record.target)
    started = [
        DueTimer(b.event, record.at + b.after, scope or b.declared_on, b.after)
        for b in table.timers()
        if b.source == record.target and b.after is not None
    ]
    return tuple(sorted(started, key=lambda t: (t.due, t.event)))


__all__ = ["DueTimer", "timers_after"]
