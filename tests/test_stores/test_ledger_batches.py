"""The ledger's asks in batches: many holders and records read, many records written at once.

A worker's handlers each ask the ledger twice per durable step (the holder and record
before the effect, the record after); the worker's completer hands the asks of many
handlers to the store together (``holders_and_effects``, ``record_effects``: one
statement each on PostgreSQL).  Each item is answered as its single call would answer it,
under its own lease, and one bad item leaves the others alone.  The contract on every
synchronous store.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm import InvalidArgument, LeaseLost, UnknownEntity
from fsm.records import EFFECT_FAILED, EFFECT_SUCCEEDED, ClaimRequest, ClaimStart, Lease, NewEntity
from stores import Store
from stores.ledger import MAX_LEDGER_BATCH, EffectWrite

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


def held(store: Store, *ids: str, owner: str = "w1") -> dict[str, Lease]:
    for entity_id in ids:
        store.create(NewEntity(id=entity_id, kind="job", state="queued"))
    request = ClaimRequest(kind="job", owner=owner, limit=len(ids), ttl=TTL, starts=(START,))
    leases = {s.id: s.lease for s in store.claim(request)}
    assert set(leases) == set(ids)
    return {k: v for k, v in leases.items() if v is not None}


def write(lease: Lease, entity_id: str, key: str, result: object = None, **kw: object) -> EffectWrite:
    return EffectWrite(entity_id, key, lease.owner, lease.token, kw.pop("status", EFFECT_SUCCEEDED), result, **kw)  # type: ignore[arg-type]


def test_records_in_one_batch_are_each_written_under_their_own_lease(any_store: Store) -> None:
    leases = held(any_store, "a", "b", "c")
    stale = leases["b"]._replace(token=leases["b"].token + 7)
    done = any_store.record_effects(  # type: ignore[attr-defined]
        [
            write(leases["a"], "a", "k1", {"n": 1}),
            write(stale, "b", "k1", {"n": 2}),  # not b's lease: refused, nothing written
            write(leases["c"], "c", "fsm:step:running:run:0", [1, 2]),  # a step row: records take them
            EffectWrite("ghost", "k1", "w1", 1, EFFECT_SUCCEEDED, 1),
        ]
    )
    (a, a_new), lost, (c, c_new), ghost = done
    assert a_new and c_new and a.result == {"n": 1} and c.result == [1, 2]
    assert a.lease_token == leases["a"].token and a.attempts == 1
    assert isinstance(lost, LeaseLost) and isinstance(ghost, UnknownEntity)
    assert any_store.effect("a", "k1") == a and any_store.effect("b", "k1") is None
    assert any_store.effect("c", "fsm:step:running:run:0") == c


def test_the_first_result_wins_and_a_failure_is_replaced_only_when_asked(any_store: Store) -> None:
    leases = held(any_store, "a", "b")
    any_store.record_effects(
        [write(leases["a"], "a", "k", 1), write(leases["b"], "b", "k", {"error": "x"}, status=EFFECT_FAILED)]
    )  # type: ignore[attr-defined]
    again, replaced, kept = any_store.record_effects(  # type: ignore[attr-defined]
        [
            write(leases["a"], "a", "k", 2),
            write(leases["b"], "b", "k", 3, replace=(EFFECT_FAILED,)),
            write(leases["a"], "a", "k", 4, replace=(EFFECT_FAILED,)),  # a success is never replaced
        ]
    )
    assert again[1] is False and again[0].result == 1
    assert replaced[1] is True and replaced[0].result == 3 and replaced[0].attempts == 2
    assert kept[1] is False and kept[0].result == 1


def test_holders_and_records_are_read_together_for_many_pairs(any_store: Store) -> None:
    leases = held(any_store, "a", "b")
    (record, _), *_ = any_store.record_effects([write(leases["a"], "a", "k", {"ok": True})])  # type: ignore[attr-defined]
    any_store.create(NewEntity(id="free", kind="job", state="queued"))
    found = any_store.holders_and_effects([("a", "k"), ("b", "k"), ("free", "k"), ("nobody", "k"), ("a", "other")])  # type: ignore[attr-defined]
    assert found[0] == (("w1", leases["a"].token), record)
    assert found[1] == (("w1", leases["b"].token), None)
    assert found[2] == ((None, 0), None)
    assert isinstance(found[3], UnknownEntity)
    assert found[4] == (("w1", leases["a"].token), None)
    assert found[:3] == [any_store.holder_and_effect(*pair) for pair in [("a", "k"), ("b", "k"), ("free", "k")]]  # type: ignore[attr-defined]


HOSTILE_PAIRS = [None, "ak", ("a",), ("a", "k", "x"), (42, "k"), ("a", None), ("a\x00", "k"), ("a", "\ud800"),
                 ("x" * 10_000, "k"), ("a", "fsm:renewals")]  # fmt: skip


@pytest.mark.parametrize("pair", HOSTILE_PAIRS)
def test_a_hostile_pair_is_refused_alone_with_a_typed_error(any_store: Store, pair: object) -> None:
    leases = held(any_store, "a")
    found = any_store.holders_and_effects([pair, ("a", "k")])  # type: ignore[attr-defined]
    assert isinstance(found[0], InvalidArgument)
    assert found[1] == (("w1", leases["a"].token), None)


def hostile_writes(lease: Lease) -> list[object]:
    good = write(lease, "a", "k")
    return [
        "junk",
        ("a", "k", lease.owner, lease.token, EFFECT_SUCCEEDED, 1),  # a tuple, not an EffectWrite
        good._replace(entity_id="a\x00"),
        good._replace(key=None),
        good._replace(key="fsm:renewals"),
        good._replace(owner=42),
        good._replace(token="1"),
        good._replace(token=2**70),
        good._replace(status="\ud800"),
        good._replace(result=float("nan")),
        good._replace(result={1, 2}),
        good._replace(result=object()),
        good._replace(result="x\x00"),
        good._replace(replace="failed"),
    ]


@pytest.mark.parametrize("n", range(14))
def test_a_hostile_write_is_refused_alone_and_writes_nothing(any_store: Store, n: int) -> None:
    leases = held(any_store, "a", "b")
    bad = hostile_writes(leases["a"])[n]
    done = any_store.record_effects([bad, write(leases["b"], "b", "k", {"fine": True})])  # type: ignore[attr-defined]
    assert isinstance(done[0], InvalidArgument), done[0]
    assert done[1][1] is True  # type: ignore[index]
    assert any_store.effects("a") == [] and any_store.effect("b", "k") is not None


@pytest.mark.parametrize("call", ["holders_and_effects", "record_effects"])
@pytest.mark.parametrize("items", [None, "ab", {"a": "k"}, 5])
def test_a_batch_that_is_no_list_is_refused(any_store: Store, call: str, items: object) -> None:
    with pytest.raises(InvalidArgument):
        getattr(any_store, call)(items)


def test_a_batch_over_the_limit_is_refused_before_anything_is_written(any_store: Store) -> None:
    leases = held(any_store, "a")
    too_many = [write(leases["a"], "a", f"k{i}") for i in range(MAX_LEDGER_BATCH + 1)]
    with pytest.raises(InvalidArgument):
        any_store.record_effects(too_many)  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument):
        any_store.holders_and_effects([("a", "k")] * (MAX_LEDGER_BATCH + 1))  # type: ignore[attr-defined]
    assert any_store.effects("a") == []
    assert any_store.record_effects([]) == [] and any_store.holders_and_effects([]) == []  # type: ignore[attr-defined]


def test_ids_keys_and_results_of_any_text_round_trip_through_a_batch(any_store: Store) -> None:
    """A batch travels as one JSON document on PostgreSQL: ids, keys and results with
    quotes, backslashes, brackets and non-ASCII text come back exactly as one call's."""
    ids = ['q"uote', "back\\slash", "ünï-🙂", "[1,2]"]
    leases = held(any_store, *ids)
    keys = {entity_id: f"k-{n}-{entity_id}" for n, entity_id in enumerate(ids)}
    results = [{"text": entity_id, "nested": ["\\", '"', "🙂"]} for entity_id in ids]
    done = any_store.record_effects(  # type: ignore[attr-defined]
        [write(leases[i], i, keys[i], r) for i, r in zip(ids, results, strict=True)]
    )
    assert [(d[0].entity_id, d[0].key, d[0].result, d[1]) for d in done] == [  # type: ignore[index]
        (i, keys[i], r, True) for i, r in zip(ids, results, strict=True)
    ]
    asked = any_store.holders_and_effects([(i, keys[i]) for i in ids])  # type: ignore[attr-defined]
    for entity_id, (holder, record) in zip(ids, asked, strict=True):
        assert holder == (leases[entity_id].owner, leases[entity_id].token)
        assert record == any_store.effect(entity_id, keys[entity_id])
