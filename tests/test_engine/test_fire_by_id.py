"""A fire by id that the store judges (no read first): the same results and errors as the
read-first path, one statement on PostgreSQL, and two racing fires never both win."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import STORE_FACTORIES, SqlTarget
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.engine.by_id import id_plans
from fsm.errors import FsmError, InvalidArgument, MalformedRow, TransitionNotAllowed
from fsm.id_write import IdWrite
from fsm.lifecycle import Lifecycle
from fsm.records import Actor, Lease, LeaseChange
from stores import MemoryStore, Store

LIFECYCLES: dict[str, type[Lifecycle]] = {"job": JobLifecycle, "pipeline": PipelineLifecycle}
OWNER = "w1"


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store_pair(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[tuple[Store, Store]]:
    """Two stores of one adapter on one clock: one fires by id, the other reads first."""
    pair = (STORE_FACTORIES[request.param](clock), STORE_FACTORIES[request.param](clock))
    yield pair
    for store in pair:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def _read_first(lifecycle: type[Lifecycle], store: Store, clock: ManualClock) -> Engine:
    engine = Engine(lifecycle, store, clock=clock, owner=OWNER)
    engine._by_id = None  # the path every fire by id took before: read, judge, compare-and-set
    return engine


def _fired(engine: Engine, entity_id: str, event: str, kwargs: dict[str, Any]) -> Any:
    try:
        result = engine.fire(entity_id, event, **kwargs)
    except FsmError as err:
        return type(err).__name__, str(err)
    return result.snapshot, result.record


def _steps(lifecycle: type[Lifecycle]) -> st.SearchStrategy[list[Any]]:
    fire = st.tuples(
        st.just("fire"),
        st.sampled_from([0, 0, 0, 1, 2, 3]),  # which entity (2: one of the other lifecycle, 3: no such id)
        st.sampled_from(lifecycle.table.events),
        st.sampled_from([Actor.WORKER, Actor.WORKER, Actor.REAPER]),
        st.sampled_from(["current", "current", "none", "stale", "other-owner"]),
        st.booleans(),  # a handler's error and backoff, and a reason
    )
    other = st.one_of(
        st.tuples(st.just("advance")),
        st.tuples(st.just("delete"), st.integers(0, 1)),
        st.tuples(st.just("release"), st.integers(0, 1)),
    )
    return st.lists(st.one_of(fire, fire, fire, fire, other), min_size=1, max_size=12)


def _check_same(lifecycle: type[Lifecycle], pair: tuple[Store, Store], clock: ManualClock, steps: list[Any]) -> None:
    by_id = Engine(lifecycle, pair[0], clock=clock, owner=OWNER)
    assert by_id._by_id is not None and by_id._id_plans
    old = _read_first(lifecycle, pair[1], clock)
    ids = [uuid.uuid4().hex for _ in range(4)]
    other = next(lc for lc in LIFECYCLES.values() if lc is not lifecycle)
    for engine in (by_id, old):
        for i in ids[:2]:
            engine.create(i)
        Engine(other, engine.store, clock=clock).create(ids[2])
    leases: dict[str, Lease | None] = {}
    for step in steps:
        if step[0] == "advance":
            clock.advance(timedelta(hours=7))  # past every lease and renewal budget
            continue
        if step[0] == "delete":
            got = [_deleted(s, ids[step[1]]) for s in pair]
            assert got[0] == got[1]
            continue
        if step[0] == "release":
            lease = leases.get(ids[step[1]])
            if lease is not None:
                got = [_released(e, lease) for e in (by_id, old)]
                assert got[0] == got[1]
            continue
        _, which, event, actor, lease_choice, extra = step
        entity_id = ids[which]
        lease = leases.get(entity_id)
        if lease_choice == "none" or lease is None:
            given_lease = None
        elif lease_choice == "stale":
            given_lease = lease._replace(token=lease.token + 1)
        elif lease_choice == "other-owner":
            given_lease = lease._replace(owner="somebody-else")
        else:
            given_lease = lease
        kwargs: dict[str, Any] = {"lease": given_lease, "actor": actor}
        if extra:
            kwargs.update(error={"type": "Boom", "message": "x"}, run_after=timedelta(seconds=30), reason="because")
        got = [_fired(e, entity_id, event, kwargs) for e in (by_id, old)]
        assert got[0] == got[1], (step, got)
        if not isinstance(got[0][0], str):
            snap = got[0][0]
            owner = snap.lease_owner
            leases[entity_id] = Lease(entity_id, owner, snap.lease_token, snap.lease_expires_at) if owner else None
    for i in ids[:2]:
        assert pair[0].get(i, include_deleted=True) == pair[1].get(i, include_deleted=True)
        assert pair[0].history(i) == pair[1].history(i)
        assert [r.seq for r in pair[0].history(i)] == list(range(1, pair[0].get(i, include_deleted=True).version + 1))


def _deleted(store: Store, entity_id: str) -> Any:
    try:
        return store.soft_delete(entity_id)
    except FsmError as err:
        return type(err).__name__, str(err)


def _released(engine: Engine, lease: Lease) -> Any:
    """A release's outcome (it moves the lease without a version: fires by id must see it)."""
    try:
        return engine.release_lease(lease)
    except FsmError as err:
        return type(err).__name__, str(err)


