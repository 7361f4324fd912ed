"""The invariants the engine owns: I1, I3, I5, I6 (DESIGN section 10)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from fsm import (
    ConditionFailed,
    Engine,
    EntityMovedOn,
    GuardRejected,
    JobLifecycle,
    LeaseLost,
    ManualClock,
    StaleVersion,
    TransitionNotAllowed,
)
from fsm.records import Actor, LeaseStale, TransitionWrite
from stores import MemoryStore

REAPER = Actor.REAPER


# -- I1: expire / reclaim never fire from finalizing while the lease is fresh ----------------


@pytest.mark.parametrize("event", ["expire", "reclaim"])
def test_I1_refused_from_finalizing_while_the_lease_is_fresh_allowed_once_stale(
    jobs: Engine, clock: ManualClock, event: str
) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    if event == "expire":  # expire needs the reclaims spent: give the policy none
        jobs = Engine(
            JobLifecycle, jobs.store, clock=clock, policy=JobLifecycle.policy.model_copy(update={"max_reclaims": 0})
        )
    ttl = jobs.policy.lease_ttl
    # keep renewing far beyond any fixed grace (seeds/002 used 300 s)
    for _ in range(20):
        clock.advance(ttl / 2)
        with pytest.raises(GuardRejected):
            jobs.fire("j1", event, actor=REAPER)
        lease = jobs.renew_lease(lease)
    assert jobs.get("j1").state == "finalizing"
    clock.advance(ttl + timedelta(seconds=1))
    assert jobs.fire("j1", event, actor=REAPER).record.event == event


def test_I1_a_renewal_between_the_reapers_read_and_write_wins(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    clock.advance(jobs.policy.lease_ttl)  # at the edge: still fresh, renewable
    read = jobs.get("j1")
    jobs.renew_lease(lease)  # lands between the reaper's read and its write
    clock.advance(seconds=1)  # the reaper's read said: expired by now
    assert read.lease_is_stale(clock.now(), jobs.policy.stale_after)
    write = TransitionWrite(
        entity_id="j1",
        event="reclaim",
        source="finalizing",
        target="finalizing",
        actor="reaper",
        expect_version=read.version,
        require=(LeaseStale(jobs.policy.stale_after),),
    )
    with pytest.raises(ConditionFailed, match="lease_stale"):
        jobs.store.apply(write)
    assert jobs.get("j1").lease_token == lease.token


# -- I3: a stale actor's write is refused ---------------------------------------------------


def test_I3_a_write_with_an_old_version_is_refused_with_the_versions(jobs: Engine) -> None:
    jobs.create("j1")
    snap = jobs.get("j1")
    jobs.fire("j1", "start")
    write = TransitionWrite(
        entity_id="j1", event="start", source="queued", target="running", actor="worker", expect_version=snap.version
    )
    with pytest.raises(StaleVersion) as info:
        jobs.store.apply(write)
    assert (info.value.expected, info.value.found) == (0, 1)
    assert len(jobs.history("j1")) == 1


def test_I3_a_write_with_an_old_token_is_refused_after_a_takeover(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    old = jobs.fire("j1", "start").lease
    assert old is not None
    jobs.fire("j1", "exited", lease=old)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "reclaim", actor=REAPER)  # fences the old holder: token 2, lease free
    with pytest.raises(EntityMovedOn) as moved:
        jobs.fire("j1", "complete", lease=old)
    assert (moved.value.expected_token, moved.value.found_token) == (1, 2)
    jobs.claim(owner="other")  # token 3
    with pytest.raises(LeaseLost) as info:
        jobs.fire("j1", "complete", lease=old)
    assert (info.value.expected_token, info.value.found_token) == (1, 3)
    with pytest.raises(LeaseLost):
        jobs.renew_lease(old)
    assert jobs.get("j1").state == "finalizing" and jobs.history("j1")[-1].event == "reclaim"


def test_I3_ABA_running_requeued_and_running_again_does_not_let_the_old_writer_through(
    jobs: Engine, clock: ManualClock
) -> None:
    jobs.create("j1")
    first = jobs.fire("j1", "start")
    stale_view = first.snapshot  # the old worker's view: running, version 1, token 1
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "expire", actor=REAPER)  # running -> queued
    second = jobs.fire("j1", "start", owner="worker-2")  # running again
    assert second.state == stale_view.state == "running"
    # same state, but the version moved: a CAS on the state alone would let this through
    write = TransitionWrite(
        entity_id="j1",
        event="exited",
        source="running",
        target="finalizing",
        actor="worker",
        expect_version=stale_view.version,
        expect_owner="worker-1",
        expect_token=1,
    )
    with pytest.raises(StaleVersion):
        jobs.store.apply(write)
    # and through the engine, the old lease is fenced by its token
    assert first.lease is not None
    with pytest.raises(LeaseLost):
        jobs.fire("j1", "exited", lease=first.lease)
    assert jobs.get("j1").lease_owner == "worker-2"


# -- I5 and I6: final states absorb, history is gap-free ------------------------------------


def test_I5_final_states_absorb_and_have_one_entering_row(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    jobs.fire("j1", "complete", lease=lease)
    clock.advance(timedelta(days=1))
    for event, actor in [("fail", Actor.WORKER), ("expire", REAPER), ("reclaim", REAPER), ("start", Actor.WORKER)]:
        with pytest.raises(TransitionNotAllowed):
            jobs.fire("j1", event, actor=actor, lease=lease)
    entering_final = [r for r in jobs.history("j1") if r.target in JobLifecycle.table.finals]
    assert len(entering_final) == 1


def test_I6_history_seq_runs_1_to_version_without_gaps(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    for _ in range(2):
        jobs.fire("j1", "start")
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
        jobs.fire("j1", "expire", actor=REAPER)
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "reclaim", actor=REAPER)
    new = jobs.claim()[0].lease  # taking a reclaimed lease is not a transition
    assert new is not None
    jobs.renew_lease(new)  # renewals never touch version or history
    jobs.fire("j1", "complete", lease=new)
    history = jobs.history("j1")
    assert [r.seq for r in history] == list(range(1, jobs.get("j1").version + 1))
    assert [r.event for r in history] == [
        "start",
        "expire",
        "start",
        "expire",
        "start",
        "exited",
        "reclaim",
        "complete",
    ]
    for prev, nxt in itertools.pairwise(history):
        assert prev.target == nxt.source


def test_soft_deleted_entities_are_not_moved(store: MemoryStore, jobs: Engine, clock: ManualClock) -> None:
    from fsm import UnknownEntity

    jobs.create("j1")
    jobs.fire("j1", "start")
    store.soft_delete("j1")
    clock.advance(timedelta(hours=1))
    with pytest.raises(UnknownEntity):
        jobs.fire("j1", "expire", actor=REAPER)
    assert store.get("j1", include_deleted=True).state == "running"
