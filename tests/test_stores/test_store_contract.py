"""The store contract: one suite, run against every adapter through ``any_store``.

Each test states one behaviour of :class:`stores.Store`; an adapter joins by adding its
factory to ``STORE_FACTORIES`` in ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import (
    ConditionFailed,
    EntityExists,
    IdempotencyKeyReused,
    LeaseLost,
    ManualClock,
    StaleVersion,
    UnknownEntity,
)
from fsm.records import (
    BatchWrite,
    CounterAtLeast,
    CounterBelow,
    HistoryRecord,
    LeaseChange,
    LeaseStale,
    NewEntity,
    NewerSibling,
    SetItems,
    Snapshot,
    TransitionWrite,
    apply_changes,
)
from stores import Store

STALE_AFTER = timedelta(minutes=60)
TTL = timedelta(minutes=2)


def new(store: Store, entity_id: str = "e1", key: str | None = None, data: dict[str, object] | None = None) -> Snapshot:
    return store.create(NewEntity(id=entity_id, kind="job", state="queued", concurrency_key=key, data=data or {}))


def step(snap: Snapshot, event: str, target: str, **kwargs: object) -> TransitionWrite:
    return TransitionWrite(
        entity_id=snap.id,
        event=event,
        source=snap.state,
        target=target,
        actor=str(kwargs.pop("actor", "worker")),
        expect_version=int(kwargs.pop("expect_version", snap.version)),
        **kwargs,  # type: ignore[arg-type]
    )


def acquire(store: Store, snap: Snapshot, owner: str = "w1") -> Snapshot:
    new_snap, _ = store.apply(
        step(
            snap,
            "start",
            "running",
            lease_change=LeaseChange.ACQUIRE,
            new_owner=owner,
            lease_ttl=TTL,
            bump_attempt=True,
        )
    )
    return new_snap


# -- create / get / history --------------------------------------------------------------


def test_create_starts_at_version_0_without_a_lease(any_store: Store, clock: ManualClock) -> None:
    snap = new(any_store, data={"x": [1, "é", {"y": None}]})
    assert (snap.version, snap.lease_owner, snap.lease_token, snap.lease_expires_at) == (0, None, 0, None)
    assert snap.created_at == snap.updated_at == snap.state_entered_at == clock.now()
    assert snap.created_at.tzinfo is not None and snap.created_at.utcoffset() == timedelta(0)
    assert any_store.get("e1") == snap
    assert snap.data == {"x": [1, "é", {"y": None}]}


def test_create_twice_is_refused(any_store: Store) -> None:
    new(any_store)
    with pytest.raises(EntityExists):
        new(any_store)


def test_get_and_history_of_an_unknown_id_raise_unknown_entity(any_store: Store) -> None:
    with pytest.raises(UnknownEntity):
        any_store.get("missing")
    with pytest.raises(UnknownEntity):
        any_store.history("missing")


def test_apply_writes_row_and_history_together(any_store: Store, clock: ManualClock) -> None:
    snap = new(any_store)
    clock.advance(seconds=5)
    after, record = any_store.apply(
        step(snap, "start", "running", data={"a": 1}, data_patch={"a": 1}, reason="go", idempotency_key="k1")
    )
    assert (after.state, after.version, after.data, after.updated_at) == ("running", 1, {"a": 1}, clock.now())
    assert after.state_entered_at == clock.now() and after.created_at == snap.created_at
    assert record.seq == 1 and (record.event, record.source, record.target) == ("start", "queued", "running")
    assert (record.reason, record.idempotency_key, record.data, record.at) == ("go", "k1", {"a": 1}, clock.now())
    assert any_store.get("e1") == after
    assert any_store.history("e1") == [record]
    assert any_store.find_transition("e1", "k1") == record
    assert any_store.find_transition("e1", "other") is None


def test_apply_keeps_data_when_none_is_given(any_store: Store) -> None:
    snap = new(any_store, data={"keep": True})
    after, record = any_store.apply(step(snap, "start", "running"))
    assert after.data == {"keep": True} and record.data is None


# -- compare-and-set ---------------------------------------------------------------------


def test_apply_with_an_old_version_raises_stale_version_and_writes_nothing(any_store: Store) -> None:
    snap = new(any_store)
    any_store.apply(step(snap, "start", "running"))
    with pytest.raises(StaleVersion) as info:
        any_store.apply(step(snap, "start", "running"))
    assert (info.value.expected, info.value.found) == (0, 1)
    assert len(any_store.history("e1")) == 1


def test_apply_with_another_token_or_owner_raises_lease_lost(any_store: Store) -> None:
    held = acquire(any_store, new(any_store))
    for owner, token in [("w1", 0), ("w2", 1)]:
        with pytest.raises(LeaseLost):
            any_store.apply(step(held, "exited", "finalizing", expect_owner=owner, expect_token=token))
    after, _ = any_store.apply(step(held, "exited", "finalizing", expect_owner="w1", expect_token=1))
    assert after.state == "finalizing" and after.lease_token == 1 and after.lease_owner == "w1"


def test_acquire_in_a_transition_bumps_token_and_sets_expiry(any_store: Store, clock: ManualClock) -> None:
    held = acquire(any_store, new(any_store))
    assert (held.lease_owner, held.lease_token, held.attempt, held.reclaims) == ("w1", 1, 1, 0)
    assert held.lease_expires_at == clock.now() + TTL
    assert any_store.history("e1")[-1].lease_token == 1


def test_clear_drops_owner_and_expiry_but_keeps_the_token(any_store: Store) -> None:
    held = acquire(any_store, new(any_store))
    after, _ = any_store.apply(step(held, "expire", "queued", actor="reaper", lease_change=LeaseChange.CLEAR))
    assert (after.lease_owner, after.lease_expires_at, after.lease_token) == (None, None, 1)


def test_bump_reclaims_counts_and_a_new_attempt_resets_them(any_store: Store, clock: ManualClock) -> None:
    held = acquire(any_store, new(any_store))
    clock.advance(TTL + timedelta(seconds=1))
    after, _ = any_store.apply(
        step(
            held,
            "reclaim",
            "running",
            actor="reaper",
            lease_change=LeaseChange.ACQUIRE,
            new_owner="r",
            lease_ttl=TTL,
            bump_reclaims=True,
        )
    )
    assert (after.reclaims, after.lease_token, after.lease_owner) == (1, 2, "r")


def test_lease_stale_condition_refuses_a_fresh_lease(any_store: Store, clock: ManualClock) -> None:
    held = acquire(any_store, new(any_store))
    clock.advance(TTL)  # expires_at == now: fresh
    with pytest.raises(ConditionFailed) as info:
        any_store.apply(step(held, "expire", "failed", actor="reaper", require=(LeaseStale(STALE_AFTER),)))
    assert info.value.condition == "lease_stale"
    clock.advance(seconds=1)
    after, _ = any_store.apply(step(held, "expire", "failed", actor="reaper", require=(LeaseStale(STALE_AFTER),)))
    assert after.state == "failed"


def test_lease_stale_condition_on_a_null_lease_uses_updated_at(any_store: Store, clock: ManualClock) -> None:
    snap = new(any_store)
    running, _ = any_store.apply(step(snap, "start", "running"))
    clock.advance(STALE_AFTER)
    with pytest.raises(ConditionFailed):
        any_store.apply(step(running, "expire", "failed", actor="reaper", require=(LeaseStale(STALE_AFTER),)))
    clock.advance(seconds=1)
    after, _ = any_store.apply(step(running, "expire", "failed", actor="reaper", require=(LeaseStale(STALE_AFTER),)))
    assert after.state == "failed"


def test_newer_sibling_condition(any_store: Store, clock: ManualClock) -> None:
    old = any_store.apply(step(new(any_store, "old", key="main"), "start", "running"))[0]
    with pytest.raises(ConditionFailed):
        any_store.apply(step(old, "supersede", "failed", actor="reaper", require=(NewerSibling(),)))
    clock.advance(seconds=1)
    newer = any_store.apply(step(new(any_store, "new", key="main"), "start", "running"))[0]
    any_store.apply(step(new(any_store, "other", key="feature"), "start", "running"))
    assert any_store.has_newer_sibling("old") and not any_store.has_newer_sibling("new")
    assert not any_store.has_newer_sibling("other")
    with pytest.raises(ConditionFailed):
        any_store.apply(step(newer, "supersede", "failed", actor="reaper", require=(NewerSibling(),)))
    assert (
        any_store.apply(step(old, "supersede", "failed", actor="reaper", require=(NewerSibling(),)))[0].state
        == "failed"
    )


def test_an_idempotency_key_is_unique_per_entity(any_store: Store) -> None:
    snap = new(any_store)
    after, _ = any_store.apply(step(snap, "start", "running", idempotency_key="k"))
    with pytest.raises(IdempotencyKeyReused):
        any_store.apply(step(after, "exited", "finalizing", idempotency_key="k"))
    other = new(any_store, "e2")
    any_store.apply(step(other, "start", "running", idempotency_key="k"))
    assert len(any_store.history("e1")) == 1


# -- leases outside transitions ------------------------------------------------------------


def test_acquire_lease_on_a_free_lease(any_store: Store, clock: ManualClock) -> None:
    snap = new(any_store)
    held = any_store.acquire_lease("e1", owner="w1", ttl=TTL, budget=None, expect_version=0)
    assert (held.lease_owner, held.lease_token, held.version) == ("w1", 1, 0)
    assert held.lease_expires_at == clock.now() + TTL
    assert any_store.history("e1") == [] and snap.version == held.version


def test_acquire_lease_refuses_a_live_lease_and_a_moved_version(any_store: Store, clock: ManualClock) -> None:
    new(any_store)
    any_store.acquire_lease("e1", owner="w1", ttl=TTL, budget=None, expect_version=0)
    with pytest.raises(LeaseLost):
        any_store.acquire_lease("e1", owner="w2", ttl=TTL, budget=None, expect_version=0)
    with pytest.raises(StaleVersion):
        any_store.acquire_lease("e1", owner="w2", ttl=TTL, budget=None, expect_version=7)
    clock.advance(TTL + timedelta(seconds=1))
    taken = any_store.acquire_lease("e1", owner="w2", ttl=TTL, budget=None, expect_version=0)
    assert (taken.lease_owner, taken.lease_token) == ("w2", 2)


def test_renew_moves_only_the_expiry(any_store: Store, clock: ManualClock) -> None:
    held = acquire(any_store, new(any_store))
    clock.advance(seconds=30)
    renewed = any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)
    assert renewed.lease_expires_at == clock.now() + TTL
    assert renewed._replace(lease_expires_at=None) == held._replace(lease_expires_at=None)


def test_renew_refuses_a_wrong_holder_an_expired_lease_and_a_spent_budget(any_store: Store, clock: ManualClock) -> None:
    acquire(any_store, new(any_store))
    with pytest.raises(LeaseLost):
        any_store.renew_lease("e1", owner="w2", token=1, ttl=TTL, budget=None)
    with pytest.raises(LeaseLost):
        any_store.renew_lease("e1", owner="w1", token=0, ttl=TTL, budget=None)
    capped = any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=timedelta(minutes=3))
    assert capped.lease_expires_at == capped.state_entered_at + TTL
    clock.advance(TTL)
    capped = any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=timedelta(minutes=3))
    assert capped.lease_expires_at == capped.state_entered_at + timedelta(minutes=3)
    clock.advance(timedelta(minutes=1))
    with pytest.raises(LeaseLost, match="budget"):
        any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=timedelta(minutes=3))
    clock.advance(seconds=1)
    with pytest.raises(LeaseLost, match="expired"):
        any_store.renew_lease("e1", owner="w1", token=1, ttl=TTL, budget=None)


def test_release_clears_the_lease_for_its_holder_only(any_store: Store) -> None:
    acquire(any_store, new(any_store))
    with pytest.raises(LeaseLost):
        any_store.release_lease("e1", owner="w2", token=1)
    released = any_store.release_lease("e1", owner="w1", token=1)
    assert (released.lease_owner, released.lease_expires_at, released.lease_token) == (None, None, 1)


# -- soft delete -----------------------------------------------------------------------------


def test_soft_deleted_entities_are_hidden_and_never_moved(any_store: Store) -> None:
    snap = new(any_store)
    any_store.soft_delete("e1")
    with pytest.raises(UnknownEntity):
        any_store.get("e1")
    assert any_store.get("e1", include_deleted=True).deleted
    with pytest.raises(UnknownEntity):
        any_store.apply(step(snap, "start", "running"))
    with pytest.raises(UnknownEntity):
        any_store.soft_delete("e1")
    with pytest.raises(EntityExists):
        new(any_store)


def test_store_now_is_aware_utc(any_store: Store) -> None:
    assert any_store.now().tzinfo is not None
    assert any_store.now().astimezone(UTC).utcoffset() == timedelta(0)


# -- the reaper's set-based reads and writes -----------------------------------------------


def _running(store: Store, clock: ManualClock, ids: list[str], key: str | None = None) -> None:
    for i in ids:
        store.apply(step(new(store, i, key=key), "start", "running"))
        clock.advance(seconds=1)


def test_candidates_are_the_stale_rows_in_id_order_with_keyset_paging(any_store: Store, clock: ManualClock) -> None:
    _running(any_store, clock, ["c", "a", "d", "b"])
    clock.advance(STALE_AFTER - timedelta(seconds=1))  # c, a, d are past stale_after; b is not
    stale = (LeaseStale(STALE_AFTER),)
    assert [s.id for s in any_store.candidates("job", "running", stale, limit=10)] == ["a", "c", "d"]
    assert [s.id for s in any_store.candidates("job", "running", stale, limit=2)] == ["a", "c"]
    assert [s.id for s in any_store.candidates("job", "running", stale, limit=2, after_id="c")] == ["d"]
    assert any_store.candidates("job", "queued", stale, limit=10) == []
    assert any_store.candidates("pipeline", "running", stale, limit=10) == []


def test_candidates_skip_soft_deleted_rows(any_store: Store, clock: ManualClock) -> None:
    _running(any_store, clock, ["a", "b"])
    any_store.soft_delete("a")
    clock.advance(STALE_AFTER * 2)
    assert [s.id for s in any_store.candidates("job", "running", (LeaseStale(STALE_AFTER),), limit=10)] == ["b"]


def test_candidates_with_counter_conditions(any_store: Store, clock: ManualClock) -> None:
    a = acquire(any_store, new(any_store, "a"))
    acquire(any_store, new(any_store, "b"))
    any_store.apply(step(a, "expire", "queued", actor="reaper", lease_change=LeaseChange.CLEAR))
    acquire(any_store, any_store.get("a"))  # a: attempt 2, b: attempt 1
    below = (CounterBelow("attempt", 2),)
    at_least = (CounterAtLeast("attempt", 2),)
    assert [s.id for s in any_store.candidates("job", "running", below, limit=10)] == ["b"]
    assert [s.id for s in any_store.candidates("job", "running", at_least, limit=10)] == ["a"]


def test_candidates_with_a_newer_sibling(any_store: Store, clock: ManualClock) -> None:
    _running(any_store, clock, ["p1", "p2", "p3"], key="main")
    _running(any_store, clock, ["q1"], key="other")
    got = any_store.candidates("job", "running", (NewerSibling(),), limit=10)
    assert [s.id for s in got] == ["p1", "p2"]


def test_apply_batch_moves_qualifying_rows_and_skips_the_rest(any_store: Store, clock: ManualClock) -> None:
    _running(any_store, clock, ["a", "b", "c"])
    held = acquire(any_store, new(any_store, "d"))  # fresh lease: never stale
    any_store.renew_lease("d", owner="w1", token=held.lease_token, ttl=STALE_AFTER * 2, budget=None)
    any_store.soft_delete("c")
    clock.advance(STALE_AFTER)
    batch = BatchWrite(
        ids=("a", "b", "c", "d", "missing"),
        kind="job",
        event="expire",
        source="running",
        target="failed",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER),),
        lease_change=LeaseChange.CLEAR,
        reason="expired",
    )
    moved = any_store.apply_batch(batch)
    assert [s.id for s, _ in moved] == ["a", "b"]
    for snap, record in moved:
        assert (snap.state, snap.version, snap.updated_at) == ("failed", 2, clock.now())
        assert (record.seq, record.event, record.source, record.target) == (2, "expire", "running", "failed")
        assert (record.actor, record.reason, record.at) == ("reaper", "expired", clock.now())
        assert any_store.history(snap.id)[-1] == record and any_store.get(snap.id) == snap
    assert any_store.get("d").state == "running"
    assert any_store.get("c", include_deleted=True).state == "running"
    assert any_store.apply_batch(batch) == []  # already moved: nothing qualifies twice


def test_apply_batch_can_reclaim_with_a_new_owner(any_store: Store, clock: ManualClock) -> None:
    acquire(any_store, new(any_store, "a"))
    clock.advance(TTL + timedelta(seconds=1))
    batch = BatchWrite(
        ids=("a",),
        kind="job",
        event="reclaim",
        source="running",
        target="running",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER), CounterBelow("reclaims", 1)),
        lease_change=LeaseChange.ACQUIRE,
        new_owner="reaper-1",
        lease_ttl=TTL,
        bump_reclaims=True,
        reason="reclaimed",
    )
    ((snap, record),) = any_store.apply_batch(batch)
    assert (snap.lease_owner, snap.lease_token, snap.reclaims) == ("reaper-1", 2, 1)
    assert snap.lease_expires_at == clock.now() + TTL and record.lease_token == 2


def test_move_candidates_claims_and_moves_up_to_limit_never_a_fresh_lease(any_store: Store, clock: ManualClock) -> None:
    _running(any_store, clock, ["a", "b", "c", "d"])
    held = acquire(any_store, new(any_store, "live"))  # a fresh lease: never claimed (I1)
    any_store.renew_lease("live", owner="w1", token=held.lease_token, ttl=STALE_AFTER * 3, budget=None)
    any_store.soft_delete("d")
    clock.advance(STALE_AFTER * 2)
    claim = BatchWrite(
        ids=(),
        kind="job",
        event="expire",
        source="running",
        target="failed",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER),),
        lease_change=LeaseChange.CLEAR,
        reason="expired",
    )
    first = any_store.move_candidates(claim, limit=2)
    second = any_store.move_candidates(claim, limit=2)
    assert len(first) == 2 and len(second) == 1
    assert sorted(s.id for s, _ in first + second) == ["a", "b", "c"]
    for snap, record in first + second:
        assert (snap.state, snap.version, snap.lease_owner) == ("failed", 2, None)
        assert (record.seq, record.event, record.source, record.target, record.reason) == (
            2, "expire", "running", "failed", "expired"
        )  # fmt: skip
        assert any_store.get(snap.id) == snap and any_store.history(snap.id)[-1] == record
    assert any_store.move_candidates(claim, limit=2) == []
    assert any_store.get("live").state == "running"
    assert any_store.get("d", include_deleted=True).state == "running"


def _brief_claim(store: Store) -> Callable[..., list[HistoryRecord]]:
    """The store's ``move_candidates_brief`` (an optional capability), or skip the test."""
    method = getattr(store, "move_candidates_brief", None)  # the async faces: through their facade
    if method is None:
        pytest.skip(f"{type(store).__name__} has no brief claim (the reaper calls move_candidates)")
    brief: Callable[..., list[HistoryRecord]] = method
    return brief


