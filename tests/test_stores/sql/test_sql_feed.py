"""The SQL feed's order: a transaction that commits after a newer one is never skipped
(PostgreSQL), and the migration adds the feed's column to a database at 0002."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from conftest import SqlTarget, postgres_url

from fsm import Engine, PipelineLifecycle
from stores.sql import SqlStore


def test_postgres_holds_a_newer_commit_back_until_an_older_transaction_ends_and_skips_neither(
    sql_target: SqlTarget,
) -> None:
    if sql_target.dialect != "postgres":
        pytest.skip("SQLite has one writer at a time: commit order is rowid order")
    store = sql_target.store()
    engine = Engine(PipelineLifecycle, store)
    engine.create("a")
    engine.create("b")
    cursor = store.feed_head()
    raw = sa.create_engine(sql_target.url)
    try:
        with raw.connect() as conn:
            older = conn.begin()
            conn.execute(sa.text("SELECT pg_current_xact_id()"))  # A takes its transaction id first
            engine.fire("b", "start")  # B, newer, commits first
            assert [e.record.entity_id for e in store.feed(cursor)] == []  # held back, not passed
            conn.execute(
                sa.text(
                    f'INSERT INTO "{sql_target.prefix}history" (entity_id, seq, event, source, target, actor, at) '
                    "VALUES ('a', 1, 'start', 'queued', 'running', 'worker', now())"
                )
            )
            older.commit()  # A commits last
        told: list[str] = []
        for _ in range(200):  # other sessions on the server may hold the horizon back a moment
            told = [e.record.entity_id for e in store.feed(cursor)]
            if len(told) >= 2:
                break
            time.sleep(0.05)
        assert told == ["a", "b"]  # the older transaction's row first, neither skipped
    finally:
        raw.dispose()


def test_a_postgres_database_at_0002_upgrades_to_the_feed_keeping_its_history() -> None:
    from stores.sql.migrate import downgrade, drop_schema, upgrade

    url = postgres_url()
    prefix = "feedmig_" + str(int(time.time() * 1000) % 10**8) + "_"
    store = SqlStore(url, table_prefix=prefix)
    try:
        engine = Engine(PipelineLifecycle, store)
        engine.create("old")
        engine.fire("old", "start")
        store.close()
        downgrade(url, "0002", table_prefix=prefix)
        raw = sa.create_engine(url)
        try:
            with raw.connect() as conn:
                columns = {c["name"] for c in sa.inspect(conn).get_columns(f"{prefix}history")}
            assert "txid" not in columns
        finally:
            raw.dispose()
        upgrade(url, table_prefix=prefix)
        store = SqlStore(url, table_prefix=prefix)
        engine = Engine(PipelineLifecycle, store)
        engine.create("new")
        engine.fire("new", "start")
        told: list[str] = []
        for _ in range(200):
            told = [e.record.entity_id for e in store.feed()]
            if len(told) >= 2:
                break
            time.sleep(0.05)
        assert told == ["old", "new"]
    finally:
        store.close()
        raw = sa.create_engine(url)
        try:
            drop_schema(raw, table_prefix=prefix)
        finally:
            raw.dispose()
