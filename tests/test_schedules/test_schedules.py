"""Schedules: one entity per due time, on every store, with a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from pydantic import BaseModel

from fsm import ConfigError, Engine, InvalidArgument, InvalidData, JobLifecycle, ManualClock, UnknownEntity
from fsm.reaping import Reaper
from fsm.scheduling import Schedule, Schedules
from stores import Store

START = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


class _Size(BaseModel):
    size: int = 0


class TypedJob(JobLifecycle):
    """Jobs whose data has a typed field: a schedule's data is validated when it is added."""

    kind = "typedjob"
    data_model = _Size


def _jobs(store: Store, clock: ManualClock) -> tuple[Engine, Schedules]:
    engine = Engine(JobLifecycle, store, clock=clock)
    return engine, Schedules(engine)


def _at(clock: ManualClock, moment: datetime) -> None:
    """Move the store's manual clock to ``moment``."""
    clock.advance(moment - clock.now())


def _runs(store: Store) -> list[str]:
    return sorted(s.id for s in store.entities("job", limit=1000))


def test_one_run_per_due_time_whoever_runs_it(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    state = schedules.add(Schedule("tick", every=timedelta(minutes=1), data={"n": 1}, overlap="allow"))
    assert state.next_due == START + timedelta(minutes=1) and not state.paused
    assert schedules.run_due().created == []  # nothing due yet
    clock.advance(timedelta(minutes=1))
    assert schedules.run_due().created == ["tick@2026-12-05T12:01:00Z"]
    other = Schedules(Engine(JobLifecycle, any_store, clock=clock))  # a second process
    assert other.run_due().created == []  # the schedule moved on: nothing is due twice
    clock.advance(timedelta(minutes=1))
    first, second = schedules.run_due(), other.run_due()
    assert first.created == ["tick@2026-12-05T12:02:00Z"] and second.created == []
    assert _runs(any_store) == ["tick@2026-12-05T12:01:00Z", "tick@2026-12-05T12:02:00Z"]
    assert any_store.get("tick@2026-12-05T12:01:00Z").data["n"] == 1
    assert schedules.get("tick").next_due == START + timedelta(minutes=3)


def test_a_stale_process_creates_nothing_twice(any_store: Store, clock: ManualClock) -> None:
    """A process that read the schedule before another moved it on (a paused one waking up)
    finds each run it would create already there."""
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("tick", every=timedelta(minutes=1), overlap="allow"))
    clock.advance(timedelta(minutes=1))
    stale_row = any_store.get("fsm-schedule:job:tick")
    assert schedules.run_due().created == ["tick@2026-12-05T12:01:00Z"]
    from fsm.scheduling.service import ScheduleStep

    step = ScheduleStep()
    schedules._run_one(stale_row, clock.now(), step)  # the stale read's step
    assert step.created == [] and step.existing == ["tick@2026-12-05T12:01:00Z"]
    assert _runs(any_store) == ["tick@2026-12-05T12:01:00Z"]


def test_overlap_skip_allow_and_cancel(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    for name in ("skip", "allow", "cancel"):
        schedules.add(Schedule(name, every=timedelta(minutes=1), overlap=name))
    clock.advance(timedelta(minutes=1))
    schedules.run_due()
    clock.advance(timedelta(minutes=1))  # every first run is still queued: not final
    step = schedules.run_due()
    assert step.skipped == ["skip@2026-12-05T12:02:00Z"]
    assert step.cancelled == ["cancel@2026-12-05T12:01:00Z"]
    assert sorted(step.created) == ["allow@2026-12-05T12:02:00Z", "cancel@2026-12-05T12:02:00Z"]
    assert any_store.get("cancel@2026-12-05T12:01:00Z").state == "failed"
    assert any_store.get("allow@2026-12-05T12:01:00Z").state == "queued"
    engine.fire("skip@2026-12-05T12:01:00Z", "cancel")  # the previous run is final now
    clock.advance(timedelta(minutes=1))
    assert "skip@2026-12-05T12:03:00Z" in schedules.run_due().created


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        ("none", []),
        ("latest", ["c@2026-12-05T13:00:00Z"]),
        ("all", [f"c@2026-12-05T12:{m:02d}:00Z" for m in range(10, 60, 10)] + ["c@2026-12-05T13:00:00Z"]),
    ],
)
def test_catch_up_after_downtime(any_store: Store, clock: ManualClock, catch_up: str, expected: list[str]) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("c", every=timedelta(minutes=10), catch_up=catch_up, overlap="allow"))
    clock.advance(timedelta(minutes=65))  # every process was down for an hour
    assert sorted(schedules.run_due().created) == expected
    clock.advance(timedelta(minutes=5))  # on time again: 13:10 runs under every policy
    assert schedules.run_due().created == ["c@2026-12-05T13:10:00Z"]