def test_move_candidates_brief_moves_as_move_candidates_and_returns_the_history_rows(
    any_store: Store, clock: ManualClock
) -> None:
    brief = _brief_claim(any_store)
    _running(any_store, clock, ["a", "b", "c", "d"])
    held = acquire(any_store, new(any_store, "live"))  # a fresh lease: never claimed (I1)
    any_store.renew_lease("live", owner="w1", token=held.lease_token, ttl=STALE_AFTER * 3, budget=None)
    any_store.soft_delete("d")
    clock.advance(STALE_AFTER * 2)
    claim = BatchWrite(
        ids=(),
        kind="job",
        event="expire",
        source="running",
        target="failed",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER),),
        lease_change=LeaseChange.CLEAR,
        reason="expired",
    )
    first, second = brief(claim, limit=2), brief(claim, limit=2)
    assert len(first) == 2 and len(second) == 1
    assert sorted(r.entity_id for r in first + second) == ["a", "b", "c"]
    for record in first + second:
        snap = any_store.get(record.entity_id)
        assert (snap.state, snap.version, snap.lease_owner, snap.lease_expires_at) == ("failed", 2, None, None)
        assert snap.updated_at == snap.state_entered_at == clock.now()
        assert any_store.history(record.entity_id)[-1] == record
        assert (record.seq, record.event, record.source, record.target, record.actor, record.reason) == (
            2, "expire", "running", "failed", "reaper", "expired"
        )  # fmt: skip
        assert (record.lease_token, record.at) == (snap.lease_token, clock.now())
    assert brief(claim, limit=2) == []
    assert any_store.get("live").state == "running"
    assert any_store.get("d", include_deleted=True).state == "running"


