"""The store contract for ``renew_leases``: many renewals in one transaction, each guarded
by its own owner, token, expiry and budget, each answered in its place."""

from __future__ import annotations

from datetime import timedelta

from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import LeaseLost, ManualClock, UnknownEntity
from fsm.records import ClaimRequest, ClaimStart, Lease, NewEntity, Snapshot
from stores import Store

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def held(store: Store, *ids: str) -> list[Snapshot]:
    store.create_many([NewEntity(id=i, kind="job", state="queued") for i in ids])
    claimed = store.claim(ClaimRequest(kind="job", owner="w1", limit=len(ids), ttl=TTL, starts=(START,)))
    return sorted(claimed, key=lambda s: ids.index(s.id))


def lease_of(snap: Snapshot) -> Lease:
    assert snap.lease is not None
    return snap.lease


def test_every_lease_is_renewed_and_logged(any_store: Store, clock: ManualClock) -> None:
    a, b = held(any_store, "a", "b")
    clock.advance(timedelta(seconds=40))
    answers = any_store.renew_leases([lease_of(a), lease_of(b)], ttl=TTL)
    assert [type(x).__name__ for x in answers] == ["Snapshot", "Snapshot"]
    for snap in answers:
        assert isinstance(snap, Snapshot)
        assert snap.lease_expires_at == clock.now() + TTL and snap.lease_owner == "w1"
        assert any_store.renewals(snap.id)[-1].expires_at == clock.now() + TTL
        assert snap.version == 1  # a renewal is not a transition


def test_a_refused_renewal_is_answered_in_its_place(any_store: Store, clock: ManualClock) -> None:
    a, b, c = held(any_store, "a", "b", "c")
    stranger = lease_of(b)._replace(token=lease_of(b).token + 1)
    ghost = lease_of(c)._replace(entity_id="ghost")
    answers = any_store.renew_leases([lease_of(a), stranger, ghost, lease_of(c)], ttl=TTL)
    assert isinstance(answers[0], Snapshot) and isinstance(answers[3], Snapshot)
    assert isinstance(answers[1], LeaseLost) and isinstance(answers[2], UnknownEntity)
    assert any_store.get("b") == b  # the refused one is unchanged


def test_an_expired_lease_is_never_revived(any_store: Store, clock: ManualClock) -> None:
    (a,) = held(any_store, "a")
    clock.advance(TTL + timedelta(seconds=1))
    (answer,) = any_store.renew_leases([lease_of(a)], ttl=TTL)
    assert isinstance(answer, LeaseLost)


def test_the_budget_of_the_entitys_state_caps_each_renewal(any_store: Store, clock: ManualClock) -> None:
    a, b = held(any_store, "a", "b")
    budgets = (("running", timedelta(minutes=3)),)
    clock.advance(timedelta(minutes=2))
    first, _ = any_store.renew_leases([lease_of(a), lease_of(b)], ttl=TTL, budgets=budgets)
    assert isinstance(first, Snapshot)
    assert first.lease_expires_at == a.state_entered_at + timedelta(minutes=3)  # capped
    clock.advance(timedelta(minutes=1, seconds=1))
    spent = any_store.renew_leases([lease_of(first)], ttl=TTL, budgets=budgets)[0]
    assert isinstance(spent, LeaseLost)


def test_no_leases_renew_nothing(any_store: Store) -> None:
    assert any_store.renew_leases([], ttl=TTL) == []