def test_a_daily_berlin_schedule_across_both_dst_changes(any_store: Store, clock: ManualClock) -> None:
    pytest.importorskip("croniter")
    _at(clock, datetime(2027, 3, 26, 12, 0, tzinfo=UTC))
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("nightly", cron="30 2 * * *", timezone="Europe/Berlin", overlap="allow"))
    created: list[str] = []
    for _ in range(4 * 24):  # four days around the spring change, an hour at a time
        clock.advance(timedelta(hours=1))
        created += schedules.run_due().created
    # 02:30 CET is 01:30Z; the night 02:00 does not exist (28 March) runs at 03:30 CEST, 01:30Z
    assert created == [
        "nightly@2027-03-27T01:30:00Z",
        "nightly@2027-03-28T01:30:00Z",
        "nightly@2027-03-29T00:30:00Z",
        "nightly@2027-03-30T00:30:00Z",
    ]
    clock.advance(datetime(2027, 10, 29, 12, 0, tzinfo=UTC) - clock.now())
    schedules.resume("nightly")  # a no-op while active; the long gap is a downtime
    created = schedules.run_due().created  # catch-up latest: one run for the missed months
    assert created == ["nightly@2027-10-29T00:30:00Z"]
    created = []
    for _ in range(4 * 24):  # the fall change: 02:30 happens twice on 31 October, runs once
        clock.advance(timedelta(hours=1))
        created += schedules.run_due().created
    assert created == [
        "nightly@2027-10-30T00:30:00Z",
        "nightly@2027-10-31T00:30:00Z",
        "nightly@2027-11-01T01:30:00Z",
        "nightly@2027-11-02T01:30:00Z",
    ]