def test_move_candidates_brief_takes_a_reclaims_fence_as_the_full_claim_does(
    any_store: Store, clock: ManualClock
) -> None:
    brief = _brief_claim(any_store)
    held = acquire(any_store, new(any_store, "f1"))
    clock.advance(TTL * 2)  # the holder died: its lease lapsed
    reclaim = BatchWrite(
        ids=(),
        kind="job",
        event="reclaim",
        source="running",
        target="running",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER),),
        lease_change=LeaseChange.ACQUIRE,
        new_owner=None,
        lease_ttl=TTL,
        bump_reclaims=True,
        reason="reclaimed",
    )
    (record,) = brief(reclaim, limit=5)
    snap = any_store.get("f1")
    assert (snap.version, snap.lease_token, snap.lease_owner, snap.reclaims) == (2, held.lease_token + 1, None, 1)
    assert snap.lease_expires_at == clock.now() + TTL
    assert (record.seq, record.lease_token) == (2, held.lease_token + 1)
    assert any_store.history("f1")[-1] == record


CHANGED_DATA: list[dict[str, Any]] = [
    {"steps": [{"name": "build", "status": "completed"}, {"name": "test", "status": "running"}]},
    {"steps": [{"status": "running", "x": {"y": [1.5, "é", None]}}, {"status": "running"}], "other": [1]},
    {"steps": [1, "running", None, ["running"], {"status": ["running"]}, {"status": "running"}]},
    {"steps": [{"status": 1}, {"status": True}, {"status": "1"}, {"status": 1.0}, {"status": None}, {}]},
    {"steps": [{"name": "idle", "status": "queued"}]},
    {"steps": {"status": "running"}},
    {"steps": "running"},
    {"steps": []},
    {},
]
"""Data shapes a declared change meets: matching and non-matching items, items that are
not objects, values that are not strings (where JSON and Python equality differ)."""


