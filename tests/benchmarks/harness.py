"""A small benchmark harness: contenders measured in one run, ratios printed, JSON on demand.

Each contender is timed in several interleaved rounds and its best round counts (the
least disturbed by the machine); ratios compare rates measured in the same process.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

POSTGRES_URL_ENV = "FSM_TEST_POSTGRES_URL"


def postgres_url(report: Report, suite: str) -> str | None:
    """The PostgreSQL URL the benchmarks may write tables into, or None (printed, noted).

    There is no default: a benchmark creates and fills tables, and must never do that in
    a database nobody named (a shared ``test`` database, say)."""
    import os

    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        why = f"set {POSTGRES_URL_ENV} to a database the benchmark may create tables in (no default)"
        print(f"  SKIPPED {suite} postgres: {why}")
        report.notes.append(f"{suite} postgres skipped: {why}")
    return url or None


Setup = Callable[[], Callable[[], int]]
"""Prepares one round (untimed) and returns the timed body, which returns its op count."""


@dataclass
class Measurement:
    name: str
    ops: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else float("inf")

    @property
    def us_per_op(self) -> float:
        return self.seconds / self.ops * 1e6 if self.ops else 0.0


@dataclass
class Ratio:
    name: str
    value: float
    target: float
    meets: bool


@dataclass
class Report:
    measurements: dict[str, Measurement] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def measure(self, contenders: dict[str, Setup], rounds: int = 5) -> None:
        """Time each contender ``rounds`` times, interleaved; keep each one's best round."""
        best: dict[str, Measurement] = {}
        for _ in range(rounds):
            for name, setup in contenders.items():
                body = setup()
                start = time.perf_counter()
                ops = body()
                elapsed = time.perf_counter() - start
                if name not in best or elapsed / ops < best[name].seconds / best[name].ops:
                    best[name] = Measurement(name, ops, elapsed)
        for name, m in best.items():
            self.measurements[name] = m
            print(f"  {name:<48} {m.rate:>12,.0f} ops/s  {m.us_per_op:>9.2f} us/op", flush=True)

    def ratio(self, name: str, numerator: str, denominator: str, target: float, *, higher: bool = True) -> Ratio:
        """``numerator`` rate / ``denominator`` rate (or cost ratio when ``higher`` is False)."""
        num, den = self.measurements[numerator], self.measurements[denominator]
        value = num.rate / den.rate if higher else (num.seconds / den.seconds)
        meets = value >= target if higher else value <= target
        sign = ">=" if higher else "<="
        print(f"  RATIO {name}: {value:.2f}x (target {sign} {target}x) {'OK' if meets else 'SHORT'}", flush=True)
        r = Ratio(name, round(value, 3), target, meets)
        self.ratios.append(r)
        return r

    def to_json(self) -> dict[str, Any]:
        return {
            "python": sys.version.split()[0],
            "machine": platform.platform(),
            "measurements": {
                k: {**asdict(v), "rate": v.rate, "us_per_op": v.us_per_op} for k, v in self.measurements.items()
            },
            "ratios": [asdict(r) for r in self.ratios],
            "notes": self.notes,
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=2)
