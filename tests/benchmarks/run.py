"""Run the benchmarks: ``python tests/benchmarks/run.py [--only fire,sql,reaper] [--json FILE]``.

Every suite prints its measurements and the ratios against its targets; ``--json``
writes them all to FILE.  Benchmarks are not tests: they never assert on timings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Report  # noqa: E402

SUITES = {"fire": "bench_fire", "sql": "bench_sql", "reaper": "bench_reaper"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated suites: " + ", ".join(SUITES))
    parser.add_argument("--json", dest="json_path", help="write measurements and ratios to this file")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SUITES)
    unknown = [s for s in chosen if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)}")
    report = Report()
    for suite in chosen:
        try:
            module = importlib.import_module(SUITES[suite])
        except ModuleNotFoundError as err:
            if err.name == SUITES[suite]:
                print(f"{suite}: not available yet")
                continue
            raise
        module.run(report)
    if args.json_path:
        report.write_json(args.json_path)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