def test_pause_resume_delete_and_add_again(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    spec = Schedule("p", every=timedelta(minutes=1))
    schedules.add(spec)
    assert schedules.add(spec).version == schedules.get("p").version  # the same again: unchanged
    with pytest.raises(ConfigError, match="replace=True"):
        schedules.add(Schedule("p", every=timedelta(minutes=2)))
    assert schedules.pause("p").paused
    clock.advance(timedelta(minutes=5))
    assert schedules.run_due().created == []
    resumed = schedules.resume("p")
    assert not resumed.paused and resumed.next_due == clock.now() + timedelta(minutes=1)
    assert schedules.run_due().created == []  # what passed while paused is not caught up
    clock.advance(timedelta(minutes=1))
    assert schedules.run_due().created == ["p@2026-12-05T12:06:00Z"]
    replaced = schedules.add(Schedule("p", every=timedelta(minutes=2)), replace=True)
    assert replaced.schedule.every == timedelta(minutes=2)
    assert [s.schedule.id for s in schedules.list()] == ["p"]
    schedules.delete("p")
    assert schedules.list() == []
    with pytest.raises(UnknownEntity):
        schedules.get("p")
    schedules.add(spec)  # a deleted id may be used again
    assert schedules.get("p").next_due == clock.now() + timedelta(minutes=1)
    events = [h.event for h in any_store.history("fsm-schedule:job:p")]
    assert events[:3] == ["pause", "resume", "fire"] and "delete" in events


def test_the_reaper_runs_the_schedules_of_its_lifecycles(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("r", every=timedelta(seconds=30)))
    reaper = Reaper(any_store, [JobLifecycle], clock=clock)
    assert reaper.sleep_for() == pytest.approx(30.005)  # the next run, not the five-minute interval
    clock.advance(timedelta(seconds=30))
    result = reaper.run_once()
    assert result.scheduled == {"job": 1} and "scheduled job=1" in result.summary()
    assert _runs(any_store) == ["r@2026-12-05T12:00:30Z"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"cron": "* * * * *", "every": 60},
        {"every": 0},
        {"every": float("nan")},
        {"every": -5},
        {"every": "60"},
        {"cron": "61 * * * *"},
        {"cron": "* * *"},
        {"cron": "\x00"},
        {"every": 60, "timezone": "Mars/Olympus"},
        {"every": 60, "timezone": "\ud800"},
        {"every": 60, "data": {"x": float("nan")}},
        {"every": 60, "data": {"x": object()}},
        {"every": 60, "data": []},
        {"every": 60, "overlap": "sometimes"},
        {"every": 60, "catch_up": 3},
        {"every": 60, "start": datetime(2026, 1, 1)},  # naive
    ],
)
def test_a_bad_schedule_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Schedule("s", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule_id", ["", "a@b", "x\x00", "\udcff", "x" * 200, 5, None])
def test_a_bad_schedule_id_is_refused(schedule_id: object) -> None:
    with pytest.raises(ConfigError):
        Schedule(schedule_id, every=60)  # type: ignore[arg-type]


def test_hostile_calls_change_nothing(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("h", every=60))
    before = any_store.get("fsm-schedule:job:h")
    for bad in ("", "h\x00", "\ud800", "x" * 10_000, 5, None):
        with pytest.raises((InvalidArgument, UnknownEntity)):
            schedules.pause(bad)  # type: ignore[arg-type]
        with pytest.raises((InvalidArgument, UnknownEntity)):
            schedules.get(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        schedules.add({"id": "h"})  # type: ignore[arg-type]
    typed = Schedules(Engine(TypedJob, any_store, clock=clock))
    with pytest.raises(InvalidData):
        typed.add(Schedule("t", every=60, data={"size": "large"}))
    assert any_store.get("fsm-schedule:job:h") == before


def test_a_cron_that_never_falls_due_is_a_config_error() -> None:
    pytest.importorskip("croniter")
    with pytest.raises(ConfigError, match="never falls due"):
        Schedule("feb30", cron="0 0 30 2 *")


def test_a_schedule_added_while_the_reaper_sleeps_wakes_it() -> None:
    """A started reaper sleeping its five-minute interval serves a schedule added after it
    went to sleep (the add notifies it), with real clocks."""
    import time as real_time

    from stores import MemoryStore

    store = MemoryStore()
    reaper = Reaper(store, [JobLifecycle])
    reaper.start()
    try:
        real_time.sleep(0.2)  # its first tick is done: it sleeps the interval
        Schedules(Engine(JobLifecycle, store)).add(Schedule("soon", every=1, overlap="allow"))
        deadline = real_time.monotonic() + 30
        while not store.entities("job") and real_time.monotonic() < deadline:
            real_time.sleep(0.05)
        assert [s.id.split("@")[0] for s in store.entities("job")][:1] == ["soon"]
    finally:
        reaper.stop()


def test_pause_and_delete_retry_when_a_reaper_step_moved_the_row_first(any_store: Store, clock: ManualClock) -> None:
    """A reaper's step that moves the schedule row between the read and the write of a
    pause (or delete) makes that write lose its compare-and-set: it reads again and retries."""
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("race", every=60, overlap="allow"))
    clock.advance(timedelta(minutes=1))
    other = Schedules(engine)
    real_row = schedules._row
    raced: list[str] = []

    def row_then_a_reaper_step(schedule_id: str) -> Any:
        row = real_row(schedule_id)
        if not raced:
            raced.append(schedule_id)
            other.run_due()  # a reaper's step lands between this read and the write
        return row

    schedules._row = row_then_a_reaper_step  # type: ignore[method-assign]
    assert schedules.pause("race").paused
    assert raced == ["race"] and _runs(any_store) == ["race@2026-12-05T12:01:00Z"]
    schedules.delete("race")
    assert schedules.list() == []


def test_a_schedules_priority_is_each_runs_and_a_bad_one_is_refused(any_store: Store, clock: ManualClock) -> None:
    _at(clock, START)
    engine, schedules = _jobs(any_store, clock)
    schedules.add(Schedule("urgent", every=timedelta(minutes=1), priority=7))
    assert schedules.get("urgent").schedule.priority == 7  # kept in the stored row
    clock.advance(timedelta(minutes=1))
    [run] = schedules.run_due().created
    assert any_store.get(run).priority == 7
    for bad in (101, -101, 1.5, True, "7", None):
        with pytest.raises(ConfigError, match="priority"):
            Schedule("bad", every=timedelta(minutes=1), priority=bad)  # type: ignore[arg-type]
