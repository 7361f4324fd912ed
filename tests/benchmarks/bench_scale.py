"""Reapers scale out: 1, 2 and 4 reaper processes moving 100,000 stale rows on PostgreSQL.

Each reaper is its own process with its own ``SqlStore`` (as reapers on separate machines
would be), started and connected before the clock starts; all start one tick
(``Reaper.run_once``, batch 500) together, and the round ends when the last finishes.
Claims (``UPDATE .. WHERE id IN (SELECT .. LIMIT 500 FOR UPDATE SKIP LOCKED)``) divide
the rows, so every row is moved once, by one reaper.  Between rounds the rows are put
back (untimed).  Target: 4 reapers >= 2.5x faster than one.  Mind the cores: with fewer
cores than reapers plus the server, the reapers' Python and the server share them.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from typing import Any

from harness import Report

ROWS = 100_000
REAPERS = (1, 2, 4)


def _reaper(url: str, prefix: str, barrier: Any, results: Any) -> None:
    from fsm import PipelineLifecycle
    from fsm.reaping import Reaper, ReaperConfig
    from stores.sql import SqlStore

    store = SqlStore(url, table_prefix=prefix, create=False)
    reaper = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=500))
    store.now()  # connected before the clock starts
    barrier.wait(timeout=600)
    result = reaper.run_once()
    results.put((result.total_moved, result.errors, result.lost_races))
    store.close()


class _Table:
    def __init__(self, url: str) -> None:
        import psycopg

        from stores.sql import SqlStore

        self.url = url
        self.prefix = f"benchs{uuid.uuid4().hex[:6]}_"
        SqlStore(url, table_prefix=self.prefix).close()
        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        ent = f"{self.prefix}entities"
        self.conn.execute(
            f"""INSERT INTO {ent} (id, kind, state, version, lease_token, state_entered_at, created_at,
                                  updated_at, deleted, attempt, reclaims, data)
            SELECT 'stale-' || lpad(i::text, 7, '0'), 'pipeline', 'running', 1, 0, now() - interval '2 hours',
                   now() - interval '2 hours', now() - interval '2 hours', false, 0, 0, '{{}}'::jsonb
            FROM generate_series(1, %s) AS i""",
            (ROWS,),
        )
        self.conn.execute(f"VACUUM ANALYZE {ent}")

    def reset(self) -> None:
        ent = f"{self.prefix}entities"
        self.conn.execute(f"TRUNCATE {self.prefix}history")
        self.conn.execute(
            f"UPDATE {ent} SET state = 'running', version = 1, updated_at = now() - interval '2 hours', "
            "state_entered_at = now() - interval '2 hours' WHERE state <> 'running'"
        )
        self.conn.execute(f"VACUUM ANALYZE {ent}")

    def close(self) -> None:
        from stores.sql import create_engine
        from stores.sql.migrate import drop_schema

        self.conn.close()
        engine = create_engine(self.url)
        drop_schema(engine, table_prefix=self.prefix)
        engine.dispose()


def _contender(table: _Table, reapers: int) -> Callable[[], Callable[[], int]]:
    ctx = multiprocessing.get_context("spawn")

    def setup() -> Callable[[], int]:
        table.reset()
        barrier, results = ctx.Barrier(reapers + 1), ctx.Queue()
        procs = [ctx.Process(target=_reaper, args=(table.url, table.prefix, barrier, results)) for _ in range(reapers)]
        for p in procs:
            p.start()

        def body() -> int:
            barrier.wait(timeout=600)
            outs = [results.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
            moved = sum(o[0] for o in outs)
            assert moved == ROWS and not any(o[1] for o in outs), outs
            return moved

        return body

    return setup


def run(report: Report, *, pg_url: str | None = None, **_: object) -> None:
    print(f"scale: 1, 2 and 4 reaper processes on {ROWS:,} stale rows (PostgreSQL)")
    if pg_url is None:
        print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("scale skipped: no URL given")
        return
    started = time.perf_counter()
    table = _Table(pg_url)
    print(f"  loaded {ROWS:,} stale rows in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        names = {k: f"{k} reaper{'s' if k > 1 else ''}/postgres {ROWS:,} stale rows" for k in REAPERS}
        report.measure({names[k]: _contender(table, k) for k in REAPERS}, unit="run")
        report.ratio("4 reapers vs 1 on 100k stale rows (speed-up)", names[4], names[1], 2.5)
        report.ratio("2 reapers vs 1 on 100k stale rows (speed-up)", names[2], names[1], 0.0)
    finally:
        table.close()
