"""A history partitioned by time (PostgreSQL, :mod:`stores.sql.partitions`).

The store contract's tests that write or read history, prune or read the feed run again
here on a store whose history is partitioned (``any_store`` below), and the tests after
them check what partitions add: retention drops a whole partition, keeps one with a
survivor (its history gap-free, I6), the keys are still enforced per entity, the feed
reads across partitions in order, and revision 0011 up and down with rows.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import isolated_postgres_store, postgres_url

from fsm import Engine, ManualClock
from fsm.errors import IdempotencyKeyReused
from fsm.lifecycles import JobLifecycle
from fsm.records import LeaseChange, NewEntity, TransitionWrite
from stores import Store
from stores.sql import SqlStore
from stores.sql.migrate import current_revision, downgrade, drop_schema, upgrade
from stores.sql.partitions import is_partitioned, partition_history, partitions

sys.path.insert(0, str(Path(__file__).parent.parent))  # the store contract's modules

import test_feed_after_prune
import test_feed_contract
import test_retention_contract
import test_store_contract

INTERVAL = timedelta(weeks=8)

for _module in (test_store_contract, test_retention_contract, test_feed_contract, test_feed_after_prune):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test):
            globals()[f"{_name}__partitioned"] = _test


def _partitioned(clock: ManualClock | None = None, **options: object) -> SqlStore:
    store = isolated_postgres_store(clock, **options)
    assert isinstance(store, SqlStore)
    start = (clock.now() if clock is not None else None) and clock.now() - INTERVAL  # type: ignore[union-attr]
    assert partition_history(store.engine, table_prefix=store.table_prefix, interval=INTERVAL, start=start)
    return store


@pytest.fixture
def any_store(clock: ManualClock) -> Iterator[Store]:
    """The contract's store, on PostgreSQL with a partitioned history."""
    store = _partitioned(clock)
    yield store
    store.close()


def _count(store: SqlStore, sql: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql(sql.replace("{p}", store.table_prefix)).scalar_one())


def _done(store: Store, entity_id: str, kind: str = "job") -> None:
    store.create(NewEntity(id=entity_id, kind=kind, state="queued"))
    start = TransitionWrite(
        entity_id, "start", "queued", "running", "worker", 0, lease_change=LeaseChange.ACQUIRE, new_owner="w1",
        lease_ttl=timedelta(minutes=2),
    )  # fmt: skip
    store.apply(start)
    store.record_effect(entity_id, "gate", owner="w1", token=1, status="succeeded", result={"ok": True})
    done = TransitionWrite(
        entity_id, "complete", "running", "completed", "worker", 1, expect_owner="w1", expect_token=1,
        lease_change=LeaseChange.CLEAR, idempotency_key=f"done-{entity_id}",
    )  # fmt: skip
    store.apply(done)


def _settled_feed(store: SqlStore, rows: int) -> list[str]:
    """The feed's positions once it shows all ``rows`` (the feed holds back rows while an
    older transaction of anyone's, another test's on a shared server, is still open)."""
    deadline = time.monotonic() + 30
    while True:
        found = [e.position for e in store.feed(None, limit=100)]
        if len(found) >= rows or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_the_conversion_keeps_rows_feed_positions_and_history_order(clock: ManualClock) -> None:
    store = isolated_postgres_store(clock)
    assert isinstance(store, SqlStore)
    try:
        for i in range(3):
            _done(store, f"e{i}")
            clock.advance(timedelta(weeks=3))
        before = {f"e{i}": store.history(f"e{i}") for i in range(3)}
        positions = _settled_feed(store, 6)
        assert partition_history(store.engine, table_prefix=store.table_prefix, interval=timedelta(weeks=1))
        with store.engine.connect() as conn:
            assert is_partitioned(conn, store.table_prefix, None)
            found, default = partitions(conn, store.table_prefix, None)
        assert default and len(found) > 9
        assert {i: store.history(i) for i in before} == before  # same rows, same order
        assert _settled_feed(store, 6) == positions  # same positions
        # every entity's rows in one partition: its creation week's
        most = "SELECT count(DISTINCT tableoid) FROM {p}history GROUP BY entity_id ORDER BY 1 DESC LIMIT 1"
        assert _count(store, most) == 1
        assert _count(store, "SELECT count(*) FROM {p}history_default") == 0
        # writes keep landing in their entity's partition: one born three weeks ago moves now
        store.create(NewEntity(id="late", kind="job", state="queued"))
        clock.advance(timedelta(weeks=3))
        store.apply(TransitionWrite("late", "start", "queued", "running", "worker", 0))
        assert _count(store, "SELECT count(DISTINCT tableoid) FROM {p}history WHERE entity_id = 'late'") == 1
        assert not partition_history(store.engine, table_prefix=store.table_prefix)  # already: a no-op
    finally:
        store.close()


def test_an_idempotency_key_and_a_seq_are_still_unique_per_entity(clock: ManualClock) -> None:
    store = _partitioned(clock)
    try:
        _done(store, "a")
        with pytest.raises(IdempotencyKeyReused):
            store.apply(TransitionWrite("a", "x", "completed", "completed", "worker", 2, idempotency_key="done-a"))
        with store.engine.connect() as conn, pytest.raises(sa.exc.IntegrityError):  # a taken seq, same partition
            born = conn.exec_driver_sql(f"SELECT born FROM {store.table_prefix}history LIMIT 1").scalar_one()
            conn.exec_driver_sql(
                f"INSERT INTO {store.table_prefix}history (entity_id, seq, event, source, target, actor, at, born) "
                "VALUES ('a', 1, 'x', 'a', 'b', 'w', now(), %(b)s)",
                {"b": born},
            )
    finally:
        store.close()


