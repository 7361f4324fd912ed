"""A small benchmark harness: contenders interleaved in one run, medians, spread, load, JSON.

Each contender is timed in several rounds, interleaved (A B A B ..., the order flipped
every round, so neither side always runs on a warmer cache or a quieter machine); its
*median* round counts, and the spread (fastest and slowest round against the median) is
printed beside it with the machine's load average, so a disturbed run shows as one.
Ratios compare medians measured in the same process.  Beside each rate, the process's own
CPU time per op (all its threads; a database server's work is not in it) shows whether a
contender is bound by its client's CPU or waits on the server.  Benchmarks never assert on
timings.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
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


def load() -> str:
    """The 1, 5 and 15 minute load averages, and the cores they are shared by."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


@dataclass
class Measurement:
    name: str
    ops: int
    seconds: float
    """The median round's seconds."""
    rounds: list[float] = field(default_factory=list)
    load: str = ""
    cpu_seconds: float = 0.0
    """The median round's CPU time of this process (all its threads): the client's own cost;
    a database server's work runs in its own processes and is not in it."""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else float("inf")

    @property
    def us_per_op(self) -> float:
        return self.seconds / self.ops * 1e6 if self.ops else 0.0

    @property
    def cpu_us_per_op(self) -> float:
        return self.cpu_seconds / self.ops * 1e6 if self.ops else 0.0

    @property
    def spread(self) -> str:
        """Fastest and slowest round against the median, in percent."""
        if not self.rounds or not self.seconds:
            return ""
        lo, hi = min(self.rounds), max(self.rounds)
        return f"-{(1 - lo / self.seconds) * 100:.0f}%/+{(hi / self.seconds - 1) * 100:.0f}%"


@dataclass
class Ratio:
    name: str
    value: float
    target: float
    meets: bool
    higher: bool = True


@dataclass
class Report:
    measurements: dict[str, Measurement] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    default_rounds: int = 5

    def measure(
        self, contenders: dict[str, Setup], rounds: int | None = None, *, unit: str = "ops"
    ) -> dict[str, Measurement]:
        """Time each contender ``rounds`` times, interleaved and flipped; keep the median."""
        rounds = max(rounds or self.default_rounds, self.default_rounds)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        ops: dict[str, int] = {}
        order = list(contenders)
        for r in range(rounds):
            for name in order if r % 2 == 0 else reversed(order):
                body = contenders[name]()
                gc.collect()  # the setup's garbage is not the timed body's cost
                start, start_cpu = time.perf_counter(), time.process_time()
                ops[name] = body()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
        now = load()
        found = {}
        for name in order:
            m = Measurement(
                name, ops[name], statistics.median(times[name]), times[name], now, statistics.median(cpu[name])
            )
            self.measurements[name] = found[name] = m
            self.show(m, unit)
        print(f"    ({rounds} rounds interleaved, order flipped each round; {now})", flush=True)
        return found

    @staticmethod
    def show(m: Measurement, unit: str = "ops") -> None:
        if unit == "ops":
            print(
                f"  {m.name:<58} {m.rate:>10,.0f} ops/s {m.us_per_op:>9.1f} us/op  spread {m.spread}"
                f"  client cpu {m.cpu_us_per_op:.1f} us/op",
                flush=True,
            )
        else:
            print(f"  {m.name:<58} {m.seconds * 1000:>10.1f} ms/{unit} ({m.ops:,} rows)  spread {m.spread}", flush=True)

    def ratio(self, name: str, numerator: str, denominator: str, target: float, *, higher: bool = True) -> Ratio:
        """``numerator`` rate / ``denominator`` rate (or a cost ratio when ``higher`` is False)."""
        num, den = self.measurements[numerator], self.measurements[denominator]
        value = num.rate / den.rate if higher else (num.seconds / den.seconds)
        meets = value >= target if higher else value <= target
        sign = ">=" if higher else "<="
        print(f"  RATIO {name}: {value:.2f}x (target {sign} {target}x) {'OK' if meets else 'SHORT'}", flush=True)
        r = Ratio(name, round(value, 3), target, meets, higher)
        self.ratios.append(r)
        return r

    def to_json(self) -> dict[str, Any]:
        return {
            "python": sys.version.split()[0],
            "machine": platform.platform(),
            "cores": os.cpu_count(),
            "load_at_end": load(),
            "measurements": {
                k: {
                    **asdict(v),
                    "rate": v.rate,
                    "us_per_op": v.us_per_op,
                    "cpu_us_per_op": v.cpu_us_per_op,
                    "spread": v.spread,
                }
                for k, v in self.measurements.items()
            },
            "ratios": [asdict(r) for r in self.ratios],
            "notes": self.notes,
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=2)
