"""Every transition and guard of the Job lifecycle (DESIGN section 3, seeds/002)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import frozen

from fsm import Engine, EntityMovedOn, FsmError, GuardRejected, LeaseLost, ManualClock, TransitionNotAllowed
from fsm.records import Lease

REAPER = "reaper"


def refused(engine: Engine, entity_id: str, error: type[FsmError], event: str, **kwargs: object) -> FsmError:
    before = frozen(engine, entity_id)
    with pytest.raises(error) as info:
        engine.fire(entity_id, event, **kwargs)  # type: ignore[arg-type]
    assert frozen(engine, entity_id) == before
    return info.value


def started(engine: Engine, entity_id: str = "j1") -> Lease:
    engine.create(entity_id)
    lease = engine.fire(entity_id, "start").lease
    assert lease is not None
    return lease


def finalizing(engine: Engine, entity_id: str = "j1") -> Lease:
    lease = started(engine, entity_id)
    engine.fire(entity_id, "exited", lease=lease, data={"exit_code": 0})
    return lease


def test_start_acquires_the_lease_and_counts_an_attempt(jobs: Engine, clock: ManualClock) -> None:
    lease = started(jobs)
    snap = jobs.get("j1")
    assert snap.state == "running" and snap.attempt == 1
    assert lease.token == 1 and lease.owner == "worker-1" and lease.expires_at == clock.now() + jobs.policy.lease_ttl


def test_start_can_name_the_owner(jobs: Engine) -> None:
    jobs.create("j1")
    assert jobs.fire("j1", "start", owner="pod-7").snapshot.lease_owner == "pod-7"


def test_exited_needs_the_lease_and_records_the_exit_code(jobs: Engine) -> None:
    lease = started(jobs)
    refused(jobs, "j1", GuardRejected, "exited", data={"exit_code": 0})
    result = jobs.fire("j1", "exited", lease=lease, data={"exit_code": 3})
    assert result.state == "finalizing" and result.snapshot.data["exit_code"] == 3
    assert result.record.data == {"exit_code": 3}
    assert result.lease == lease._replace(expires_at=result.lease.expires_at)  # same holder and token


@pytest.mark.parametrize(("event", "final"), [("complete", "completed"), ("fail", "failed")])
def test_complete_and_fail_need_the_lease(jobs: Engine, event: str, final: str) -> None:
    lease = finalizing(jobs)
    refused(jobs, "j1", GuardRejected, event)
    refused(jobs, "j1", LeaseLost, event, lease=lease._replace(owner="someone-else"))
    assert jobs.fire("j1", event, lease=lease).state == final


def test_complete_is_refused_from_running(jobs: Engine) -> None:
    lease = started(jobs)
    refused(jobs, "j1", TransitionNotAllowed, "complete", lease=lease)


def test_expire_running_is_refused_while_the_lease_is_fresh(jobs: Engine, clock: ManualClock) -> None:
    started(jobs)
    clock.advance(jobs.policy.lease_ttl)  # expires_at == now: still fresh
    refused(jobs, "j1", GuardRejected, "expire", actor=REAPER)


def test_expire_running_requeues_while_attempts_remain_then_fails(jobs: Engine, clock: ManualClock) -> None:
    started(jobs)
    for attempt in range(1, jobs.policy.max_attempts):
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
        result = jobs.fire("j1", "expire", actor=REAPER)
        assert result.state == "queued" and result.lease is None and result.record.reason == "expired"
        again = jobs.fire("j1", "start")
        assert again.snapshot.attempt == attempt + 1 and again.lease is not None
        assert again.lease.token == attempt + 1
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    assert jobs.fire("j1", "expire", actor=REAPER).state == "failed"


def test_reclaim_is_refused_while_the_finalizer_lease_is_fresh(jobs: Engine, clock: ManualClock) -> None:
    finalizing(jobs)
    clock.advance(seconds=60)
    refused(jobs, "j1", GuardRejected, "reclaim", actor=REAPER)


def test_reclaim_fences_a_stale_finalizer_and_a_worker_claims_it_to_resume(jobs: Engine, clock: ManualClock) -> None:
    old = finalizing(jobs)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    result = jobs.fire("j1", "reclaim", actor=REAPER, owner="reaper-9")
    assert result.state == "finalizing" and result.record.reason == "reclaimed"
    assert result.lease is None, "the reaper never becomes the owner"
    assert result.snapshot.lease_token == old.token + 1 and result.snapshot.reclaims == 1
    refused(jobs, "j1", EntityMovedOn, "complete", lease=old)  # the old finalizer is fenced off
    (claimed,) = jobs.claim(owner="worker-2")
    new = claimed.lease
    assert new is not None and new.owner == "worker-2" and new.token == old.token + 2
    refused(jobs, "j1", LeaseLost, "complete", lease=old)
    assert jobs.fire("j1", "complete", lease=new).state == "completed"


def test_expire_finalizing_only_once_reclaims_are_spent_by_holder_deaths(jobs: Engine, clock: ManualClock) -> None:
    finalizing(jobs)
    for i in range(jobs.policy.max_reclaims):
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
        refused(jobs, "j1", GuardRejected, "expire", actor=REAPER)  # reclaims_exhausted does not hold
        jobs.fire("j1", "reclaim", actor=REAPER)
        (rescued,) = jobs.claim(owner=f"rescuer-{i}")  # a new holder takes it over, then dies too
        assert rescued.lease_owner == f"rescuer-{i}"
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    refused(jobs, "j1", GuardRejected, "reclaim", actor=REAPER)
    result = jobs.fire("j1", "expire", actor=REAPER)
    assert result.state == "failed" and result.record.source == "finalizing" and result.record.reason == "expired"


def test_a_reclaimed_finalizer_nobody_claims_waits_and_only_the_backstop_fails_it(
    jobs: Engine, clock: ManualClock
) -> None:
    finalizing(jobs)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "reclaim", actor=REAPER)
    waited = timedelta()
    while waited + jobs.policy.lease_ttl < jobs.policy.max_wait:  # every claim window passes unclaimed
        clock.advance(jobs.policy.lease_ttl)
        waited += jobs.policy.lease_ttl
        refused(jobs, "j1", GuardRejected, "reclaim", actor=REAPER)  # waiting is not dying
        refused(jobs, "j1", GuardRejected, "expire", actor=REAPER)
    assert jobs.get("j1").reclaims == 1
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))  # past max_wait since the reclaim
    result = jobs.fire("j1", "expire", actor=REAPER)
    assert result.state == "failed" and result.record.reason == "unclaimed"


def test_expire_finalizing_is_refused_while_fresh_even_with_reclaims_spent(jobs: Engine, clock: ManualClock) -> None:
    finalizing(jobs)
    for i in range(jobs.policy.max_reclaims):
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
        jobs.fire("j1", "reclaim", actor=REAPER)
        jobs.claim(owner=f"rescuer-{i}")
    refused(jobs, "j1", GuardRejected, "expire", actor=REAPER)  # the last reclaim's lease is fresh