def test_retention_drops_a_whole_partition_and_keeps_one_with_a_survivor_gap_free(clock: ManualClock) -> None:
    store = _partitioned(clock)
    engine = Engine(JobLifecycle, store)
    try:
        t0 = clock.now()
        for i in range(4):  # first partition: all finished
            _done(store, f"old-{i}")
        clock.advance(INTERVAL)  # second partition: finished, and one still running
        t1 = clock.now()
        for i in range(3):
            _done(store, f"mid-{i}")
        store.create(NewEntity(id="mid-live", kind="job", state="queued"))
        store.apply(TransitionWrite("mid-live", "start", "queued", "running", "worker", 0))
        clock.advance(INTERVAL * 2)
        with store.engine.connect() as conn:
            found = partitions(conn, store.table_prefix, None)[0]
        names = [next(p.name for p in found if p.lo <= t < p.hi) for t in (t0, t1)]
        result = engine.prune(timedelta(days=1))
        assert sorted(result.removed) == sorted([*(f"old-{i}" for i in range(4)), *(f"mid-{i}" for i in range(3))])
        with store.engine.connect() as conn:
            left = [p.name for p in partitions(conn, store.table_prefix, None)[0]]
        assert names[0] not in left and names[1] in left  # the first dropped, the second kept
        history = store.history("mid-live")
        assert [h.seq for h in history] == list(range(1, store.get("mid-live").version + 1))  # I6
        assert _count(store, "SELECT count(*) FROM {p}effects") == 0
        assert _count(store, "SELECT count(*) FROM {p}history WHERE entity_id <> 'mid-live'") == 0
    finally:
        store.close()


def test_a_partition_with_another_lifecycles_entity_stays_unless_both_are_pruned(clock: ManualClock) -> None:
    store = _partitioned(clock)
    try:
        _done(store, "job-1")
        _done(store, "pipe-1", kind="pipeline")
        clock.advance(INTERVAL * 3)
        cut = clock.now() - timedelta(days=1)
        with store.engine.connect() as conn:
            first = partitions(conn, store.table_prefix, None)[0][0].name
        assert store.prune_partitions({"job": ("completed",)}, cut) == []  # the pipeline survives
        both = store.prune_partitions({"job": ("completed",), "pipeline": ("completed",)}, cut)
        assert sorted(both) == [("job", "job-1"), ("pipeline", "pipe-1")]
        with store.engine.connect() as conn:
            assert first not in [p.name for p in partitions(conn, store.table_prefix, None)[0]]
    finally:
        store.close()


def test_the_feed_reads_across_partitions_in_commit_order(clock: ManualClock) -> None:
    store = _partitioned(clock)
    try:
        order = []
        for i in range(3):
            store.create(NewEntity(id=f"f{i}", kind="job", state="queued"))
            clock.advance(INTERVAL)  # each entity in a partition of its own
        for i in (2, 0, 1):  # commits across partitions, newest partition first
            store.apply(TransitionWrite(f"f{i}", "start", "queued", "running", "worker", 0))
            order.append(f"f{i}")
        fed: list[str] = []
        for _ in range(200):
            fed = [e.record.entity_id for e in store.feed(None, limit=100)]
            if len(fed) == 3:
                break
            time.sleep(0.05)
        assert fed == order
        assert _count(store, "SELECT count(DISTINCT tableoid) FROM {p}history") == 3
    finally:
        store.close()


def test_revision_0011_upgrades_and_downgrades_a_partitioned_store_with_rows(clock: ManualClock) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    engine = sa.create_engine(postgres_url())
    try:
        upgrade(engine, table_prefix=prefix, revision="0010")
        store = SqlStore(engine, clock=clock, table_prefix=prefix)  # upgrades 0010 -> 0011
        _done(store, "a")
        assert _count(store, "SELECT count(*) FROM {p}history WHERE born IS NOT NULL") == 2
        with engine.begin() as conn:  # a row written before 0011: no born
            conn.exec_driver_sql(f"UPDATE {prefix}history SET born = NULL WHERE seq = 1")
        partition_history(engine, table_prefix=prefix, interval=INTERVAL)
        assert _count(store, "SELECT count(*) FROM {p}history WHERE born IS NULL") == 0
        history = store.history("a")
        store.close()
        downgrade(engine, "0010", table_prefix=prefix)
        assert current_revision(engine, table_prefix=prefix) == "0010"
        with engine.connect() as conn:
            assert not is_partitioned(conn, prefix, None)
            cols = {c["name"] for c in sa.inspect(conn).get_columns(f"{prefix}history")}
        assert "born" not in cols
        upgrade(engine, table_prefix=prefix)
        again = SqlStore(engine, clock=clock, table_prefix=prefix, create=False)
        assert again.history("a") == history
        again.apply(TransitionWrite("a", "x", "completed", "completed", "worker", 2))
        again.close()
    finally:
        drop_schema(engine, table_prefix=prefix)
        engine.dispose()


def test_inside_the_callers_transaction_prune_drops_no_partition_and_the_batches_do_the_work(
    clock: ManualClock,
) -> None:
    store = _partitioned(clock)
    try:
        _done(store, "a")
        clock.advance(INTERVAL * 3)
        cut = clock.now() - timedelta(days=1)
        with store.engine.connect() as conn:
            count = len(partitions(conn, store.table_prefix, None)[0])
            with store.joined(conn):
                assert store.prune_partitions({"job": ("completed",)}, cut) == []
                assert store.prune("job", ("completed",), cut) == ["a"]
            conn.commit()
        with store.engine.connect() as conn:
            assert len(partitions(conn, store.table_prefix, None)[0]) == count
        assert _count(store, "SELECT count(*) FROM {p}history") == 0
    finally:
        store.close()
