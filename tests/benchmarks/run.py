"""Run the benchmarks.

    python tests/benchmarks/run.py [--only fire,sql,reaper,scale,aio,inspect,work,timers,retention] [--pg-url URL]
                                   [--big] [--json FILE]

- ``fire``: in-memory ``fire`` vs python-statemachine and ``transitions`` (fast: the CI smoke run);
- ``sql``: ``fire`` through SqlStore vs the fastest honest raw driver code on the same tables,
  SQLite always, PostgreSQL with 1, 2, 4 and 8 writers when a URL is given;
- ``reaper``: a tick over 10,000 rows with 1,000 stale (``--big``: also 1,000,000 rows) vs
  seeds/000's own way and one set-based ``UPDATE .. RETURNING``, SQLite and PostgreSQL;
- ``scale``: 1, 2 and 4 reaper processes on 100,000 stale rows (PostgreSQL only);
- ``aio``: ``AsyncEngine`` fire from 8 tasks vs the sync engine from 8 threads vs raw async
  psycopg from 8 tasks (PostgreSQL only);
- ``inspect``: ``fsm inspect``'s page times at 100,000 entities (``--big``: also 1,000,000),
  SQLite and PostgreSQL, against the 100 ms target;
- ``work``: the work path against pgqueuer on the same server: enqueue (one call per job
  and the list form), drain 5,000 no-op jobs with 1 and 4 worker processes, idle pickup
  p50/p90 (PostgreSQL only; needs the ``bench`` extra: pgqueuer and asyncpg);
- ``timers``: 10,000 timers due together, fired by a started reaper (lateness p50/p99/max,
  target p99 < 1 s), and the cost of firing 1,000 vs one raw set-based ``UPDATE``, SQLite
  and PostgreSQL;
- ``retention`` (on demand only: never in the default run, it fills 10,000,000 history rows
  twice; ``FSM_BENCH_RETENTION_ROWS`` for fewer): one retention run removing the oldest 30% of
  the history, partitions dropped vs today's row-by-row prune: wall time, server CPU, table
  and index sizes before and after, a concurrent writer's rate (PostgreSQL only).

The PostgreSQL parts run only on the database named by ``--pg-url`` (or the
``FSM_BENCH_POSTGRES_URL`` environment variable), never on a default: use a database of
your own (``createdb bench``), the benchmarks create and drop their own tables in it.
Every suite prints its measurements (median of interleaved rounds, spread, load) and
its ratios against the targets of DESIGN section 11; ``--json`` writes them all to FILE.
Benchmarks are not tests: they never assert on timings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# the checkout this script is in comes first: a worktree's run measures its own packages,
# not those of the editable install
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]

from harness import Report, load  # noqa: E402

SUITES = {
    "fire": "bench_fire",
    "sql": "bench_sql",
    "reaper": "bench_reaper",
    "scale": "bench_scale",
    "aio": "bench_aio",
    "inspect": "bench_inspect",
    "work": "bench_work",
    "timers": "bench_timers",
    "retention": "bench_retention",
}
ON_DEMAND = frozenset({"retention"})
"""Suites run only when ``--only`` names them."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated suites: " + ", ".join(SUITES))
    parser.add_argument("--json", dest="json_path", help="write measurements and ratios to this file")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("FSM_BENCH_POSTGRES_URL"),
        help="PostgreSQL URL for the PostgreSQL parts (default: $FSM_BENCH_POSTGRES_URL; none: skipped)",
    )
    parser.add_argument("--big", action="store_true", help="reaper: also the 1,000,000-row table (minutes)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per comparison (at least 5)")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or [s for s in SUITES if s not in ON_DEMAND]
    unknown = [s for s in chosen if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)}")
    report = Report(default_rounds=max(5, args.rounds))
    import fsm

    print(f"python {sys.version.split()[0]}; {load()}; postgres: {args.pg_url or 'not given (skipped)'}")
    print(f"measuring the packages in {os.path.dirname(os.path.dirname(os.path.abspath(fsm.__file__)))}")
    for suite in chosen:
        module = importlib.import_module(SUITES[suite])
        module.run(report, pg_url=args.pg_url, big=args.big)
    if args.json_path:
        report.write_json(args.json_path)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
