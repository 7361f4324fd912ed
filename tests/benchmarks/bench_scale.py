"""Reapers scale out: 1, 2 and 4 reaper processes moving 100,000 stale rows on PostgreSQL.

Each reaper is its own process with its own ``SqlStore`` (as reapers on separate machines
would be), started and connected before the clock starts; all start one tick
(``Reaper.run_once``, batch 500) together, and the round ends when the last finishes.
Claims (``UPDATE .. WHERE id IN (SELECT .. LIMIT 500 FOR UPDATE SKIP LOCKED)``) divide
the rows, so every row is moved once, by one reaper.  Between rounds the rows are put
back (untimed).  Target: 4 reapers >= 2.5x faster than one.

Mind the cores: a speed-up needs idle cores (or time spent waiting, not computing).  So
each round also measures where the time goes, and the suite prints it beside the ratio:

- CPU time per moved row of the reaper processes (``time.process_time`` in each) and of
  the server processes serving them (their backends' ``/proc/<pid>/stat``, when the server
  runs on this machine), and how many cores the machine was busy on during the round
  (``/proc/stat``: everything, other users' load included);
- what the reapers' backends were doing, sampled from ``pg_stat_activity`` every 10 ms:
  on CPU (active, no wait event), waiting for the client (idle: the reaper's own work and
  the round trip), or a wait event (``LWLock:WALWrite``, ``IO:WALSync``, ``Lock:...``);
- the bound the cores put on the speed-up: with ``C`` CPU seconds per row (reapers and
  server) and ``k`` cores, no number of reapers moves the rows faster than ``C x rows / k``.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from harness import Report

ROWS = 100_000
REAPERS = (1, 2, 4)
SAMPLE_EVERY = 0.01


def _reaper(url: str, prefix: str, ready: Any, barrier: Any, results: Any, release: Any) -> None:
    from fsm import PipelineLifecycle
    from fsm.reaping import Reaper, ReaperConfig
    from stores.sql import SqlStore

    store = SqlStore(url, table_prefix=prefix, create=False)
    reaper = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=500))
    store.now()  # connected before the clock starts
    # the backend serving this process (the store's own connection: measured, not used)
    cursor = store._conns.slot().cursor
    cursor.execute("SELECT pg_backend_pid()")
    ready.put(cursor.fetchone()[0])
    barrier.wait(timeout=600)
    cpu = time.process_time()
    result = reaper.run_once()
    cpu = time.process_time() - cpu
    results.put((result.total_moved, result.errors, result.lost_races, cpu))
    release.wait(timeout=600)  # the parent reads this backend's CPU time before it exits
    store.close()


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` on this machine, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float] | None:
    """Busy and total CPU seconds of the whole machine so far (``/proc/stat``)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


class _Sampler:
    """Samples what the given backends are doing, every ``SAMPLE_EVERY`` seconds."""

    def __init__(self, conn: Any, pids: list[int]) -> None:
        self.conn, self.pids = conn, pids
        self.seen: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE pid = ANY(%s)"
        while not self._stop.wait(SAMPLE_EVERY):
            for state, kind, event in self.conn.execute(query, (self.pids,)).fetchall():
                if state == "active":
                    self.seen["server CPU" if kind is None else f"{kind}:{event}"] += 1
                elif state is not None:
                    self.seen["waiting for the client"] += 1

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class _Table:
    def __init__(self, url: str) -> None:
        import psycopg

        from stores.sql import SqlStore

        self.url = url
        self.prefix = f"benchs{uuid.uuid4().hex[:6]}_"
        SqlStore(url, table_prefix=self.prefix).close()
        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        self.probe = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
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
        self.probe.close()
        engine = create_engine(self.url)
        drop_schema(engine, table_prefix=self.prefix)
        engine.dispose()


