"""Delayed fires: stored, delivered by the reaper when due if the chart allows the event,
dropped with the refusal otherwise, and fenced: a deliverer that lost the request changes
nothing.  On every store and face, with a manual clock."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import (
    ConditionFailed,
    Engine,
    IdempotencyKeyReused,
    InvalidArgument,
    JobLifecycle,
    ManualClock,
    UnknownEntity,
    UnknownEvent,
)
from fsm.engine.later import later_kind
from fsm.reaping import Reaper
from fsm.reaping.later import Delivery, _deliver
from fsm.records import ClaimRequest, ClaimStart, HeldBy
from stores import MemoryStore, Store


def test_a_delayed_fire_fires_when_due(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    request = jobs.fire_later("j1", "cancel", after=timedelta(minutes=2), reason="deadline passed")
    assert (request.state, request.event, request.entity_id) == ("pending", "cancel", "j1")
    assert request.due == clock.now() + timedelta(minutes=2)
    reaper = Reaper(any_store, [JobLifecycle], clock=clock)
    assert reaper.sleep_for() == pytest.approx(120.005)  # until the request is due, not the interval
    clock.advance(timedelta(minutes=1))
    assert reaper.run_once().delayed == {}
    assert jobs.get("j1").state == "queued"
    clock.advance(timedelta(minutes=1))
    result = reaper.run_once()
    assert result.delayed == {"job.fired": 1} and "delayed job.fired=1" in result.summary()
    assert jobs.get("j1").state == "failed"
    (record,) = jobs.history("j1")
    assert (record.event, record.reason) == ("cancel", "deadline passed")
    done = jobs.delayed(request.id)
    assert done.state == "fired" and done.outcome == f"fired cancel: queued -> failed (seq {record.seq})"
    assert reaper.run_once().delayed == {}  # once


def test_a_delayed_fire_the_chart_no_longer_allows_is_dropped_with_its_reason(
    any_store: Store, clock: ManualClock
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    request = jobs.fire_later("j1", "cancel", after=60)
    jobs.fire("j1", "cancel", reason="cancelled by hand")  # the entity moved on first
    clock.advance(timedelta(minutes=1))
    assert Reaper(any_store, [JobLifecycle], clock=clock).run_once().delayed == {"job.dropped": 1}
    assert [h.reason for h in jobs.history("j1")] == ["cancelled by hand"]  # nothing more
    dropped = jobs.delayed(request.id)
    assert dropped.state == "dropped" and dropped.outcome is not None
    assert dropped.outcome.startswith("TransitionNotAllowed:") and "final" in dropped.outcome


def test_one_request_per_idempotency_key(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    at = clock.now() + timedelta(hours=1)
    first = jobs.fire_later("j1", "cancel", at=at, idempotency_key="k")
    assert jobs.fire_later("j1", "cancel", at=at, idempotency_key="k") == first
    with pytest.raises(IdempotencyKeyReused):
        jobs.fire_later("j1", "cancel", at=at + timedelta(seconds=1), idempotency_key="k")
    clock.advance(timedelta(hours=1))
    reaper = Reaper(any_store, [JobLifecycle], clock=clock)
    assert reaper.run_once().delayed == {"job.fired": 1}
    assert [h.event for h in jobs.history("j1")] == ["cancel"]


def test_a_deliverer_that_lost_the_request_changes_nothing(any_store: Store, clock: ManualClock) -> None:
    """A deliverer claims a due request and stalls past its lease; another takes the request
    over.  The stalled one's fire, fenced by its old token, is refused in the store (the
    event would be allowed): only the new holder delivers it."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    request = jobs.fire_later("j1", "cancel", after=0)
    starts = (ClaimStart("pending", "delivering", "deliver"),)
    (stalled,) = any_store.claim(ClaimRequest(later_kind("job"), "stalled", 1, timedelta(seconds=30), starts=starts))
    old = stalled.lease
    assert old is not None
    clock.advance(timedelta(seconds=31))  # its lease lapsed: another deliverer takes over
    taken = any_store.acquire_lease(
        request.id, owner="rescuer", ttl=timedelta(seconds=30), budget=None, expect_version=stalled.version
    )
    with pytest.raises(ConditionFailed) as refused:
        jobs.fire("j1", "cancel", fence=HeldBy(request.id, old.owner, old.token))
    assert refused.value.condition == "held_by" and jobs.history("j1") == []
    done = Delivery()
    _deliver(jobs, taken, done)
    assert done.fired == [request.id] and [h.event for h in jobs.history("j1")] == ["cancel"]
    assert jobs.delayed(request.id).state == "fired"


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("j1", "cancel"), {}, InvalidArgument),  # neither after nor at
        (("j1", "cancel"), {"after": 1, "at": None, "idempotency_key": "\x00"}, InvalidArgument),
        (("j1", "cancel"), {"after": float("nan")}, InvalidArgument),
        (("j1", "cancel"), {"after": -1}, InvalidArgument),
        (("j1", "cancel"), {"after": "soon"}, InvalidArgument),
        (("j1", "cancel"), {"after": 1, "reason": "\ud800"}, InvalidArgument),
        (("j1", "cancel"), {"after": 1, "data": {"x": float("inf")}}, Exception),
        (("j1", "nope"), {"after": 1}, UnknownEvent),
        (("missing", "cancel"), {"after": 1}, UnknownEntity),
        (("j1", "cancel"), {"after": 1, "idempotency_key": "k" * 250}, InvalidArgument),
        (("j1", "cancel"), {"after": 1, "actor": "mallory"}, InvalidArgument),
    ],
)
def test_fire_later_refuses_hostile_input_and_stores_nothing(
    any_store: Store, clock: ManualClock, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    before = any_store.get("j1")
    with pytest.raises(error):
        jobs.fire_later(*args, **kwargs)
    assert any_store.get("j1") == before
    assert any_store.entities(later_kind("job")) == []


@pytest.mark.parametrize("where", ["memory", "sql"])
def test_a_started_reaper_delivers_a_request_due_sooner_than_its_sleep(where: str, sql_target: SqlTarget) -> None:
    """The reaper sleeps its five-minute interval; a request due in 200 ms wakes it."""
    store = MemoryStore() if where == "memory" else sql_target.store()  # real clocks
    jobs = Engine(JobLifecycle, store)
    jobs.create("j1")
    reaper = Reaper(store, [JobLifecycle])
    reaper.start()
    try:
        time.sleep(0.2)  # the loop has ticked once and sleeps
        jobs.fire_later("j1", "cancel", after=0.2)
        deadline = time.monotonic() + 30
        while jobs.get("j1").state != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert jobs.get("j1").state == "failed"
    finally:
        reaper.stop()


def test_a_retried_request_with_a_delay_returns_the_first(any_store: Store, clock: ManualClock) -> None:
    """``after=`` is due later each time it is sent: a retry under the same key is the same
    request; another event under the key is refused, naming what differs."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j1")
    first = jobs.fire_later("j1", "cancel", after=60, idempotency_key="k")
    clock.advance(timedelta(seconds=5))
    assert jobs.fire_later("j1", "cancel", after=60, idempotency_key="k") == first
    with pytest.raises(IdempotencyKeyReused, match="reason differ"):
        jobs.fire_later("j1", "cancel", after=60, idempotency_key="k", reason="other")


def test_fire_later_refuses_a_store_bound_to_an_application_table() -> None:
    """Its reserved row would land in the application's table (as the leader row would)."""
    from fsm import ConfigError

    store = MemoryStore()
    jobs = Engine(JobLifecycle, store)
    jobs.create("j1")
    store.binding = "an application table"  # type: ignore[attr-defined]  # what SqlStore(binding=...) has
    with pytest.raises(ConfigError, match="own tables"):
        jobs.fire_later("j1", "cancel", after=60)
    assert [s.id for s in store.entities("job")] == ["j1"]
