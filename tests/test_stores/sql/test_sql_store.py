"""SqlStore behaviours beyond the contract suite: guards in the statement, time source,
typed failures, threads, query plans.  Each test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import SqlTarget, postgres_url

from fsm import (
    ConditionFailed,
    ConfigError,
    Engine,
    InvalidData,
    JobLifecycle,
    LeaseLost,
    MalformedRow,
    ManualClock,
    PipelineLifecycle,
    StaleVersion,
    StoreUnavailable,
    TransitionNotAllowed,
)
from fsm.records import BatchWrite, LeaseChange, LeaseStale, NewEntity, NewerSibling, TransitionWrite
from stores.sql import SqlStore
from stores.sql.dialect import condition_shape

TTL = timedelta(minutes=2)
STALE = timedelta(minutes=60)


def _entities(target: SqlTarget) -> str:
    return f"{target.prefix}entities"


def _execute(target: SqlTarget, sql: str, **params: object) -> list[tuple[Any, ...]]:
    engine = target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        result = conn.execute(sa.text(sql), params)
        return [tuple(r) for r in result] if result.returns_rows else []


def test_a_renewal_between_the_readers_read_and_its_write_makes_the_write_fail(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w1")
    lease = engine.fire(engine.create("j1").id, "start").lease
    assert lease is not None
    clock.advance(TTL - timedelta(seconds=10))
    read = store.get("j1")  # the reaper reads the row...
    store.renew_lease("j1", owner="w1", token=lease.token, ttl=TTL, budget=None)  # ...the holder renews...
    clock.advance(seconds=30)  # ...and by the reaper's write, the lease it read has expired
    assert read.lease_is_stale(clock.now(), STALE)
    write = TransitionWrite("j1", "expire", read.state, "failed", "reaper", read.version, require=(LeaseStale(STALE),))
    with pytest.raises(ConditionFailed) as info:
        store.apply(write)
    assert info.value.condition == "lease_stale"
    after = store.get("j1")
    assert after == read._replace(lease_expires_at=after.lease_expires_at)
    assert after.lease_expires_at is not None and after.lease_expires_at > clock.now()
    assert len(store.history("j1")) == 1


def test_a_renewal_between_a_reapers_candidates_and_its_batch_keeps_the_row(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w1")
    leases = [engine.fire(engine.create(f"j{i}").id, "start").lease for i in range(3)]
    clock.advance(TTL + timedelta(seconds=1))
    found = store.candidates("job", "running", (LeaseStale(STALE),), limit=10)
    assert [s.id for s in found] == ["j0", "j1", "j2"]
    lease = leases[1]
    assert lease is not None
    with pytest.raises(LeaseLost, match="expired"):  # an expired lease is never revived...
        store.renew_lease("j1", owner="w1", token=lease.token, ttl=TTL, budget=None)
    store.acquire_lease("j1", owner="w1", ttl=TTL, budget=None, expect_version=1)  # ...but may be retaken
    batch = BatchWrite(
        tuple(s.id for s in found), "job", "expire", "running", "failed", "reaper", (LeaseStale(STALE),),
        LeaseChange.CLEAR, reason="expired",
    )  # fmt: skip
    assert [s.id for s, _ in store.apply_batch(batch)] == ["j0", "j2"]
    assert store.get("j1").state == "running"


def test_without_a_clock_postgres_takes_now_from_the_server(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    before = datetime.now(UTC)
    snap = store.create(NewEntity("e1", "job", "queued"))
    server_now = store.now()
    if sql_target.dialect == "postgres":
        (db_now,) = _execute(sql_target, "SELECT statement_timestamp()")[0]
        assert abs(db_now - server_now) < timedelta(seconds=5)
    assert before - timedelta(seconds=5) <= snap.created_at <= server_now + timedelta(seconds=5)
    assert snap.created_at.utcoffset() == timedelta(0) and server_now.utcoffset() == timedelta(0)


def test_datetimes_round_trip_to_the_microsecond(sql_target: SqlTarget) -> None:
    clock = ManualClock(datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC))
    store = sql_target.store(clock=clock)
    created = store.create(NewEntity("e1", "job", "queued"))
    assert created.created_at == datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    clock.advance(timedelta(microseconds=7))
    moved, record = store.apply(
        TransitionWrite("e1", "start", "queued", "running", "worker", 0, lease_change=LeaseChange.ACQUIRE,
                        new_owner="w", lease_ttl=timedelta(seconds=1, microseconds=3))
    )  # fmt: skip
    assert moved.lease_expires_at == clock.now() + timedelta(seconds=1, microseconds=3)
    assert store.get("e1") == moved and store.history("e1") == [record] and record.at == clock.now()


def test_the_budget_cap_keeps_microseconds(sql_target: SqlTarget) -> None:
    clock = ManualClock(datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC))
    store = sql_target.store(clock=clock)
    store.create(NewEntity("e1", "job", "queued"))
    budget = timedelta(seconds=90, microseconds=17)
    held = store.acquire_lease("e1", owner="w", ttl=TTL, budget=budget, expect_version=0)
    assert held.lease_expires_at == held.state_entered_at + budget


def test_data_that_is_not_json_is_refused_and_nothing_is_written(sql_target: SqlTarget) -> None:
    store = sql_target.store(clock=ManualClock())
    with pytest.raises(InvalidData):
        store.create(NewEntity("e1", "job", "queued", data={"when": datetime.now(UTC)}))
    store.create(NewEntity("e1", "job", "queued"))
    with pytest.raises(InvalidData):
        store.apply(TransitionWrite("e1", "start", "queued", "running", "worker", 0, data={"x": float("nan")}))
    assert store.get("e1").version == 0 and store.history("e1") == []


def test_broken_json_is_a_malformed_row_naming_the_entity(
    sql_target: SqlTarget, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    for i in ("bad", "good"):
        engine.fire(engine.create(i).id, "start")
    if sql_target.dialect == "sqlite":
        _execute(sql_target, f"UPDATE {_entities(sql_target)} SET data = '{{broken' WHERE id = 'bad'")
    else:  # jsonb cannot hold broken JSON; a JSON array is just as unreadable as entity data
        _execute(sql_target, f"UPDATE {_entities(sql_target)} SET data = '[1, 2]' WHERE id = 'bad'")
    for read in (lambda: store.get("bad"), lambda: engine.get("bad"), lambda: engine.fire("bad", "fail")):
        with pytest.raises(MalformedRow) as info:
            read()
        assert info.value.entity_id == "bad"
    clock.advance(STALE * 2)
    with pytest.raises(MalformedRow) as bad:
        store.candidates("pipeline", "running", (LeaseStale(STALE),), limit=10)
    assert bad.value.entity_id == "bad"
    found = store.candidates("pipeline", "running", (LeaseStale(STALE),), limit=10, after_id="bad")
    assert [s.id for s in found] == ["good"]
    batch = BatchWrite(("bad", "good"), "pipeline", "expire", "running", "failed", "reaper", (LeaseStale(STALE),))
    assert [s.id for s, _ in store.apply_batch(batch)] == ["good"]
    with pytest.raises(MalformedRow):
        store.get("bad")
    assert store.get("good").state == "failed"
    ((state, version),) = _execute(sql_target, f"SELECT state, version FROM {_entities(sql_target)} WHERE id = 'bad'")
    assert (state, version) == ("running", 1)


def test_an_unknown_state_is_a_malformed_row_through_the_engine(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    engine = Engine(JobLifecycle, store)
    engine.create("j1")
    _execute(sql_target, f"UPDATE {_entities(sql_target)} SET state = 'limbo' WHERE id = 'j1'")
    with pytest.raises(MalformedRow, match="limbo"):
        engine.get("j1")
    with pytest.raises(MalformedRow):
        engine.fire("j1", "start")


def test_an_unreachable_postgres_server_raises_store_unavailable() -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/test"
    for create in (True, False):
        with pytest.raises(StoreUnavailable) as info:
            SqlStore(url, create=create)
        assert info.value.__cause__ is not None


def test_an_unopenable_sqlite_file_raises_store_unavailable(tmp_path: object) -> None:
    with pytest.raises(StoreUnavailable):
        SqlStore(f"sqlite:///{tmp_path}/no/such/dir/fsm.db")


def test_a_dropped_postgres_connection_raises_store_unavailable_then_reconnects() -> None:
    url = postgres_url()
    from conftest import isolated_postgres_store

    store = isolated_postgres_store()
    try:
        store.create(NewEntity("e1", "job", "queued"))
        assert isinstance(store, SqlStore)
        pid = store._conns.slot().conn.info.backend_pid
        killer = sa.create_engine(url)
        with killer.begin() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        killer.dispose()
        with pytest.raises(StoreUnavailable) as info:
            store.get("e1")
        assert info.value.__cause__ is not None
        assert store.get("e1").state == "queued"  # a new connection on the next call
    finally:
        store.close()  # type: ignore[attr-defined]


def test_a_closed_store_raises_store_unavailable(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    assert isinstance(store, SqlStore)
    store.close()
    with pytest.raises(StoreUnavailable):
        store.get("e1")


def test_threads_sharing_one_store_get_exactly_one_winner_per_entity(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    ids = [f"j{i}" for i in range(20)]
    setup = Engine(JobLifecycle, store)
    for i in ids:
        setup.create(i)
    wins: list[tuple[str, str]] = []
    barrier = threading.Barrier(4)

    def worker(n: int) -> None:
        engine = Engine(JobLifecycle, store, owner=f"t{n}")
        barrier.wait()
        for i in ids:
            try:
                engine.fire(i, "start")
                wins.append((i, f"t{n}"))
            except (StaleVersion, TransitionNotAllowed):
                pass

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for i, _ in wins) == sorted(ids)
    for i, owner in wins:
        assert store.get(i).lease_owner == owner and [r.seq for r in store.history(i)] == [1]


def test_in_memory_sqlite_is_one_database_shared_by_threads() -> None:
    store = SqlStore("sqlite://")
    try:
        store.create(NewEntity("e1", "job", "queued"))
        seen: list[str] = []
        thread = threading.Thread(target=lambda: seen.append(store.get("e1").state))
        thread.start()
        thread.join()
        assert seen == ["queued"]
    finally:
        store.close()


def test_a_bad_table_prefix_or_an_unsupported_database_is_a_config_error(tmp_path: object) -> None:
    with pytest.raises(ConfigError):
        SqlStore(f"sqlite:///{tmp_path}/fsm.db", table_prefix="fsm; drop")
    with pytest.raises(ConfigError):
        SqlStore("mysql://nobody@127.0.0.1:1/x")


def test_create_false_refuses_tables_that_are_missing(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="upgrade"):
        SqlStore(f"sqlite:///{tmp_path}/fsm.db", create=False)


def test_candidates_are_answered_from_the_reaper_indexes_on_sqlite(tmp_path: object) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=ManualClock())
    try:
        with store.engine.begin() as conn:  # with statistics, SQLite would rather walk the primary key
            conn.exec_driver_sql(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000) "
                "INSERT INTO fsm_entities (id, kind, state, state_entered_at, created_at, updated_at) "
                "SELECT 'e' || n, 'job', 'running', 't', 't', 't' FROM g"
            )
            conn.exec_driver_sql("ANALYZE")
        params = {"kind": "job", "state": "running", "after": "", "limit": 10, "now": "x", "stale0": "x"}
        for require, index in [((LeaseStale(STALE),), "lease"), ((NewerSibling(),), "siblings")]:
            sql = store._sql.candidates(condition_shape(require), require, True)
            with store.engine.connect() as conn:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            text = " | ".join(str(row[-1]) for row in plan)
            assert f"USING INDEX ix_fsm_entities_{index}" in text, text
            assert "sqlite_autoindex" not in text.split("CORRELATED")[0], text  # not the primary key
    finally:
        store.close()


def test_candidates_are_answered_from_the_reaper_indexes_on_postgres() -> None:
    from conftest import isolated_postgres_store

    store = isolated_postgres_store(ManualClock())
    try:
        assert isinstance(store, SqlStore)
        table = f"{store.table_prefix}entities"
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, lease_expires_at)"
                    " SELECT 'e' || g, 'job', 'running', now(), now(), now(), now() + interval '1 hour'"
                    " FROM generate_series(1, 20000) AS g"
                )
            )
            conn.execute(sa.text(f"ANALYZE {table}"))
        sql = store._sql.candidates(((LeaseStale, None),), (LeaseStale(STALE),), True)
        raw = store._conns.slot().cursor
        raw.execute(
            f"EXPLAIN {sql}",
            {"kind": "job", "state": "running", "after": "", "limit": 10, "now": datetime.now(UTC), "stale0": STALE},
        )
        plan = "\n".join(r[0] for r in raw.fetchall())
        # one index range scan per branch (expired leases; idle lease-less rows), no table scan
        assert plan.count(f"Index Scan using ix_{table}_") == 2, plan
        assert "Seq Scan" not in plan, plan
    finally:
        store.close()  # type: ignore[attr-defined]


def test_importing_stores_does_not_load_sqlalchemy() -> None:
    code = "import stores, sys; print('sqlalchemy' in sys.modules, stores.SqlStore.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "SqlStore"]


def test_a_postgresql_url_without_a_driver_uses_psycopg_3() -> None:
    from stores.sql import create_engine

    engine = create_engine(postgres_url().replace("postgresql+psycopg://", "postgresql://"))
    try:
        assert engine.dialect.driver == "psycopg"
    finally:
        engine.dispose()


def test_history_data_round_trips_as_json(sql_target: SqlTarget) -> None:
    store = sql_target.store(clock=ManualClock())
    store.create(NewEntity("e1", "job", "queued", data={"a": [1, "é"]}))
    _, record = store.apply(
        TransitionWrite("e1", "start", "queued", "running", "worker", 0, data={"a": [1, "é"], "b": (2, 3)},
                        data_patch={"b": (2, 3)})
    )  # fmt: skip
    assert record.data == {"b": [2, 3]} and store.history("e1")[0].data == {"b": [2, 3]}
    assert store.get("e1").data == {"a": [1, "é"], "b": [2, 3]}
    assert json.loads(json.dumps(store.get("e1").data)) == store.get("e1").data


def test_a_sqlite_writer_kept_waiting_past_busy_timeout_raises_store_unavailable(tmp_path: object) -> None:
    import sqlite3

    path = f"{tmp_path}/fsm.db"
    store = SqlStore(f"sqlite:///{path}", busy_timeout=0.1, clock=ManualClock())
    try:
        store.create(NewEntity("e1", "job", "queued"))
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        start = TransitionWrite("e1", "start", "queued", "running", "worker", 0)
        with pytest.raises(StoreUnavailable, match="locked") as info:
            store.apply(start)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert store.get("e1").version == 0  # readers are not blocked (WAL), nothing was written
        blocker.rollback()
        blocker.close()
        assert store.apply(start)[0].version == 1
    finally:
        store.close()


def test_a_store_in_its_own_postgres_schema() -> None:
    url = postgres_url()
    schema = f"s_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        store = SqlStore(url, schema=schema)
        engine = Engine(JobLifecycle, store)
        engine.fire(engine.create("j1").id, "start")
        assert [r.event for r in engine.history("j1")] == ["start"]
        assert "fsm_entities" in sa.inspect(admin).get_table_names(schema=schema)
        store.close()
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def test_an_unknown_synchronous_setting_is_a_config_error(tmp_path: object) -> None:
    with pytest.raises(ConfigError):
        SqlStore(f"sqlite:///{tmp_path}/fsm.db", sqlite_synchronous="SOMETIMES")


class _CountingCursor:
    """Wraps a DBAPI cursor and records the statements it runs."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.statements: list[str] = []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.statements.append(sql.split(maxsplit=1)[0].upper())
        return self._cursor.execute(sql) if params is None else self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def test_a_transition_is_one_statement_on_postgres_and_one_immediate_transaction_on_sqlite(
    sql_target: SqlTarget,
) -> None:
    store = sql_target.store(clock=ManualClock())
    assert isinstance(store, SqlStore)
    store.create(NewEntity("e1", "job", "queued"))
    slot = store._conns.slot()
    counting = _CountingCursor(slot.cursor)
    slot.cursor = counting
    store.apply(TransitionWrite("e1", "start", "queued", "running", "worker", 0, lease_change=LeaseChange.ACQUIRE,
                                new_owner="w", lease_ttl=TTL))  # fmt: skip
    if sql_target.dialect == "postgres":
        assert counting.statements == ["WITH"]  # autocommit: no BEGIN/COMMIT round trips
        assert slot.conn.autocommit
    else:
        assert counting.statements == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    counting.statements.clear()
    store.renew_lease("e1", owner="w", token=1, ttl=TTL, budget=timedelta(hours=1))
    # a renewal and its log entry (the renewal log's upsert) commit together: one statement
    # on PostgreSQL (the update in a CTE), one immediate transaction on SQLite
    expected = ["WITH"] if sql_target.dialect == "postgres" else ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    assert counting.statements == expected


