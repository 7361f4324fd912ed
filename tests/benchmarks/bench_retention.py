"""Retention at scale (on demand: ``run.py --only retention --pg-url URL``; PostgreSQL only).

One store's history of ``FSM_BENCH_RETENTION_ROWS`` rows (default 10,000,000: a third as
many finished jobs of three rows each, born over ten weeks), filled set-based (``INSERT ..
SELECT generate_series``, not through the library), twice: a plain history, and the same
rows partitioned by week (:func:`stores.sql.partition_history`, its conversion timed too).
Then one retention run removes the oldest three weeks (30%):

- ``rows``: today's :meth:`fsm.Engine.prune` on the plain history, batch after batch (500
  entities each) to completion;
- ``partitions``: the same call on the partitioned history, which drops the three old
  partitions (their entities and effects deleted set-based) before its batches.

Printed for each: the run's wall time and the database server's CPU during it (every
``postgres`` process on this machine, the writer's backend included; the writer's own
baseline is printed so the difference is the run's), the history's table + index size and
the entity table's before, after, and (plain history) after a plain ``VACUUM`` (which makes
the space reusable but gives back to the operating system only empty pages at the end of
the file), and the rate of a concurrent writer (one process creating and completing jobs
through the store, three history rows each) before the run and during it, with its slowest
job during the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from datetime import timedelta
from typing import Any

from harness import Report

ROWS_ENV = "FSM_BENCH_RETENTION_ROWS"
WEEKS = 10
OLD_WEEKS = 3
BEFORE_S = 8.0
"""How long the writer's rate is measured before the run."""


def _server_cpu() -> float:
    """CPU seconds (user + system) of every ``postgres`` process on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rfind(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _writer(url: str, prefix: str, done: Any, slowest: Any, stop: Any) -> None:
    """Create and complete jobs through the store until told to stop; count them, and keep
    the slowest job's milliseconds."""
    from fsm.records import LeaseChange, NewEntity, TransitionWrite
    from stores.sql import SqlStore

    store = SqlStore(url, table_prefix=prefix, create=False)
    ttl = timedelta(minutes=2)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            eid = f"w{os.getpid()}-{n}"
            began = time.perf_counter()
            store.create(NewEntity(id=eid, kind="job", state="queued"))
            start = TransitionWrite(
                eid, "start", "queued", "running", "worker", 0, lease_change=LeaseChange.ACQUIRE, new_owner="w",
                lease_ttl=ttl,
            )  # fmt: skip
            store.apply(start)
            store.apply(TransitionWrite(eid, "exited", "running", "finalizing", "worker", 1, "w", 1))
            done_write = TransitionWrite(
                eid, "complete", "finalizing", "completed", "worker", 2, "w", 1, lease_change=LeaseChange.CLEAR
            )
            store.apply(done_write)
            ms = (time.perf_counter() - began) * 1000
            with slowest.get_lock():
                slowest.value = max(slowest.value, ms)
            with done.get_lock():
                done.value += 1
    finally:
        store.close()