@pytest.mark.parametrize(
    "changes",
    [
        (SetItems("steps", "status", ("running",), "failed"),),
        (SetItems("steps", "status", ("running", "queued"), {"failed": True}), SetItems("other", "z", ("a",), 1)),
        (SetItems("steps", "status", (1, None), "zero"),),  # Python's 1 == True == 1.0: not a string match
        (*(SetItems("steps", "status", (f"s{i}",), i) for i in range(3)), SetItems("steps", "status", ("running",), 9)),
    ],
    ids=["one-text", "two-text", "non-text", "many"],
)
@pytest.mark.parametrize("brief", [False, True], ids=["full", "brief"])
def test_a_claimed_page_applies_declared_changes_exactly_as_apply_changes(
    any_store: Store, clock: ManualClock, changes: tuple[SetItems, ...], brief: bool
) -> None:
    claim_page = _brief_claim(any_store) if brief else any_store.move_candidates
    for i, data in enumerate(CHANGED_DATA):
        any_store.apply(step(new(any_store, f"p{i}", data=data), "start", "running"))
    clock.advance(STALE_AFTER * 2)
    claim = BatchWrite(
        ids=(),
        kind="job",
        event="expire",
        source="running",
        target="failed",
        actor="reaper",
        require=(LeaseStale(STALE_AFTER),),
        lease_change=LeaseChange.CLEAR,
        reason="expired",
        changes=changes,
    )
    moved = claim_page(claim, limit=100)
    assert len(moved) == len(CHANGED_DATA)
    for i, data in enumerate(CHANGED_DATA):
        expected = apply_changes(changes, data)
        assert any_store.get(f"p{i}").data == (data if expected is None else expected), data
    if not brief:  # the returned snapshots carry the changed data too
        assert all(snap == any_store.get(snap.id) for snap, _ in moved)


