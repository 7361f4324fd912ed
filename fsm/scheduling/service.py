"""Stored schedules of one lifecycle, and the step that creates their due runs.

Each schedule is a reserved row of kind :data:`SCHEDULE_KIND` (``fsm-schedule:{kind}:{id}``,
its concurrency key the lifecycle's kind), the way the reaper keeps its leader rows: its
data holds the :class:`~fsm.scheduling.spec.Schedule` and a *cursor* (every due time up to
it has been handled), its due time (``run_after``) is the next run, and each step that
handles due times is one compare-and-set transition with a history row saying what it did.

:meth:`Schedules.run_due` creates each due run with the deterministic id
``{schedule id}@{due time}``: any number of processes running it at once (every reaping
worker, a restarted one, a paused one that wakes up late) create exactly one entity per
due time: the others find it exists.  The reaper calls it for the lifecycles it leads, so
schedules need no process of their own.
"""

from __future__ import annotations

import builtins
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fsm.engine import Engine
from fsm.errors import (
    ConfigError,
    EntityExists,
    FsmError,
    InvalidArgument,
    StaleVersion,
    StoreUnavailable,
    UnknownEntity,
)
from fsm.limits import check_id
from fsm.records import NewEntity, Snapshot, TransitionWrite
from fsm.scheduling.spec import MAX_CATCH_UP, CatchUp, Overlap, Schedule

log = logging.getLogger("fsm.schedules")

SCHEDULE_KIND = "fsm.schedule"
ACTIVE, PAUSED, DELETED = "active", "paused", "deleted"
CHANGE_ATTEMPTS = 5
"""How often a pause, resume or delete reads the row again after losing it to a reaper's step."""
MAX_WALK = 1_000_000
"""The most due times one step walks past after a downtime (a per-second schedule down for
eleven days); older ones are skipped, as ``catch_up`` would skip them anyway."""


def active_schedules(store: Any, state: str = ACTIVE) -> list[Snapshot]:
    """Every stored schedule row in ``state``, of every lifecycle: an index range on the
    schedule kind and state (``Store.candidates``), a page of 500 at a time."""
    found: list[Snapshot] = []
    after: str | None = None
    while True:
        page: list[Snapshot] = store.candidates(SCHEDULE_KIND, state, (), limit=500, after_id=after)
        found += page
        if len(page) < 500:
            return found
        after = page[-1].id


def schedule_row_id(kind: str, schedule_id: str) -> str:
    """The id of the reserved row that stores schedule ``schedule_id`` of lifecycle ``kind``."""
    return f"fsm-schedule:{kind}:{schedule_id}"


class UnknownSchedule(UnknownEntity):
    """No schedule has this id for this lifecycle (or it was deleted)."""

    def __init__(self, schedule_id: str, kind: str) -> None:
        super().__init__(schedule_row_id(kind, schedule_id), kind=SCHEDULE_KIND)
        self.schedule_id = schedule_id
        self.args = (f"no schedule {schedule_id!r} of {kind}",)


@dataclass(frozen=True)
class ScheduleState:
    """A stored schedule as it is now."""

    schedule: Schedule
    paused: bool
    next_due: datetime | None
    """When the next run is due (``None`` while paused)."""
    cursor: datetime
    """Every due time up to here has been handled."""
    last_run: str | None
    """The id of the entity the schedule created last."""
    version: int


