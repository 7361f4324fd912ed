"""Every transition and guard of the Pipeline lifecycle (DESIGN section 3, seeds/000).

Each refused case also checks that the entity and its history are unchanged (I10).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import frozen

from fsm import (
    ConditionFailed,
    Engine,
    FsmError,
    GuardRejected,
    LeaseLost,
    ManualClock,
    TransitionNotAllowed,
    UnknownEntity,
    UnknownEvent,
)
from fsm.records import Lease

REAPER = "reaper"


def refused(engine: Engine, entity_id: str, error: type[FsmError], event: str, **kwargs: object) -> FsmError:
    before = frozen(engine, entity_id)
    with pytest.raises(error) as info:
        engine.fire(entity_id, event, **kwargs)  # type: ignore[arg-type]
    assert frozen(engine, entity_id) == before, "a refused transition changed the entity or its history"
    return info.value


def running(engine: Engine, entity_id: str = "p1", key: str | None = None) -> None:
    engine.create(entity_id, concurrency_key=key, data={"steps": [{"name": "build"}]})
    engine.fire(entity_id, "start")


def finalizing(engine: Engine, entity_id: str = "p1") -> Lease:
    running(engine, entity_id)
    lease = engine.fire(entity_id, "finish").lease
    assert lease is not None
    return lease


def test_start_moves_queued_to_running(pipelines: Engine) -> None:
    pipelines.create("p1")
    result = pipelines.fire("p1", "start")
    assert result.state == "running" and result.snapshot.version == 1
    assert pipelines.configuration("p1") == ("active", "running")
    assert result.record.actor == "worker" and result.record.source == "queued"


def test_start_is_refused_from_running(pipelines: Engine) -> None:
    running(pipelines)
    refused(pipelines, "p1", TransitionNotAllowed, "start")


def test_finish_takes_the_finalizer_lease(pipelines: Engine, clock: ManualClock) -> None:
    running(pipelines)
    result = pipelines.fire("p1", "finish")
    assert result.state == "finalizing"
    lease = result.lease
    assert lease is not None and lease.owner == "worker-1" and lease.token == 1
    assert lease.expires_at == clock.now() + pipelines.policy.lease_ttl


def test_succeed_with_the_lease_completes_and_drops_the_lease(pipelines: Engine) -> None:
    lease = finalizing(pipelines)
    result = pipelines.fire("p1", "succeed", lease=lease)
    assert result.state == "completed" and result.lease is None


def test_succeed_without_the_lease_is_refused(pipelines: Engine) -> None:
    finalizing(pipelines)
    err = refused(pipelines, "p1", GuardRejected, "succeed")
    assert isinstance(err, GuardRejected) and err.failed == {"finalizing->completed": ["holds_lease"]}


def test_succeed_with_an_old_token_is_refused_as_lease_lost(pipelines: Engine) -> None:
    lease = finalizing(pipelines)
    err = refused(pipelines, "p1", LeaseLost, "succeed", lease=lease._replace(token=0))
    assert isinstance(err, LeaseLost) and err.expected_token == 0 and err.found_token == 1


def test_succeed_is_refused_from_running(pipelines: Engine) -> None:
    running(pipelines)
    refused(pipelines, "p1", TransitionNotAllowed, "succeed")


def test_fail_from_finalizing_needs_the_lease(pipelines: Engine) -> None:
    lease = finalizing(pipelines)
    refused(pipelines, "p1", GuardRejected, "fail")
    assert pipelines.fire("p1", "fail", lease=lease, reason="tests failed").record.reason == "tests failed"


def test_fail_from_running_is_a_worker_webhook(pipelines: Engine) -> None:
    running(pipelines)
    result = pipelines.fire("p1", "fail")
    assert result.state == "failed" and result.record.actor == "worker"


def test_expire_is_a_reaper_transition_a_worker_cannot_fire(pipelines: Engine, clock: ManualClock) -> None:
    running(pipelines)
    clock.advance(timedelta(hours=2))
    err = refused(pipelines, "p1", TransitionNotAllowed, "expire")
    assert "reaper transition" in str(err)


def test_expire_from_running_is_refused_before_stale_after(pipelines: Engine, clock: ManualClock) -> None:
    running(pipelines)
    clock.advance(timedelta(minutes=59))
    refused(pipelines, "p1", GuardRejected, "expire", actor=REAPER)


def test_expire_from_running_after_stale_after_fails_it_with_reason_expired(
    pipelines: Engine, clock: ManualClock
) -> None:
    running(pipelines)
    clock.advance(timedelta(minutes=61))
    result = pipelines.fire("p1", "expire", actor=REAPER)
    assert result.state == "failed" and result.record.reason == "expired" and result.record.actor == "reaper"
    assert result.snapshot.data["steps"] == [{"name": "build", "status": "queued"}]


def test_expire_from_finalizing_is_refused_while_the_lease_is_fresh(pipelines: Engine, clock: ManualClock) -> None:
    finalizing(pipelines)
    clock.advance(timedelta(hours=3))  # far past stale_after, but the lease governs finalizing
    lease = pipelines.get("p1").lease
    assert lease is not None and not lease.is_fresh(clock.now())
    # renew-free: the lease expired, so now it is stale; check the fresh case on a new one
    finalizing(pipelines, "p2")
    clock.advance(timedelta(minutes=1))
    refused(pipelines, "p2", GuardRejected, "expire", actor=REAPER)


def test_expire_from_finalizing_once_the_lease_is_stale(pipelines: Engine, clock: ManualClock) -> None:
    finalizing(pipelines)
    clock.advance(pipelines.policy.lease_ttl + timedelta(seconds=1))
    result = pipelines.fire("p1", "expire", actor=REAPER)
    assert result.state == "failed" and result.record.source == "finalizing"


def test_supersede_is_refused_without_a_newer_running_sibling(pipelines: Engine, clock: ManualClock) -> None:
    running(pipelines, "old", key="main")
    running(pipelines, "other-branch", key="feature")
    refused(pipelines, "old", GuardRejected, "supersede", actor=REAPER)


def test_supersede_fails_the_older_of_two_running_with_reason_duplicate(pipelines: Engine, clock: ManualClock) -> None:
    running(pipelines, "old", key="main")
    clock.advance(seconds=1)
    running(pipelines, "new", key="main")
    assert pipelines.fire("old", "supersede", actor=REAPER).record.reason == "duplicate"
    refused(pipelines, "new", GuardRejected, "supersede", actor=REAPER)
    assert pipelines.get("new").state == "running"


def test_supersede_is_rechecked_at_commit(pipelines: Engine, clock: ManualClock) -> None:
    """The newer sibling finishes between the guard's read and the write: the store refuses."""
    running(pipelines, "old", key="main")
    clock.advance(seconds=1)
    running(pipelines, "new", key="main")
    from fsm.records import NewerSibling, TransitionWrite

    snap = pipelines.get("old")
    pipelines.fire("new", "fail")  # the newer one leaves running
    write = TransitionWrite(
        entity_id="old",
        event="supersede",
        source="running",
        target="failed",
        actor="reaper",
        expect_version=snap.version,
        require=(NewerSibling(),),
    )
    with pytest.raises(ConditionFailed, match="superseded"):
        pipelines.store.apply(write)


@pytest.mark.parametrize("final", ["completed", "failed"])
@pytest.mark.parametrize("event", ["start", "finish", "succeed", "fail", "expire", "supersede"])
def test_final_states_are_absorbing(pipelines: Engine, clock: ManualClock, final: str, event: str) -> None:
    lease = finalizing(pipelines)
    pipelines.fire("p1", "succeed" if final == "completed" else "fail", lease=lease)
    clock.advance(timedelta(days=1))
    actor = REAPER if event in ("expire", "supersede") else "worker"
    err = refused(pipelines, "p1", TransitionNotAllowed, event, actor=actor, lease=lease)
    assert "is final" in str(err)


def test_unknown_event_is_a_typed_error_listing_the_events(pipelines: Engine) -> None:
    pipelines.create("p1")
    err = refused(pipelines, "p1", UnknownEvent, "launch")
    assert isinstance(err, UnknownEvent) and "start" in err.known


def test_unknown_entity_is_a_typed_error(pipelines: Engine) -> None:
    with pytest.raises(UnknownEntity, match="nope"):
        pipelines.fire("nope", "start")
