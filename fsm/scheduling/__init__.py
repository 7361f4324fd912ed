"""Schedules: one entity of a lifecycle per due time (cron in a time zone, or an interval).

See :mod:`fsm.scheduling.spec` (what a schedule is, its due times, DST) and
:mod:`fsm.scheduling.service` (stored schedules, and the step the reaper runs).
"""

from fsm.scheduling.service import (
    SCHEDULE_KIND,
    Schedules,
    ScheduleState,
    ScheduleStep,
    UnknownSchedule,
    schedule_row_id,
)
from fsm.scheduling.spec import CatchUp, Overlap, Schedule

__all__ = [
    "SCHEDULE_KIND",
    "CatchUp",
    "Overlap",
    "Schedule",
    "ScheduleState",
    "ScheduleStep",
    "Schedules",
    "UnknownSchedule",
    "schedule_row_id",
]
