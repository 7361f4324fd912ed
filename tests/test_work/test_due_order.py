"""Claim serves due time order on every store: a job requeued after its holder died keeps
its place (its due time stays when it first became claimable), a delayed job is not
claimed before its ``run_after``, and resumed work still comes first."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm import Engine, InvalidArgument, JobLifecycle, ManualClock
from fsm.reaping import Reaper
from stores import Store


def test_a_job_requeued_after_its_holders_death_is_claimed_before_jobs_created_after_it(
    any_store: Store, clock: ManualClock
) -> None:
    dead = Engine(JobLifecycle, any_store, clock=clock, owner="dead-worker")
    dead.create("first")
    (taken,) = dead.claim()
    assert taken.id == "first"
    for i in range(5):
        clock.advance(seconds=1)
        dead.create(f"later-{i}")
    clock.advance(dead.policy.lease_ttl + timedelta(seconds=1))  # its holder died
    assert Reaper(any_store, [JobLifecycle], clock=clock).run_once().moved == {"job.expire": 1}
    requeued = any_store.get("first")
    assert (requeued.state, requeued.attempt) == ("queued", 1)
    assert requeued.run_after == requeued.created_at  # the requeue kept its place in line
    rescuer = Engine(JobLifecycle, any_store, clock=clock, owner="rescuer")
    assert [s.id for s in rescuer.claim(3)] == ["first", "later-0", "later-1"]


def test_a_delayed_job_is_not_claimed_before_its_run_after(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    start = clock.now()
    jobs.create("in-a-minute", run_after=timedelta(minutes=1))
    jobs.create("at-noon", run_after=start + timedelta(minutes=2))
    jobs.create("now")
    assert any_store.get("in-a-minute").run_after == start + timedelta(minutes=1)
    assert [s.id for s in jobs.claim(5)] == ["now"]
    clock.advance(timedelta(minutes=1) - timedelta(microseconds=1))
    assert jobs.claim(5) == []
    clock.advance(timedelta(microseconds=1))
    assert [s.id for s in jobs.claim(5)] == ["in-a-minute"]
    clock.advance(timedelta(minutes=1))
    assert [s.id for s in jobs.claim(5)] == ["at-noon"]


def test_resumed_work_comes_before_due_starts(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock, owner="first")
    jobs.create("fin")
    (snap,) = jobs.claim()
    assert snap.lease is not None
    jobs.fire("fin", "exited", lease=snap.lease)
    for i in range(3):
        jobs.create(f"q{i}")
    assert not jobs.waiting_for_worker("fin") and jobs.waiting_for_worker("q0")
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    assert Reaper(any_store, [JobLifecycle], clock=clock).run_once().moved == {"job.reclaim": 1}
    assert jobs.waiting_for_worker("fin")  # reclaimed, nobody claimed it yet: the inspector flags it
    assert [s.id for s in Engine(JobLifecycle, any_store, clock=clock, owner="second").claim(2)] == ["fin", "q0"]
    assert not jobs.waiting_for_worker("fin")


def test_a_due_time_must_be_an_aware_time_or_a_delay(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for bad in (clock.now().replace(tzinfo=None), -timedelta(seconds=1), 5, "soon"):
        with pytest.raises(InvalidArgument, match="run_after"):
            jobs.create("x", run_after=bad)  # type: ignore[arg-type]
    assert jobs.counts()["queued"] == 0
