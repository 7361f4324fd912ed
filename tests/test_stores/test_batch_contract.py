"""The store contract of the batched work paths (issue 22): a claim of many entities, a
batch of outcomes of one shape, a round of renewals, each row fenced on its own.  Every
adapter, sync and async faces (the SQL stores write each batch in one statement)."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta

from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import LeaseLost, ManualClock, StaleVersion
from fsm.records import ClaimRequest, ClaimStart, Lease, LeaseChange, NewEntity, Snapshot, TransitionWrite
from stores import Store

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def claim(store: Store, owner: str, limit: int, budgets: tuple[tuple[str, timedelta], ...] = ()) -> list[Snapshot]:
    return store.claim(
        ClaimRequest(
            kind="job", owner=owner, limit=limit, ttl=TTL, starts=(START,), resumes=("finalizing",), budgets=budgets
        )
    )


def new(store: Store, *ids: str, state: str = "queued") -> None:
    store.create_many([NewEntity(id=i, kind="job", state=state) for i in ids])


def exited(snap: Snapshot, **changes: object) -> TransitionWrite:
    write = TransitionWrite(
        snap.id, "exited", "running", "finalizing", "worker", snap.version,
        expect_owner=snap.lease_owner, expect_token=snap.lease_token, before=snap, data_patch={"exit": 0},
    )  # fmt: skip
    return dataclasses.replace(write, **changes)  # type: ignore[arg-type]


def lease_of(snap: Snapshot) -> Lease:
    assert snap.lease is not None
    return snap.lease


# -- claim ------------------------------------------------------------------------------------


def test_one_claim_takes_resumes_first_then_the_longest_due_within_its_limit(
    any_store: Store, clock: ManualClock
) -> None:
    new(any_store, "f1", "f2", state="finalizing")  # reclaimed finalizers: no owner
    for name in ("q3", "q1", "q2"):
        new(any_store, name)
        clock.advance(timedelta(seconds=1))
    got = claim(any_store, "w1", limit=4)
    assert [s.id for s in got] == ["f1", "f2", "q3", "q1"]
    for snap in got[:2]:  # resumed: the lease taken back, no transition, its attempt kept
        assert (snap.state, snap.version, snap.lease_owner, snap.lease_token, snap.attempt) == (
            "finalizing", 0, "w1", 1, 0,
        )  # fmt: skip
        assert any_store.history(snap.id) == []
        (renewal,) = any_store.renewals(snap.id)
        assert renewal.acquired and renewal.token == 1 and renewal.owner == "w1"
    for snap in got[2:]:  # started: the transition and its history row, attempt + 1
        assert (snap.state, snap.version, snap.lease_owner, snap.lease_token, snap.attempt) == (
            "running", 1, "w1", 1, 1,
        )  # fmt: skip
        assert snap.lease_expires_at == clock.now() + TTL
        (record,) = any_store.history(snap.id)
        assert (record.event, record.source, record.target, record.owner, record.lease_token) == (
            "start", "queued", "running", "w1", 1,
        )  # fmt: skip
        assert any_store.get(snap.id) == snap
    assert [s.id for s in claim(any_store, "w2", limit=4)] == ["q2"]
    assert claim(any_store, "w3", limit=4) == []


def test_a_claim_never_resumes_a_finalizer_whose_budget_is_spent(any_store: Store, clock: ManualClock) -> None:
    new(any_store, "old", state="finalizing")
    clock.advance(timedelta(minutes=2))
    new(any_store, "young", state="finalizing")
    clock.advance(timedelta(minutes=1, seconds=30))
    budget = timedelta(minutes=3)  # old's is spent (entered 3.5 min ago), young's is not
    got = claim(any_store, "w1", limit=2, budgets=(("finalizing", budget),))
    assert [s.id for s in got] == ["young"]
    young = got[0]
    assert young.lease_expires_at == min(clock.now() + TTL, young.state_entered_at + budget)
    old = any_store.get("old")
    assert (old.lease_owner, old.lease_token) == (None, 0)


def test_concurrent_claims_of_resumes_and_starts_never_take_one_entity_twice(any_store: Store) -> None:
    new(any_store, *(f"f{i:02d}" for i in range(15)), state="finalizing")
    new(any_store, *(f"q{i:02d}" for i in range(25)))
    got: dict[str, list[str]] = {}
    lock = threading.Lock()

    def worker(owner: str) -> None:
        while True:
            batch = claim(any_store, owner, limit=4)
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
    assert sorted(got) == sorted([f"f{i:02d}" for i in range(15)] + [f"q{i:02d}" for i in range(25)])
    assert all(len(owners) == 1 for owners in got.values())
    for entity_id, (owner,) in got.items():
        snap = any_store.get(entity_id)
        assert snap.lease_owner == owner and snap.lease_token == 1
        assert len(any_store.history(entity_id)) == (0 if entity_id.startswith("f") else 1)


# -- apply_many: one shape, each row fenced on its own -------------------------------------------


def test_a_stale_row_inside_a_batch_is_refused_while_the_others_commit(any_store: Store) -> None:
    new(any_store, "a", "b", "c", "d")
    held = {s.id: s for s in claim(any_store, "w1", limit=4)}
    any_store.release_lease("d", owner="w1", token=held["d"].lease_token)
    batch = [
        exited(held["a"]),
        exited(held["b"], expect_version=0, before=None),  # stale: b is at version 1
        exited(held["c"], expect_token=7),  # a token that is not the holder's
        exited(held["d"]),  # released: no holder any more
    ]
    results = any_store.apply_many(batch)
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], StaleVersion) and (results[1].expected, results[1].found) == (0, 1)
    assert isinstance(results[2], LeaseLost) and isinstance(results[3], LeaseLost)
    a, record = results[0]
    assert (a.state, a.version, record.seq, record.data) == ("finalizing", 2, 2, {"exit": 0})
    assert any_store.get("a") == a and any_store.history("a")[-1] == record
    for entity_id in ("b", "c"):
        assert any_store.get(entity_id) == held[entity_id]  # the refused rows are unchanged
        assert len(any_store.history(entity_id)) == 1


def test_outcomes_of_several_shapes_and_data_land_in_one_batch(any_store: Store) -> None:
    new(any_store, "a", "b", "c")
    held = {s.id: s for s in claim(any_store, "w1", limit=3)}
    complete = TransitionWrite(
        "b", "fail", "running", "failed", "worker", 1, expect_owner="w1", expect_token=1,
        lease_change=LeaseChange.CLEAR, data={"why": "broken"}, error={"type": "RuntimeError", "message": "x"},
    )  # fmt: skip
    retry = TransitionWrite(
        "c", "retry", "running", "queued", "worker", 1, expect_owner="w1", expect_token=1,
        lease_change=LeaseChange.CLEAR, run_after=timedelta(seconds=30),
    )  # fmt: skip
    results = any_store.apply_many([exited(held["a"]), complete, retry])
    assert all(not isinstance(r, Exception) for r in results), results
    (a, _), (b, hb), (c, _) = results  # type: ignore[misc]
    assert a.lease_owner == "w1" and a.data == {}
    assert (b.state, b.lease_owner, b.lease_expires_at, b.data) == ("failed", None, None, {"why": "broken"})
    assert hb.error == {"type": "RuntimeError", "message": "x"} and hb.owner == "w1"
    assert c.state == "queued" and c.run_after == any_store.now() + timedelta(seconds=30)
    for snap in (a, b, c):
        assert any_store.get(snap.id) == snap


# -- renew_leases: one round, each lease guarded by its own token and its state's budget ----------


def test_one_round_renews_each_lease_within_its_own_states_budget(any_store: Store, clock: ManualClock) -> None:
    new(any_store, "r")
    new(any_store, "f", state="finalizing")
    r, f = sorted(claim(any_store, "w1", limit=2), key=lambda s: s.id, reverse=True)
    assert (r.id, f.id) == ("r", "f")
    clock.advance(timedelta(minutes=1))
    budgets = (("running", timedelta(minutes=2)),)  # finalizing: no budget
    answers = any_store.renew_leases(
        [lease_of(r), lease_of(f), lease_of(r)._replace(token=9)], ttl=TTL, budgets=budgets
    )
    renewed_r, renewed_f, stranger = answers
    assert isinstance(renewed_r, Snapshot) and isinstance(renewed_f, Snapshot)
    assert renewed_r.lease_expires_at == r.state_entered_at + timedelta(minutes=2)  # capped by its budget
    assert renewed_f.lease_expires_at == clock.now() + TTL  # no budget: the full TTL
    assert isinstance(stranger, LeaseLost)
    assert any_store.renewals("r")[-1].expires_at == renewed_r.lease_expires_at
    assert (renewed_r.version, renewed_f.version) == (1, 0)  # a renewal is not a transition
