"""``fire`` through SqlStore against the raw driver running the same statements.

Pipeline start, finish, succeed on fresh entities, through ``Engine.fire`` (which reads the
entity, checks the table, and hands the store one guarded write), against the raw driver
doing, per event, what a hand-written job table does: read the row, ``UPDATE ... WHERE id
AND version``, ``INSERT`` the history row, commit.  The raw side runs on the store's own
tables, so both pay for the same indexes.

- SQLite: a file in WAL mode, both sides with the same ``synchronous`` setting; NORMAL is
  the headline (a commit is a WAL append, so the library's own cost shows), FULL (the
  store's default, one fsync per commit) is printed for reference.
- PostgreSQL: ``FSM_TEST_POSTGRES_URL`` (no default: without it the PostgreSQL part is skipped);
  skipped with a line saying why when unreachable.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import Report, postgres_url

from fsm import Engine, PipelineLifecycle
from stores.sql import SqlStore
from stores.sql.schema import encode_sqlite_time

EVENTS = (("start", "queued", "running"), ("finish", "running", "finalizing"), ("succeed", "finalizing", "completed"))
TTL = timedelta(minutes=2)


def _fsm_fire(store: SqlStore, n: int) -> Callable[[], Callable[[], int]]:
    engine = Engine(PipelineLifecycle, store, owner="bench-worker")

    def setup() -> Callable[[], int]:
        ids = [engine.create().id for _ in range(n)]

        def body() -> int:
            fire = engine.fire
            for i in ids:
                fire(i, "start")
                lease = fire(i, "finish").lease
                fire(i, "succeed", lease=lease)
            return 3 * n

        return body

    return setup


# -- SQLite ---------------------------------------------------------------------------------------


def _raw_sqlite(path: str, prefix: str, synchronous: str, n: int) -> Callable[[], Callable[[], int]]:
    conn = sqlite3.connect(path)  # default (deferred) transactions: BEGIN before the UPDATE
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    ent, hist = f"{prefix}entities", f"{prefix}history"
    select = f"SELECT * FROM {ent} WHERE id = ?"
    update = (
        f"UPDATE {ent} SET state = ?, version = version + 1, lease_owner = ?, lease_token = ?, "
        f"lease_expires_at = ?, state_entered_at = ?, updated_at = ? WHERE id = ? AND version = ?"
    )
    insert = (
        f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, at) "
        "VALUES (?, ?, ?, ?, ?, 'worker', ?, ?)"
    )

    def setup() -> Callable[[], int]:
        now = encode_sqlite_time(datetime.now(UTC))
        ids = [uuid.uuid4().hex for _ in range(n)]
        conn.executemany(
            f"INSERT INTO {ent} (id, kind, state, state_entered_at, created_at, updated_at, data) "
            "VALUES (?, 'pipeline', 'queued', ?, ?, ?, '{}')",
            [(i, now, now, now) for i in ids],
        )
        conn.commit()

        def body() -> int:
            execute, commit = conn.execute, conn.commit
            for i in ids:
                for event, source, target in EVENTS:
                    row = execute(select, (i,)).fetchone()
                    now_dt = datetime.now(UTC)
                    now = encode_sqlite_time(now_dt)
                    owner, token, expires = row[4], row[5], row[6]
                    if event == "finish":
                        owner, token, expires = "bench-worker", token + 1, encode_sqlite_time(now_dt + TTL)
                    cur = execute(update, (target, owner, token, expires, now, now, i, row[3]))
                    assert cur.rowcount == 1
                    execute(insert, (i, row[3] + 1, event, source, target, token, now))
                    commit()
            return 3 * n

        return body

    return setup


def _sqlite_suite(report: Report, synchronous: str, n: int) -> None:
    directory = tempfile.mkdtemp(prefix="fsm-bench-")
    try:
        store = SqlStore(f"sqlite:///{directory}/fsm.db", sqlite_synchronous=synchronous)
        ours = f"fire/sqlite {synchronous} (fsm Engine + SqlStore)"
        raw = f"raw sqlite3 {synchronous} (select, update, insert, commit)"
        report.measure(
            {
                ours: _fsm_fire(store, n),
                raw: _raw_sqlite(f"{directory}/fsm.db", "fsm_", synchronous, n),
            },
            rounds=5,
        )
        report.ratio(f"sqlite fire vs raw sqlite3 ({synchronous})", ours, raw, 0.5)
        store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- PostgreSQL -----------------------------------------------------------------------------------


def _raw_psycopg(url: str, prefix: str, n: int) -> tuple[Callable[[], Callable[[], int]], Any]:
    import psycopg

    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    conn = psycopg.connect(conninfo)  # default: a transaction per unit of work, ended by commit()
    ent, hist = f"{prefix}entities", f"{prefix}history"
    select = f"SELECT * FROM {ent} WHERE id = %s"
    update = (
        f"UPDATE {ent} SET state = %s, version = version + 1, lease_owner = %s, lease_token = %s, "
        f"lease_expires_at = %s, state_entered_at = now(), updated_at = now() WHERE id = %s AND version = %s"
    )
    insert = (
        f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, at) "
        "VALUES (%s, %s, %s, %s, %s, 'worker', %s, now())"
    )

    def setup() -> Callable[[], int]:
        ids = [uuid.uuid4().hex for _ in range(n)]
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {ent} (id, kind, state, state_entered_at, created_at, updated_at, data) "
                "VALUES (%s, 'pipeline', 'queued', now(), now(), now(), '{}')",
                [(i,) for i in ids],
            )
        conn.commit()

        def body() -> int:
            cur = conn.cursor()
            for i in ids:
                for event, source, target in EVENTS:
                    cur.execute(select, (i,))
                    row = cur.fetchone()
                    assert row is not None
                    owner, token, expires = row[4], row[5], row[6]
                    if event == "finish":
                        owner, token, expires = "bench-worker", token + 1, datetime.now(UTC) + TTL
                    cur.execute(update, (target, owner, token, expires, i, row[3]))
                    assert cur.rowcount == 1
                    cur.execute(insert, (i, row[3] + 1, event, source, target, token))
                    conn.commit()
            return 3 * n

        return body

    return setup, conn


def _postgres_suite(report: Report, n: int) -> None:
    from stores.sql.migrate import drop_schema

    url = postgres_url(report, "sql")
    if url is None:
        return
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    try:
        store = SqlStore(url, table_prefix=prefix)
    except Exception as err:
        print(f"  SKIPPED postgres: {url} unreachable ({str(err).splitlines()[0]})")
        report.notes.append(f"postgres skipped: {err}")
        return
    try:
        raw_setup, raw_conn = _raw_psycopg(url, prefix, n)
        ours = "fire/postgres (fsm Engine + SqlStore)"
        raw = "raw psycopg (select, update, insert, commit)"
        report.measure({ours: _fsm_fire(store, n), raw: raw_setup}, rounds=5)
        report.ratio("postgres fire vs raw psycopg", ours, raw, 0.5)
        raw_conn.close()
    finally:
        drop_schema(store.engine, table_prefix=prefix)
        store.close()


def run(report: Report) -> None:
    print("sql: Engine.fire through SqlStore vs the raw driver (Pipeline start/finish/succeed)")
    _sqlite_suite(report, "NORMAL", 1000)
    _sqlite_suite(report, "FULL", 200)
    _postgres_suite(report, 400)
