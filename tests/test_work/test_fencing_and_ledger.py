"""The engine's face of durable work: one fencing error, the ledger's results and signals,
and a reclaimed entity that nobody claims staying bounded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import signals
from fsm import (
    EffectFailed,
    Engine,
    EntityMovedOn,
    Fenced,
    InvalidArgument,
    JobLifecycle,
    LeaseLost,
    ManualClock,
)
from fsm.reaping import Reaper
from fsm.records import Lease
from stores import MemoryStore


def finalizing(engine: Engine, entity_id: str = "j1") -> Lease:
    engine.create(entity_id)
    (snap,) = engine.claim()
    assert snap.lease is not None
    engine.fire(entity_id, "exited", lease=snap.lease)
    return snap.lease


def take_over(engine: Engine, clock: ManualClock, owner: str = "worker-2") -> Lease:
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
    engine.fire("j1", "reclaim", actor="reaper")
    (snap,) = engine.claim(owner=owner)
    assert snap.lease is not None
    return snap.lease


def test_a_same_key_retry_from_a_fenced_holder_raises_instead_of_replaying(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    (snap,) = jobs.claim()
    old = snap.lease
    assert old is not None
    jobs.fire("j1", "exited", lease=old, idempotency_key="exit-1")
    new = take_over(jobs, clock)
    # the first call's answer was lost on the wire; the fenced holder retries it
    with pytest.raises(Fenced):
        jobs.fire("j1", "exited", lease=old, idempotency_key="exit-1")
    jobs.fire("j1", "complete", lease=new, idempotency_key="done")
    with pytest.raises(Fenced):  # ... and it is not told that the new owner's completion was its own
        jobs.fire("j1", "complete", lease=old, idempotency_key="done")
    assert jobs.fire("j1", "complete", lease=new, idempotency_key="done").replayed


def test_the_holder_that_finished_an_entity_itself_is_told_it_is_final_not_fenced(
    jobs: Engine, clock: ManualClock
) -> None:
    lease = finalizing(jobs)
    jobs.fire("j1", "complete", lease=lease)
    from fsm import TransitionNotAllowed

    with pytest.raises(TransitionNotAllowed, match="final"):
        jobs.fire("j1", "fail", lease=lease)


def test_a_holder_whose_entity_the_reaper_expired_gets_entity_moved_on(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    (snap,) = jobs.claim()
    assert snap.lease is not None
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "expire", actor="reaper")  # running -> queued: attempts remain
    with pytest.raises(EntityMovedOn) as moved:
        jobs.fire("j1", "exited", lease=snap.lease)
    assert moved.value.state == "queued" and isinstance(moved.value, Fenced)


def test_a_fenced_holders_late_effect_raises_and_is_neither_recorded_nor_signalled(
    jobs: Engine, clock: ManualClock
) -> None:
    old = finalizing(jobs)
    recorded: list[Any] = []
    signals.effect_recorded.connect(lambda sender, payload: recorded.append(payload), weak=False)
    try:

        def deploy(key: str) -> str:
            take_over(jobs, clock)  # the holder is fenced while its deploy runs
            return "deployed by the old holder"

        with pytest.raises(LeaseLost):
            jobs.run("j1", "deploy", deploy, old)
    finally:
        signals.effect_recorded.receivers.clear()
    assert jobs.effects("j1") == [] and recorded == []


def test_effect_recorded_is_sent_after_the_commit_with_the_result(jobs: Engine) -> None:
    lease = finalizing(jobs)
    seen: list[Any] = []

    def receiver(sender: str, payload: Any) -> None:
        seen.append((payload.key, payload.result, jobs.store.effect("j1", payload.key) is not None))

    signals.effect_recorded.connect(receiver, weak=False)
    try:
        jobs.run("j1", "security", lambda key: {"status": "passed"}, lease)
        jobs.run("j1", "security", lambda key: {"status": "other"}, lease)  # a replay sends nothing
    finally:
        signals.effect_recorded.receivers.clear()
    assert seen == [("security", {"status": "passed"}, True)]


class Gate(BaseModel):
    status: str
    findings: int


def test_a_named_model_is_stored_as_json_and_validated_on_replay(jobs: Engine) -> None:
    lease = finalizing(jobs)
    first = jobs.run("j1", "coverage", lambda key: Gate(status="passed", findings=0), lease, model=Gate)
    again = jobs.run("j1", "coverage", lambda key: pytest.fail("replayed"), lease, model=Gate)
    assert first == again == Gate(status="passed", findings=0)
    assert jobs.effects("j1")[0].result == {"status": "passed", "findings": 0}
    with pytest.raises(InvalidArgument):
        jobs.run("j1", "image", lambda key: {"not": "a Gate"}, lease, model=Gate)


def test_a_failed_effect_that_must_not_be_retried_raises_effect_failed_for_the_next_owner(
    jobs: Engine, clock: ManualClock
) -> None:
    old = finalizing(jobs)

    def merge_gate(key: str) -> None:
        raise ValueError("conflict in main")

    with pytest.raises(ValueError, match="conflict"):
        jobs.run("j1", "merge-gate", merge_gate, old, retry_failed=False)
    new = take_over(jobs, clock)
    with pytest.raises(EffectFailed) as failed:
        jobs.run("j1", "merge-gate", lambda key: pytest.fail("re-run"), new, retry_failed=False)
    assert failed.value.error == {"error": {"type": "ValueError", "message": "conflict in main"}}


def test_a_reclaimed_entity_nobody_claims_waits_without_spending_reclaims_until_the_backstop(
    store: MemoryStore, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, store, clock=clock)
    finalizing(engine)
    reaper = Reaper(store, [JobLifecycle], clock=clock)
    moves = []
    waited = timedelta()
    while engine.get("j1").state != "failed" and waited < 2 * engine.policy.max_wait:
        step = engine.policy.lease_ttl + timedelta(seconds=1)
        clock.advance(step)  # nobody claims in time: every worker is busy
        waited += step
        moves.extend(sorted(reaper.run_once().moved))
    assert moves == ["job.reclaim", "job.expire"]  # one death, one reclaim; then only the backstop
    assert engine.get("j1").reclaims == 1
    assert engine.history("j1")[-1].reason == "unclaimed"
    assert waited > engine.policy.max_wait
