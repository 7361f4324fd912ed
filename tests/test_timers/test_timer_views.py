"""When an entity's timers fall due, as read back by people: :func:`pending_timers` (the one
helper the views share) and ``fsm show`` on a SQLite store (the CLI's own clock: the store's)."""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from statemachine import State
from tests_support import Untyped

from fsm import Engine, JobLifecycle, Lifecycle, ManualClock, reaper, starts, worker
from fsm.cli import main
from fsm.diagram.pending import PendingTimer, duration, pending_timers, timestamp
from fsm.diagram.refs import ref_of
from stores import MemoryStore, open_store

from .charts import Approval, Reminder

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)

# -- pending_timers ------------------------------------------------------------------------


def test_an_entitys_pending_timers_follow_its_leaf_and_its_clock() -> None:
    clock = ManualClock(T0)
    engine = Engine(Approval, MemoryStore(clock), clock=clock)
    engine.create("req-1")
    (timeout,) = pending_timers(Approval.table, engine.get("req-1"))
    assert (timeout.event, timeout.state, timeout.target, timeout.guards) == ("timeout", "waiting", "failed", ())
    assert timeout.due == T0 + timedelta(hours=24) and timeout.reason == "timed out" and timeout.delay == "24h"
    clock.advance(timedelta(minutes=1))
    now = clock.now()
    assert timeout.describe(now) == "timeout due 2026-12-06T10:00:00+00:00 (in 23h 59m)"

    snap = engine.fire("req-1", "start").snapshot
    (deadline,) = pending_timers(Approval.table, snap)
    assert (deadline.event, deadline.state, deadline.guards) == ("deadline", "active", ("lease_stale",))
    assert deadline.due == now + timedelta(minutes=90)
    clock.advance(timedelta(hours=2))
    assert deadline.describe(clock.now()) == (
        "deadline due 2026-12-05T11:31:00+00:00 (overdue by 30m 00s; also needs lease_stale)"
    )
    # a move between the children of the timed compound keeps its clock
    snap = engine.fire("req-1", "finish", lease=snap.lease).snapshot
    assert pending_timers(Approval.table, snap) == [deadline]
    snap = engine.fire("req-1", "succeed", lease=snap.lease).snapshot
    assert snap.timer_since is None and pending_timers(Approval.table, snap) == []


def test_no_timer_without_a_running_clock_a_timed_leaf_or_a_live_entity() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock)
    jobs = Engine(JobLifecycle, store, clock=clock)
    assert pending_timers(JobLifecycle.table, jobs.create("job-1")) == []
    approvals = Engine(Approval, store, clock=clock)
    snap = approvals.create("req-1")
    assert pending_timers(Approval.table, snap._replace(deleted=True)) == []
    assert pending_timers(Approval.table, snap._replace(timer_since=None)) == []
    reminders = Engine(Reminder, store, clock=clock)
    assert [t.event for t in pending_timers(Reminder.table, reminders.create("rem-1"))] == ["expire"]
    assert pending_timers(Untyped.table, snap._replace(kind=Untyped.kind)) == []  # a lifecycle with no timer


class TwoTimers(Lifecycle):
    """Two timers on one state, the later one declared first."""

    kind = "two-timers"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    late = reaper(waiting.to(failed), after=timedelta(hours=2), reason="late")
    nudge = reaper(waiting.to.itself(), after=timedelta(minutes=10), reason="nudged")  # type: ignore[no-untyped-call]


def test_timers_are_listed_soonest_first() -> None:
    clock = ManualClock(T0)
    snap = Engine(TwoTimers, MemoryStore(clock), clock=clock).create("t-1")
    timers = pending_timers(TwoTimers.table, snap)
    assert [(t.event, t.due - T0) for t in timers] == [("nudge", timedelta(minutes=10)), ("late", timedelta(hours=2))]
    assert isinstance(timers[0], PendingTimer) and timers[0].target == "waiting"


@pytest.mark.parametrize(
    ("delta", "said"),
    [
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(seconds=45), "45s"),
        (timedelta(minutes=3, seconds=5), "3m 05s"),
        (timedelta(hours=23, minutes=59, seconds=59), "23h 59m"),
        (timedelta(days=3, hours=4, minutes=5), "3d 4h"),
        (-timedelta(minutes=5), "5m 00s"),
    ],
)
def test_durations_read_short_and_round_down(delta: timedelta, said: str) -> None:
    assert duration(delta) == said