@pytest.mark.parametrize("change", [LeaseChange.KEEP, LeaseChange.ACQUIRE, LeaseChange.CLEAR])
def test_apply_on_a_snapshot_whose_lease_moved_since_returns_the_stored_row(
    any_store: Store, clock: ManualClock, change: LeaseChange
) -> None:
    """A lease is taken and dropped without a version bump (acquire_lease, release_lease):
    a store that builds the new row from the judged snapshot must not return the old lease."""
    snap = new(any_store)
    taken = any_store.acquire_lease("e1", owner="other", ttl=TTL, budget=None, expect_version=snap.version)
    assert taken.version == snap.version and taken.lease_token == snap.lease_token + 1
    ttl = TTL if change is LeaseChange.ACQUIRE else None
    owner = "w2" if change is LeaseChange.ACQUIRE else None
    moved, record = any_store.apply(
        step(snap, "start", "running", lease_change=change, new_owner=owner, lease_ttl=ttl, before=snap)
    )
    stored = any_store.get("e1")
    assert moved == stored and record == any_store.history("e1")[-1]
    assert record.lease_token == stored.lease_token == taken.lease_token + (change is LeaseChange.ACQUIRE)
    assert stored.lease_owner == {LeaseChange.KEEP: "other", LeaseChange.ACQUIRE: "w2", LeaseChange.CLEAR: None}[change]
    # and released (owner cleared, token kept) since the snapshot the next write is judged on
    clock.advance(seconds=1)
    if stored.lease_owner is not None:
        released = any_store.release_lease("e1", owner=stored.lease_owner, token=stored.lease_token)
        finished, _ = any_store.apply(step(moved, "finish", "finalizing", before=moved))
        assert released.lease_owner is None and released.version == moved.version
        assert finished == any_store.get("e1") and finished.lease_owner is None


def test_apply_with_the_snapshot_it_was_judged_on_returns_the_stored_row(any_store: Store, clock: ManualClock) -> None:
    snap = new(any_store, "e1", key="k", data={"x": [1, 2]})
    started, _ = any_store.apply(step(snap, "start", "running", lease_change=LeaseChange.ACQUIRE, new_owner="w1",
                                      lease_ttl=TTL, bump_attempt=True, before=snap))  # fmt: skip
    assert started == any_store.get("e1") and started.data == {"x": [1, 2]}
    clock.advance(seconds=5)
    finish = step(started, "finish", "finalizing", expect_owner="w1", expect_token=started.lease_token,
                  data={"x": [3]}, before=started)  # fmt: skip
    changed, record = any_store.apply(finish)
    assert changed == any_store.get("e1") and changed.data == {"x": [3]}
    assert any_store.history("e1")[-1] == record and record.source == "running"
    with pytest.raises(StaleVersion):  # a stale snapshot is refused as any stale write is
        any_store.apply(step(started, "finish", "finalizing", before=started))
