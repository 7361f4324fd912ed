"""``Store.apply_group`` on every store: the writes and the creates commit together or not
at all, and hostile input is refused with a typed error, every row, history row,
idempotency key, feed entry and concurrency key left as it was."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fsm.errors import FsmError, IdempotencyKeyReused, StaleVersion
from fsm.records import NewEntity, TransitionWrite
from stores.base import Store


def _write(entity_id: str = "r1", version: int = 0, **given: Any) -> TransitionWrite:
    return TransitionWrite(entity_id, "begin", "queued", "checks", "worker", expect_version=version, **given)


def _new(entity_id: Any = "n1", **given: Any) -> NewEntity:
    given.setdefault("kind", "release.build")
    given.setdefault("state", "compiling")
    return NewEntity(id=entity_id, **given)


class Weird:
    pass


HOSTILE: dict[str, tuple[Any, Any]] = {
    "NaN in created data": ([_write()], [_new(data={"x": float("nan")})]),
    "a set in created data": ([_write()], [_new(data={"x": {1, 2}})]),
    "an object in a write's data": ([_write(data={"x": Weird()})], []),
    "NUL in an id": ([_write()], [_new("a\x00b")]),
    "a surrogate in an id": ([_write()], [_new("a\ud800")]),
    "a surrogate in data": ([_write()], [_new(data={"x": "\udfff"})]),
    "a surrogate key in data": ([_write()], [_new(data={"\ud800": 1})]),
    "NUL in a kind": ([_write()], [_new(kind="k\x00")]),
    "an int id": ([_write()], [_new(7)]),
    "a float id": ([_write()], [_new(1.5)]),
    "one id created twice": ([_write()], [_new("d"), _new("d")]),
    "a write for an id it creates": ([_write()], [_new("r1/x"), _new("r1")]),
    "an id that exists": ([_write(idempotency_key="k1")], [_new("ck", concurrency_key="c"), _new("existing")]),
    "a stale second write": ([_write(idempotency_key="k2"), _write(version=0)], [_new("zz", concurrency_key="c")]),
    "an unknown entity": ([_write(), _write("ghost")], [_new("q")]),
    "a generator": ((w for w in [_write()]), []),
    "a dict of creates": ([_write()], {"a": _new()}),
    "None": (None, None),
    "nothing at all": ([], []),
    "a due time that is text": ([_write()], [_new(run_after="tomorrow")]),
    "a huge priority": ([_write()], [_new(priority=10**30)]),
    "a bool version": ([_write(version=True)], []),
    "a negative version": ([_write(version=-1)], []),
    "a huge version": ([_write(version=2**70)], []),
    "a huge delay": ([_write(run_after=timedelta(days=10**8))], []),
    "restart that is not a bool": ([_write(restart="yes")], []),
    "two actives of one unique key": (
        [_write()],
        [
            _new("u1", concurrency_key="k", unique_finals=("built",)),
            _new("u2", concurrency_key="k", unique_finals=("built",)),
        ],
    ),
}


def _seen(store: Store) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for entity_id in ("r1", "existing", "ck", "zz", "n1", "d", "u1", "u2", "q"):
        try:
            snap = store.get(entity_id, include_deleted=True)
            found[entity_id] = (snap.state, snap.version, len(store.history(entity_id)))
        except FsmError:
            found[entity_id] = None
    found["feed"] = len(store.feed(None, limit=500))
    found["keys"] = [store.find_transition("r1", k) is not None for k in ("k1", "k2")]
    return found


def _seed(store: Store) -> None:
    for entity_id in ("r1", "existing"):
        store.create(NewEntity(id=entity_id, kind="release", state="queued", data={}))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_refused_typed_and_changes_nothing(any_store: Store, case: str) -> None:
    _seed(any_store)
    before = _seen(any_store)
    writes, creates = HOSTILE[case]
    with pytest.raises(FsmError):
        any_store.apply_group(writes, creates)  # type: ignore[attr-defined]
    assert _seen(any_store) == before
    # the concurrency-key index is as it was: a unique create of a key the refused call used lands
    any_store.create(_new("later", concurrency_key="c", unique_finals=("built",)))


def test_writes_and_creates_commit_together(any_store: Store) -> None:
    _seed(any_store)
    done, made = any_store.apply_group(  # type: ignore[attr-defined]
        [_write(idempotency_key="k"), _write("existing")], [_new("r1/build", parent_id="r1")]
    )
    assert [new.state for new, _ in done] == ["checks", "checks"]
    assert [m.id for m in made] == ["r1/build"] and any_store.get("r1/build").parent_id == "r1"
    with pytest.raises(IdempotencyKeyReused):  # the key recorded with its write
        any_store.apply_group([_write(version=1, idempotency_key="k")], [])  # type: ignore[attr-defined]
    with pytest.raises(StaleVersion):
        any_store.apply_group([_write()], [_new("r1/tests")])  # type: ignore[attr-defined]
    with pytest.raises(FsmError):
        any_store.get("r1/tests")


def test_a_restart_write_starts_the_counters_over(any_store: Store) -> None:
    any_store.create(NewEntity(id="r1/tests", kind="release.tests", state="testing", data={}))
    move = TransitionWrite("r1/tests", "test_start", "testing", "run", "worker", expect_version=0, bump_attempt=True)
    any_store.apply(move)
    assert any_store.get("r1/tests").attempt == 1
    again = TransitionWrite("r1/tests", "fix", "run", "testing", "worker", expect_version=1, restart=True)
    any_store.apply_group([again], [])  # type: ignore[attr-defined]
    row = any_store.get("r1/tests")
    assert (row.state, row.attempt, row.reclaims) == ("testing", 0, 0)


def test_a_restart_write_retried_after_its_snapshot_went_stale_still_starts_over(any_store: Store) -> None:
    from fsm.records import LeaseChange

    any_store.create(NewEntity(id="x", kind="k", state="a", data={}))
    started, _ = any_store.apply(
        TransitionWrite(
            "x", "start", "a", "b", "worker", expect_version=0, lease_change=LeaseChange.ACQUIRE,
            new_owner="w1", lease_ttl=timedelta(seconds=1), bump_attempt=True,
        )
    )  # fmt: skip
    any_store.release_lease("x", owner="w1", token=started.lease_token)
    held = any_store.get("x")  # the caller's snapshot: no lease, attempt 1
    # a lease taken since moves no version (SQLite's write judged on the snapshot is retried)
    any_store.acquire_lease("x", owner="w2", ttl=timedelta(seconds=60), budget=None, expect_version=held.version)
    again = TransitionWrite(
        "x", "redo", "b", "a", "worker", expect_version=held.version, lease_change=LeaseChange.CLEAR,
        restart=True, before=held,
    )  # fmt: skip
    [(new, _)], _ = any_store.apply_group([again], [])  # type: ignore[attr-defined]
    row = any_store.get("x")
    assert (new.attempt, row.attempt, row.reclaims, row.lease_owner) == (0, 0, 0, None)
