"""Concurrency and rate limits kept by real worker processes, checked from the store's history.

Every test runs on a SQLite file and on PostgreSQL (tables of its own, a unique prefix):
:data:`PROCESSES` child processes, each a ``Worker`` with :data:`CONCURRENCY` slots whose
handlers sleep a few random milliseconds (``proc_limits.handlers``), drain a backlog of
jobs of a lifecycle that declares one limit.  Each job is ``queued -> running`` (``start``,
the claim) ``-> finalizing`` (``exited``) ``-> completed`` (``complete``), all under the
claim's one lease.  What is asserted, and why it is sound (it never fails while the store
keeps its promise):

**Concurrency** (``per_key=2`` over 20 keys; ``total=3``): a job's active interval is
``[start.at, complete.at)`` from its history, and a sweep over these intervals (an end at
``t`` before a start at ``t``: they do not overlap) never finds more than the limit at one
instant, per key or in all.  The times are not the moments a lease began and ended, so
this needs an argument.  Let B's claim write its ``start`` row at ``b``, and let A be a job
of B's key with ``start.at <= b < complete.at``:

- SQLite: a claim reads its times after ``BEGIN IMMEDIATE`` took the one write lock, so
  A's ``start.at <= b`` means A's claim committed before B's took the lock (or is B's
  own); any write reads its ``at`` before it commits, so ``complete.at > b`` means A's
  release had not committed when B's claim counted.
- PostgreSQL: a row's ``at`` is the ``statement_timestamp()`` of the statement writing it,
  not the transaction's start (``now()``): B's ``start`` statement runs after B held the
  advisory lock of its key (of the lifecycle, for ``total``; a claim takes rows only
  under those locks) and counted again in a new snapshot.  A's claim, under the same
  lock, wrote ``start.at <= b``, so it held the lock before B and committed before B's
  count; A's release statement began after ``b``, so it had not committed at B's count.

Either way A was counted by B's claim as a live lease of its key (the leases are renewed;
every job has one claim, token 1, no retry and no reclaim, which is asserted), so at most
the limit such A exist, B included; a sweep's maximum is reached at a start.  A second,
independent check on the handlers' own clocks: ``[t0, t1]``, from the ``running``
handler's start to the ``finalizing`` handler's end (recorded in the job's data), lies
inside the time the store counted the job's lease (after the claim committed, before the
release's statement), so these spans never overlap beyond the limit either; they are what
an application sees.  When the store's clock is this machine's (SQLite, a local
PostgreSQL), ``start.at <= t0`` and ``t1 <= complete.at`` are checked too.

**Rate** (``Rate(20, per=1 s)``): the claim counts the rate table's starts with
``at > now - per`` and admits while fewer than 20, so among any 21 starts the last claim
to commit saw one of the others at least ``per`` before its count: any 21 starts span at
least ``per``.  In the history:

- PostgreSQL: a ``start`` row's ``at`` is its statement's time, after its claim's count
  and before its claim's rate-table row; so taking the starts in ``at`` order, the 21st
  after any start is at least ``per`` later (every start is a window's start and end).
- SQLite: the claim's ``now`` (its count, its rate-table row) is read when the claim
  begins, but each ``start`` row's ``at`` a moment later, when that row is written: the
  history's times lag the limiter's by up to the claim's own duration, so ``at`` alone
  cannot bound a window strictly (a window measured on it could hold 21 while the
  limiter's held 20; seen in most runs: 21 rows within 0.995 to 0.9997 s of a 1 s
  window, while the bounds below held by a millisecond).  The limiter's time of a start
  lies between its ``at`` and a lower bound: the ``at`` of the latest earlier row in the
  feed (SQLite's commit order) that another transaction wrote (any transition but a
  ``start``, or a ``start`` of another worker).  Asserted: in commit order, the 21st
  start after any start has ``at`` at least ``per`` after that start's lower bound
  (sound; weaker than the strict check by the claim's duration, a millisecond or two).

Every job completes, each run ends within :data:`PATIENT` (the only use of a clock as a
bound), the workers exit cleanly on SIGTERM, and the limit was reached at least once (the
backlog is many times the limit: otherwise the test would have tested nothing).
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine, JobLifecycle
from fsm.records import HistoryRecord, Snapshot

from .proc_limits import PER_KEY, RATE, RATE_PER, TOTAL, PerKey, Rated, Total

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PROCESSES = 6
CONCURRENCY = 4
"""Slots per worker process: 24 in all, more than any limit here lets run."""
PATIENT = 180.0
"""How long a drain may take before the test fails (never asserted as a duration)."""
KEYS = 20
PER_KEY_JOBS = 2000
TOTAL_JOBS = 600
"""Fewer than the per-key test's: three at a time drain 60 to 90 jobs a second here."""
RATED_JOBS = 200
TESTS_DIR = Path(__file__).resolve().parents[1]
"""On the children's path: they import ``test_coordination.proc_limits``."""

