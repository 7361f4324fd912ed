"""A reaper tick over 10,000 and over 1,000,000 rows, each with 1,000 stale, and the naive loop.

Data: pipelines, 1,000 of them running and idle for two hours (stale), the rest split
like a real table: 90% finished (completed), 10% running and fresh.  The reaper's tick
(``Reaper.run_once``: indexed candidates in keyset pages, one set-based move per page)
is timed against the naive loop of seeds/000 on the same data: select every running row,
then update each stale one (and write its history row) in its own statement and commit.

Targets: the 1,000,000-row tick costs at most 2x the 10,000-row tick; the reaper is at
least 10x faster than the naive loop.  Between rounds the 1,000 stale rows are put back.
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

from harness import Measurement, Report, postgres_url

from fsm import PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from stores.sql import SqlStore
from stores.sql.schema import encode_sqlite_time

STALE = 1_000
SIZES = (10_000, 1_000_000)
ROUNDS = 3


class Backend:
    """Loads, resets and naive-sweeps one database; the reaper goes through SqlStore."""

    name: str
    store: SqlStore
    prefix: str

    def load(self, total: int) -> None: ...
    def reset(self) -> None: ...
    def naive(self) -> int: ...
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
        self.conn = sqlite3.connect(self.path)
        self.conn.execute("PRAGMA synchronous = FULL")  # as the store: a commit is durable

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
            "WHERE id LIKE 'stale-%'",
            (old, old),
        )
        self.conn.execute(f"DELETE FROM {self.prefix}history WHERE entity_id LIKE 'stale-%'")
        self.conn.commit()

    def naive(self) -> int:
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        cutoff = encode_sqlite_time(datetime.now(UTC) - timedelta(minutes=60))
        rows = self.conn.execute(
            f"SELECT id, version, updated_at FROM {ent} WHERE kind = 'pipeline' AND state = 'running' AND deleted = 0"
        ).fetchall()
        moved = 0
        for entity_id, version, updated_at in rows:
            if updated_at >= cutoff:
                continue
            now = encode_sqlite_time(datetime.now(UTC))
            cur = self.conn.execute(
                f"UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = ?, updated_at = ? "
                "WHERE id = ? AND version = ?",
                (now, now, entity_id, version),
            )
            if cur.rowcount == 1:
                self.conn.execute(
                    f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
                    "VALUES (?, ?, 'expire', 'running', 'failed', 'reaper', 0, 'expired', ?)",
                    (entity_id, version + 1, now),
                )
                moved += 1
            self.conn.commit()
        assert moved == STALE, moved
        return moved

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
                "WHERE id LIKE 'stale-%%'"
            )
            cur.execute(f"DELETE FROM {self.prefix}history WHERE entity_id LIKE 'stale-%%'")
        self.conn.commit()

    def naive(self) -> int:
        ent, hist = f"{self.prefix}entities", f"{self.prefix}history"
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT id, version, updated_at < now() - interval '60 minutes' FROM {ent} "
            "WHERE kind = 'pipeline' AND state = 'running' AND NOT deleted"
        )
        rows = cur.fetchall()
        self.conn.commit()
        moved = 0
        for entity_id, version, stale in rows:
            if not stale:
                continue
            cur.execute(
                f"UPDATE {ent} SET state = 'failed', version = version + 1, state_entered_at = now(), "
                "updated_at = now() WHERE id = %s AND version = %s",
                (entity_id, version),
            )
            if cur.rowcount == 1:
                cur.execute(
                    f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
                    "VALUES (%s, %s, 'expire', 'running', 'failed', 'reaper', 0, 'expired', now())",
                    (entity_id, version + 1),
                )
                moved += 1
            self.conn.commit()
        assert moved == STALE, moved
        return moved

    def close(self) -> None:
        from stores.sql.migrate import drop_schema

        self.conn.close()
        drop_schema(self.store.engine, table_prefix=self.prefix)
        self.store.close()


def _best(backend: Backend, body_for: Callable[[], Callable[[], int]], name: str, report: Report) -> Measurement:
    best: Measurement | None = None
    for _ in range(ROUNDS):
        backend.reset()
        body = body_for()
        start = time.perf_counter()
        ops = body()
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best.seconds:
            best = Measurement(name, ops, elapsed)
    assert best is not None
    report.measurements[name] = best
    print(f"  {name:<48} {best.seconds * 1000:>10.1f} ms per tick ({best.ops} stale rows)", flush=True)
    return best


def _suite(report: Report, backend: Backend) -> None:
    n = backend.name
    for total in SIZES:
        started = time.perf_counter()
        backend.load(total)
        print(f"  loaded {total:,} rows into {n} in {time.perf_counter() - started:.1f} s", flush=True)
        _best(backend, backend.tick, f"reaper tick/{n} {total:,} rows", report)
    _best(backend, lambda: backend.naive, f"naive loop/{n} {SIZES[-1]:,} rows", report)
    big, small = f"reaper tick/{n} {SIZES[-1]:,} rows", f"reaper tick/{n} {SIZES[0]:,} rows"
    report.ratio(f"{n} tick cost 1M rows / 10k rows", big, small, 2.0, higher=False)
    report.ratio(f"{n} reaper vs naive loop (1M rows)", big, f"naive loop/{n} {SIZES[-1]:,} rows", 10.0)


def run(report: Report) -> None:
    print(f"reaper: a tick over {SIZES[0]:,} and {SIZES[-1]:,} rows with {STALE:,} stale, vs the naive loop")
    sqlite_backend = SqliteBackend()
    try:
        _suite(report, sqlite_backend)
    finally:
        sqlite_backend.close()
    url = postgres_url(report, "reaper")
    if url is None:
        return
    try:
        pg: Any = PostgresBackend(url)
    except Exception as err:
        print(f"  SKIPPED postgres: {url} unreachable ({str(err).splitlines()[0]})")
        report.notes.append(f"reaper postgres skipped: {err}")
        return
    try:
        _suite(report, pg)
    finally:
        pg.close()
