"""Durable waits: ``job.sleep`` and ``job.wait_for`` park the entity and free the slot; a
later claim resumes the handler, whose recorded steps replay; ``Engine.send`` delivers a
message once per key and wakes a parked entity.  On every store, with a manual clock."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import Engine, InvalidArgument, JobLifecycle, ManualClock
from fsm.errors import WaitTimedOut
from fsm.reaping import Reaper
from fsm.work import Job, Worker
from stores import MemoryStore, Store

QUICK = {"poll_interval": timedelta(milliseconds=10), "grace": timedelta(seconds=5)}


def _turn(worker: Worker) -> None:
    """Claim what is due and let every handler it started finish (or park)."""
    for _ in range(500):
        worker.run_once()
        if worker.running == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError("handlers still running")


def test_a_sleeping_job_frees_its_slot_and_resumes_when_due(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    ran: Counter[str] = Counter()

    def handler(job: Job) -> str:
        job.run("before", lambda key: ran.update([f"{job.id} before"]) or 1)
        if job.id == "sleeper":
            job.sleep(timedelta(hours=1))
        ran.update([f"{job.id} after"])
        return "exited"

    engine.create("sleeper")
    clock.advance(timedelta(seconds=1))
    engine.create("other")
    with Worker(engine, {"running": handler}, concurrency=1, **QUICK) as worker:
        _turn(worker)  # the sleeper parks: its slot is free
        _turn(worker)  # so the other job runs while it sleeps
        assert engine.get("other").state == "finalizing"
        parked = engine.get("sleeper")
        assert parked.state == "running" and parked.lease is None
        assert parked.run_after == clock.now() + timedelta(hours=1)
        assert worker.stats.parked == 1
        clock.advance(timedelta(minutes=59))
        _turn(worker)
        assert engine.get("sleeper").state == "running"  # not due yet
        clock.advance(timedelta(minutes=1))
        _turn(worker)
    assert engine.get("sleeper").state == "finalizing"
    assert ran == Counter({"sleeper before": 1, "sleeper after": 1, "other before": 1, "other after": 1})
    assert [h.event for h in engine.history("sleeper")] == ["start", "exited"]  # parking is no transition


def test_the_reaper_leaves_a_parked_job_alone_until_it_is_due(any_store: Store, clock: ManualClock) -> None:
    """Two days asleep: past stale_after (1 h), max_wait (24 h) and the running budget (6 h)."""
    engine = Engine(JobLifecycle, any_store, clock=clock)

    def handler(job: Job) -> str:
        job.sleep(timedelta(days=2))
        return "exited"

    engine.create("j1")
    reaper = Reaper(any_store, [JobLifecycle], clock=clock)
    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
        clock.advance(timedelta(days=2) - timedelta(minutes=1))
        assert reaper.run_once().moved == {}
        clock.advance(timedelta(minutes=1))
        _turn(worker)  # resumed: its renewal budget counts from the wake, not from entering running
    assert engine.get("j1").state == "finalizing"
    assert [h.event for h in engine.history("j1")] == ["start", "exited"]


def test_a_message_sent_before_the_wait_is_taken_at_once(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    assert engine.send("j1", "approval", {"by": "alice"}, idempotency_key="k1") is True
    got: list[Any] = []

    def handler(job: Job) -> str:
        got.append(job.wait_for("approval", timeout=timedelta(hours=1)))
        return "exited"

    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
    assert got == [{"by": "alice"}] and engine.get("j1").state == "finalizing"


def test_a_message_sent_during_the_wait_wakes_the_job_once_per_key(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    got: list[Any] = []
    before = Counter[str]()

    def handler(job: Job) -> str:
        job.run("charge", lambda key: before.update(["charge"]) or "charged")
        got.append(job.wait_for("approval"))
        got.append(job.wait_for("approval"))  # a second wait takes the next message
        return "exited"

    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
        assert engine.get("j1").lease is None and got == []  # parked, waiting without a timeout
        assert engine.send("j1", "approval", 1, idempotency_key="a") is True
        assert engine.send("j1", "approval", 1, idempotency_key="a") is False  # the same key: nothing more
        _turn(worker)  # woken at once: due now, no clock advance needed
        assert got == [1] and engine.get("j1").lease is None  # parked again, on the second wait
        assert engine.send("j1", "approval", 2, idempotency_key="b") is True
        _turn(worker)
    assert got == [1, 1, 2]  # the replay took message a again at the first wait: recorded
    assert before == Counter({"charge": 1})
    assert engine.get("j1").state == "finalizing"


def test_a_wait_times_out_and_replays_its_timeout(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    for entity_id in ("raises", "default"):
        engine.create(entity_id)
    outcomes: list[str] = []

    def handler(job: Job) -> tuple[str, dict[str, int]]:
        if job.id == "default":
            outcomes.append(str(job.wait_for("approval", timeout=600, default="none")))
            return "exited", {"exit_code": 0}
        try:
            job.wait_for("approval", timeout=timedelta(minutes=10))
        except WaitTimedOut as err:
            outcomes.append(f"timed out: {err.name}")
            return "exited", {"exit_code": 1}
        return "exited", {"exit_code": 0}

    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
        clock.advance(timedelta(minutes=10))
        _turn(worker)
    assert sorted(outcomes) == ["none", "timed out: approval"]
    assert engine.get("raises").data["exit_code"] == 1
    # a message after the timeout is kept (the next wait on that name would take it); no wake
    assert engine.send("raises", "approval", "late", idempotency_key="late") is True
    assert engine.get("raises").state == "finalizing"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("j1", "approval", None), {"idempotency_key": "\x00"}),
        (("j1", "appr:oval", None), {"idempotency_key": "k"}),
        (("j1", "\ud800", None), {"idempotency_key": "k"}),
        (("j1", "a" * 65, None), {"idempotency_key": "k"}),
        (("j1", "approval", None), {"idempotency_key": "k" * 161}),
        (("j1", "approval", float("nan")), {"idempotency_key": "k"}),
        (("j1", "approval", object()), {"idempotency_key": "k"}),
        (("j1", "approval", {"x": "\x00"}), {"idempotency_key": "k"}),
        (("j1", 5, None), {"idempotency_key": "k"}),
        ((None, "approval", None), {"idempotency_key": "k"}),
    ],
)
def test_send_refuses_hostile_input_and_changes_nothing(
    any_store: Store, clock: ManualClock, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from fsm import FsmError

    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    before = any_store.get("j1")
    with pytest.raises((InvalidArgument, FsmError)):
        engine.send(*args, **kwargs)
    assert any_store.get("j1") == before and any_store.effects("j1") == []


def test_sleep_and_wait_refuse_bad_arguments(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    errors: list[str] = []

    def handler(job: Job) -> str:
        for call in (
            lambda: job.sleep("1h"),  # type: ignore[arg-type]
            lambda: job.sleep(-1),
            lambda: job.sleep(float("inf")),
            lambda: job.wait_for("a:b"),
            lambda: job.wait_for("ok", timeout=float("nan")),
            lambda: job.wait_for(None),  # type: ignore[arg-type]
        ):
            try:
                call()
            except InvalidArgument as err:
                errors.append(type(err).__name__)
        return "exited"

    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
    assert errors == ["InvalidArgument"] * 6
    assert engine.get("j1").state == "finalizing"


@pytest.mark.parametrize("where", ["memory", "sql"])
def test_a_running_worker_wakes_for_a_sleeper_and_for_a_message_without_polling(
    where: str, sql_target: SqlTarget
) -> None:
    """A worker that polls once a day still resumes a 200 ms sleep when it is due (its idle
    wait ends at the next due time) and a waiting job when a message comes (the wake-up)."""
    store = MemoryStore() if where == "memory" else sql_target.store()  # real clocks
    engine = Engine(JobLifecycle, store)
    engine.create("j1")
    seen: list[Any] = []

    def handler(job: Job) -> str:
        job.sleep(0.2)
        seen.append(job.wait_for("go"))
        return "exited"

    worker = Worker(engine, {"running": handler}, poll_interval=timedelta(days=1), grace=timedelta(seconds=5))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            if worker.stats.parked == 2:
                break
            threading.Event().wait(0.01)
        assert worker.stats.parked == 2  # slept, resumed when due, now waits for go
        engine.send("j1", "go", "now", idempotency_key="go")
        for _ in range(3000):
            if engine.get("j1").state == "finalizing":
                break
            threading.Event().wait(0.01)
        assert engine.get("j1").state == "finalizing" and seen == ["now"]
    finally:
        worker.stop()
        thread.join(10)


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("park", ("j1",), {"owner": "w", "token": 1, "until": "tomorrow"}),
        ("park", ("j1",), {"owner": "w", "token": 1, "until": datetime(2030, 1, 1)}),  # naive
        ("park", ("j1",), {"owner": "w\x00", "token": 1, "until": datetime(2030, 1, 1, tzinfo=UTC)}),
        ("park", ("j1",), {"owner": "w", "token": -1, "until": datetime(2030, 1, 1, tzinfo=UTC)}),
        ("park", ("\ud800",), {"owner": "w", "token": 1, "until": datetime(2030, 1, 1, tzinfo=UTC)}),
        ("send_message", ("j1", "go:x", "k", None), {}),
        ("send_message", ("j1", "go", "k" * 161, None), {}),
        ("send_message", ("j1", "go", "k", float("nan")), {}),
        ("send_message", ("j1", "go", "k", {"a": object()}), {}),
        ("send_message", ("j1", None, "k", None), {}),
        ("wake", ("x" * 10_000,), {}),
        ("wake", (5,), {}),
    ],
)
def test_the_wait_primitives_refuse_hostile_input_on_every_store(
    any_store: Store, clock: ManualClock, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    Engine(JobLifecycle, any_store, clock=clock).create("j1")
    before = any_store.get("j1")
    with pytest.raises(InvalidArgument):
        getattr(any_store, method)(*args, **kwargs)
    assert any_store.get("j1") == before and any_store.effects("j1") == []


def test_park_refuses_a_caller_without_the_lease(any_store: Store, clock: ManualClock) -> None:
    from fsm import LeaseLost

    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    (claimed,) = engine.claim(1)
    assert claimed.lease is not None
    with pytest.raises(LeaseLost):
        any_store.park("j1", owner="someone-else", token=claimed.lease_token, until=clock.now())  # type: ignore[attr-defined]
    assert any_store.get("j1") == claimed


def test_each_states_handler_numbers_its_own_steps(any_store: Store, clock: ManualClock) -> None:
    """A finalizer resumed by a new claim replays its own steps, never the steps of the
    handler before it (both wait, for different messages)."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    got: dict[str, Any] = {}

    def running(job: Job) -> str:
        got["running"] = job.wait_for("approval")
        return "exited"

    def finalizing(job: Job) -> str:
        got["finalizing"] = job.wait_for("confirm")
        return "complete"

    engine.send("j1", "approval", {"by": "alice"}, idempotency_key="a")
    with Worker(engine, {"running": running, "finalizing": finalizing}, **QUICK) as worker:
        _turn(worker)  # running takes approval, finalizing (same claim) parks for confirm
        assert got == {"running": {"by": "alice"}} and engine.get("j1").state == "finalizing"
        clock.advance(timedelta(seconds=1))
        _turn(worker)  # nothing new: a resumed finalizer must not take running's recorded wait
        assert "finalizing" not in got and engine.get("j1").state == "finalizing"
        engine.send("j1", "confirm", {"ok": True}, idempotency_key="c")
        _turn(worker)
    assert got == {"running": {"by": "alice"}, "finalizing": {"ok": True}}
    assert engine.get("j1").state == "completed"
    keys = sorted(e.key for e in any_store.effects("j1") if e.key.startswith("fsm:step:"))
    assert "fsm:step:running:wait:1" in keys and "fsm:step:finalizing:wait:1" in keys