WORKER = textwrap.dedent(
    f"""
    import logging, sys, time
    from datetime import timedelta

    from fsm import Engine
    from fsm.work import Worker
    from stores.sql import SqlStore
    from test_coordination.proc_limits import LIFECYCLES, handlers

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    url, prefix, name, owner, seed = sys.argv[1:6]
    store = SqlStore(url, table_prefix=prefix, create=False)
    worker = Worker(
        Engine(LIFECYCLES[name], store, owner=owner),
        handlers(int(seed)),
        concurrency={CONCURRENCY},
        poll_interval=timedelta(milliseconds=50),
        handler_connections=1,
    )
    print("ready", flush=True)
    stats = worker.run(install_signals=True)
    print(f"claimed {{stats.claimed}} failed {{stats.failed}} cpu {{time.process_time():.1f}} s", flush=True)
    store.close()
    """
)
"""A worker process of one of ``proc_limits``' lifecycles (its own limits), until SIGTERM.
On PostgreSQL it holds about five connections (the claim loop, the completer, the keeper,
the ``LISTEN``, one for the handlers): 30 for the six."""


# -- children ----------------------------------------------------------------------------------


class Child(ChildProcess):
    """A child process with ``tests/`` on its path; output in ``directory/name.out``/``.err``."""

    def __init__(self, argv: list[str], directory: Path, name: str) -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *filter(None, sys.path)])}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=directory, env=env, stdout=out, stderr=err)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def tail(self) -> str:
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.name} (rc {self.proc.poll()}):\n{self.stdout()[-1500:]}{err[-2500:]}"


def logs(children: Iterable[Child]) -> str:
    return "\n".join(child.tail() for child in children)


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


# -- a drain by real workers --------------------------------------------------------------------


@dataclass
class Drained:
    """What the store holds after a drain: the jobs, and every transition in feed order."""

    jobs: dict[str, Snapshot]
    feed: list[HistoryRecord]
    owners: set[str]
    seconds: float

    def histories(self) -> dict[str, list[HistoryRecord]]:
        found: dict[str, list[HistoryRecord]] = defaultdict(list)
        for record in self.feed:
            found[record.entity_id].append(record)
        return found


def drain(
    target: SqlTarget,
    tmp_path: Path,
    children: list[Child],
    lifecycle: type[JobLifecycle],
    keys: Sequence[str | None],
) -> Drained:
    """Start the worker processes, create one job per key of ``keys`` (in that order), wait
    until every job completed, stop the workers (SIGTERM) and read the store back."""
    store = target.store()  # creates the tables: the children open the store without creating any
    engine = Engine(lifecycle, store, owner="test")
    workers = [
        Child(
            ["-c", WORKER, target.url, target.prefix, lifecycle.__name__, f"w{i}", str(i)],
            tmp_path,
            f"w{i}",
        )
        for i in range(PROCESSES)
    ]
    children += workers
    for child in workers:
        wait_for(functools.partial(_ready_or_exited, child), child.tail)
        assert child.proc.poll() is None, child.tail()

    began = time.monotonic()
    made: list[Snapshot] = []
    for at in range(0, len(keys), 1000):
        chunk = list(keys[at : at + 1000])
        made += engine.create_many([{}] * len(chunk), concurrency_keys=chunk)
    total = len(made)

    def done() -> bool:
        if any(child.proc.poll() is not None for child in workers):
            raise AssertionError(f"a worker exited during the drain:\n{logs(workers)}")
        return engine.counts()["completed"] == total

    wait_for(done, lambda: f"{engine.counts()}\n{logs(workers)}")
    seconds = time.monotonic() - began
    for child in workers:
        child.stop()
    assert [child.proc.returncode for child in workers] == [0] * PROCESSES, logs(workers)

    jobs = {snap.id: snap for snap in store.entities(lifecycle.kind, limit=10_000)}
    assert set(jobs) == {snap.id for snap in made}
    feed: list[HistoryRecord] = []
    after: str | None = None
    while page := store.feed(after, kind=lifecycle.kind, limit=10_000):
        feed += [entry.record for entry in page]
        after = page[-1].position
    return Drained(jobs, feed, {f"w{i}" for i in range(PROCESSES)}, seconds)


