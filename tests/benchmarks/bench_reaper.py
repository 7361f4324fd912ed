"""A reaper tick over 10,000 rows (and, with ``--big``, 1,000,000), each with 1,000 stale.

Data: pipelines, 1,000 of them running and idle for two hours (stale, no lease), the rest
like a real table: 90% completed, 10% running and fresh.  Three contenders, interleaved,
the 1,000 stale rows put back (untimed) before every round:

- the reaper's tick (``Reaper.run_once``: claims of 500 found and moved by one statement
  each, then a keyset read of what is left);
- seeds/000's own way: the database filters the stale rows (one ``SELECT`` with the stale
  predicate), then one ``UPDATE`` (guarded by id and version), its history row and a
  ``COMMIT`` per row;
- the set-based limit: one ``UPDATE .. RETURNING`` of every stale row plus one batched
  history insert, in one transaction (PostgreSQL: one CTE statement).

Each contender runs one untimed round first (the reaper's store opens its statements' plans
and catalog lookups on its first tick; the raw connection is warm from loading the rows).
Targets: the tick within 1.5x of the limit, >= 10x faster than seeds/000's way at both
sizes, and the 1,000,000-row tick at most 1.5x the 10,000-row tick.  The 1M size is on
demand (``--big``): loading it takes a minute or two per database.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import Report

from fsm import PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from stores.sql import SqlStore
from stores.sql.schema import encode_sqlite_time

STALE = 1_000
SMALL, BIG = 10_000, 1_000_000


class Backend:
    """Loads, resets and naive-sweeps one database; the reaper goes through SqlStore."""

    name: str
    store: SqlStore
    prefix: str

    def load(self, total: int) -> None: ...
    def reset(self) -> None: ...
    def naive(self) -> int: ...
    def limit(self) -> int: ...
    def close(self) -> None: ...

    def tick(self) -> Callable[[], int]:
        reaper = Reaper(self.store, [PipelineLifecycle], ReaperConfig(batch_size=500))

        def body() -> int:
            result = reaper.run_once()
            assert result.moved == {"pipeline.expire": STALE}, result.summary()
            return STALE

        return body


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="fsm-reaper-bench-")
        self.path = f"{self.dir}/fsm.db"
        self.prefix = "fsm_"
        self.store = SqlStore(f"sqlite:///{self.path}")
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA synchronous = FULL")  # as the store: a commit is durable
        self.conn.execute("PRAGMA foreign_keys = ON")

    def load(self, total: int) -> None:
        ent = f"{self.prefix}entities"
        now = datetime.now(UTC)
        fresh, old = encode_sqlite_time(now), encode_sqlite_time(now - timedelta(hours=2))
        rest = total - STALE
        self.conn.execute(f"DELETE FROM {ent}")
        self.conn.execute(f"DELETE FROM {self.prefix}history")
        # generated in SQL: a million rows in seconds, no Python loop
        self.conn.execute(
            f"""WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
            INSERT INTO {ent} (id, kind, state, version, lease_token, state_entered_at, created_at, updated_at,
                               deleted, attempt, reclaims, data)
            SELECT printf('row-%08d', i), 'pipeline', CASE WHEN i % 10 = 0 THEN 'running' ELSE 'completed' END,
                   3, 1, ?, ?, ?, 0, 0, 0, '{{}}' FROM n""",
            (rest, fresh, fresh, fresh),
        )
        self.conn.execute(
            f"""WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
            INSERT INTO {ent} (id, kind, state, version, lease_token, state_entered_at, created_at, updated_at,
                               deleted, attempt, reclaims, data)
            SELECT printf('stale-%06d', i), 'pipeline', 'running', 1, 0, ?, ?, ?, 0, 0, 0, '{{}}' FROM n""",
            (STALE, old, old, old),
        )
        self.conn.commit()
        self.conn.execute("ANALYZE")
        self.conn.commit()

    def reset(self) -> None:
        old = encode_sqlite_time(datetime.now(UTC) - timedelta(hours=2))
        self.conn.execute(
            f"UPDATE {self.prefix}entities SET state = 'running', version = 1, updated_at = ?, state_entered_at = ? "
            "WHERE id >= 'stale-' AND id < 'stale.'",
            (old, old),
        )
        self.conn.execute(f"DELETE FROM {self.prefix}history WHERE entity_id >= 'stale-' AND entity_id < 'stale.'")

    def naive(self) -> int:
        """seeds/000: the database filters the stale rows, then one update and commit per row."""
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        now_dt = datetime.now(UTC)
        cutoff = encode_sqlite_time(now_dt - timedelta(minutes=60))
        rows = self.conn.execute(
            f"SELECT id, version, lease_token FROM {ent} INDEXED BY ix_{ent}_lease WHERE kind = 'pipeline' "
            "AND state = 'running' AND NOT deleted AND lease_expires_at IS NULL AND updated_at < ?",
            (cutoff,),
        ).fetchall()
        moved = 0
        update = (
            f"UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = ?, updated_at = ? "
            "WHERE id = ? AND version = ?"
        )
        history = (
            f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
            "VALUES (?, ?, 'expire', 'running', 'failed', 'reaper', ?, 'expired', ?)"
        )
        execute = self.conn.execute
        for entity_id, version, token in rows:
            now = encode_sqlite_time(datetime.now(UTC))
            execute("BEGIN")
            if execute(update, (now, now, entity_id, version)).rowcount == 1:
                execute(history, (entity_id, version + 1, token, now))
                moved += 1
            execute("COMMIT")
        assert moved == STALE, moved
        return moved

    def limit(self) -> int:
        """One set-based UPDATE .. RETURNING and one batched history insert, one transaction."""
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        now_dt = datetime.now(UTC)
        now, cutoff = encode_sqlite_time(now_dt), encode_sqlite_time(now_dt - timedelta(minutes=60))
        self.conn.execute("BEGIN IMMEDIATE")
        moved = self.conn.execute(
            f"UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = ?, updated_at = ? "
            f"WHERE id IN (SELECT id FROM {ent} INDEXED BY ix_{ent}_lease WHERE kind = 'pipeline' "
            "AND state = 'running' AND NOT deleted AND lease_expires_at IS NULL AND updated_at < ?) "
            "RETURNING id, version, lease_token",
            (now, now, cutoff),
        ).fetchall()
        self.conn.executemany(
            f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
            "VALUES (?, ?, 'expire', 'running', 'failed', 'reaper', ?, 'expired', ?)",
            [(i, v, t, now) for i, v, t in moved],
        )
        self.conn.execute("COMMIT")
        assert len(moved) == STALE, len(moved)
        return len(moved)

    def close(self) -> None:
        self.conn.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg

        self.prefix = f"benchr{uuid.uuid4().hex[:6]}_"
        self.store = SqlStore(url, table_prefix=self.prefix)
        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))

    def load(self, total: int) -> None:
        ent = f"{self.prefix}entities"
        with self.conn.cursor() as cur:
            cur.execute(f"TRUNCATE {self.prefix}history, {self.prefix}effects, {ent}")
            cur.execute(
                f"""INSERT INTO {ent} (id, kind, state, version, lease_token, state_entered_at, created_at,
                                      updated_at, deleted, attempt, reclaims, data)
                SELECT 'row-' || lpad(i::text, 8, '0'), 'pipeline',
                       CASE WHEN i %% 10 = 0 THEN 'running' ELSE 'completed' END,
                       3, 1, now(), now(), now(), false, 0, 0, '{{}}'::jsonb
                FROM generate_series(1, %s) AS i""",
                (total - STALE,),
            )
            cur.execute(
                f"""INSERT INTO {ent} (id, kind, state, version, lease_token, state_entered_at, created_at,
                                      updated_at, deleted, attempt, reclaims, data)
                SELECT 'stale-' || lpad(i::text, 6, '0'), 'pipeline', 'running', 1, 0,
                       now() - interval '2 hours', now() - interval '2 hours', now() - interval '2 hours',
                       false, 0, 0, '{{}}'::jsonb
                FROM generate_series(1, %s) AS i""",
                (STALE,),
            )
        self.conn.commit()
        self.conn.execute(f"ANALYZE {ent}")
        self.conn.commit()

    def reset(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(
                f"UPDATE {self.prefix}entities SET state = 'running', version = 1, "
                "updated_at = now() - interval '2 hours', state_entered_at = now() - interval '2 hours' "
                "WHERE id >= 'stale-' AND id < 'stale.'"
            )
            cur.execute(f"DELETE FROM {self.prefix}history WHERE entity_id >= 'stale-' AND entity_id < 'stale.'")
        self.conn.commit()
        self.conn.autocommit = True
        self.conn.execute(f"VACUUM {self.prefix}entities")  # every round starts from a clean index
        self.conn.autocommit = False

    def naive(self) -> int:
        """seeds/000: the database filters the stale rows, then one update and commit per row."""
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT id, version, lease_token FROM {ent} WHERE kind = 'pipeline' AND state = 'running' "
            "AND NOT deleted AND lease_expires_at IS NULL AND updated_at < now() - interval '60 minutes'"
        )
        rows = cur.fetchall()
        self.conn.commit()
        moved = 0
        for entity_id, version, token in rows:
            cur.execute(
                f"UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = now(), "
                "updated_at = now() WHERE id = %s AND version = %s",
                (entity_id, version),
                prepare=True,
            )
            if cur.rowcount == 1:
                cur.execute(
                    f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
                    "VALUES (%s, %s, 'expire', 'running', 'failed', 'reaper', %s, 'expired', now())",
                    (entity_id, version + 1, token),
                    prepare=True,
                )
                moved += 1
            self.conn.commit()
        assert moved == STALE, moved
        return moved

    def limit(self) -> int:
        """One set-based UPDATE .. RETURNING feeding one batched history insert (one CTE)."""
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        cur = self.conn.cursor()
        cur.execute(
            f"WITH u AS (UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = now(), "
            "updated_at = now() WHERE kind = 'pipeline' AND state = 'running' AND NOT deleted "
            "AND lease_expires_at IS NULL AND updated_at < now() - interval '60 minutes' "
            "RETURNING id, version, lease_token, updated_at) "
            f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
            "SELECT id, version, 'expire', 'running', 'failed', 'reaper', lease_token, 'expired', updated_at FROM u"
        )
        moved = cur.rowcount
        self.conn.commit()
        assert moved == STALE, moved
        return int(moved)

    def close(self) -> None:
        from stores.sql.migrate import drop_schema

        self.conn.close()
        drop_schema(self.store.engine, table_prefix=self.prefix)
        self.store.close()


def _round(backend: Backend, body_for: Callable[[], int]) -> Callable[[], Callable[[], int]]:
    def setup() -> Callable[[], int]:
        backend.reset()  # untimed: the 1,000 stale rows back, their history gone
        return body_for

    return setup


def _suite(report: Report, backend: Backend, sizes: tuple[int, ...]) -> None:
    n = backend.name
    for total in sizes:
        started = time.perf_counter()
        backend.load(total)
        print(f"  loaded {total:,} rows into {n} in {time.perf_counter() - started:.1f} s", flush=True)
        kinds = ("reaper tick", "seeds-000 way", "set-based limit")
        tick, seed, limit = (f"{what}/{n} {total:,} rows" for what in kinds)
        tick_body = backend.tick()
        for warm_up in (tick_body, backend.naive, backend.limit):  # one untimed round each, alike:
            backend.reset()  # connections, catalog caches and the server's buffers warm for all three
            warm_up()
        report.measure(
            {
                tick: _round(backend, tick_body),
                seed: _round(backend, backend.naive),
                limit: _round(backend, backend.limit),
            },
            unit="tick",
        )
        report.ratio(f"{n} {total:,}: reaper tick vs set-based limit (cost)", tick, limit, 1.5, higher=False)
        report.ratio(f"{n} {total:,}: reaper tick vs seeds/000 way", tick, seed, 10.0)
    if len(sizes) > 1:
        big, small = (f"reaper tick/{n} {total:,} rows" for total in (sizes[-1], sizes[0]))
        report.ratio(f"{n} tick cost {sizes[-1]:,} rows / {sizes[0]:,} rows", big, small, 1.5, higher=False)


def run(report: Report, *, pg_url: str | None = None, big: bool = False, **_: object) -> None:
    sizes = (SMALL, BIG) if big else (SMALL,)
    print(f"reaper: a tick over {' and '.join(f'{s:,}' for s in sizes)} rows with {STALE:,} stale")
    if not big:
        print("  (1,000,000 rows on demand: --big)")
    sqlite_backend = SqliteBackend()
    try:
        _suite(report, sqlite_backend, sizes)
    finally:
        sqlite_backend.close()
    if pg_url is None:
        print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("reaper postgres skipped: no URL given")
        return
    pg: Any = PostgresBackend(pg_url)
    try:
        _suite(report, pg, sizes)
    finally:
        pg.close()
