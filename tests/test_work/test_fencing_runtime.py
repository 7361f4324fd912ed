"""Fencing with no exception, on every store: a fenced holder's ``run`` is refused whether
or not its key is recorded, progress is written at once under the lease, and history says
who held the lease beside its token."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from fsm import Engine, JobLifecycle, LeaseLost, ManualClock
from fsm.reaping import Reaper
from fsm.work import Job, Worker
from stores import Store


def fenced_holder(store: Store, clock: ManualClock) -> tuple[Engine, Engine, object]:
    """A holder that recorded one gate, was reclaimed while it paused, and a new owner that
    took over and recorded another; returns (old engine, new engine, old lease)."""
    old = Engine(JobLifecycle, store, clock=clock, owner="paused-worker")
    old.create("j1")
    (snap,) = old.claim()
    lease = snap.lease
    assert lease is not None
    old.fire("j1", "exited", lease=lease)
    old.run("j1", "security", lambda key: {"by": "old"}, lease)
    clock.advance(old.policy.lease_ttl + timedelta(seconds=1))
    assert Reaper(store, [JobLifecycle], clock=clock).run_once().moved == {"job.reclaim": 1}
    new = Engine(JobLifecycle, store, clock=clock, owner="rescuer")
    (taken,) = new.claim()
    assert taken.lease is not None
    new.run("j1", "merge", lambda key: {"by": "new"}, taken.lease)
    return old, new, lease


@pytest.mark.parametrize("key", ["security", "merge", "coverage"])
def test_a_fenced_holder_running_any_key_is_refused_recorded_or_not(
    any_store: Store, clock: ManualClock, key: str
) -> None:
    old, new, lease = fenced_holder(any_store, clock)
    before = [e._replace(recorded_at=None) for e in new.effects("j1")]
    calls: list[str] = []
    with pytest.raises(LeaseLost):
        old.run("j1", key, lambda k: calls.append(k) or {"by": "old again"}, lease)  # type: ignore[arg-type]
    assert calls == []  # nothing ran
    assert [e._replace(recorded_at=None) for e in new.effects("j1")] == before  # nothing recorded


def test_progress_is_written_at_once_under_the_lease_not_with_the_next_renewal(
    any_store: Store, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, any_store)
    engine.create("j1")
    reported, finish = threading.Event(), threading.Event()

    def agent(job: Job) -> str:
        job.progress({"phase": "cloning", "done": 1})
        reported.set()
        finish.wait(30)
        return "exited"

    # renewals a day apart: only the handler's own write can have recorded the progress
    worker = Worker(engine, {"running": agent}, keeper_period=timedelta(seconds=100), concurrency=1)
    worker.run_once()
    assert reported.wait(30)
    reader = Engine(JobLifecycle, any_store, owner="dashboard")
    assert reader.progress("j1") == {"phase": "cloning", "done": 1}  # a crash now would keep it
    finish.set()
    worker.stop()


def test_a_fenced_holders_progress_is_refused(any_store: Store, clock: ManualClock) -> None:
    old, new, lease = fenced_holder(any_store, clock)
    with pytest.raises(LeaseLost):
        old.record_progress(lease, {"phase": "late"})  # type: ignore[arg-type]
    assert new.progress("j1") is None


def test_history_records_the_lease_owner_beside_the_token(any_store: Store, clock: ManualClock) -> None:
    old, new, _ = fenced_holder(any_store, clock)
    (lease,) = [s.lease for s in [new.get("j1")] if s.lease is not None]
    new.fire("j1", "complete", lease=lease)
    rows = [(h.event, h.actor, h.lease_token, h.owner) for h in new.history("j1")]
    assert rows == [
        ("start", "worker", 1, "paused-worker"),  # the claim started it for its worker
        ("exited", "worker", 1, "paused-worker"),
        ("reclaim", "reaper", 2, None),  # the reaper fences; it owns nothing
        ("complete", "worker", 3, "rescuer"),
    ]