def _ready_or_exited(child: Child) -> bool:
    return "ready" in child.stdout() or child.proc.poll() is not None


# -- what the history says ----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One job's run: its history's interval and its handlers' span (this machine's clock)."""

    job: str
    key: str | None
    owner: str
    start: datetime
    end: datetime
    t0: float
    t1: float


def runs(drained: Drained) -> list[Run]:
    """Each job's one run, after checking it is one: completed by ``start``, ``exited``,
    ``complete``, all by one worker under the claim's lease (token 1: no retry, no reclaim,
    no second claim), its handlers' times in its data."""
    found = []
    histories = drained.histories()
    for job_id, snap in drained.jobs.items():
        history = histories[job_id]
        assert snap.state == "completed", snap
        assert [(h.event, h.source, h.target) for h in history] == [
            ("start", "queued", "running"),
            ("exited", "running", "finalizing"),
            ("complete", "finalizing", "completed"),
        ], history
        owners = {h.owner for h in history}
        assert len(owners) == 1 and owners <= drained.owners, history
        assert {h.lease_token for h in history} == {1}, history
        start, end = history[0].at, history[2].at
        assert start < end, history
        t0, t1 = snap.data["t0"], snap.data["t1"]
        assert t0 <= t1, snap.data
        found.append(Run(job_id, snap.concurrency_key, history[0].owner or "", start, end, t0, t1))
    return found


T = TypeVar("T", datetime, float)


def most_at_once(spans: Iterable[tuple[T, T, str]]) -> tuple[int, list[str]]:
    """The most half-open spans ``[begin, end)`` holding one instant, and the jobs of the first
    instant where that many do (an end at ``t`` is swept before a begin at ``t``)."""
    listed = list(spans)
    points = sorted(
        [(end, 0, job) for _, end, job in listed] + [(begin, 1, job) for begin, _, job in listed],
        key=lambda p: (p[0], p[1]),
    )
    active: set[str] = set()
    most, witness = 0, []
    for _, begins, job in points:
        if begins:
            active.add(job)
            if len(active) > most:
                most, witness = len(active), sorted(active)
        else:
            active.discard(job)
    return most, witness