def _fill(engine: Any, prefix: str, entities: int) -> float:
    """The finished jobs and their three history rows each, born over ``WEEKS`` weeks (set-based)."""
    from stores.sql.partitions import ORIGIN

    started = time.perf_counter()
    with engine.begin() as conn:
        now = conn.exec_driver_sql("SELECT now()").scalar_one()
        week = timedelta(weeks=1)
        start = ORIGIN + ((now - ORIGIN) // week - WEEKS) * week  # a partition boundary
        params = {"start": start, "span": timedelta(weeks=WEEKS), "n": entities}
        conn.exec_driver_sql(
            f"INSERT INTO {prefix}entities (id, kind, state, version, lease_token, state_entered_at, created_at, "
            "updated_at, deleted, attempt, reclaims, data, run_after, priority) "
            "SELECT 'e' || g, 'job', 'completed', 3, 1, t + interval '1 minute', t, t + interval '1 minute', false, "
            "1, 0, '{}', t, 0 FROM generate_series(1, %(n)s) AS g, "
            "LATERAL (SELECT %(start)s + (g - 1) * (%(span)s / %(n)s) AS t) AS x",
            params,
        )
        conn.exec_driver_sql(
            f"INSERT INTO {prefix}history (entity_id, seq, event, source, target, actor, lease_token, at, born) "
            "SELECT 'e' || g, s, (ARRAY['start', 'exited', 'complete'])[s], "
            "(ARRAY['queued', 'running', 'finalizing'])[s], (ARRAY['running', 'finalizing', 'completed'])[s], "
            "'worker', 1, t + s * interval '10 seconds', t FROM generate_series(1, %(n)s) AS g, "
            "LATERAL (SELECT %(start)s + (g - 1) * (%(span)s / %(n)s) AS t) AS x, generate_series(1, 3) AS s",
            params,
        )
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.exec_driver_sql(f"VACUUM ANALYZE {prefix}entities")
        auto.exec_driver_sql(f"VACUUM ANALYZE {prefix}history")
    return time.perf_counter() - started


def _sizes(engine: Any, prefix: str) -> tuple[int, int, int]:
    """History table + indexes (all partitions), entities table + indexes, history rows."""
    with engine.connect() as conn:
        history = conn.exec_driver_sql(  # a plain table is no partition tree
            "SELECT CASE WHEN (SELECT relkind FROM pg_class WHERE oid = %(t)s::regclass) = 'p' "
            "THEN (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%(t)s)) "
            "ELSE pg_total_relation_size(%(t)s) END",
            {"t": f"{prefix}history"},
        ).scalar_one()
        entities = conn.exec_driver_sql("SELECT pg_total_relation_size(%(t)s)", {"t": f"{prefix}entities"}).scalar_one()
        rows = conn.exec_driver_sql(f"SELECT count(*) FROM {prefix}history").scalar_one()
    return int(history), int(entities), int(rows)


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def _retention(report: Report, url: str, engine: Any, prefix: str, label: str, cut_weeks: int) -> None:
    from fsm import Engine
    from fsm.lifecycles import JobLifecycle
    from stores.sql import SqlStore

    history, entities, rows = _sizes(engine, prefix)
    print(f"  {label:<12} before: history {_mb(history)} ({rows:,} rows), entities {_mb(entities)}", flush=True)
    ctx = mp.get_context("spawn")
    done, slowest, stop = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Event()
    writer = ctx.Process(target=_writer, args=(url, prefix, done, slowest, stop), daemon=True)
    writer.start()
    time.sleep(3.0)  # the writer warms up
    n0, cpu0, t0 = done.value, _server_cpu(), time.perf_counter()
    time.sleep(BEFORE_S)
    n1, cpu1, t1 = done.value, _server_cpu(), time.perf_counter()
    with slowest.get_lock():
        before_slowest, slowest.value = slowest.value, 0.0
    store = SqlStore(url, table_prefix=prefix, create=False)
    now = store.now()
    with engine.connect() as conn:
        first = conn.exec_driver_sql(f"SELECT min(created_at) FROM {prefix}entities").scalar_one()
    # entities last updated before the cut: the oldest OLD_WEEKS weeks (a minute after birth)
    age = now - (first + timedelta(weeks=cut_weeks, minutes=1))
    try:
        result = Engine(JobLifecycle, store).prune(age, batch_size=500)
    finally:
        n2, cpu2, t2 = done.value, _server_cpu(), time.perf_counter()
        store.close()
    during_slowest = slowest.value
    stop.set()
    writer.join(30)
    seconds = t2 - t1
    base_rate, base_cpu = (n1 - n0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)
    rate = (n2 - n1) / seconds if seconds else 0.0
    extra_cpu = (cpu2 - cpu1) - base_cpu * seconds
    print(
        f"  {label:<12} retention run: {seconds:>8.1f} s wall, removed {len(result.removed):,} entities "
        f"in {result.batches:,} batches; server cpu {cpu2 - cpu1:,.1f} s ({extra_cpu:,.1f} s above the writer's "
        f"{base_cpu:.2f} cpu-s/s)",
        flush=True,
    )
    print(
        f"  {label:<12} writer: {base_rate:>7,.0f} jobs/s before (slowest {before_slowest:,.0f} ms), "
        f"{rate:>7,.0f} jobs/s during ({rate / base_rate if base_rate else 0:.2f}x; slowest {during_slowest:,.0f} ms)",
        flush=True,
    )
    report.notes.append(
        f"retention {label}: {seconds:.1f} s, server cpu {cpu2 - cpu1:.1f} s, "
        f"writer {base_rate:.0f} -> {rate:.0f} jobs/s"
    )
    history2, entities2, rows2 = _sizes(engine, prefix)
    print(f"  {label:<12} after:  history {_mb(history2)} ({rows2:,} rows), entities {_mb(entities2)}", flush=True)
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        started = time.perf_counter()
        auto.exec_driver_sql(f"VACUUM {prefix}history")
        auto.exec_driver_sql(f"VACUUM {prefix}entities")
        vacuum = time.perf_counter() - started
    history3, entities3, _ = _sizes(engine, prefix)
    back = "returned to the OS" if history3 < history * 0.9 else "kept (reusable, not returned to the OS)"
    print(
        f"  {label:<12} after VACUUM ({vacuum:.1f} s): history {_mb(history3)}, entities {_mb(entities3)}; "
        f"history space {back}",
        flush=True,
    )


def run(report: Report, pg_url: str | None = None, big: bool = False) -> None:
    from stores.sql import SqlStore, create_engine, partition_history
    from stores.sql.migrate import drop_schema

    print("\n== retention: one run removing the oldest 30% of the history, partitions vs rows (PostgreSQL) ==")
    if not pg_url:
        print("  SKIPPED retention: needs --pg-url (or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("retention skipped: no PostgreSQL URL")
        return
    rows = int(os.environ.get(ROWS_ENV, "10000000"))
    entities = rows // 3
    engine = create_engine(pg_url)
    prefixes = {"rows": "bret_rows_", "partitions": "bret_part_"}
    try:
        for label, prefix in prefixes.items():
            drop_schema(engine, table_prefix=prefix)
            SqlStore(engine, table_prefix=prefix).close()
            took = _fill(engine, prefix, entities)
            print(f"  {label:<12} filled {entities:,} jobs, {entities * 3:,} history rows in {took:.1f} s", flush=True)
        started = time.perf_counter()
        partition_history(engine, table_prefix=prefixes["partitions"], interval=timedelta(weeks=1))
        print(
            f"  {'partitions':<12} partition_history (the one-off conversion, a copy under an exclusive lock): "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                f"VACUUM ANALYZE {prefixes['partitions']}history"
            )
        for label, prefix in prefixes.items():
            _retention(report, pg_url, engine, prefix, label, OLD_WEEKS)
    finally:
        for prefix in prefixes.values():
            drop_schema(engine, table_prefix=prefix)
        engine.dispose()
