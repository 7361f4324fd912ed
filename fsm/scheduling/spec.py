"""What a schedule is, and when it is due: a cron expression in a time zone, or a fixed interval.

A schedule creates one entity of a lifecycle per due time, with the deterministic id
``{schedule id}@{due time in UTC}`` (``nightly@2026-12-06T01:30:00Z``): any number of
processes creating it get exactly one (the others find it exists).  This module is the
pure part: the validated :class:`Schedule` and its due times; :mod:`fsm.scheduling.service`
stores schedules and runs them.

Time zones and DST: a cron expression is read in its ``timezone`` (``zoneinfo``) on the
wall clock.  A wall time that a DST change skips (02:30 on the spring-forward night in
Europe/Berlin) runs at the same offset after the change (03:30 local); a wall time that
occurs twice (02:30 on the fall-back night) runs once, at its first occurrence.
Cron expressions are parsed by ``croniter`` (the ``cron`` extra); fixed intervals need
nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fsm.errors import ConfigError, FsmError
from fsm.limits import check_id, check_json, check_priority

MAX_SCHEDULE_ID = 160
"""A schedule id's longest form: an entity id adds ``@`` and a 20-character time (255 in all)."""
MIN_EVERY = timedelta(seconds=1)
MAX_EVERY = timedelta(days=3660)
MAX_CATCH_UP = 1000
"""The most missed runs one ``catch_up="all"`` creates after a downtime."""
DEFAULT_GRACE = timedelta(minutes=1)
"""How late a run may start and still count as on time (``catch_up="none"``)."""


class Overlap(StrEnum):
    """What a due time does while the schedule's previous run is not final."""

    SKIP = "skip"
    """Create nothing for this due time (recorded in the schedule's history)."""
    ALLOW = "allow"
    """Create the new run beside the previous one."""
    CANCEL = "cancel"
    """Fire the lifecycle's ``cancel`` event on the previous run, then create the new one."""


class CatchUp(StrEnum):
    """What a schedule does with the due times it missed (every process down, paused...)."""

    NONE = "none"
    """Skip them: only a due time at most ``grace`` ago runs."""
    LATEST = "latest"
    """Run the most recent missed due time once."""
    ALL = "all"
    """Run every missed due time, at most ``MAX_CATCH_UP`` (the most recent)."""


class Schedule:
    """One schedule: ``Schedule("nightly", cron="30 2 * * *", timezone="Europe/Berlin")`` or
    ``Schedule("heartbeat", every=timedelta(seconds=30))``.

    ``data`` is each run's data (validated by the lifecycle when a run is created);
    ``overlap`` and ``catch_up`` are the policies above; ``start`` anchors a fixed interval
    (default: when the schedule is added) and no run is due before it; ``priority`` is each
    run's claim priority (``Engine.create(priority=...)``).  Every value is
    checked here: a bad one is a ``ConfigError`` naming each problem."""

    __slots__ = ("catch_up", "cron", "data", "every", "grace", "id", "overlap", "priority", "start", "timezone")

    def __init__(
        self,
        id: str,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        data: dict[str, Any] | None = None,
        overlap: Overlap | str = Overlap.SKIP,
        catch_up: CatchUp | str = CatchUp.LATEST,
        grace: timedelta | float = DEFAULT_GRACE,
        start: datetime | None = None,
        priority: int = 0,
    ) -> None:
        problems: list[str] = []
        try:
            self.id = check_id("schedule id", id)
        except ValueError as err:
            problems.append(str(err))
            self.id = ""
        if self.id and (len(self.id) > MAX_SCHEDULE_ID or "@" in self.id):
            problems.append(f"schedule id must be at most {MAX_SCHEDULE_ID} characters without '@': {self.id[:40]!r}")
        if (cron is None) == (every is None):
            problems.append("give exactly one of cron= (an expression) or every= (an interval)")
        self.cron = None
        if cron is not None:
            if not isinstance(cron, str) or not cron.strip() or "\x00" in cron or len(cron) > 200:
                problems.append(f"cron must be a cron expression, not {cron!r:.60}")
            else:
                self.cron = " ".join(cron.split())
                problem = _cron_problem(self.cron)
                if problem:
                    problems.append(problem)
        self.every = None
        if every is not None:
            self.every = _duration("every", every, MIN_EVERY, MAX_EVERY, problems)
        self.timezone = "UTC"
        if not isinstance(timezone, str) or not timezone or "\x00" in timezone or len(timezone) > 64:
            problems.append(f"timezone must be an IANA time zone name, not {timezone!r:.60}")
        else:
            try:
                ZoneInfo(timezone)
                self.timezone = timezone
            except (ZoneInfoNotFoundError, ValueError, OSError):
                problems.append(f"unknown time zone {timezone!r}")
        self.data = {} if data is None else data
        if not isinstance(self.data, dict):
            problems.append(f"data must be a JSON object, not {type(data).__name__}")
        else:
            try:
                check_json(self.data, lifecycle="schedule")
            except (FsmError, ValueError) as err:
                problems.append(f"data: {err}")
        try:
            self.overlap = Overlap(overlap)
        except ValueError:
            problems.append(f"overlap must be one of {', '.join(o.value for o in Overlap)}, not {overlap!r:.40}")
            self.overlap = Overlap.SKIP
        try:
            self.catch_up = CatchUp(catch_up)
        except ValueError:
            problems.append(f"catch_up must be one of {', '.join(c.value for c in CatchUp)}, not {catch_up!r:.40}")
            self.catch_up = CatchUp.LATEST
        self.grace = _duration("grace", grace, timedelta(seconds=1), timedelta(days=366), problems) or DEFAULT_GRACE
        self.priority = 0
        try:
            self.priority = check_priority(priority)
        except ValueError as err:
            problems.append(str(err))
        self.start = None
        if start is not None:
            if not isinstance(start, datetime) or start.tzinfo is None:
                problems.append(f"start must be an aware datetime, not {start!r:.60}")
            else:
                self.start = start.astimezone(UTC)
        if problems:
            raise ConfigError(f"invalid schedule {str(id)[:60]!r}: " + "; ".join(problems), problems=problems)

    # -- stored form ------------------------------------------------------------------------

    def to_data(self) -> dict[str, Any]:
        """The schedule as the JSON its stored row keeps."""
        return {
            "cron": self.cron,
            "every": None if self.every is None else self.every.total_seconds(),
            "timezone": self.timezone,
            "data": self.data,
            "overlap": self.overlap.value,
            "catch_up": self.catch_up.value,
            "grace": self.grace.total_seconds(),
            "start": None if self.start is None else _iso(self.start),
            "priority": self.priority,
        }

    @classmethod
    def from_data(cls, schedule_id: str, stored: dict[str, Any]) -> Schedule:
        """The schedule a stored row holds (``ConfigError`` when it was tampered with)."""
        start = stored.get("start")
        return cls(
            schedule_id,
            cron=stored.get("cron"),
            every=stored.get("every"),
            timezone=stored.get("timezone", "UTC"),
            data=stored.get("data"),
            overlap=stored.get("overlap", Overlap.SKIP),
            catch_up=stored.get("catch_up", CatchUp.LATEST),
            grace=stored.get("grace", DEFAULT_GRACE),
            start=None if start is None else datetime.fromisoformat(start),
            priority=stored.get("priority", 0),
        )

    __hash__ = None  # type: ignore[assignment]  # compared by value, mutable data: not hashable

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and (self.id, self.to_data()) == (other.id, other.to_data())

    def __repr__(self) -> str:
        when = f"cron={self.cron!r}, timezone={self.timezone!r}" if self.cron else f"every={self.every!r}"
        return f"Schedule({self.id!r}, {when}, overlap={self.overlap.value!r}, catch_up={self.catch_up.value!r})"

    # -- due times ---------------------------------------------------------------------------

    def due_after(self, moment: datetime, anchor: datetime) -> Iterator[datetime]:
        """The due times strictly after ``moment``, in order, as aware UTC datetimes.
        ``anchor`` starts a fixed interval when ``start`` was not given."""
        start = self.start or anchor
        if self.every is not None:
            n = 0 if moment < start else (moment - start) // self.every + 1
            while True:
                yield start + n * self.every
                n += 1
        floor = max(moment, start - timedelta(microseconds=1))
        yield from _cron_after(self.cron or "", ZoneInfo(self.timezone), floor)

    def next_due(self, moment: datetime, anchor: datetime) -> datetime:
        """The first due time strictly after ``moment``."""
        return next(self.due_after(moment, anchor))

    def run_id(self, due: datetime) -> str:
        """The id of the entity this schedule creates for ``due``: ``{id}@{UTC time}``."""
        return f"{self.id}@{_iso(due)}"


