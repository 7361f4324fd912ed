"""The store contract for the lease renewal log: ``renewals`` and what writes it.

Run against every adapter and face (memory, SQLite, PostgreSQL; sync and async) through
``any_store``, like the rest of the contract suite.  The log is what the inspector's
timeline shows of a lease between transitions.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import InvalidArgument, LeaseLost, ManualClock, StaleVersion, UnknownEntity
from fsm.records import (
    EFFECT_PROGRESS,
    PROGRESS_KEY,
    RENEWALS_KEPT,
    RENEWALS_KEY,
    ClaimRequest,
    ClaimStart,
    LeaseChange,
    LeaseRenewal,
    NewEntity,
    Snapshot,
    TransitionWrite,
)
from stores import Store

TTL = timedelta(minutes=2)


def new(store: Store, entity_id: str = "e1", state: str = "queued") -> Snapshot:
    return store.create(NewEntity(id=entity_id, kind="job", state=state))


def started(store: Store, entity_id: str = "e1", owner: str = "w1") -> Snapshot:
    """Running under ``owner``'s lease, taken by the start transition (token 1)."""
    new(store, entity_id)
    write = TransitionWrite(
        entity_id, "start", "queued", "running", "worker", 0,
        lease_change=LeaseChange.ACQUIRE, new_owner=owner, lease_ttl=TTL,
    )  # fmt: skip
    return store.apply(write)[0]


def frozen(store: Store, entity_id: str = "e1") -> object:
    return store.get(entity_id), store.history(entity_id), store.effects(entity_id), store.renewals(entity_id)


def test_each_renewal_is_logged_with_its_time_expiry_owner_and_token(any_store: Store, clock: ManualClock) -> None:
    started(any_store)
    assert any_store.renewals("e1") == []  # the start transition's lease is in history, not here
    logged = []
    for _ in range(3):
        clock.advance(seconds=40)
        renewed = any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
        logged.append(LeaseRenewal(clock.now(), clock.now() + TTL, "w1", 1))
        assert renewed.lease_expires_at == clock.now() + TTL
    assert any_store.renewals("e1") == logged
    assert [h.seq for h in any_store.history("e1")] == [1]  # a renewal is not a transition
    assert any_store.get("e1").version == 1


def test_a_lease_taken_outside_a_transition_is_logged_as_acquired(any_store: Store, clock: ManualClock) -> None:
    new(any_store)
    any_store.acquire_lease("e1", owner="w1", ttl=TTL, budget=None, expect_version=0)
    clock.advance(seconds=10)
    any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    start = clock.now() - timedelta(seconds=10)
    assert any_store.renewals("e1") == [
        LeaseRenewal(start, start + TTL, "w1", 1, acquired=True),
        LeaseRenewal(clock.now(), clock.now() + TTL, "w1", 1),
    ]


def test_a_claim_that_resumes_an_entity_logs_its_new_lease(any_store: Store, clock: ManualClock) -> None:
    new(any_store, "f1", state="finalizing")
    start = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)
    request = ClaimRequest(kind="job", owner="w2", limit=5, ttl=TTL, starts=(start,), resumes=("finalizing",))
    (claimed,) = any_store.claim(request)
    assert any_store.renewals("f1") == [LeaseRenewal(clock.now(), clock.now() + TTL, "w2", claimed.lease_token, True)]


def test_the_log_keeps_only_the_newest_renewals(any_store: Store, clock: ManualClock) -> None:
    started(any_store)
    times = []
    for _ in range(RENEWALS_KEPT + 7):
        clock.advance(seconds=5)
        any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
        times.append(clock.now())
    log = any_store.renewals("e1")
    assert [r.at for r in log] == times[-RENEWALS_KEPT:]
    row = any_store.effect("e1", RENEWALS_KEY)
    assert row is not None and row.attempts == RENEWALS_KEPT + 7  # how many were ever logged


def test_a_refused_renewal_or_acquire_logs_nothing(any_store: Store, clock: ManualClock) -> None:
    started(any_store)
    clock.advance(seconds=30)
    any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    before = frozen(any_store)
    with pytest.raises(LeaseLost):
        any_store.renew_lease("e1", owner="w2", token=1, ttl=TTL, budget=None)
    with pytest.raises(LeaseLost):
        any_store.renew_lease("e1", owner="w1", token=7, ttl=TTL, budget=None)
    with pytest.raises(LeaseLost, match="budget"):
        any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=timedelta(seconds=10))
    with pytest.raises(LeaseLost):
        any_store.acquire_lease("e1", owner="w2", ttl=TTL, budget=None, expect_version=1)  # a live lease
    with pytest.raises(StaleVersion):
        any_store.acquire_lease("e1", owner="w2", ttl=TTL, budget=None, expect_version=0)
    clock.advance(TTL + timedelta(seconds=1))
    with pytest.raises(LeaseLost, match="expired"):
        any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    assert frozen(any_store) == before


def test_the_log_is_a_reserved_row_no_effect_can_write_or_list(any_store: Store, clock: ManualClock) -> None:
    started(any_store)
    any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    any_store.record_effect("e1", PROGRESS_KEY, owner="w1", token=1, status=EFFECT_PROGRESS, result={"p": 1})
    before = frozen(any_store)
    with pytest.raises(InvalidArgument, match="reserved"):
        any_store.record_effect("e1", RENEWALS_KEY, owner="w1", token=1, status="succeeded", result=[])
    with pytest.raises(InvalidArgument, match="reserved"):
        any_store.run("e1", RENEWALS_KEY, lambda key: [], any_store.get("e1").lease)  # type: ignore[arg-type]
    assert frozen(any_store) == before
    assert [e.key for e in any_store.effects("e1")] == [PROGRESS_KEY]  # the log is not an effect


@pytest.mark.parametrize("bad", ["", "a\x00b", "k" * 300, 42, None, b"e1", "\ud800"])
def test_renewals_of_a_bad_or_unknown_id_are_refused(any_store: Store, bad: object) -> None:
    started(any_store)
    before = frozen(any_store)
    with pytest.raises(InvalidArgument):
        any_store.renewals(bad)  # type: ignore[arg-type]
    with pytest.raises(UnknownEntity):
        any_store.renewals("missing")
    assert frozen(any_store) == before


def test_a_soft_deleted_entity_keeps_its_log(any_store: Store, clock: ManualClock) -> None:
    started(any_store)
    any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    log = any_store.renewals("e1")
    any_store.soft_delete("e1")
    assert any_store.renewals("e1") == log and len(log) == 1
