"""Leases outside transitions (acquire, renew, release, renewal budget) and idempotency keys."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm import (
    Engine,
    IdempotencyKeyReused,
    JobLifecycle,
    LeaseLost,
    ManualClock,
    TransitionNotAllowed,
    new_owner_id,
)
from fsm.policy import Policy


def test_renew_extends_a_live_lease_without_moving_version_or_history(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    clock.advance(seconds=30)
    renewed = jobs.renew_lease(lease)
    assert renewed.token == lease.token and renewed.expires_at == clock.now() + jobs.policy.lease_ttl
    assert jobs.get("j1").version == 1 and len(jobs.history("j1")) == 1


def test_an_expired_lease_is_never_revived_by_renew(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    with pytest.raises(LeaseLost, match="expired"):
        jobs.renew_lease(lease)


def test_renewal_stops_at_the_state_budget(store: object, clock: ManualClock) -> None:
    policy = Policy(lease_ttl=timedelta(minutes=1), renewal_budget={"running": timedelta(minutes=10)})
    jobs = Engine(JobLifecycle, store, clock=clock, policy=policy)  # type: ignore[arg-type]
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    entered = jobs.get("j1").state_entered_at
    for _ in range(19):
        clock.advance(seconds=30)
        lease = jobs.renew_lease(lease)
        assert lease.expires_at <= entered + timedelta(minutes=10)
    clock.advance(seconds=30)  # 10 min after entering running: still fresh, but the budget is spent
    assert lease.is_fresh(clock.now())
    with pytest.raises(LeaseLost, match="budget"):
        jobs.renew_lease(lease)


def test_acquire_takes_a_free_or_expired_lease_and_bumps_the_token(jobs: Engine, clock: ManualClock) -> None:
    jobs.create("j1")
    first = jobs.fire("j1", "start").lease
    assert first is not None
    with pytest.raises(LeaseLost, match="held by worker-1"):
        jobs.acquire_lease("j1", owner="thief")
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    taken = jobs.acquire_lease("j1", owner="rescuer")
    assert taken.owner == "rescuer" and taken.token == first.token + 1
    with pytest.raises(LeaseLost):
        jobs.fire("j1", "exited", lease=first)
    assert jobs.fire("j1", "exited", lease=taken).state == "finalizing"


def test_release_drops_owner_and_keeps_the_token(jobs: Engine) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    snap = jobs.release_lease(lease)
    assert snap.lease is None and snap.lease_token == lease.token
    assert jobs.acquire_lease("j1").token == lease.token + 1


def test_acquire_on_a_final_entity_is_refused(jobs: Engine) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    jobs.fire("j1", "complete", lease=lease)
    with pytest.raises(TransitionNotAllowed, match="final"):
        jobs.acquire_lease("j1")


def test_owner_ids_are_unique_per_call_and_name_host_and_pid() -> None:
    import os

    ids = {new_owner_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(f":{os.getpid()}:" in i for i in ids)


def test_same_idempotency_key_returns_the_first_result_and_writes_nothing(jobs: Engine) -> None:
    jobs.create("j1")
    first = jobs.fire("j1", "start", idempotency_key="webhook-41")
    again = jobs.fire("j1", "start", idempotency_key="webhook-41")
    assert again.replayed and not first.replayed
    assert again.record == first.record and again.snapshot == first.snapshot
    assert len(jobs.history("j1")) == 1 and jobs.get("j1").version == 1


def test_an_idempotency_key_reused_for_another_event_is_refused(jobs: Engine) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start", idempotency_key="k").lease
    with pytest.raises(IdempotencyKeyReused) as info:
        jobs.fire("j1", "exited", lease=lease, idempotency_key="k")
    assert (info.value.recorded_event, info.value.event) == ("start", "exited")
    assert len(jobs.history("j1")) == 1


def test_idempotency_keys_are_per_entity(jobs: Engine) -> None:
    jobs.create("a")
    jobs.create("b")
    jobs.fire("a", "start", idempotency_key="k")
    assert not jobs.fire("b", "start", idempotency_key="k").replayed


def test_replay_after_the_entity_moved_on_returns_the_first_record(jobs: Engine) -> None:
    jobs.create("j1")
    first = jobs.fire("j1", "start", idempotency_key="start-1")
    assert first.lease is not None
    jobs.fire("j1", "exited", lease=first.lease)
    again = jobs.fire("j1", "start", idempotency_key="start-1")
    assert again.replayed and again.record == first.record and again.state == "finalizing"


def test_a_same_key_fire_committing_between_lookup_and_read_is_a_replay_not_a_refusal(
    store: object, clock: ManualClock
) -> None:
    """Two deliveries of one webhook race: the loser must get the winner's result."""
    from stores import MemoryStore

    assert isinstance(store, MemoryStore)
    winner = Engine(JobLifecycle, store, clock=clock, owner="w1")
    winner.create("j1")

    class Interleaved:
        """The other delivery commits right after our key lookup found nothing."""

        def __init__(self, inner: MemoryStore) -> None:
            self.inner = inner
            self.armed = True

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def find_transition(self, entity_id: str, key: str) -> object:
            found = self.inner.find_transition(entity_id, key)
            if self.armed:
                self.armed = False
                winner.fire(entity_id, "start", idempotency_key=key)
            return found

    loser = Engine(JobLifecycle, Interleaved(store), clock=clock, owner="w2")  # type: ignore[arg-type]
    result = loser.fire("j1", "start", idempotency_key="delivery-9")
    assert result.replayed and result.snapshot.lease_owner == "w1"
    assert len(store.history("j1")) == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"reason": 42}, {"actor": "bogus"}, {"data": ["x"]}, {"idempotency_key": 7}, {"idempotency_key": ""}],
)
def test_ill_typed_arguments_are_refused_before_anything_is_written(jobs: Engine, kwargs: dict[str, object]) -> None:
    from fsm import InvalidArgument

    jobs.create("j1")
    before = jobs.get("j1"), jobs.history("j1")
    with pytest.raises(InvalidArgument):
        jobs.fire("j1", "start", **kwargs)  # type: ignore[arg-type]
    assert (jobs.get("j1"), jobs.history("j1")) == before