def _iso(moment: datetime) -> str:
    text = moment.astimezone(UTC).isoformat(timespec="seconds" if not moment.microsecond else "milliseconds")
    return text.replace("+00:00", "Z")


def _duration(name: str, value: object, low: timedelta, high: timedelta, problems: list[str]) -> timedelta | None:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        problems.append(f"{name} must be a timedelta or seconds, not {type(value).__name__}")
        return None
    if not isinstance(value, timedelta):
        if not math.isfinite(value) or not low.total_seconds() <= value <= high.total_seconds():
            problems.append(f"{name} must be between {low} and {high}, not {value!r}")
            return None
        value = timedelta(seconds=value)
    if not low <= value <= high:
        problems.append(f"{name} must be between {low} and {high}, not {value}")
        return None
    return value


def _croniter() -> Any:
    try:
        from croniter import croniter  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - the cron extra is part of the test install
        raise ConfigError("cron schedules need croniter: pip install 'fsm-lifecycles[cron]' (or use every=)") from None
    return croniter


def _cron_problem(expression: str) -> str | None:
    croniter = _croniter()
    if len(expression.split()) != 5:
        return f"cron expression {expression!r} must have five fields (minute hour day month weekday)"
    if not croniter.is_valid(expression):
        return f"invalid cron expression {expression!r}"
    try:  # a valid expression that never matches (30 February) is refused here, not at add
        croniter(expression, datetime(2000, 1, 1)).get_next(datetime)
    except Exception:  # croniter's CroniterBadDateError and kin: its own exception types
        return f"cron expression {expression!r} never falls due"
    return None


def _cron_after(expression: str, zone: ZoneInfo, moment: datetime) -> Iterator[datetime]:
    """Cron due times strictly after ``moment`` (aware), read on ``zone``'s wall clock.

    croniter walks naive wall times; each becomes aware in ``zone`` with ``fold=0``: a
    skipped wall time lands after the change, a repeated one at its first occurrence."""
    croniter = _croniter()
    local = moment.astimezone(zone).replace(tzinfo=None)
    # start a little before: a wall time skipped or repeated near ``moment`` is still seen
    walk = croniter(expression, local - timedelta(hours=3))
    last = moment
    while True:
        wall: datetime = walk.get_next(datetime)
        due = wall.replace(tzinfo=zone).astimezone(UTC)
        if due > last:
            last = due
            yield due


__all__ = ["DEFAULT_GRACE", "MAX_CATCH_UP", "CatchUp", "Overlap", "Schedule"]
