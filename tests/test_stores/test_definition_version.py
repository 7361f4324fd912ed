"""The store contract for lifecycle definition versions (``Snapshot.definition``).

Each row records the version of the lifecycle definition it was created, last claimed or
last migrated under; a claim of definition ``n`` takes only rows at ``n`` or below (or
rows written before versions were recorded, ``None``) and records ``n`` on every row it
takes, so a worker of an older definition never takes a row a newer one wrote.  Run
against every adapter, sync and async (``any_store``), and on a bound application table.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces
from conftest import SqlTarget

from fsm import FsmError, InvalidArgument, ManualClock
from fsm.id_write import IdWrite
from fsm.records import (
    MAX_DEFINITION,
    BatchWrite,
    ClaimLimits,
    ClaimRequest,
    ClaimStart,
    LeaseChange,
    NewEntity,
    Snapshot,
    TransitionWrite,
)
from stores import Store
from stores.sql import SqlStore
from stores.sql.binding import TableBinding, add_missing_columns

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)
HOSTILE: list[Any] = [True, False, 0, -1, MAX_DEFINITION + 1, 2**40, "2", 1.5, float("nan"), math.inf, [1]]


def new(store: Store, entity_id: str, definition: int | None, state: str = "queued", **fields: Any) -> Snapshot:
    return store.create(NewEntity(id=entity_id, kind="job", state=state, definition=definition, **fields))


def request(owner: str, definition: int | None, *, limits: ClaimLimits | None = None, limit: int = 10) -> ClaimRequest:
    return ClaimRequest(
        kind="job",
        owner=owner,
        limit=limit,
        ttl=TTL,
        starts=(START,),
        resumes=("finalizing",),
        limits=limits,
        definition=definition,
    )


LIMITS = [
    pytest.param(None, id="plain"),
    pytest.param(ClaimLimits(leased=("running", "finalizing"), per_key=5, total=50), id="limited"),
    pytest.param(ClaimLimits(leased=("running", "finalizing"), rate=(50, timedelta(minutes=1))), id="rated"),
]


def frozen(store: Store, entity_id: str) -> tuple[Snapshot, int]:
    """The row and how many history rows it has: what a refused write must leave alone."""
    return store.get(entity_id), len(store.history(entity_id))


# -- create and read -------------------------------------------------------------------------


def test_create_records_the_definition_and_get_returns_it(any_store: Store) -> None:
    assert new(any_store, "one", 1).definition == 1
    assert new(any_store, "none", None).definition is None
    assert new(any_store, "top", MAX_DEFINITION, priority=5).definition == MAX_DEFINITION  # the single-row insert
    assert [any_store.get(i).definition for i in ("one", "none", "top")] == [1, None, MAX_DEFINITION]
    assert [s.definition for s in any_store.entities("job")] == [None, 1, MAX_DEFINITION]  # by id


@pytest.mark.parametrize("kinds", [("job",), ("job", "other")], ids=["one-kind", "two-kinds"])
def test_create_many_records_each_rows_definition(any_store: Store, kinds: tuple[str, ...]) -> None:
    batch = [
        NewEntity(id=f"b{n}", kind=kinds[n % len(kinds)], state="queued", definition=d, data={"n": n})
        for n, d in enumerate([3, None, 7, 3])
    ]
    made = any_store.create_many(batch)
    assert [s.definition for s in made] == [3, None, 7, 3]
    assert [any_store.get(f"b{n}").definition for n in range(4)] == [3, None, 7, 3]
    plain = any_store.create_many([NewEntity(id=f"p{n}", kind="job", state="queued") for n in range(3)])
    assert [s.definition for s in plain] == [None, None, None]
    assert [any_store.get(f"p{n}").definition for n in range(3)] == [None, None, None]


# -- claims ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", LIMITS)
def test_a_claim_of_an_older_definition_skips_rows_a_newer_one_wrote(
    any_store: Store, limits: ClaimLimits | None
) -> None:
    new(any_store, "same", 1)
    new(any_store, "unknown", None)
    new(any_store, "newer", 2)
    new(any_store, "resume-same", 1, state="finalizing")
    new(any_store, "resume-newer", 2, state="finalizing")
    before = {i: frozen(any_store, i) for i in ("newer", "resume-newer")}
    taken = any_store.claim(request("w1", 1, limits=limits))
    assert sorted(s.id for s in taken) == ["resume-same", "same", "unknown"]
    assert {s.id: s.definition for s in taken} == {"resume-same": 1, "same": 1, "unknown": None}
    assert {i: frozen(any_store, i) for i in before} == before  # left as they were: no lease, no move
    assert any_store.claim(request("w2", 1, limits=limits)) == []  # nothing more an old worker may take
    assert sorted(s.id for s in any_store.claim(request("w3", 2, limits=limits))) == ["newer", "resume-newer"]


@pytest.mark.parametrize("limits", LIMITS)
def test_a_claim_of_a_newer_definition_leaves_each_rows_own_version(
    any_store: Store, limits: ClaimLimits | None
) -> None:
    """A row's version is the shape of its state and data (created or migrated under it):
    a newer worker claiming an older row does not migrate it, so the row keeps its own and
    an older worker may take it back once released."""
    new(any_store, "old", 1)
    new(any_store, "unknown", None)
    new(any_store, "resume-old", 1, state="finalizing")
    new(any_store, "resume-unknown", None, state="finalizing")
    taken = {s.id: s for s in any_store.claim(request("w2", 2, limits=limits))}
    assert sorted(taken) == ["old", "resume-old", "resume-unknown", "unknown"]
    for entity_id, snap in taken.items():
        stored = any_store.get(entity_id)
        assert snap.definition == stored.definition == (1 if "old" in entity_id else None), entity_id
        assert stored.lease_owner == "w2" and stored.lease_token == 1, entity_id
    assert any_store.get("old").state == "running" and any_store.get("resume-old").state == "finalizing"
    for entity_id, snap in taken.items():
        any_store.release_lease(entity_id, owner="w2", token=snap.lease_token)
    assert sorted(s.id for s in any_store.claim(request("w1", 1, limits=limits))) == ["resume-old", "resume-unknown"]


@pytest.mark.parametrize("limits", LIMITS)
def test_a_claim_without_a_definition_takes_every_row_and_keeps_theirs(
    any_store: Store, limits: ClaimLimits | None
) -> None:
    new(any_store, "one", 1)
    new(any_store, "two", 2)
    new(any_store, "unknown", None)
    new(any_store, "resume-two", 2, state="finalizing")
    taken = {s.id: s.definition for s in any_store.claim(request("w", None, limits=limits))}
    assert taken == {"one": 1, "two": 2, "unknown": None, "resume-two": 2}
    assert {i: any_store.get(i).definition for i in taken} == taken


def test_a_limited_claim_gives_no_slot_to_a_row_it_may_not_take(any_store: Store, clock: ManualClock) -> None:
    limits = ClaimLimits(leased=("running",), per_key=1)
    new(any_store, "x-newer", 2, concurrency_key="k")
    clock.advance(timedelta(seconds=1))
    new(any_store, "y-older", 1, concurrency_key="k")
    # the newer definition's row, due the longest, is not this claimer's: the key's one
    # slot goes to the row it may take
    (taken,) = any_store.claim(request("w1", 1, limits=limits))
    assert (taken.id, taken.definition, taken.state) == ("y-older", 1, "running")
    assert frozen(any_store, "x-newer")[0].lease_owner is None
    assert any_store.get("x-newer").version == 0


# -- transitions -----------------------------------------------------------------------------


@pytest.mark.parametrize("lean", [False, True], ids=["read-back", "from-before"])
def test_a_transition_with_a_definition_records_it_and_one_without_keeps_the_rows(any_store: Store, lean: bool) -> None:
    snap = new(any_store, "e", 1)
    kept, _ = any_store.apply(
        TransitionWrite("e", "start", "queued", "running", "worker", 0, before=snap if lean else None)
    )
    assert kept.definition == any_store.get("e").definition == 1
    moved, _ = any_store.apply(
        TransitionWrite(
            "e", "migrate", "running", "queued", "worker", 1, before=kept if lean else None,
            lease_change=LeaseChange.CLEAR, definition=4,
        )
    )  # fmt: skip
    assert moved.definition == any_store.get("e").definition == 4
    assert (moved.state, moved.version) == ("queued", 2)
    again, _ = any_store.apply(
        TransitionWrite(
            "e", "start", "queued", "running", "worker", 2, before=moved if lean else None,
            lease_change=LeaseChange.ACQUIRE, new_owner="w", lease_ttl=TTL,
        )
    )  # fmt: skip
    assert again.definition == any_store.get("e").definition == 4


def test_apply_many_records_a_definition_where_given_and_keeps_the_rest(any_store: Store) -> None:
    snaps = [new(any_store, f"e{n}", 1) for n in range(4)]
    results = any_store.apply_many(
        [
            TransitionWrite(
                s.id, "start", "queued", "running", "worker", 0, before=s, definition=(3 if n % 2 else None)
            )
            for n, s in enumerate(snaps)
        ]
    )
    assert [r[0].definition for r in results if not isinstance(r, FsmError)] == [1, 3, 1, 3]
    assert [any_store.get(s.id).definition for s in snaps] == [1, 3, 1, 3]


def test_a_stale_write_with_a_definition_records_nothing(any_store: Store) -> None:
    new(any_store, "e", 1)
    before = frozen(any_store, "e")
    with pytest.raises(FsmError):
        any_store.apply(TransitionWrite("e", "migrate", "queued", "queued", "worker", 7, definition=2))
    assert frozen(any_store, "e") == before


def test_the_reapers_batch_moves_keep_the_rows_definition(any_store: Store) -> None:
    for n, definition in enumerate([2, None, 5]):
        new(any_store, f"a{n}", definition)
        new(any_store, f"m{n}", definition, state="finalizing")
        new(any_store, f"b{n}", definition, state="running")
    moved = any_store.apply_batch(BatchWrite(("a0", "a1", "a2"), "job", "expire", "queued", "failed", "reaper"))
    assert {s.id: s.definition for s, _ in moved} == {"a0": 2, "a1": None, "a2": 5}
    claimed = any_store.move_candidates(BatchWrite((), "job", "fail", "finalizing", "failed", "reaper"), limit=10)
    assert {s.id: s.definition for s, _ in claimed} == {"m0": 2, "m1": None, "m2": 5}
    brief = getattr(any_store, "move_candidates_brief", None)
    if brief is not None:
        records = brief(BatchWrite((), "job", "fail", "running", "failed", "reaper"), limit=10)
        assert sorted(r.entity_id for r in records) == ["b0", "b1", "b2"]
    for prefix in "amb" if brief is not None else "am":
        got = [(any_store.get(f"{prefix}{n}").state, any_store.get(f"{prefix}{n}").definition) for n in range(3)]
        assert got == [("failed", 2), ("failed", None), ("failed", 5)], prefix


@pytest.mark.parametrize(
    "moves",
    [
        (("queued", "running"),),
        (("queued", "running"), ("running", "done")),
        (("queued", "failed"), ("running", "failed")),
    ],
    ids=["one-move", "two-moves", "shared-target"],
)
def test_a_fire_by_id_keeps_the_rows_definition(any_store: Store, moves: tuple[tuple[str, str], ...]) -> None:
    fire = getattr(any_store, "apply_by_id", None)
    if fire is None:
        pytest.skip("the async faces do not fire by id")
    new(any_store, "e", 6)
    applied = fire(IdWrite("e", "job", "go", "worker", moves))
    assert applied is not None
    snap, _ = applied
    assert (snap.state, snap.definition) == (moves[0][1], 6)
    assert (any_store.get("e").state, any_store.get("e").definition) == (moves[0][1], 6)


# -- hostile values --------------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_hostile_definition_is_refused_with_a_typed_error_and_nothing_is_written(
    any_store: Store, value: Any
) -> None:
    snap = new(any_store, "e", 1)
    new(any_store, "r", None, state="finalizing")
    rows = {i: frozen(any_store, i) for i in ("e", "r")}
    with pytest.raises(InvalidArgument):
        any_store.create(NewEntity("x", "job", "queued", definition=value))
    with pytest.raises(InvalidArgument):
        any_store.create_many([NewEntity("y", "job", "queued"), NewEntity("z", "job", "queued", definition=value)])
    for lean in (None, snap):
        with pytest.raises(InvalidArgument):
            any_store.apply(
                TransitionWrite("e", "start", "queued", "running", "worker", 0, before=lean, definition=value)
            )
    with pytest.raises(InvalidArgument):
        any_store.apply_many([TransitionWrite("e", "start", "queued", "running", "worker", 0, definition=value)])
    for limits in (None, ClaimLimits(leased=("running",), total=5)):
        with pytest.raises(InvalidArgument):
            any_store.claim(request("w", value, limits=limits))
    assert {i: frozen(any_store, i) for i in rows} == rows
    assert [s.id for s in any_store.entities("job")] == ["e", "r"]


def test_the_bounds_of_a_definition_are_taken(any_store: Store) -> None:
    assert new(any_store, "low", 1).definition == 1
    assert new(any_store, "high", MAX_DEFINITION).definition == MAX_DEFINITION == 2**31 - 1
    below = {s.id: s.definition for s in any_store.claim(request("v", MAX_DEFINITION - 1))}
    assert below == {"low": 1}  # "high" is newer than it
    taken = {s.id: s.definition for s in any_store.claim(request("w", MAX_DEFINITION))}
    assert taken == {"high": MAX_DEFINITION}


# -- a bound application table ---------------------------------------------------------------

STATUS = {"queued": "Queued", "running": "Running", "finalizing": "Running", "done": "Done", "failed": "Failed"}


@pytest.fixture(params=["status", "plain"])
def bound(request: pytest.FixtureRequest, sql_target: SqlTarget, clock: ManualClock) -> Iterator[SqlStore]:
    """A store on an application's own table (with a status column the store keeps in sync,
    or without), its columns added by ``add_missing_columns``."""
    table = f"jobs_{uuid.uuid4().hex[:8]}"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    status = request.param == "status"
    with engine.begin() as conn:
        extra = ", status TEXT NOT NULL DEFAULT 'Queued'" if status else ""
        stamp = "TEXT" if sql_target.dialect == "sqlite" else "TIMESTAMPTZ"
        conn.execute(sa.text(f'CREATE TABLE {table} (job_id TEXT PRIMARY KEY, "updatedAt" {stamp} NOT NULL{extra})'))
    binding = TableBinding(
        table=table,
        kind="job",
        columns={"id": "job_id", "updated_at": "updatedAt"},
        status_column="status" if status else None,
        status_of=STATUS if status else {},
    )
    add_missing_columns(engine, binding)
    store = sql_target.store(binding=binding, clock=clock)  # closed by sql_target
    assert isinstance(store, SqlStore)
    yield store
    if sql_target.dialect == "postgres":
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))


def test_a_bound_table_records_and_returns_the_definition(bound: SqlStore) -> None:
    assert bound.binding is not None
    assert "fsm_definition" in {c["name"] for c in sa.inspect(bound.engine).get_columns(bound.binding.table)}
    assert new(bound, "one", 1).definition == bound.get("one").definition == 1
    assert new(bound, "none", None).definition is None
    made = bound.create_many([NewEntity("m1", "job", "queued", definition=3), NewEntity("m2", "job", "queued")])
    assert [s.definition for s in made] == [3, None]
    assert [bound.get(i).definition for i in ("none", "m1", "m2")] == [None, 3, None]
    moved, _ = bound.apply(TransitionWrite("one", "migrate", "queued", "queued", "worker", 0, definition=2))
    assert moved.definition == bound.get("one").definition == 2
    kept, _ = bound.apply(TransitionWrite("one", "start", "queued", "running", "worker", 1, before=moved))
    assert kept.definition == bound.get("one").definition == 2


@pytest.mark.parametrize("limits", LIMITS)
def test_a_bound_tables_claim_skips_newer_rows_and_keeps_each_rows_version(
    bound: SqlStore, limits: ClaimLimits | None
) -> None:
    new(bound, "old", 1)
    new(bound, "unknown", None)
    new(bound, "newer", 3)
    new(bound, "resume-old", 1, state="finalizing")
    new(bound, "resume-newer", 3, state="finalizing")
    before = {i: frozen(bound, i) for i in ("newer", "resume-newer")}
    taken = {s.id: s.definition for s in bound.claim(request("w", 2, limits=limits))}
    assert taken == {"old": 1, "unknown": None, "resume-old": 1}
    assert {i: bound.get(i).definition for i in taken} == taken
    # (the state is not checked: a limited claim leaves a bound status column as it was)
    assert [(bound.get(i).lease_owner, bound.get(i).lease_token) for i in taken] == [("w", 1)] * 3
    assert {i: frozen(bound, i) for i in before} == before