def test_timestamps_are_utc_with_milliseconds_only_when_there_are_some_or_asked() -> None:
    assert timestamp(T0) == "2026-12-05T10:00:00+00:00"
    assert timestamp(T0 + timedelta(milliseconds=300)) == "2026-12-05T10:00:00.300+00:00"
    assert timestamp(T0 + timedelta(milliseconds=300), millis=False) == "2026-12-05T10:00:00+00:00"
    assert timestamp(T0, millis=True) == "2026-12-05T10:00:00.000+00:00"
    # a timer says its due time to the second, or to the millisecond when its delay has some
    since = T0 + timedelta(microseconds=123_456)
    assert PendingTimer("t", timedelta(hours=1), since + timedelta(hours=1), "s", "x").text == (
        "t due 2026-12-05T11:00:00+00:00"
    )
    assert PendingTimer("q", timedelta(milliseconds=300), since + timedelta(milliseconds=300), "s", "x").text == (
        "q due 2026-12-05T10:00:00.423+00:00"
    )
    assert timestamp(T0.astimezone(timezone(timedelta(hours=2)))) == timestamp(T0)  # said in UTC


# -- fsm show --------------------------------------------------------------------------------


@pytest.fixture(name="url")
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    assert main(["migrate", "upgrade", url]) == 0
    return url


def seed(url: str, entity: str, *, ago: timedelta = timedelta(), events: tuple[str, ...] = ()) -> datetime:
    """``entity`` created (and ``events`` fired) ``ago`` before now: its ``timer_since``."""
    clock = ManualClock(datetime.now(UTC) - ago)
    store = open_store(url, clock=clock, create=False)
    engine = Engine(Approval, store, clock=clock)
    engine.create(entity)
    for event in events:
        engine.fire(entity, event)
    since = engine.get(entity).timer_since
    store.close()  # type: ignore[attr-defined]
    assert since is not None
    return since


def show(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["show", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


APPROVAL = ["--lifecycle", ref_of(Approval)]


def test_show_prints_when_the_timer_of_the_current_state_is_due(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    since = seed(url, "req-1")
    out = show(capsys, "req-1", "--db", url, *APPROVAL)
    (line,) = [line for line in out.splitlines() if "timer" in line]
    assert line == f"  timer: timeout due {timestamp(since + timedelta(hours=24), millis=False)} (in 23h 59m)"
    assert out.index("lease: none") < out.index(line) < out.index("data: ")  # with the entity's other facts


def test_show_says_what_else_a_due_timer_needs_and_how_overdue_it_is(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    since = seed(url, "req-2", ago=timedelta(hours=2), events=("start",))
    out = show(capsys, "req-2", "--db", url, *APPROVAL)
    due = timestamp(since + timedelta(minutes=90), millis=False)
    assert re.search(
        rf"^  timer: deadline due {re.escape(due)} \(overdue by 30m \d\ds; also needs lease_stale\)$", out, re.M
    )


def test_show_prints_no_timer_line_when_none_runs(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    seed(url, "req-3")
    store = open_store(url, create=False)
    Engine(Approval, store).fire("req-3", "cancel")
    Engine(JobLifecycle, store).create("job-1")
    store.close()  # type: ignore[attr-defined]
    assert "timer" not in show(capsys, "req-3", "--db", url, *APPROVAL)
    assert "timer" not in show(capsys, "job-1", "--db", url)


def test_show_without_the_lifecycle_says_the_clock_runs_and_how_to_see_more(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    since = seed(url, "req-4")
    out = show(capsys, "req-4", "--db", url)
    assert f"  timer clock: running since {since.isoformat(timespec='seconds')}" in out
    assert "pass --lifecycle MODULE:Class to see when its timers are due" in out
    assert json.loads(show(capsys, "req-4", "--db", url, "--json"))["timers"] is None


def test_show_json_lists_the_timers(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    since = seed(url, "req-5", events=("start",))
    doc = json.loads(show(capsys, "req-5", "--db", url, "--json", *APPROVAL))
    assert doc["timer_since"] == since.isoformat(timespec="seconds")
    assert doc["timers"] == [
        {
            "event": "deadline",
            "after": "1h30m",
            "after_seconds": 5400.0,
            "state": "active",
            "target": "failed",
            "due": timestamp(since + timedelta(minutes=90)),
            "overdue": False,
            "guards": ["lease_stale"],
        }
    ]
    store = open_store(url, create=False)
    Engine(JobLifecycle, store).create("job-2")
    store.close()  # type: ignore[attr-defined]
    job = json.loads(show(capsys, "job-2", "--db", url, "--json"))
    assert job["timers"] == [] and job["timer_since"] is None


def test_show_refuses_a_lifecycle_it_cannot_load(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    seed(url, "req-6")
    assert main(["show", "req-6", "--db", url, "--lifecycle", "no.such:Thing"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "fsm show: error: cannot load lifecycle 'no.such:Thing'" in err


def test_show_on_a_timer_past_due_by_days(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    seed(url, "req-7")
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    conn.execute("UPDATE fsm_entities SET timer_since = '2000-01-01 00:00:00.000000' WHERE id = 'req-7'")
    conn.commit()
    conn.close()
    out = show(capsys, "req-7", "--db", url, *APPROVAL)
    assert re.search(r"^  timer: timeout due 2000-01-02T00:00:00\+00:00 \(overdue by \d+d \d+h\)$", out, re.M)