def test_open_store_gives_a_sql_store_for_a_sqlalchemy_url(tmp_path: object) -> None:
    from stores import open_store

    store = open_store(f"sqlite:///{tmp_path}/fsm.db")
    try:
        assert isinstance(store, SqlStore) and store.now().utcoffset() == timedelta(0)
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["'not json'", "'\"text\"'", "'{\"a\": 1}'", "'[1, 2]'"])
def test_a_damaged_renewal_log_reads_as_malformed_and_a_renewal_still_lands(sql_target: SqlTarget, damage: str) -> None:
    from fsm.errors import MalformedRow
    from fsm.records import RENEWALS_KEY

    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    store.create(NewEntity("e1", "job", "running"))
    store.acquire_lease("e1", owner="w", ttl=TTL, budget=None, expect_version=0)
    if damage == "'not json'" and sql_target.dialect == "postgres":
        pytest.skip("jsonb holds only JSON")
    value = damage if sql_target.dialect == "sqlite" else f"CAST({damage} AS jsonb)"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store._sql.L.effects} SET result = {value} WHERE key = :k"), {"k": RENEWALS_KEY})
    with pytest.raises(MalformedRow, match="renewal"):
        store.renewals("e1")
    clock.advance(seconds=5)
    renewed = store.renew_lease("e1", owner="w", token=1, ttl=TTL, budget=None)  # the lease is what matters
    assert renewed.lease_expires_at == clock.now() + TTL
    if damage == "'[1, 2]'":  # a list keeps its entries until they scroll out
        with pytest.raises(MalformedRow):
            store.renewals("e1")
    else:  # anything else is started afresh
        assert [(r.at, r.owner) for r in store.renewals("e1")] == [(clock.now(), "w")]
    assert store.effects("e1") == []