@pytest.mark.parametrize("name", sorted(LIFECYCLES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_by_id_gives_the_read_first_results_and_errors(
    name: str, store_pair: tuple[Store, Store], clock: ManualClock, data: st.DataObject
) -> None:
    lifecycle = LIFECYCLES[name]
    _check_same(lifecycle, store_pair, clock, data.draw(_steps(lifecycle)))


def test_every_built_in_worker_event_is_covered(store_pair: tuple[Store, Store], clock: ManualClock) -> None:
    """Each worker event of the built-in lifecycles, from each source, by both paths."""
    for lifecycle in LIFECYCLES.values():
        for (leaf, event), branches in lifecycle.table.branches.items():
            if not any(b.actor is Actor.WORKER for b in branches):
                continue
            steps: list[Any] = []
            # walk the entity into ``leaf`` first (start, then exited/finish), then fire
            path = {"queued": [], "running": ["start"], "finalizing": ["start", "finish", "exited"]}[leaf]
            for walk in path:
                if walk in lifecycle.table.events:
                    steps.append(("fire", 0, walk, Actor.WORKER, "current", False))
            for lease_choice in ("stale", "other-owner", "none", "current"):
                steps.append(("fire", 0, event, Actor.WORKER, lease_choice, lease_choice == "current"))
            _check_same(lifecycle, store_pair, clock, steps)


def test_plans_come_from_the_table() -> None:
    """Derived, not listed: one-branch events and a lease-guarded one are judged by the store;
    one reaper event guarded by time is not, nor moves of two shapes (one holding the lease)."""
    plans = id_plans(PipelineLifecycle.table)
    assert plans[("start", Actor.WORKER, False)].moves == (("queued", "running"),)
    assert plans[("succeed", Actor.WORKER, True)].moves == (("finalizing", "completed"),)
    assert ("succeed", Actor.WORKER, False) not in plans  # holds_lease without a lease: GuardRejected on a read
    assert ("expire", Actor.REAPER, False) not in plans  # lease_stale is the reaper's (it reads)
    assert plans[("fail", Actor.WORKER, False)].moves == (("running", "failed"),)  # finalizing needs the lease
    assert ("fail", Actor.WORKER, True) not in plans  # from running it needs no lease, from finalizing it does
    job = id_plans(JobLifecycle.table)
    assert job[("retry", Actor.WORKER, True)].moves == (("running", "queued"), ("finalizing", "finalizing"))
    assert job[("fail", Actor.WORKER, True)].moves == (("running", "failed"), ("finalizing", "failed"))  # one target


class Statements:
    """Counts the statements the store's connection of this thread runs during a block."""

    def __init__(self, store: Any) -> None:
        self.slot = store._conns.slot()
        self.texts: list[str] = []

    def __enter__(self) -> Statements:
        cursor, texts = self.slot.cursor, self.texts

        class Counting:
            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

            def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
                texts.append(sql.split(maxsplit=1)[0].upper())
                return cursor.execute(sql, *args, **kwargs)

        self.cursor = cursor
        self.slot.cursor = Counting()
        return self

    def __exit__(self, *_: object) -> None:
        self.slot.cursor = self.cursor


def test_a_store_judged_fire_makes_no_read(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    engine = Engine(PipelineLifecycle, store, owner=OWNER)
    entity = engine.create().id
    expected = ["WITH"] if sql_target.dialect == "postgres" else ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    for event, lease in (("start", None), ("finish", None), ("succeed", "held")):
        held = store.get(entity)
        given = Lease(entity, held.lease_owner, held.lease_token, held.lease_expires_at) if lease else None  # type: ignore[arg-type]
        with Statements(store) as seen:
            result = engine.fire(entity, event, lease=given)
        assert seen.texts == expected, (event, seen.texts)
        assert result.snapshot == store.get(entity)
    # two sources into one target (fail from running or finalizing): still one statement
    jobs = Engine(JobLifecycle, store, owner=OWNER)
    job = jobs.create().id
    started = jobs.fire(job, "start")
    shared = ["WITH"] if sql_target.dialect == "postgres" else ["BEGIN", "INSERT", "UPDATE", "COMMIT"]
    with Statements(store) as seen:
        failed = jobs.fire(job, "fail", lease=started.lease)
    assert seen.texts == shared
    assert (failed.record.source, failed.record.target, failed.snapshot) == ("running", "failed", store.get(job))
    assert store.history(job)[-1] == failed.record
    # a refusal reads the row once, to say why (as the read-first path would)
    with Statements(store) as seen, pytest.raises(TransitionNotAllowed, match="'completed' is final"):
        engine.fire(entity, "start")
    assert "SELECT" in seen.texts


def test_two_racing_fires_by_id_never_both_win(sql_target: SqlTarget) -> None:
    """Two threads (a connection each) fire ``start`` and then ``succeed`` with the one
    lease on the same entities at once: exactly one of each pair moves the row."""
    stores = [sql_target.store(), sql_target.store(create=False)]
    engines = [Engine(PipelineLifecycle, s, owner=OWNER) for s in stores]
    ids = [engines[0].create().id for _ in range(20)]
    for i in ids[10:]:
        engines[0].fire(i, "start")
        engines[0].fire(i, "finish")
    lease_of = {i: engines[0].get(i) for i in ids[10:]}
    barrier = threading.Barrier(2)
    outcomes: list[list[str]] = [[], []]

    def run(k: int) -> None:
        for i in ids:
            barrier.wait()
            snap = lease_of.get(i)
            try:
                if snap is None:
                    engines[k].fire(i, "start")
                else:
                    lease = Lease(i, snap.lease_owner, snap.lease_token, snap.lease_expires_at)  # type: ignore[arg-type]
                    engines[k].fire(i, "succeed", lease=lease)
                outcomes[k].append("won")
            except FsmError as err:
                outcomes[k].append(type(err).__name__)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, i in enumerate(ids):
        pair = sorted([outcomes[0][n], outcomes[1][n]])
        assert pair.count("won") == 1, (i, pair)
        history = stores[0].history(i)
        assert [r.seq for r in history] == list(range(1, len(history) + 1))
        assert len(history) == (1 if n < 10 else 3)


def test_apply_by_id_refuses_hostile_writes_with_a_typed_error(any_store: Store) -> None:
    good = IdWrite("x", "pipeline", "start", "worker", (("queued", "running"),))
    bad: list[Any] = [
        "not a write",
        good.__class__("x\x00", "pipeline", "start", "worker", (("queued", "running"),)),
        good.__class__("x", "pipeline", "start", "worker", ()),
        good.__class__("x", "pipeline", "start", "worker", (("queued", "\ud800"),)),
        good.__class__("x", "pipeline", "start", "worker", (("a", "b"), ("a", "c"))),
        good.__class__("x", "pipeline", "start", "worker", (("queued", "running"),), "o", None),
        good.__class__("x", "pipeline", "start", "worker", (("queued", "running"),), "o", -1),
        good.__class__("x", "pipeline", "start", "worker", (("queued", "running"),), lease_change="ACQ"),  # type: ignore[arg-type]
        good.__class__("x", "pipeline", "start", "worker", (("queued", "running"),), error={"x": float("nan")}),
        good.__class__("x", "pipeline", "start", "worker", (("queued", "running"),), run_after=5),  # type: ignore[arg-type]
    ]
    engine = Engine(PipelineLifecycle, any_store)
    engine.create("x")
    for write in bad:
        with pytest.raises(FsmError):
            any_store.apply_by_id(write)  # type: ignore[attr-defined]
    assert any_store.get("x").version == 0
    assert any_store.apply_by_id(good) is not None  # type: ignore[attr-defined]
    assert any_store.get("x").state == "running"
    with pytest.raises(InvalidArgument):
        odd = IdWrite("x", "pipeline", "s", "worker", (("a", "b"),), lease_change=LeaseChange.KEEP, holds=1)  # type: ignore[arg-type]
        any_store.apply_by_id(odd)  # type: ignore[attr-defined]


def test_a_store_subclass_overriding_apply_is_fired_through_it(clock: ManualClock) -> None:
    class Audited(MemoryStore):
        def apply(self, write: Any) -> Any:
            self.seen = write.event
            return super().apply(write)

    store = Audited(clock=clock)
    engine = Engine(PipelineLifecycle, store)
    assert engine._by_id is None
    engine.create("p")
    engine.fire("p", "start")
    assert store.seen == "start"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_async_engine_fires_by_id_through_the_store(kind: str, tmp_path: Any) -> None:
    """The async face runs the sync engine's logic: by id it writes through ``apply_by_id``
    (no read), and a refusal reads the row for the read-first error."""
    import asyncio

    from fsm import AsyncEngine
    from stores.aio import AsyncMemoryStore, AsyncSqlStore

    store: Any = AsyncMemoryStore() if kind == "memory" else AsyncSqlStore(f"sqlite:///{tmp_path}/fsm.db")
    inner = store.sync if kind == "memory" else None
    calls: list[str] = []
    face_call = store.call

    def counted(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(name)
        return face_call(name, args, kwargs)

    store.call = counted

    async def main() -> None:
        jobs = AsyncEngine(PipelineLifecycle, store, owner=OWNER)
        await jobs.create("p")
        calls.clear()
        await jobs.fire("p", "start")
        finished = await jobs.fire("p", "finish")
        done = await jobs.fire("p", "succeed", lease=finished.lease)
        assert done.state == "completed" and calls == ["apply_by_id"] * 3
        with pytest.raises(TransitionNotAllowed):
            await jobs.fire("p", "start")
        assert "get" in calls[3:]
        assert [h.seq for h in await jobs.history("p")] == [1, 2, 3]
        await store.close()

    asyncio.run(main())
    if inner is not None:
        assert inner.get("p").version == 3


def test_two_racing_fails_into_one_target_never_both_win(sql_target: SqlTarget) -> None:
    """``fail`` enters ``failed`` from running or finalizing (the row is locked first on
    PostgreSQL, the history row inserted first on SQLite): of two at once, one wins."""
    stores = [sql_target.store(), sql_target.store(create=False)]
    engines = [Engine(JobLifecycle, s, owner=OWNER) for s in stores]
    leases = {}
    for n in range(12):
        started = engines[0].fire(engines[0].create().id, "start")
        if n % 2:
            started = engines[0].fire(started.snapshot.id, "exited", lease=started.lease)
        leases[started.snapshot.id] = started.lease
    barrier = threading.Barrier(2)
    outcomes: list[list[str]] = [[], []]

    def run(k: int) -> None:
        for i, lease in leases.items():
            barrier.wait()
            try:
                engines[k].fire(i, "fail", lease=lease)
                outcomes[k].append("won")
            except FsmError as err:
                outcomes[k].append(type(err).__name__)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, i in enumerate(leases):
        assert sorted([outcomes[0][n], outcomes[1][n]]).count("won") == 1
        history = stores[0].history(i)
        assert [r.seq for r in history] == list(range(1, len(history) + 1))
        assert history[-1].source == ("finalizing" if n % 2 else "running") and history[-1].target == "failed"


@pytest.mark.parametrize("extra", ["none", "reason", "error", "run_after", "all"])
def test_a_fire_by_id_returns_the_row_and_history_it_wrote(sql_target: SqlTarget, extra: str) -> None:
    """Each write shape (keep, acquire, clear with a held lease, two moves from the row's
    state), with and without a reason, an error and a backoff: the snapshot and history
    row a fire by id returns are the ones the store reads back (SQLite's update returns
    only what the write did not set; its history row writes NULL for what is absent)."""
    store = sql_target.store()
    kwargs: dict[str, Any] = {}
    if extra in ("reason", "all"):
        kwargs["reason"] = "because"
    if extra in ("error", "all"):
        kwargs["error"] = {"type": "Boom", "message": "x", "detail": [1, None]}
    if extra in ("run_after", "all"):
        kwargs["run_after"] = timedelta(seconds=30)
    pipelines, jobs = Engine(PipelineLifecycle, store, owner=OWNER), Engine(JobLifecycle, store, owner=OWNER)

    def check(result: Any) -> None:
        assert result.snapshot == store.get(result.snapshot.id)
        assert result.record == store.history(result.snapshot.id)[-1]
        if "reason" in kwargs:
            assert result.record.reason == "because"
        if "error" in kwargs:
            assert result.record.error == kwargs["error"]
        if "run_after" in kwargs:
            assert result.snapshot.run_after == result.snapshot.updated_at + timedelta(seconds=30)

    entity = pipelines.create(data={"steps": [{"name": "a"}, {"name": "é", "status": "running"}]}).id
    check(pipelines.fire(entity, "start", **kwargs))  # keeps the lease
    finished = pipelines.fire(entity, "finish", **kwargs)  # takes one
    check(finished)
    assert finished.record.owner == OWNER
    check(pipelines.fire(entity, "succeed", lease=finished.lease, **kwargs))  # clears the held one
    job = jobs.create().id
    started = jobs.fire(job, "start")
    released = jobs.fire(job, "release", lease=started.lease, **kwargs)  # running -> queued of two moves
    check(released)
    assert (released.record.source, released.record.target) == ("running", "queued")


def test_a_fire_by_id_reads_any_json_text_and_refuses_a_broken_row(tmp_path: Any) -> None:
    """SQLite: data text with whitespace (written by hand) reads as json.loads reads it; a
    row whose data is not a JSON object is ``MalformedRow`` and the fire is undone (the
    row keeps its version, no history row)."""
    from stores.sql import SqlStore

    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    engine = Engine(PipelineLifecycle, store, owner=OWNER)
    spaced, broken, listed = engine.create().id, engine.create().id, engine.create().id
    conn = store._conns.slot().conn
    conn.execute("UPDATE fsm_entities SET data = ? WHERE id = ?", (' { "steps" : [ ] } ', spaced))
    conn.execute("UPDATE fsm_entities SET data = ? WHERE id = ?", ('{"steps": [', broken))
    conn.execute("UPDATE fsm_entities SET data = ? WHERE id = ?", ("[1]", listed))
    result = engine.fire(spaced, "start")
    assert result.snapshot.data == {"steps": []} and result.snapshot == store.get(spaced)
    for bad in (broken, listed):
        with pytest.raises(MalformedRow) as caught:
            engine.fire(bad, "start")
        assert caught.value.entity_id == bad
        (version,) = conn.execute("SELECT version FROM fsm_entities WHERE id = ?", (bad,)).fetchone()
        assert version == 0
        assert conn.execute("SELECT count(*) FROM fsm_history WHERE entity_id = ?", (bad,)).fetchone() == (0,)
    store.close()


def test_a_lease_is_checked_field_by_field_whatever_its_time_zone(clock: ManualClock) -> None:
    """The quick look at a held lease (UTC expiry, plain ids, an int token) accepts only
    what the full check accepts: an aware expiry in another zone is the same instant and
    fires; a naive one, a negative token or an owner with NUL is refused, the row unchanged."""
    from datetime import timezone

    store = MemoryStore(clock=clock)
    engine = Engine(PipelineLifecycle, store, owner="w1")
    engine.create("p1")
    engine.fire("p1", "start")
    held = engine.fire("p1", "finish").lease
    assert held is not None
    before = store.get("p1")
    for bad in (
        held._replace(expires_at=held.expires_at.replace(tzinfo=None)),
        held._replace(token=-1),
        held._replace(owner="w\x001"),
        held._replace(entity_id=""),
    ):
        with pytest.raises(InvalidArgument):
            engine.fire("p1", "succeed", lease=bad)
        assert store.get("p1") == before
    east = held._replace(expires_at=held.expires_at.astimezone(timezone(timedelta(hours=5))))
    assert engine.fire("p1", "succeed", lease=east).state == "completed"


def test_the_engines_fire_result_is_the_frozen_dataclass_a_caller_builds(clock: ManualClock) -> None:
    import dataclasses

    from fsm.engine.result import FireResult, fire_result

    engine = Engine(PipelineLifecycle, MemoryStore(clock=clock))
    fired = engine.fire(engine.create().id, "start")
    built = FireResult(fired.snapshot, fired.record)
    assert type(fired) is FireResult and fired == built and not fired.replayed
    assert fire_result(fired.snapshot, fired.record) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        fired.snapshot = fired.snapshot  # type: ignore[misc]


def test_the_memory_stores_fire_by_id_writes_what_its_general_move_writes() -> None:
    """The memory store writes a fire by id in a function of its own (the hot path: one
    call fewer per fire); it must write the very row, history row and feed entry its
    general ``_move`` writes for the same IdWrite, over every lease change, counter bump,
    lease holding, TTL, due time, error and lease."""
    import copy
    import itertools
    from datetime import UTC, datetime

    from fsm.records import HistoryRecord, Snapshot

    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    cases = itertools.product(
        list(LeaseChange),
        [False, True],  # bump_attempt
        [False, True],  # bump_reclaims
        [False, True],  # holds
        [None, timedelta(seconds=30)],  # lease_ttl
        [None, timedelta(0), timedelta(seconds=5)],  # run_after
        [None, {"type": "X", "nested": {"a": [1]}}],  # error
        [None, t0 - timedelta(hours=1), t0 + timedelta(hours=5)],  # the row's due time
        [None, ("w1", 3)],  # the row's lease
    )
    for change, bump_a, bump_r, holds, ttl, run_after, err, row_due, lease in cases:
        clock = ManualClock(t0 + timedelta(minutes=10))
        row = Snapshot(
            "e1", "k", "a", 4, lease and lease[0], lease[1] if lease else 2,
            (t0 + timedelta(seconds=99)) if lease else None, t0, t0, t0, False, "ck", 2, 1,
            {"x": 1}, row_due, t0 - timedelta(seconds=3), 7, "p", 3, {"m": "v"},
        )  # fmt: skip
        write = IdWrite(
            "e1", "k", "go", "worker", (("a", "b"),), expect_owner=lease and lease[0],
            expect_token=lease and lease[1], lease_change=change,
            new_owner="w2" if change is LeaseChange.ACQUIRE else None, lease_ttl=ttl, bump_attempt=bump_a,
            bump_reclaims=bump_r, reason="r", holds=holds, run_after=run_after, error=err,
        )  # fmt: skip
        written = []
        for by_id in (True, False):
            store = MemoryStore(clock=clock)
            store._rows["e1"] = row
            store._history["e1"] = []
            if by_id:
                out = store.apply_by_id_checked(copy.deepcopy(write))
            else:
                out = store._move(row, write, store.now(), None, None, None, write.target_for(row))
            assert out is not None
            assert type(out[0]) is Snapshot and type(out[1]) is HistoryRecord
            assert err is None or out[1].error is not write.error  # a copy of the handler's error
            written.append((out, store._rows, store._history, store._feed, store._keys))
        assert written[0] == written[1], (change, bump_a, bump_r, holds, ttl, run_after, err, row_due, lease)