def _contender(table: _Table, reapers: int, stats: list[dict[str, Any]]) -> Callable[[], Callable[[], int]]:
    ctx = multiprocessing.get_context("spawn")

    def setup() -> Callable[[], int]:
        table.reset()
        ready, barrier, results, release = ctx.Queue(), ctx.Barrier(reapers + 1), ctx.Queue(), ctx.Barrier(reapers + 1)
        procs = [
            ctx.Process(target=_reaper, args=(table.url, table.prefix, ready, barrier, results, release))
            for _ in range(reapers)
        ]
        for p in procs:
            p.start()
        pids = [ready.get(timeout=600) for _ in procs]

        def body() -> int:
            server = [_proc_cpu(pid) for pid in pids]
            machine = _machine_busy()
            started = time.perf_counter()
            with _Sampler(table.probe, pids) as sampler:
                barrier.wait(timeout=600)
                outs = [results.get(timeout=600) for _ in procs]
            wall = time.perf_counter() - started
            after = [_proc_cpu(pid) for pid in pids]
            machine_after = _machine_busy()
            release.wait(timeout=600)
            for p in procs:
                p.join()
            moved = sum(o[0] for o in outs)
            assert moved == ROWS and not any(o[1] for o in outs), outs
            known = None not in server and None not in after
            stats.append(
                {
                    "wall": wall,
                    "reaper_cpu": sum(o[3] for o in outs),
                    "server_cpu": sum(a - b for a, b in zip(after, server, strict=True)) if known else None,  # type: ignore[operator]
                    "busy_cores": (machine_after[0] - machine[0]) / wall if machine and machine_after else None,
                    "samples": sampler.seen,
                }
            )
            return moved

        return body

    return setup


def _show_where_time_goes(report: Report, stats: dict[int, list[dict[str, Any]]]) -> None:
    """The median round's CPU per row, busy cores and backend states, and the cores' bound."""
    cores = os.cpu_count() or 1
    print(f"  where the time goes ({cores} cores on this machine, shared by the reapers and the server):")
    per_row: dict[int, float] = {}
    for k, rounds in stats.items():
        med = sorted(rounds, key=lambda r: r["wall"])[len(rounds) // 2]
        us = 1e6 / ROWS
        reaper_cpu, server_cpu = med["reaper_cpu"], med["server_cpu"]
        line = f"    {k} reaper{'s' if k > 1 else ' '}: wall {med['wall'] * us:5.1f} us/row;"
        line += f" CPU reapers {reaper_cpu * us:5.1f}"
        if server_cpu is not None:
            line += f" + server backends {server_cpu * us:5.1f} = {(reaper_cpu + server_cpu) * us:5.1f} us/row"
            per_row[k] = (reaper_cpu + server_cpu) / ROWS
        else:
            line += " (server CPU not measurable: it does not run on this machine)"
        if med["busy_cores"] is not None:
            line += f"; machine busy {med['busy_cores']:.2f} of {cores} cores"
        print(line)
        seen: Counter[str] = med["samples"]
        total = sum(seen.values())
        if total:
            shares = ", ".join(f"{name} {n / total:.0%}" for name, n in seen.most_common(5))
            print(f"      reapers' backends (sampled every {SAMPLE_EVERY * 1000:.0f} ms): {shares}")
        report.notes.append(
            f"scale {k} reapers: wall {med['wall']:.3f} s, reaper CPU {reaper_cpu:.3f} s, "
            f"server CPU {server_cpu if server_cpu is None else round(server_cpu, 3)} s, "
            f"busy cores {med['busy_cores'] if med['busy_cores'] is None else round(med['busy_cores'], 2)}"
        )
    if 1 in per_row and 4 in per_row:
        one_wall = statistics.median(r["wall"] for r in stats[1])
        best = one_wall / (per_row[4] * ROWS / cores)
        print(
            f"  bound: 4 reapers need {per_row[4] * 1e6:.1f} us of CPU per row; on {cores} cores they move "
            f"100k rows in >= {per_row[4] * ROWS / cores:.2f} s, at best {best:.2f}x one reaper's "
            f"{one_wall:.2f} s (target 2.5x)"
        )
        report.notes.append(f"scale bound: at best {best:.2f}x on {cores} cores")


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
        stats: dict[int, list[dict[str, Any]]] = {k: [] for k in REAPERS}
        report.measure({names[k]: _contender(table, k, stats[k]) for k in REAPERS}, unit="run")
        report.ratio("4 reapers vs 1 on 100k stale rows (speed-up)", names[4], names[1], 2.5)
        report.ratio("2 reapers vs 1 on 100k stale rows (speed-up)", names[2], names[1], 0.0)
        _show_where_time_goes(report, stats)
    finally:
        table.close()