def test_a_parked_job_moved_on_by_an_operator_is_claimable_at_once(any_store: Store, clock: ManualClock) -> None:
    """A job parked on a wait without a timeout is due in a hundred years; an operator's
    ``release`` (running -> queued) gives the work back now, not then."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    calls: list[str] = []

    def handler(job: Job) -> str:
        calls.append(job.id)
        if len(calls) == 1:
            job.wait_for("never")
        return "exited"

    with Worker(engine, {"running": handler}, **QUICK) as worker:
        _turn(worker)
        parked = engine.get("j1")
        assert parked.lease is None and parked.run_after is not None and parked.run_after > clock.now()
        released = engine.fire("j1", "release")
        assert released.state == "queued" and released.snapshot.run_after == clock.now()
        assert any_store.get("j1").run_after == clock.now()
        _turn(worker)  # claimed at once, started again
    assert calls == ["j1", "j1"] and engine.get("j1").state == "finalizing"


def test_a_message_does_not_wake_an_entity_that_is_not_parked(any_store: Store, clock: ManualClock) -> None:
    """A create due later (or a retry's backoff) is not a park: a message leaves its due time."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    later = engine.create("j1", run_after=timedelta(hours=1))
    assert engine.send("j1", "go", None, idempotency_key="k") is True
    assert any_store.get("j1").run_after == later.run_after
    assert engine.claim(1) == []
