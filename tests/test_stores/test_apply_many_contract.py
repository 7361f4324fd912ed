"""The store contract for ``apply_many``: many transitions in one transaction, each fenced
by its own guards, each answered in its place.  Every adapter, sync and async faces."""

from __future__ import annotations

from datetime import timedelta

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import IdempotencyKeyReused, InvalidArgument, LeaseLost, StaleVersion, UnknownEntity
from fsm.limits import MAX_APPLY_MANY
from fsm.records import LeaseChange, NewEntity, Snapshot, TransitionWrite
from stores import Store

TTL = timedelta(minutes=2)


def start(entity_id: str, version: int = 0, owner: str = "w1") -> TransitionWrite:
    return TransitionWrite(
        entity_id, "start", "queued", "running", "worker", version,
        lease_change=LeaseChange.ACQUIRE, new_owner=owner, lease_ttl=TTL, bump_attempt=True,
    )  # fmt: skip


def exited(snap: Snapshot, *, token: int | None = None, key: str | None = None) -> TransitionWrite:
    return TransitionWrite(
        snap.id, "exited", "running", "finalizing", "worker", snap.version,
        expect_owner=snap.lease_owner, expect_token=snap.lease_token if token is None else token,
        idempotency_key=key, before=snap,
    )  # fmt: skip


def queued(store: Store, *ids: str) -> None:
    store.create_many([NewEntity(id=i, kind="job", state="queued") for i in ids])


def test_every_write_of_the_batch_is_applied_with_its_history(any_store: Store) -> None:
    queued(any_store, "a", "b", "c")
    results = any_store.apply_many([start(i) for i in ("a", "b", "c")])
    assert len(results) == 3
    for entity_id, result in zip(("a", "b", "c"), results, strict=True):
        assert not isinstance(result, Exception), result
        snap, record = result
        assert (snap.id, snap.state, snap.version, snap.lease_owner, snap.lease_token) == (
            entity_id,
            "running",
            1,
            "w1",
            1,
        )
        assert (record.seq, record.event, record.source, record.target) == (1, "start", "queued", "running")
        assert any_store.get(entity_id) == snap
        assert any_store.history(entity_id) == [record]


def test_a_refused_write_is_answered_in_its_place_and_the_others_land(any_store: Store) -> None:
    queued(any_store, "a", "b", "c", "d")
    (a, _), (b, _), (c, _) = any_store.apply_many([start("a"), start("b"), start("c")])  # type: ignore[misc]
    batch = [
        exited(a),
        exited(b._replace(version=0)),  # stale: b is at version 1
        exited(c, token=c.lease_token + 1),  # a token that is not the holder's
        exited(any_store.get("d")._replace(id="nobody")),
        start("d"),
    ]
    results = any_store.apply_many(batch)
    assert [type(r).__name__ if isinstance(r, Exception) else "ok" for r in results] == [
        "ok", "StaleVersion", "LeaseLost", "UnknownEntity", "ok",
    ]  # fmt: skip
    assert isinstance(results[1], StaleVersion) and isinstance(results[2], LeaseLost)
    assert isinstance(results[3], UnknownEntity)
    assert any_store.get("a").state == "finalizing" and any_store.get("d").state == "running"
    assert any_store.get("b") == b and any_store.get("c") == c  # the refused rows are unchanged
    assert len(any_store.history("b")) == 1 and len(any_store.history("c")) == 1


def test_writes_on_one_entity_apply_in_order(any_store: Store) -> None:
    queued(any_store, "a")
    (snap, _), (after, record) = any_store.apply_many(  # type: ignore[misc]
        [start("a"), exited(Snapshot("a", "job", "running", 1, "w1", 1, None, *([any_store.now()] * 3)), key=None)]
    )
    assert snap.version == 1 and after.version == 2 and after.state == "finalizing" and record.seq == 2
    assert [h.event for h in any_store.history("a")] == ["start", "exited"]


def test_a_reused_idempotency_key_refuses_only_its_write(any_store: Store) -> None:
    queued(any_store, "a", "b")
    (a, _), (b, _) = any_store.apply_many([start("a"), start("b")])  # type: ignore[misc]
    any_store.apply(exited(a, key="k-1"))
    again = any_store.get("a")
    results = any_store.apply_many([
        TransitionWrite("a", "complete", "finalizing", "completed", "worker", again.version,
                        expect_owner="w1", expect_token=again.lease_token, idempotency_key="k-1"),
        exited(b),
    ])  # fmt: skip
    assert isinstance(results[0], IdempotencyKeyReused)
    assert not isinstance(results[1], Exception)
    assert any_store.get("a").state == "finalizing" and any_store.get("b").state == "finalizing"


def test_an_empty_batch_writes_nothing_and_a_malformed_one_is_refused(any_store: Store) -> None:
    assert any_store.apply_many([]) == []
    queued(any_store, "a")
    for bad in ("nope", [start("a"), "not a write"], [start("a")] * (MAX_APPLY_MANY + 1)):
        with pytest.raises(InvalidArgument):
            any_store.apply_many(bad)  # type: ignore[arg-type]
    assert any_store.get("a").state == "queued" and any_store.history("a") == []
