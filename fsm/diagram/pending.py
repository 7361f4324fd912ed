"""The timers a stored entity is waiting out (:mod:`fsm.timers`), and when each falls due.

A timed transition (``reaper(waiting.to(failed), after=timedelta(hours=24))``) is due at
``timer_since + after``: ``timer_since`` is when the entity entered the timed state on its
leaf's path.  The timers pending for an entity are the timed branches of its current leaf;
none when its clock is not running (``timer_since`` is ``None``) or it is deleted.

``fsm show``, the inspector's entity page and a diagram's entity overlay all say them
the same way::

    timeout due 2026-12-06T10:00:00+00:00 (in 23h 59m)
    deadline due 2026-12-05T11:30:00+00:00 (overdue by 5m; also needs lease_stale)

A due timer fires on the reaper's next tick once the transition's other guards hold
(``lease_stale`` for a deadline out of ``finalizing``): "overdue" says the clock ran out,
not that something is stuck.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fsm.records import Snapshot
from fsm.table import Branch, CompiledTable
from fsm.timers import format_delay


def timestamp(when: datetime, *, millis: bool | None = None) -> str:
    """``2026-12-06T10:00:00+00:00`` in UTC; with milliseconds when ``millis``, or, when it
    is ``None``, when the time has some."""
    when = when.astimezone(UTC)
    if millis is None:
        millis = bool(when.microsecond)
    return when.isoformat(timespec="milliseconds" if millis else "seconds")


def duration(delta: timedelta) -> str:
    """A short length of time, rounded down: ``300ms``, ``45s``, ``3m 05s``, ``23h 59m``, ``3d 4h``."""
    micros = abs(delta) // timedelta(microseconds=1)
    seconds = micros // 1_000_000
    if seconds < 1:
        return f"{micros // 1000}ms"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def other_guards(branch: Branch) -> tuple[str, ...]:
    """The branch's guards but its generated timer guard (``after_24h``), as diagrams name
    them (``not name`` for an ``unless`` guard)."""
    return tuple(g.name if expected else f"not {g.name}" for g, expected in branch.guards if g.after is None)


@dataclass(frozen=True, slots=True)
class PendingTimer:
    """One timed transition an entity is waiting out."""

    event: str
    after: timedelta
    due: datetime
    """``timer_since + after``."""
    state: str
    """The timed state: the one the transition is declared on, whose clock it reads."""
    target: str
    guards: tuple[str, ...] = ()
    """The transition's other guards (``lease_stale``): a due timer fires once they hold too."""
    reason: str | None = None

    @property
    def delay(self) -> str:
        """``24h``, ``1h30m``: as the diagrams label the edge (``after 24h``)."""
        return format_delay(self.after)

    def is_due(self, now: datetime) -> bool:
        return self.due <= now

    def until(self, now: datetime) -> str:
        """``in 23h 59m``, or ``overdue by 5m 02s`` once due."""
        return f"overdue by {duration(now - self.due)}" if self.is_due(now) else f"in {duration(self.due - now)}"

    @property
    def due_text(self) -> str:
        """When it is due, as people read it: to the second, or to the millisecond for a
        delay that is not a whole number of seconds (``after 500ms``)."""
        return timestamp(self.due, millis=bool(self.after % timedelta(seconds=1)))

    @property
    def text(self) -> str:
        """``timeout due 2026-12-06T10:00:00+00:00``: with no clock to compare with (an exported diagram)."""
        return f"{self.event} due {self.due_text}"

    def describe(self, now: datetime) -> str:
        """``timeout due 2026-12-06T10:00:00+00:00 (in 23h 59m)``, its other guards after."""
        needs = f"; also needs {', '.join(self.guards)}" if self.guards else ""
        return f"{self.text} ({self.until(now)}{needs})"


def timer_line(timer: PendingTimer) -> str:
    """``timer deadline after 1h30m in active``: what an overlay's box says before the due time."""
    return f"timer {timer.event} after {timer.delay} in {timer.state}"


def timer_needs(timer: PendingTimer) -> str:
    """`` (also needs lease_stale)`` (or nothing): the timer's other guards."""
    return f" (also needs {', '.join(timer.guards)})" if timer.guards else ""


def pending_timers(table: CompiledTable, snapshot: Snapshot) -> list[PendingTimer]:
    """The timers of ``snapshot``'s current leaf, soonest first (declaration order among
    equals); empty when its clock is not running, it is deleted, or its leaf has none."""
    since = snapshot.timer_since
    if since is None or snapshot.deleted:
        return []
    found = [
        PendingTimer(
            event=b.event,
            after=b.after,
            due=since + b.after,
            state=b.declared_on,
            target=b.declared_target,
            guards=other_guards(b),
            reason=b.reason,
        )
        for b in table.timers()
        if b.source == snapshot.state and b.after is not None
    ]
    return sorted(found, key=lambda t: t.due)


__all__ = ["PendingTimer", "duration", "other_guards", "pending_timers", "timer_line", "timer_needs", "timestamp"]
