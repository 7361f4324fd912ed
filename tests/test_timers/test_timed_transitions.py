"""Timed transitions (``reaper(..., after=...)``) on every store: when they fire, and never after."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import Engine, ManualClock
from fsm.engine.timers import DueTimer
from fsm.reaping import Reaper
from fsm.records import Lease, TimerMode
from stores import Store

from .charts import Approval, Quick


def test_the_chart_knows_where_each_clock_starts() -> None:
    table = Approval.table
    assert table.timed == {
        "waiting": "waiting",
        "running": "active",
        "finalizing": "active",
        "done": None,
        "failed": None,
    }
    modes = {(b.event, b.source): b.timer for b in table.declared}
    assert modes[("start", "waiting")] is TimerMode.ARM  # enters the timed compound state
    assert modes[("finish", "running")] is TimerMode.KEEP  # a move between its children
    assert modes[("succeed", "finalizing")] is TimerMode.CLEAR
    assert table.arms_on_create()


def test_a_timer_fires_once_at_its_due_time(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Approval, any_store, clock=clock)
    created = engine.create("a1")
    assert created.timer_since == any_store.get("a1").timer_since is not None
    reaper_ = Reaper(any_store, [Approval], clock=clock)
    clock.advance(timedelta(hours=23, minutes=59))
    assert reaper_.run_once().moved == {}
    assert any_store.get("a1").state == "waiting"
    clock.advance(timedelta(minutes=1))
    assert reaper_.run_once().moved == {"approval.timeout": 1}
    row = any_store.get("a1")
    assert row.state == "failed" and row.timer_since is None
    assert [(h.event, h.reason, h.actor) for h in any_store.history("a1")] == [("timeout", "timed out", "reaper")]
    assert reaper_.run_once().moved == {}  # fired once


def test_a_timer_never_fires_after_the_entity_left_the_state(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Approval, any_store, clock=clock)
    engine.create("a1")
    clock.advance(timedelta(hours=23))
    engine.fire("a1", "cancel")
    clock.advance(timedelta(hours=2))
    reaper_ = Reaper(any_store, [Approval], clock=clock)
    assert reaper_.run_once().moved == {}
    assert [h.event for h in any_store.history("a1")] == ["cancel"]


def _hold(engine: Engine, lease: Lease, clock: ManualClock, minutes: int) -> Lease:
    """Keep ``lease`` alive for ``minutes``, renewing it every minute, as a live holder does."""
    for _ in range(minutes):
        clock.advance(timedelta(minutes=1))
        lease = engine.renew_lease(lease)
    return lease


def test_a_compound_timer_counts_from_entering_it_not_from_each_child(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Approval, any_store, clock=clock, owner="w1")
    engine.create("a1")
    clock.advance(timedelta(hours=1))
    started = engine.claim(1)[0]
    entered = started.timer_since
    assert entered is not None and entered == started.state_entered_at  # the start entered ``active``
    assert started.lease is not None
    lease = _hold(engine, started.lease, clock, 80)
    moved = engine.fire("a1", "finish", lease=lease)
    assert moved.state == "finalizing" and moved.snapshot.timer_since == entered  # not restarted by the child move
    assert any_store.get("a1").timer_since == entered
    assert moved.lease is not None
    lease = _hold(engine, moved.lease, clock, 15)  # 95 minutes in ``active``, the finalizer alive
    reaper_ = Reaper(any_store, [Approval], clock=clock)
    assert reaper_.run_once().moved == {}  # never expire a live finalizer, timer or not
    clock.advance(timedelta(minutes=10))  # the lease lapses: the deadline (due long ago) fires
    assert reaper_.run_once().moved == {"approval.deadline": 1}
    assert any_store.get("a1").state == "failed"


def test_a_timed_state_entered_by_claim_on_every_store(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Approval, any_store, clock=clock, owner="w1")
    engine.create_many([{}, {}, {}], ids=["b1", "b2", "b3"])
    for entity_id in ("b1", "b2", "b3"):
        assert any_store.get(entity_id).timer_since is not None
    clock.advance(timedelta(minutes=5))
    claimed = engine.claim(3)
    assert {s.state for s in claimed} == {"running"}
    assert all(s.timer_since == s.state_entered_at for s in claimed)
    assert all(any_store.get(s.id).timer_since == s.timer_since for s in claimed)


@pytest.mark.parametrize("after", [0, -1, float("nan"), float("inf"), "1h", True, timedelta(microseconds=1)])
def test_a_bad_delay_is_refused_at_declaration(after: object) -> None:
    from statemachine import State

    from fsm import InvalidDefinition, Lifecycle, reaper

    with pytest.raises(InvalidDefinition):

        class Bad(Lifecycle):
            a = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            b = State(final=True)
            go = reaper(a.to(b), after=after)  # type: ignore[arg-type]


def test_the_reaper_sleeps_until_the_earliest_pending_timer(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Approval, any_store, clock=clock)
    reaper_ = Reaper(any_store, [Approval], clock=clock)  # the default interval: five minutes
    assert reaper_.timers == {
        "approval": (
            ("waiting", timedelta(hours=24)),
            ("running", timedelta(minutes=90)),
            ("finalizing", timedelta(minutes=90)),
        )
    }
    assert reaper_.next_timer() is None  # nothing is waiting
    assert reaper_.sleep_for() == 300.0
    engine.create("a1")
    clock.advance(timedelta(hours=23, minutes=58))
    engine.create("a2")
    assert reaper_.next_timer() == pytest.approx(120.0)
    assert reaper_.sleep_for() == pytest.approx(120.005)
    clock.advance(timedelta(minutes=2))
    assert reaper_.next_timer() == pytest.approx(86_280.0)  # a1 is due: the next one is a2's
    assert reaper_.run_once().moved == {"approval.timeout": 1}


def test_a_timer_fires_on_time_with_the_default_interval(sql_target: SqlTarget) -> None:
    """A started reaper with the default five-minute interval fires a 300 ms timer at once,
    not at its next interval: its loop sleeps until the timer is due."""
    store = sql_target.store()
    engine = Engine(Quick, store)
    reaper_ = Reaper(store, [Quick])
    reaper_.start()
    try:
        engine.create("q1")
        deadline = time.monotonic() + 60  # far below the interval: a sleeping loop would miss it
        while store.get("q1").state != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.get("q1").state == "failed"
        assert [h.event for h in store.history("q1")] == ["timeout"]
    finally:
        reaper_.stop()


@pytest.mark.parametrize(
    ("kind", "timers"),
    [
        (None, [("waiting", timedelta(hours=1))]),
        ("approval", []),
        ("approval", "waiting"),
        ("approval", [("waiting",)]),
        ("approval", [("wait\x00ing", timedelta(hours=1))]),
        ("approval", [("\ud800", timedelta(hours=1))]),
        ("approval", [("w" * 10_000, timedelta(hours=1))]),
        ("approval", [("waiting", 3600)]),
        ("approval", [("waiting", float("nan"))]),
        ("approval", [("waiting", timedelta(days=-1))]),
        ("approval", [("waiting", timedelta.max)]),
        ("approval", [("waiting", timedelta(hours=1))] * 65),
        ("ap\x00proval", [("waiting", timedelta(hours=1))]),
    ],
)
def test_next_timer_refuses_hostile_arguments_on_every_store(
    any_store: Store, clock: ManualClock, kind: object, timers: object
) -> None:
    from fsm import InvalidArgument

    Engine(Approval, any_store, clock=clock).create("a1")
    before = any_store.get("a1")
    with pytest.raises(InvalidArgument):
        any_store.next_timer(kind, timers)  # type: ignore[attr-defined]
    assert any_store.get("a1") == before


@pytest.mark.parametrize("timer", ["arm", None, 1, object()])
def test_a_write_with_a_bad_timer_mode_is_refused_and_changes_nothing(
    any_store: Store, clock: ManualClock, timer: object
) -> None:
    from fsm import InvalidArgument
    from fsm.records import BatchWrite, ClaimRequest, ClaimStart, NewEntity, TransitionWrite

    engine = Engine(Approval, any_store, clock=clock)
    engine.create("a1")
    before = any_store.get("a1")
    write = TransitionWrite("a1", "cancel", "waiting", "failed", "worker", 0, timer=timer)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        any_store.apply(write)
    batch = BatchWrite(("a1",), "approval", "timeout", "waiting", "failed", "reaper", timer=timer)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        any_store.apply_batch(batch)
    start = ClaimStart("waiting", "running", "start", True, timer)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        any_store.claim(ClaimRequest("approval", "w1", 1, timedelta(minutes=1), starts=(start,)))
    with pytest.raises(InvalidArgument):
        any_store.create(NewEntity("a2", "approval", "waiting", arm_timer=timer))  # type: ignore[arg-type]
    assert any_store.get("a1") == before
    assert [e.id for e in any_store.entities("approval")] == ["a1"]


def test_a_read_first_fire_that_loses_a_race_is_judged_on_the_winner(clock: ManualClock) -> None:
    """A timed chart's fires read the row first; one whose row moves between its read and its
    write reads it again and is refused as the store-judged fire of an untimed chart is."""
    from fsm import TransitionNotAllowed
    from stores import MemoryStore

    store = MemoryStore(clock=clock)
    Engine(Approval, store, clock=clock).create("a1")
    raced: list[str] = []

    def racing(original: Any) -> Any:
        def read_then_race(entity_id: str, **kwargs: bool) -> object:
            snap = original(entity_id, **kwargs)
            if not raced:
                raced.append(entity_id)
                Engine(Approval, store, clock=clock).fire("a1", "cancel")  # another process wins
            return snap

        return read_then_race

    for name in ("_live", "get"):  # the engine reads through either: race right after the read
        setattr(store, name, racing(getattr(store, name)))
    with pytest.raises(TransitionNotAllowed):
        Engine(Approval, store, clock=clock).fire("a1", "cancel")
    assert raced == ["a1"] and [h.event for h in store.history("a1")] == ["cancel"]


def test_a_feed_consumer_learns_each_timer_from_the_entries(any_store: Store, clock: ManualClock) -> None:
    """``engine.watch`` entries carry transitions; ``timers_after`` says what each did to the
    timers: started (with due times), stopped, or kept running."""
    engine = Engine(Approval, any_store, clock=clock, owner="w1")
    head = any_store.feed_head()
    engine.create("a1")
    clock.advance(timedelta(minutes=5))
    (started,) = engine.claim(1)  # waiting -> running: enters ``active``, starts its deadline
    assert started.lease is not None
    moved = engine.fire("a1", "finish", lease=started.lease)  # a move inside ``active``: kept
    assert moved.lease is not None
    engine.fire("a1", "succeed", lease=moved.lease)  # out of every timed state: stopped
    entries = []
    for entry in engine.watch(head, timeout=30):  # PostgreSQL shows an entry once no earlier write is in flight
        entries.append(entry)
        if len(entries) == 3:
            break
    told = [(e.record.event, engine.timers_after(e.record)) for e in entries]
    start_at = entries[0].record.at
    assert told == [
        ("start", (DueTimer("deadline", start_at + timedelta(minutes=90), "active", timedelta(minutes=90)),)),
        ("finish", None),
        ("succeed", ()),
    ]
