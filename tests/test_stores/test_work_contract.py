"""The store contract for durable work: the effects ledger, claiming and listing.

Run against every adapter (memory, SQLite, PostgreSQL) through ``any_store``, like the
rest of the contract suite.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import InvalidArgument, LeaseLost, ManualClock, UnknownEntity
from fsm.records import (
    ClaimRequest,
    ClaimStart,
    Lease,
    LeaseChange,
    NewEntity,
    Snapshot,
    TransitionWrite,
)
from stores import Store

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def new(store: Store, entity_id: str, state: str = "queued") -> Snapshot:
    return store.create(NewEntity(id=entity_id, kind="job", state=state))


def claim(store: Store, owner: str, limit: int = 10, resumes: tuple[str, ...] = ("finalizing",)) -> list[Snapshot]:
    return store.claim(ClaimRequest(kind="job", owner=owner, limit=limit, ttl=TTL, starts=(START,), resumes=resumes))


def held(store: Store, entity_id: str = "e1", owner: str = "w1") -> Lease:
    new(store, entity_id)
    (snap,) = [s for s in claim(store, owner) if s.id == entity_id]
    assert snap.lease is not None
    return snap.lease


# -- the ledger (I4) ------------------------------------------------------------------------


def test_I4_a_recorded_result_is_returned_and_fn_is_not_called_again(any_store: Store) -> None:
    lease = held(any_store)
    calls: list[str] = []

    def gate(key: str) -> dict[str, object]:
        calls.append(key)
        return {"status": "passed", "n": len(calls)}

    first, executed = any_store.run("e1", "security", gate, lease)
    again, executed_again = any_store.run("e1", "security", gate, lease)
    assert (executed, executed_again) == (True, False)
    assert calls == ["e1:security"]
    assert first.result == again.result == {"status": "passed", "n": 1}
    assert again.status == "succeeded" and again.lease_token == lease.token and again.attempts == 1
    assert [e.key for e in any_store.effects("e1")] == ["security"]


def test_I4_a_late_result_from_a_fenced_holder_raises_lease_lost_and_is_not_recorded(
    any_store: Store, clock: ManualClock
) -> None:
    lease = held(any_store)

    def slow_gate(key: str) -> str:
        # while the gate runs, the holder dies for the store: its lease lapses and the
        # reaper fences it (token + 1, lease left free for a claim)
        clock.advance(TTL * 2)
        snap = any_store.get("e1")
        any_store.apply(
            TransitionWrite(
                "e1", "reclaim", "running", "running", "reaper", snap.version,
                lease_change=LeaseChange.ACQUIRE, new_owner=None, lease_ttl=TTL,
            )
        )  # fmt: skip
        return "late"

    with pytest.raises(LeaseLost):
        any_store.run("e1", "deploy", slow_gate, lease)
    assert any_store.effect("e1", "deploy") is None


def test_a_fenced_holder_asking_for_an_effect_is_refused_before_it_runs(any_store: Store, clock: ManualClock) -> None:
    """seeds/002 BR-2: an actor that no longer owns the entity executes no side effect."""
    lease = held(any_store)
    clock.advance(TTL * 2)  # the holder hangs past its TTL; the reaper fences it
    snap = any_store.get("e1")
    any_store.apply(
        TransitionWrite(
            "e1", "reclaim", "running", "running", "reaper", snap.version,
            lease_change=LeaseChange.ACQUIRE, new_owner=None, lease_ttl=TTL,
        )
    )  # fmt: skip
    calls: list[str] = []
    with pytest.raises(LeaseLost, match="not run"):
        any_store.run("e1", "coverage", calls.append, lease)
    assert calls == [] and any_store.effect("e1", "coverage") is None


def test_I4_two_holders_racing_on_one_key_record_one_result(any_store: Store) -> None:
    lease = held(any_store)
    barrier = threading.Barrier(2)
    outcomes: list[tuple[object, bool]] = []

    def gate(key: str) -> str:
        barrier.wait(timeout=10)  # both have looked the key up and found nothing
        return threading.current_thread().name

    def actor() -> None:
        record, executed = any_store.run("e1", "merge-gate", gate, lease)
        outcomes.append((record.result, executed))

    threads = [threading.Thread(target=actor, name=f"t{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(outcomes) == 2
    assert sorted(executed for _, executed in outcomes) == [False, True]
    assert outcomes[0][0] == outcomes[1][0]  # the loser is handed the winner's result
    (recorded,) = any_store.effects("e1")
    assert recorded.result == outcomes[0][0] and recorded.attempts == 1


def test_a_failed_effect_is_recorded_with_its_error_and_retried_only_when_allowed(any_store: Store) -> None:
    lease = held(any_store)

    def broken(key: str) -> None:
        raise RuntimeError("registry down")

    with pytest.raises(RuntimeError, match="registry down"):
        any_store.run("e1", "image", broken, lease)
    failed = any_store.effect("e1", "image")
    assert failed is not None and failed.status == "failed"
    assert failed.result == {"error": {"type": "RuntimeError", "message": "registry down"}}
    kept, executed = any_store.run("e1", "image", lambda key: "fresh", lease, retry_failed=False)
    assert (kept.status, executed) == ("failed", False)
    retried, executed = any_store.run("e1", "image", lambda key: "fresh", lease)
    assert (retried.status, retried.result, retried.attempts, executed) == ("succeeded", "fresh", 2, True)


def test_recording_needs_the_current_lease_and_a_json_result(any_store: Store) -> None:
    lease = held(any_store)
    with pytest.raises(LeaseLost):
        any_store.record_effect("e1", "k", owner="w2", token=lease.token, status="succeeded", result=1)
    with pytest.raises(LeaseLost):
        any_store.record_effect("e1", "k", owner=lease.owner, token=lease.token + 1, status="succeeded", result=1)
    with pytest.raises(InvalidArgument):
        any_store.run("e1", "k", lambda key: float("nan"), lease)
    with pytest.raises(InvalidArgument):
        any_store.run("e1", "fsm:mine", lambda key: 1, lease)
    with pytest.raises(UnknownEntity):
        any_store.record_effect("nope", "k", owner="w1", token=1, status="succeeded", result=1)
    assert any_store.effects("e1") == []


# -- claiming -----------------------------------------------------------------------------


def test_claim_takes_the_oldest_queued_first_with_a_fresh_token_and_a_history_row(
    any_store: Store, clock: ManualClock
) -> None:
    for i in range(3):
        new(any_store, f"j{2 - i}")  # created j2, j1, j0: the oldest is j2
        clock.advance(timedelta(seconds=1))
    got = claim(any_store, "w1", limit=2)
    assert [s.id for s in got] == ["j2", "j1"]
    for snap in got:
        assert (snap.state, snap.lease_owner, snap.lease_token, snap.attempt) == ("running", "w1", 1, 1)
        (record,) = any_store.history(snap.id)
        assert (record.event, record.source, record.target, record.actor) == ("start", "queued", "running", "worker")
    assert [s.id for s in claim(any_store, "w2", limit=5)] == ["j0"]
    assert claim(any_store, "w3") == []


def test_claim_resumes_a_reclaimed_finalizer_by_taking_its_free_lease(any_store: Store, clock: ManualClock) -> None:
    new(any_store, "f1", state="finalizing")
    new(any_store, "r1", state="running")  # running without an owner: not a resume state here
    (snap,) = claim(any_store, "w1")
    assert (snap.id, snap.lease_owner, snap.lease_token, snap.version) == ("f1", "w1", 1, 0)
    assert any_store.history("f1") == []  # taking a lease is not a transition
    assert claim(any_store, "w2") == []  # its lease is held now


def test_claim_never_hands_one_entity_to_two_claimers(any_store: Store) -> None:
    for i in range(40):
        new(any_store, f"e{i:02d}")
    got: dict[str, list[str]] = {}
    lock = threading.Lock()

    def worker(owner: str) -> None:
        while True:
            batch = claim(any_store, owner, limit=3)
            if not batch:
                return
            with lock:
                for snap in batch:
                    got.setdefault(snap.id, []).append(owner)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got) == [f"e{i:02d}" for i in range(40)]
    assert all(len(owners) == 1 for owners in got.values())


# -- listing ------------------------------------------------------------------------------


def test_entities_are_listed_by_id_in_keyset_pages_and_counted_by_state(any_store: Store) -> None:
    for i in range(5):
        new(any_store, f"e{i}")
    claim(any_store, "w1", limit=2)
    assert [s.id for s in any_store.entities("job", limit=3)] == ["e0", "e1", "e2"]
    assert [s.id for s in any_store.entities("job", after_id="e2")] == ["e3", "e4"]
    assert [s.id for s in any_store.entities("job", state="running")] == ["e0", "e1"]
    assert any_store.entities("pipeline") == []
    assert any_store.count_states("job") == {"queued": 3, "running": 2}
