"""``fsm inspect``'s page times at 100,000 and 1,000,000 entities (issue 21: each under 100 ms).

Data, generated in SQL (no Python loop): jobs and pipelines, 90% completed long ago, 3%
failed (their last history row records an error), 5% queued, 1% running and 1% finalizing
under leases held by 50 workers (a tenth of those leases expired), the last hour's 5,000
changes with their history rows (the charts' sample), and a tick log.  The inspector is
served for real (uvicorn in a thread) and each page fetched over HTTP, warm (the counts
cache filled once, as after the first visit); each row prints the median of ``--rounds``
fetches and the spread.  The background recount (the one whole-index count, at most
every ``max(5 s, 20 x its own time)``) is timed apart.  PostgreSQL runs with ``--pg-url``.

    python tests/benchmarks/run.py --only inspect [--big] [--pg-url URL]

Without ``--big`` only 100,000 rows (the 1M load takes a minute or two per database).
"""

from __future__ import annotations

import shutil
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any

from harness import Report

from fsm import JobLifecycle, PipelineLifecycle
from stores.sql import SqlStore

SMALL, BIG = 100_000, 1_000_000
TARGET_MS = 100.0
PAGES = {
    "overview (the 2 s refresh)": "/fragment/overview",
    "overview, whole page": "/",
    "filter: kind + state (failed)": "/?kind=job&state=failed",
    "filter: state only (queued)": "/?state=queued",
    "filter: id prefix": "/?q=job-00012",
    "filter: expired leases": "/?expired=1",
    "filter: one holder": "/?holder=worker-07",
    "filter: a holder holding nothing": "/?holder=worker-99",  # walks every leased row
    "filter: data field (bounded window)": "/?data=task&value=task-3",
    "next page (keyset)": None,
    "entity page": "/entity?id=job-0000042",
}

SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :total)
INSERT INTO {p}entities (id, kind, state, version, lease_owner, lease_token, lease_expires_at, state_entered_at,
                         created_at, updated_at, deleted, attempt, reclaims, data)
SELECT CASE WHEN i % 4 = 0 THEN printf('pipe-%07d', i) ELSE printf('job-%07d', i) END,
       CASE WHEN i % 4 = 0 THEN 'pipeline' ELSE 'job' END,
       CASE WHEN i % 100 < 90 THEN 'completed' WHEN i % 100 < 93 THEN 'failed' WHEN i % 100 < 98 THEN 'queued'
            WHEN i % 100 = 98 THEN 'running' ELSE 'finalizing' END,
       3,
       CASE WHEN i % 100 >= 98 THEN printf('worker-%02d', (i / 100) % 50) END,
       1,
       CASE WHEN i % 100 >= 98 THEN strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now',
            CASE WHEN i % 1000 < 100 THEN '-5 minutes' ELSE '+2 minutes' END) END,
       t, t, t, 0, 1, 0,
       '{{"task": "task-' || (i % 1000) || '", "n": ' || i || '}}'
FROM (SELECT i, strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now',
      CASE WHEN i <= :recent THEN printf('-%d seconds', i % 3600) ELSE printf('-%d minutes', 1440 + i % 100000) END)
      AS t FROM n)
"""
SQLITE_HISTORY = """
INSERT INTO {p}history (entity_id, seq, event, source, target, actor, lease_token, reason, at, data)
SELECT id, 1, 'start', 'queued', 'running', 'worker', 1, NULL, updated_at, NULL FROM {p}entities
WHERE updated_at >= strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now', '-3600 seconds') AND kind = 'job'
UNION ALL
SELECT id, 2, 'fail', 'running', 'failed', 'worker', 1, 'gate failed', updated_at,
       '{{"error": {{"type": "GateFailed", "message": "2 tests failed"}}}}' FROM {p}entities
WHERE state = 'failed' AND kind = 'job' AND updated_at >= strftime('%Y-%m-%d %H:%M:%f000+00:00', 'now', '-3600 seconds')
"""
PG_FILL = """
INSERT INTO {p}entities (id, kind, state, version, lease_owner, lease_token, lease_expires_at, state_entered_at,
                         created_at, updated_at, deleted, attempt, reclaims, data)
SELECT CASE WHEN i %% 4 = 0 THEN 'pipe-' || lpad(i::text, 7, '0') ELSE 'job-' || lpad(i::text, 7, '0') END,
       CASE WHEN i %% 4 = 0 THEN 'pipeline' ELSE 'job' END,
       CASE WHEN i %% 100 < 90 THEN 'completed' WHEN i %% 100 < 93 THEN 'failed' WHEN i %% 100 < 98 THEN 'queued'
            WHEN i %% 100 = 98 THEN 'running' ELSE 'finalizing' END,
       3,
       CASE WHEN i %% 100 >= 98 THEN 'worker-' || lpad(((i / 100) %% 50)::text, 2, '0') END,
       1,
       CASE WHEN i %% 100 >= 98 THEN now() + CASE WHEN i %% 1000 < 100 THEN interval '-5 minutes'
            ELSE interval '2 minutes' END END,
       t, t, t, false, 1, 0,
       jsonb_build_object('task', 'task-' || (i %% 1000), 'n', i)
FROM (SELECT i, CASE WHEN i <= %(recent)s THEN now() - (i %% 3600) * interval '1 second'
                     ELSE now() - (1440 + i %% 100000) * interval '1 minute' END AS t
      FROM generate_series(1, %(total)s) AS i) AS g
