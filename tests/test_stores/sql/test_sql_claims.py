"""Claiming on SQL: its pick is an index range scan whatever the backlog (no sort of every
claimable row), and it is one transaction that a claimer on another connection skips."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from fsm import Engine, JobLifecycle, ManualClock
from fsm.errors import StoreUnavailable
from stores.sql import SqlStore


def test_the_claim_pick_walks_the_due_time_index_in_order_on_sqlite(tmp_path: object) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=ManualClock())
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000) "
                "INSERT INTO fsm_entities (id, kind, state, state_entered_at, created_at, updated_at, run_after) "
                "SELECT 'e' || n, 'job', 'queued', 't', 't', 't', 't' || n FROM g"
            )
            conn.exec_driver_sql("ANALYZE")
        for which in ("start", "resume", "start+def", "resume+def"):  # +def: a claimer's definition version
            sql = store._claim_sql()[which]
            with store.engine.connect() as conn:
                plan = conn.exec_driver_sql(
                    f"EXPLAIN QUERY PLAN {sql}", {"kind": "job", "state": "queued", "limit": 5, "now": "u", "defn": 1}
                ).fetchall()
            text = " | ".join(str(row[-1]) for row in plan)
            assert "USING INDEX ix_fsm_entities_claim (kind=? AND state=? AND run_after<?)" in text, text
            assert "TEMP B-TREE" not in text, text  # walked in due order: nothing is sorted
    finally:
        store.close()


def test_the_claim_pick_is_a_due_time_index_scan_without_a_sort_on_postgres() -> None:
    from conftest import isolated_postgres_store

    store = isolated_postgres_store(ManualClock())
    try:
        assert isinstance(store, SqlStore)
        table = f"{store.table_prefix}entities"
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, run_after)"
                    " SELECT 'e' || g, 'job', CASE WHEN g % 10 = 0 THEN 'running' ELSE 'queued' END,"
                    " now(), now(), now(), now() - g * interval '1 second' FROM generate_series(1, 20000) AS g"
                )
            )
            conn.execute(sa.text(f"ANALYZE {table}"))
        raw = store._conns.slot().cursor
        for which in ("start", "resume", "start+def", "resume+def"):  # +def: a claimer's definition version
            raw.execute(
                f"EXPLAIN {store._claim_sql()[which]}",
                {"kind": "job", "state": "queued", "limit": 5, "now": datetime.now(UTC) + timedelta(0), "defn": 1},
            )
            plan = "\n".join(r[0] for r in raw.fetchall())
            assert f"Index Scan using ix_{table}_claim" in plan, plan
            assert "Seq Scan" not in plan, plan
            assert "Sort" not in plan, plan  # walked in due order: nothing is sorted
    finally:
        store.close()


def test_an_idle_sqlite_claim_leaves_the_write_lock_to_the_writers_with_work(tmp_path: object) -> None:
    """Nothing claimable: the claim reads, finds nothing, and never asks for the write lock,
    so it neither waits behind a writer nor makes a live holder's renewal wait behind it.
    Work there: the claim still queues for the lock (and, held past busy_timeout, says so)."""
    path = f"{tmp_path}/fsm.db"
    store = SqlStore(f"sqlite:///{path}", busy_timeout=0.05)
    engine = Engine(JobLifecycle, store)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        engine.create("done")
        engine.claim(1, owner="w")
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction holds the lock
        assert engine.claim(5, owner="idle") == []  # nothing queued: no wait, no "database is locked"
        other.execute("ROLLBACK")
        engine.create("queued-one")
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable):
            engine.claim(5, owner="busy")  # work there: it asks for the lock like any writer
        other.execute("ROLLBACK")
        assert [s.id for s in engine.claim(5, owner="busy")] == ["queued-one"]
    finally:
        other.close()
        store.close()