def test_a_non_positive_ttl_is_refused(jobs: Engine) -> None:
    from fsm import InvalidArgument

    jobs.create("j1")
    with pytest.raises(InvalidArgument):
        jobs.acquire_lease("j1", ttl=timedelta(seconds=-1))
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    with pytest.raises(InvalidArgument):
        jobs.renew_lease(lease, ttl=timedelta(0))
    assert jobs.get("j1").lease == lease


def test_mutating_the_patch_after_fire_does_not_change_the_stored_history(store: object) -> None:
    from tests_support import Untyped

    engine = Engine(Untyped, store)  # type: ignore[arg-type]
    engine.create("u1")
    patch = {"steps": [{"name": "build"}]}
    engine.fire("u1", "start", data=patch)
    patch["steps"][0]["name"] = "changed"
    assert engine.get("u1").data == {"steps": [{"name": "build"}]}
    assert engine.history("u1")[-1].data == {"steps": [{"name": "build"}]}


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e.fire(123, "start"),
        lambda e: e.fire("j1", "start", lease="tok"),
        lambda e: e.fire("j1", "start", owner=5),
        lambda e: e.get(None),
        lambda e: e.create(7),
        lambda e: e.create("j2", concurrency_key=9),
        lambda e: e.create("j2", data=[1, 2]),
        lambda e: e.renew_lease("x"),
        lambda e: e.release_lease("x"),
        lambda e: e.acquire_lease("j1", owner=5),
    ],
)
def test_ill_typed_ids_leases_and_owners_are_invalid_arguments(jobs: Engine, call: object) -> None:
    from fsm import InvalidArgument

    jobs.create("j1")
    with pytest.raises(InvalidArgument):
        call(jobs)  # type: ignore[operator]
    assert jobs.get("j1").version == 0 and len(jobs.store.history("j1")) == 0


def test_data_that_is_not_json_is_refused_by_every_store(store: object) -> None:
    from tests_support import Untyped

    from fsm import InvalidData

    engine = Engine(Untyped, store)  # type: ignore[arg-type]
    with pytest.raises(InvalidData, match="not JSON"):
        engine.create("u1", data={"when": object()})
    engine.create("u1")
    with pytest.raises(InvalidData, match="not JSON"):
        engine.fire("u1", "start", data={"x": float("nan")})
    assert engine.get("u1").version == 0