"""
PG_HISTORY = """
INSERT INTO {p}history (entity_id, seq, event, source, target, actor, lease_token, reason, at, data)
SELECT id, 1, 'start', 'queued', 'running', 'worker', 1, NULL, updated_at, NULL FROM {p}entities
WHERE updated_at >= now() - interval '1 hour' AND kind = 'job'
UNION ALL
SELECT id, 2, 'fail', 'running', 'failed', 'worker', 1, 'gate failed', updated_at,
       '{{"error": {{"type": "GateFailed", "message": "2 tests failed"}}}}'::jsonb FROM {p}entities
WHERE state = 'failed' AND kind = 'job' AND updated_at >= now() - interval '1 hour'
"""
RECENT = 5000


def _serve(app: Any) -> tuple[Any, threading.Thread, str]:
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


def _get(url: str) -> tuple[float, str]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read().decode()
        assert response.status == 200, (url, response.status)
    return time.perf_counter() - start, body


def _load(store: SqlStore, total: int, pg: bool) -> None:
    from fsm.reaping import ReapResult
    from fsm.reaping.ticklog import TickLog

    p = store._sql.L.entities[: -len("entities")]
    with store.engine.begin() as conn:
        import sqlalchemy as sa

        if pg:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            with raw.cursor() as cur:
                cur.execute(PG_FILL.format(p=p), {"total": total, "recent": RECENT})
                cur.execute(PG_HISTORY.format(p=p))
        else:
            conn.exec_driver_sql(SQLITE_FILL.format(p=p).replace(":total", str(total)).replace(":recent", str(RECENT)))
            conn.exec_driver_sql(SQLITE_HISTORY.format(p=p))
        conn.execute(sa.text("ANALYZE"))
    log = TickLog(store)
    for i in range(30):
        log.record(ReapResult(duration_s=0.002) if i % 5 else ReapResult(duration_s=0.01), "reaper:bench")


def _suite(report: Report, name: str, url: str, prefix: str, total: int, rounds: int) -> None:
    from fsm.inspect.app import create_app

    pg = name == "postgres"
    writer = SqlStore(url, table_prefix=prefix)
    start = time.perf_counter()
    _load(writer, total, pg)
    print(f"  {name} {total:,} entities loaded in {time.perf_counter() - start:.0f} s", flush=True)
    reader = SqlStore(url, table_prefix=prefix, create=False)
    app = create_app(reader, [JobLifecycle, PipelineLifecycle], count_every=3600)  # no recount while timing
    started = time.perf_counter()
    server, thread, base = _serve(app)
    print(f"  {name} {total:,}: serving after {time.perf_counter() - started:.1f} s (counts the store at start)")
    try:
        first, _ = _get(base + "/")  # the store was counted once at start, before this visit
        print(f"  {name} {total:,}: first visit (the store counted at start) {first * 1000:.0f} ms", flush=True)
        _, body = _get(base + "/?limit=100")
        marker = "href='/?after_t="
        nxt = body[body.index(marker) + len("href='") :].split("'", 1)[0].replace("&amp;", "&")
        worst = 0.0
        for label, path in PAGES.items():
            target = base + (path if path is not None else nxt)
            times = []
            for _ in range(rounds):
                took, _ = _get(target)
                times.append(took)
            median = statistics.median(times) * 1000
            worst = max(worst, median)
            spread = f"{min(times) * 1000:.1f}-{max(times) * 1000:.1f}"
            verdict = "OK" if median < TARGET_MS else "SLOW"
            print(
                f"  {name} {total:>9,} {label:<38} {median:7.1f} ms  (spread {spread} ms, {rounds} rounds) {verdict}",
                flush=True,
            )
            report.notes.append(f"inspect {name} {total} {label}: {median:.1f} ms")
        recount = []
        from fsm.inspect.data import InspectorData

        counter = InspectorData(reader)
        for _ in range(3):
            t0 = time.perf_counter()
            counter._count()
            recount.append(time.perf_counter() - t0)
        rc = statistics.median(recount) * 1000
        print(
            f"  {name} {total:>9,} {'background recount (not per page)':<38} {rc:7.1f} ms  "
            f"(redone at most every {max(5.0, 20 * rc / 1000):.0f} s)",
            flush=True,
        )
        print(f"  {name} {total:,}: slowest page {worst:.1f} ms (target < {TARGET_MS:.0f} ms)", flush=True)
    finally:
        server.should_exit = True
        thread.join(10)
        reader.close()
        writer.close()


def run(report: Report, *, pg_url: str | None = None, big: bool = False, **_: object) -> None:
    sizes = (SMALL, BIG) if big else (SMALL,)
    rounds = max(5, report.default_rounds)
    print(f"inspect: page times at {' and '.join(f'{s:,}' for s in sizes)} entities (target < {TARGET_MS:.0f} ms)")
    if not big:
        print("  (1,000,000 entities on demand: --big)")
    for total in sizes:
        directory = tempfile.mkdtemp(prefix="fsm-inspect-bench-")
        try:
            _suite(report, "sqlite", f"sqlite:///{directory}/fsm.db", "fsm_", total, rounds)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if pg_url is None:
            print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
            continue
        prefix = f"benchi{uuid.uuid4().hex[:6]}_"
        try:
            _suite(report, "postgres", pg_url, prefix, total, rounds)
        finally:
            import sqlalchemy as sa

            from stores.sql.migrate import drop_schema

            engine = sa.create_engine(pg_url)
            drop_schema(engine, table_prefix=prefix)
            engine.dispose()