@dataclass
class ScheduleStep:
    """What :meth:`Schedules.run_due` did: entity ids created, found already created by
    another process, skipped (overlap), and previous runs cancelled (overlap ``cancel``)."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    errors: int = 0


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


class Schedules:
    """The schedules of ``engine``'s lifecycle: add, pause, resume, delete, list, and run.

    ::

        schedules = Schedules(Engine(ReportLifecycle, store))
        schedules.add(Schedule("nightly", cron="30 2 * * *", timezone="Europe/Berlin"))
        schedules.run_due()  # the reaper does this at every tick
    """

    def __init__(self, engine: Engine) -> None:
        if getattr(engine.store, "binding", None) is not None:
            raise ConfigError(
                "schedules need a store with the library's own tables: on a store bound to an application "
                "table their rows would land in that table; keep the schedules in a SqlStore of their own"
            )
        self.engine = engine
        self.store = engine.store
        self.kind = engine.kind

    # -- managing ----------------------------------------------------------------------------

    def add(self, schedule: Schedule, *, replace: bool = False) -> ScheduleState:
        """Store ``schedule``.  Adding the same schedule again changes nothing (every process
        may add its schedules at start); a different one with the same id is a
        ``ConfigError`` unless ``replace=True``, which keeps its cursor (no run is repeated).
        A deleted schedule's id may be added again."""
        if not isinstance(schedule, Schedule):
            raise InvalidArgument(f"add takes a Schedule, not {type(schedule).__name__}")
        self.engine._validate(dict(schedule.data), entity_id=None)  # each run's data, refused up front
        row_id = schedule_row_id(self.kind, schedule.id)
        now = self.engine.clock.now()
        data: dict[str, Any] = {"id": schedule.id, "schedule": schedule.to_data(), "anchor": _iso(now)}
        data.update(cursor=_iso(now), last_run=None)
        due = schedule.next_due(now, now)
        try:
            self.store.create(
                NewEntity(
                    id=row_id, kind=SCHEDULE_KIND, state=ACTIVE, concurrency_key=self.kind, data=data, run_after=due
                )
            )
        except EntityExists:
            row = self.store.get(row_id)
            current = self._state(row)
            if row.state != DELETED and current.schedule == schedule:
                return current
            if row.state != DELETED and not replace:
                raise ConfigError(
                    f"schedule {schedule.id!r} of {self.kind} exists with other settings: add(..., replace=True) "
                    "replaces it"
                ) from None
            if row.state == DELETED:  # a new schedule under an old id: a new cursor too
                moved = {**data}
            else:
                moved = {**row.data, "schedule": schedule.to_data()}
                due = schedule.next_due(_time(row.data["cursor"]), _time(row.data["anchor"]))
            target = PAUSED if row.state == PAUSED else ACTIVE
            self._write(row, "replace", target, moved, due, reason="replaced")
        return self.get(schedule.id)

    def get(self, schedule_id: str) -> ScheduleState:
        """The stored schedule ``schedule_id`` (:class:`UnknownSchedule` when there is none)."""
        return self._state(self._row(schedule_id))

    def list(self) -> builtins.list[ScheduleState]:
        """Every stored schedule of this lifecycle (paused ones too), by id."""
        found: builtins.list[ScheduleState] = []
        for row in self._rows(None):
            if row.state != DELETED:
                try:
                    found.append(self._state(row))
                except ConfigError as err:
                    log.warning("schedule row %s cannot be read: %s", row.id, err)
        return found

    def pause(self, schedule_id: str) -> ScheduleState:
        """Stop creating runs until :meth:`resume` (idempotent)."""

        def pause(row: Snapshot) -> None:
            if row.state == ACTIVE:
                self._write(row, "pause", PAUSED, row.data, None, reason="paused")

        self._change(schedule_id, pause)
        return self.get(schedule_id)

    def resume(self, schedule_id: str) -> ScheduleState:
        """Create runs again, from now on: the due times that passed while it was paused
        are not caught up (idempotent)."""

        def resume(row: Snapshot) -> None:
            if row.state == PAUSED:
                state = self._state(row)
                now = self.engine.clock.now()
                data = {**row.data, "cursor": _iso(now)}
                due = state.schedule.next_due(now, _time(row.data["anchor"]))
                self._write(row, "resume", ACTIVE, data, due, reason="resumed")

        self._change(schedule_id, resume)
        return self.get(schedule_id)

    def delete(self, schedule_id: str) -> None:
        """Remove the schedule (its runs stay; its history is kept)."""
        self._change(schedule_id, lambda row: self._write(row, "delete", DELETED, row.data, None, reason="deleted"))

    def _change(self, schedule_id: str, change: Callable[[Snapshot], object]) -> None:
        """Apply ``change`` to the schedule's row as read now; read again and retry when a
        reaper's step moved the row on in between (its compare-and-set lost the race)."""
        for _ in range(CHANGE_ATTEMPTS - 1):
            try:
                change(self._row(schedule_id))
                return
            except StaleVersion:
                continue
        change(self._row(schedule_id))

    # -- running -----------------------------------------------------------------------------

    def run_due(self, rows: builtins.list[Snapshot] | None = None) -> ScheduleStep:
        """Create the runs of every active schedule that is due, by its overlap and catch-up
        policies, and move each schedule's cursor on.  Never raises for one schedule: a
        failure is logged and counted, the others still run (a store outage propagates).
        ``rows``: the active schedule rows, when the caller read them already (the reaper
        reads every lifecycle's at once: :func:`active_schedules`)."""
        step = ScheduleStep()
        now = self.engine.clock.now()
        for row in self._rows(ACTIVE) if rows is None else rows:
            if row.concurrency_key != self.kind:
                continue
            if row.run_after is not None and row.run_after > now:
                continue
            try:
                self._run_one(row, now, step)
            except StoreUnavailable:
                raise
            except (FsmError, ValueError, KeyError, TypeError) as err:
                step.errors += 1
                log.error("schedule %s of %s failed: %s", row.data.get("id", row.id), self.kind, err)
        return step

    def next_due(self) -> float | None:
        """Seconds until the next run of any active schedule (of any lifecycle: one indexed
        probe), or ``None`` when there is none or the store cannot tell."""
        probe = getattr(self.store, "next_due", None)
        if probe is None:
            return None
        wait: float | None = probe(SCHEDULE_KIND, [ACTIVE])
        return wait

    def _run_one(self, row: Snapshot, now: datetime, step: ScheduleStep) -> None:
        state = self._state(row)
        spec = state.schedule
        anchor = _time(row.data["anchor"])
        recent: deque[datetime] = deque(maxlen=MAX_CATCH_UP)
        on_time: list[datetime] = []
        last_due = None
        for walked, due in enumerate(spec.due_after(state.cursor, anchor)):
            if due > now or walked >= MAX_WALK:
                break
            last_due = due
            (on_time if due >= now - spec.grace else recent).append(due)
        if last_due is None:  # not due yet (another process moved it on): just fix the due time
            return
        missed: builtins.list[datetime] = []
        if spec.catch_up is CatchUp.LATEST:
            missed = builtins.list(recent)[-1:]
        elif spec.catch_up is CatchUp.ALL:
            missed = builtins.list(recent)
        last_run = state.last_run
        done: builtins.list[str] = []
        for due in [*missed, *on_time]:
            run_id = spec.run_id(due)
            if last_run is not None and spec.overlap is not Overlap.ALLOW and self._live(last_run):
                if spec.overlap is Overlap.SKIP:
                    step.skipped.append(run_id)
                    done.append(f"skipped {run_id}")
                    continue
                try:
                    self.engine.fire(last_run, "cancel", reason=f"schedule {spec.id}: overlapped by {run_id}")
                    step.cancelled.append(last_run)
                except FsmError as err:  # not cancellable (a finalizer): the new run still starts
                    log.warning("schedule %s could not cancel %s: %s", spec.id, last_run, err)
            try:
                self.engine.create(run_id, data=spec.data, priority=spec.priority)
                step.created.append(run_id)
                done.append(f"created {run_id}")
            except EntityExists:
                step.existing.append(run_id)
            last_run = run_id
        data = {**row.data, "cursor": _iso(last_due), "last_run": last_run}
        following = spec.next_due(last_due, anchor)
        reason = "; ".join(done[-3:]) + (f" (+{len(done) - 3} more)" if len(done) > 3 else "")
        try:
            self._write(row, "fire", ACTIVE, data, following, reason=reason or "nothing to create")
        except (StaleVersion, FsmError) as err:  # another process moved it on first: its runs are ours
            log.debug("schedule %s moved on by another process: %s", spec.id, err)

    # -- rows --------------------------------------------------------------------------------

    def _rows(self, state: str | None) -> builtins.list[Snapshot]:
        states = (ACTIVE, PAUSED) if state is None else (state,)
        found = [r for s in states for r in active_schedules(self.store, s) if r.concurrency_key == self.kind]
        return sorted(found, key=lambda r: r.id)

    def _row(self, schedule_id: str) -> Snapshot:
        row_id = schedule_row_id(self.kind, check_id("schedule id", schedule_id))
        try:
            row = self.store.get(row_id)
        except UnknownEntity:
            raise UnknownSchedule(schedule_id, self.kind) from None
        if row.state == DELETED:
            raise UnknownSchedule(schedule_id, self.kind)
        return row

    def _live(self, entity_id: str) -> bool:
        """Whether the run ``entity_id`` exists and is not final."""
        try:
            return self.store.get(entity_id).state not in self.engine.table.finals
        except UnknownEntity:
            return False

    def _state(self, row: Snapshot) -> ScheduleState:
        data = row.data
        try:
            schedule = Schedule.from_data(data["id"], data["schedule"])
            cursor = _time(data["cursor"])
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"schedule row {row.id!r} holds no readable schedule: {err}") from None
        return ScheduleState(
            schedule=schedule,
            paused=row.state == PAUSED,
            next_due=row.run_after if row.state == ACTIVE else None,
            cursor=cursor,
            last_run=data.get("last_run"),
            version=row.version,
        )

    def _write(
        self, row: Snapshot, event: str, target: str, data: dict[str, Any], due: datetime | None, *, reason: str
    ) -> Snapshot:
        """One compare-and-set transition of the schedule row; ``due``: its next run."""
        delay = None if due is None else max(due - self.engine.clock.now(), timedelta())
        write = TransitionWrite(
            row.id,
            event,
            row.state,
            target,
            "reaper",
            row.version,
            data=data,
            reason=reason[:500],
            run_after=delay,
        )
        moved = self.store.apply(write)[0]
        if target == ACTIVE and event in ("replace", "resume"):  # a sleeping reaper hears of it
            notify = getattr(self.store, "notify_work", None)
            if notify is not None:
                try:
                    notify(SCHEDULE_KIND)
                except FsmError as err:  # a hint: its next tick finds the schedule all the same
                    log.info("could not wake the reapers for schedule %s: %s", row.id, err)
        return moved


__all__ = [
    "SCHEDULE_KIND",
    "ScheduleState",
    "ScheduleStep",
    "Schedules",
    "UnknownSchedule",
    "active_schedules",
    "schedule_row_id",
]