def by(items: Iterable[Run], key: Callable[[Run], Hashable]) -> dict[Hashable, list[Run]]:
    groups: dict[Hashable, list[Run]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def local_clock(target: SqlTarget) -> bool:
    """Whether the store's times come from this machine's clock (SQLite; PostgreSQL here)."""
    return target.dialect == "sqlite" or urlsplit(target.url).hostname in {"127.0.0.1", "localhost", "::1"}


def assert_at_most(target: SqlTarget, found: list[Run], limit: int, group: Callable[[Run], Hashable]) -> int:
    """No instant with more than ``limit`` runs of one group active, by the history's
    intervals and by the handlers' spans (see the module doc); the most found at once."""
    most = 0
    for name, members in by(found, group).items():
        n, witness = most_at_once((r.start, r.end, r.job) for r in members)
        assert n <= limit, f"{n} jobs of {name!r} active at once by the history: {witness}"
        spans, spanned = most_at_once((r.t0, r.t1, r.job) for r in members)
        assert spans <= limit, f"{spans} handlers of {name!r} ran at once: {spanned}"
        most = max(most, n, spans)
    if local_clock(target):  # the handlers ran inside the history's interval, on one clock
        for r in found:
            assert r.start.timestamp() <= r.t0 and r.t1 <= r.end.timestamp(), r
    return most


def weighted_keys(jobs: int, seed: int) -> list[str]:
    """``jobs`` keys of :data:`KEYS`, a few hot ones and a long tail (weights 1/(i+1)), in a
    random order: hot keys queue at their limit while the claims step over them."""
    rng = random.Random(seed)
    names = [f"key{i:02d}" for i in range(KEYS)]
    return rng.choices(names, weights=[1 / (i + 1) for i in range(KEYS)], k=jobs)


# -- 1. per key ---------------------------------------------------------------------------------


def test_processes_never_hold_more_than_the_per_key_limit(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    drained = drain(sql_target, tmp_path, children, PerKey, weighted_keys(PER_KEY_JOBS, 2024))
    found = runs(drained)
    assert len(found) == PER_KEY_JOBS
    most = assert_at_most(sql_target, found, PER_KEY, lambda r: r.key)
    assert most == PER_KEY, "no key ever reached its limit: the test tested nothing"
    owners = sorted({r.owner for r in found})
    print(f"{sql_target.dialect}: {PER_KEY_JOBS} jobs in {drained.seconds:.1f} s, by {owners}")


# -- 2. in all ----------------------------------------------------------------------------------


def test_processes_never_hold_more_than_the_total_limit(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    keys = weighted_keys(TOTAL_JOBS, 2025)  # keys too: the total counts every key at once
    drained = drain(sql_target, tmp_path, children, Total, keys)
    found = runs(drained)
    assert len(found) == TOTAL_JOBS
    most = assert_at_most(sql_target, found, TOTAL, lambda r: "all")
    assert most == TOTAL, "the lifecycle never reached its limit: the test tested nothing"
    print(f"{sql_target.dialect}: {TOTAL_JOBS} jobs in {drained.seconds:.1f} s")


# -- 3. a rate -----------------------------------------------------------------------------------


def test_processes_never_start_more_than_the_rate(sql_target: SqlTarget, tmp_path: Path, children: list[Child]) -> None:
    drained = drain(sql_target, tmp_path, children, Rated, [None] * RATED_JOBS)
    found = runs(drained)
    assert len(found) == RATED_JOBS
    starts = [h for h in drained.feed if h.event == "start"]
    assert len(starts) == RATED_JOBS
    if sql_target.dialect == "postgres":
        times = sorted(h.at for h in starts)
        lower = times  # the limiter's time of each start is its row's (see the module doc)
    else:
        times, lower = sqlite_start_bounds(drained.feed)
    assert len(times) == RATED_JOBS
    for k in range(RATED_JOBS - RATE):
        assert times[k + RATE] - lower[k] >= RATE_PER, (
            f"{RATE + 1} starts within {times[k + RATE] - lower[k]}: starts {k}..{k + RATE}, "
            f"from {lower[k].isoformat()} (bound) {times[k].isoformat()} (at) to {times[k + RATE].isoformat()}"
        )
    # the limit was reached: some window of the rate's length held as many starts as it allows
    assert any(times[k + RATE - 1] - times[k] < RATE_PER for k in range(RATED_JOBS - RATE + 1))
    bound = min(times[k + RATE] - lower[k] for k in range(RATED_JOBS - RATE))
    by_at = min(times[k + RATE] - times[k] for k in range(RATED_JOBS - RATE))  # SQLite: not a bound
    print(f"{sql_target.dialect}: {RATED_JOBS} jobs in {drained.seconds:.1f} s; {RATE + 1} starts span")
    print(f"  at least {bound.total_seconds():.6f} s by the bounds, {by_at.total_seconds():.6f} s by the rows' at")


def sqlite_start_bounds(feed: list[HistoryRecord]) -> tuple[list[datetime], list[datetime]]:
    """The starts in commit order (SQLite's feed): each one's ``at``, and a lower bound of the
    time its claim counted the rate: the latest ``at`` of the earlier rows another
    transaction wrote (a transition other than ``start``, or a ``start`` of another worker:
    a claim writes only ``start`` rows, of one worker), the epoch when there is none.  Each
    of those committed before the claim took the write lock, and read its time before."""
    times: list[datetime] = []
    lower: list[datetime] = []
    latest_other = datetime.min.replace(tzinfo=UTC)
    latest_start: dict[str | None, datetime] = {}
    for h in feed:
        if h.event != "start":
            latest_other = max(latest_other, h.at)
            continue
        if times:  # read under the write lock: in commit order
            assert h.at >= times[-1], f"starts out of commit order: {times[-1]} then {h}"
        lower.append(max([latest_other, *(t for owner, t in latest_start.items() if owner != h.owner)]))
        times.append(h.at)
        latest_start[h.owner] = h.at
    return times, lower
