"""The store contract for ``create_many``: many entities at once, all or nothing.

Run against every adapter, sync and async faces (``any_store`` from ``async_support``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import EntityExists, InvalidArgument, ManualClock, UnknownEntity
from fsm.limits import MAX_CREATE_MANY
from fsm.records import ClaimRequest, ClaimStart, NewEntity
from stores import Store

START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def batch(*ids: str, **data: object) -> list[NewEntity]:
    return [NewEntity(id=i, kind="job", state="queued", data={"n": n, **data}) for n, i in enumerate(ids)]


def test_create_many_inserts_every_entity_at_version_0_in_the_given_order(any_store: Store) -> None:
    made = any_store.create_many(batch("c", "a", "b", tag="x"))
    assert [s.id for s in made] == ["c", "a", "b"]
    assert all(s.version == 0 and s.state == "queued" and s.kind == "job" for s in made)
    assert all(s.lease_owner is None and s.lease_token == 0 and not s.deleted for s in made)
    assert [s.data for s in made] == [{"n": 0, "tag": "x"}, {"n": 1, "tag": "x"}, {"n": 2, "tag": "x"}]
    for snap in made:
        assert any_store.get(snap.id) == snap
        assert any_store.history(snap.id) == []


def test_create_many_keeps_each_concurrency_key_and_unicode_data(any_store: Store) -> None:
    entities = [
        NewEntity(id="k1", kind="job", state="queued", concurrency_key="repo-1", data={"s": "ção ✓ \u2028"}),
        NewEntity(id="k2", kind="job", state="queued", data={"nested": {"list": [1, 2.5, None, True]}}),
    ]
    one, two = any_store.create_many(entities)
    assert one.concurrency_key == "repo-1" and two.concurrency_key is None
    assert any_store.get("k1").data == {"s": "ção ✓ \u2028"}
    assert any_store.get("k2").data == {"nested": {"list": [1, 2.5, None, True]}}


def test_create_many_with_an_existing_id_writes_nothing(any_store: Store) -> None:
    any_store.create(NewEntity(id="b", kind="job", state="queued", data={"old": True}))
    with pytest.raises(EntityExists) as caught:
        any_store.create_many(batch("a", "b", "c"))
    assert caught.value.entity_id == "b"
    for missing in ("a", "c"):
        with pytest.raises(UnknownEntity):
            any_store.get(missing)
    assert any_store.get("b").data == {"old": True}


def test_create_many_conflicts_with_a_soft_deleted_id(any_store: Store) -> None:
    any_store.create(NewEntity(id="gone", kind="job", state="queued"))
    any_store.soft_delete("gone")
    with pytest.raises(EntityExists):
        any_store.create_many(batch("new", "gone"))
    with pytest.raises(UnknownEntity):
        any_store.get("new")


def test_create_many_refuses_an_id_given_twice_and_writes_nothing(any_store: Store) -> None:
    with pytest.raises(EntityExists):
        any_store.create_many(batch("x", "y", "x"))
    with pytest.raises(UnknownEntity):
        any_store.get("y")


@pytest.mark.parametrize("bad", [[], "abc", None, [object()], [{"id": "a"}]])
def test_create_many_refuses_a_batch_that_is_not_a_list_of_new_entities(any_store: Store, bad: object) -> None:
    with pytest.raises(InvalidArgument):
        any_store.create_many(bad)  # type: ignore[arg-type]


def test_create_many_refuses_more_than_the_limit(any_store: Store) -> None:
    too_many = [NewEntity(id=f"e{i}", kind="job", state="queued") for i in range(MAX_CREATE_MANY + 1)]
    with pytest.raises(InvalidArgument):
        any_store.create_many(too_many)
    with pytest.raises(UnknownEntity):
        any_store.get("e0")


def test_created_entities_are_claimable(any_store: Store, clock: ManualClock) -> None:
    any_store.create_many(batch(*(f"j{i}" for i in range(5))))
    request = ClaimRequest(
        kind="job", owner="w1", limit=10, ttl=timedelta(minutes=2), starts=(START,), resumes=("finalizing",)
    )
    claimed = any_store.claim(request)
    assert sorted(s.id for s in claimed) == [f"j{i}" for i in range(5)]
    assert all(s.state == "running" and s.lease_owner == "w1" for s in claimed)