def test_a_renewal_log_longer_than_kept_is_cut_to_the_newest(sql_target: SqlTarget) -> None:
    """A log written when more were kept (or by hand) shrinks to RENEWALS_KEPT at the next renewal."""
    from fsm.records import RENEWALS_KEPT, RENEWALS_KEY

    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    store.create(NewEntity("e1", "job", "running"))
    store.acquire_lease("e1", owner="w", ttl=TTL, budget=None, expect_version=0)
    old = [
        {"at": f"2025-01-01 00:00:{i:02d}.000000+00:00", "expires_at": "2025-01-01 00:02:00.000000+00:00",
         "owner": f"old-{i}", "token": 1}
        for i in range(RENEWALS_KEPT + 10)
    ]  # fmt: skip
    cast = ":log" if sql_target.dialect == "sqlite" else "CAST(:log AS jsonb)"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {store._sql.L.effects} SET result = {cast} WHERE key = :k"),
            {"k": RENEWALS_KEY, "log": json.dumps(old)},
        )
    assert len(store.renewals("e1")) == RENEWALS_KEPT + 10
    store.renew_lease("e1", owner="w", token=1, ttl=TTL, budget=None)
    log = store.renewals("e1")
    assert len(log) == RENEWALS_KEPT
    assert [r.owner for r in log] == [f"old-{i}" for i in range(11, RENEWALS_KEPT + 10)] + ["w"]
