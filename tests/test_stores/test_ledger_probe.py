"""The ledger's read before each effect: the holder and the recorded result together.

``run`` asks the store for both before it calls ``fn`` (one statement on SQL); this is the
contract of that read on every synchronous store (the asyncio face runs the ledger over
its bridge, which reads them one by one).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm import LeaseLost, UnknownEntity
from fsm.records import ClaimRequest, ClaimStart, Lease, NewEntity, Snapshot
from stores import Store

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def new(store: Store, entity_id: str, state: str = "queued") -> Snapshot:
    return store.create(NewEntity(id=entity_id, kind="job", state=state))


def held(store: Store, entity_id: str = "e1", owner: str = "w1") -> Lease:
    new(store, entity_id)
    request = ClaimRequest(kind="job", owner=owner, limit=10, ttl=TTL, starts=(START,))
    (snap,) = [s for s in store.claim(request) if s.id == entity_id]
    assert snap.lease is not None
    return snap.lease


def test_run_reads_the_holder_and_the_recorded_effect_together(any_store: Store) -> None:
    """``holder_and_effect``: the holder ``(owner, token)`` and the recorded effect (one read
    on SQL); ``run`` decides from it whether to call ``fn``, replay, or refuse."""
    lease = held(any_store)
    probe = any_store.holder_and_effect  # type: ignore[attr-defined]
    assert probe("e1", "security") == (("w1", lease.token), None)
    record, _ = any_store.run("e1", "security", lambda key: {"ok": True}, lease)
    assert probe("e1", "security") == (("w1", lease.token), record)
    assert probe("e1", "other") == (("w1", lease.token), None)
    new(any_store, "free")
    assert probe("free", "security") == ((None, 0), None)
    any_store.soft_delete("free")
    with pytest.raises(UnknownEntity):
        probe("free", "security")
    with pytest.raises(UnknownEntity):
        probe("nobody", "security")


def test_run_refuses_a_stale_lease_before_calling_fn_even_when_the_key_is_recorded(any_store: Store) -> None:
    lease = held(any_store)
    any_store.run("e1", "security", lambda key: {"ok": True}, lease)
    any_store.release_lease("e1", owner="w1", token=lease.token)
    calls: list[str] = []
    with pytest.raises(LeaseLost):
        any_store.run("e1", "security", calls.append, lease)
    with pytest.raises(LeaseLost):
        any_store.run("e1", "fresh", calls.append, lease)
    assert calls == []


@pytest.mark.parametrize(
    ("entity_id", "key"),
    [(None, "k"), (42, "k"), ("e1", None), ("e1", b"k"), ("e\x00", "k"), ("e1", "k\x00"), ("x" * 10_000, "k"),
     ("e1", "\ud800"), ("e1", "fsm:renewals")],
)  # fmt: skip
def test_the_read_refuses_hostile_arguments_with_a_typed_error(
    any_store: Store, entity_id: object, key: object
) -> None:
    from fsm import InvalidArgument

    lease = held(any_store)
    before = any_store.get("e1")
    with pytest.raises(InvalidArgument):  # refused before any read, not UnknownEntity or a driver error
        any_store.holder_and_effect(entity_id, key)  # type: ignore[attr-defined]
    assert any_store.get("e1") == before and any_store.effects("e1") == []
    assert lease.token == before.lease_token
