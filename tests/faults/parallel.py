"""The fault scenario of parallel regions: a worker per region, real processes, killed and
paused at random, while reapers reap the regions and race the join.

    python -m tests.faults.parallel run --store sqlite --pipelines 40
    python -m tests.faults.parallel run --store postgres        # a private server of its own

Each pipeline is a :class:`tests.faults.release.Release`: ``begin`` enters ``checks``, whose
``build`` region (``running``, then a ``finalizing`` that runs two ledger effects) and
``tests`` region run in two worker processes each; the join (``done.state.checks``) moves
the pipeline to ``released``.  The workers run with ``max_attempts=1``, so a region whose
holder dies in ``running`` is ended by the reaper's set-based move (``broken`` or
``red``): then the reaper's tick joins, racing a sibling's worker that joins after its own
final write.  A finalizer whose holder dies is reclaimed and resumed, replaying its
recorded effects.

Checked at the end (printed, each a problem):

- every pipeline was joined exactly once (one ``done.state.checks`` row), after both its
  regions' final rows, and rests in ``released``;
- every entity's history is gap-free and enters a final state at most once (I5, I6), the
  pipelines' and each region row's;
- the build finalizer's effects: at most one recorded result per key (I4), recorded by an
  execution under that lease, none executed under a later lease than the recorded one
  (a replay never re-executes), both recorded for every ``built`` region;
- no finalizing region was moved by the reaper while its holder's lease was fresh (I1):
  each reaper move out of ``finalizing`` came after its holder was killed or paused, or
  after every lapse time its holder logged for that lease (``hold``: the keeper's
  deadline, logged before each effect and before the final write);
- every fire a worker saw acknowledged is in history (I8);
- no worker or reaper died of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from fsm import Engine, Policy
from fsm.errors import Fenced, StoreUnavailable
from fsm.regions import region_row_id
from fsm.testing.checks import acknowledged_problems, effect_problems, history_problems
from fsm.work import Job, Worker

from .proc import Log, open_store, retrying
from .release import Release

REPO = Path(__file__).resolve().parents[2]
REGIONS = ("build", "tests")
CLOCK_SLACK_S = 0.05
"""How far the workers' wall clock and the database's may disagree (one machine here)."""
EFFECTS = ("publish-artifact", "sign")


def policy(ttl: float) -> Policy:
    """Short leases; one attempt per region (a region whose holder dies in ``running`` is
    ended by the reaper, racing its sibling's join); a finalizer is reclaimed instead."""
    return Policy(
        lease_ttl=timedelta(seconds=ttl),
        renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1), "run": timedelta(hours=1)},
        max_attempts=1,
        max_reclaims=1000,
    )


def fails(entity_id: str) -> bool:
    """A fifth of the test runs fail (the same answer in every process)."""
    return zlib.crc32(entity_id.encode()) % 5 == 0


class Handlers:
    def __init__(self, log: Log, work_s: float) -> None:
        self.log = log
        self.work_s = work_s

    def _fire(self, job: Job, event: str) -> None:
        token = job.held.lease.token
        result = retrying(job, lambda: job.fire(event, idempotency_key=f"{event}:{token}"), event)
        self.log.write("ack", job.id, result.record.seq, result.record.event)

    def _claimed(self, job: Job) -> None:
        self.log.write("claim", job.id, job.held.lease.token, job.state)

    def running(self, job: Job) -> None:
        self._claimed(job)
        time.sleep(random.uniform(0, 2 * self.work_s))
        self._fire(job, "finish")

    def _hold(self, job: Job) -> None:
        """When the lease this holder holds lapses at the latest, as it knows it now (its
        keeper renews it): the reaper must not move the row out of finalizing before."""
        held = job.held
        if not held.lost:
            until = time.time() + (held.deadline - time.monotonic())
            self.log.write("hold", job.id, held.lease.token, f"{until:.6f}")

    def finalizing(self, job: Job) -> None:
        self._claimed(job)
        token = job.held.lease.token
        for key in EFFECTS:
            self._hold(job)

            def run(idempotency_key: str, key: str = key) -> dict[str, Any]:
                self.log.write("effect", job.id, key, token)
                time.sleep(random.uniform(0, self.work_s))
                return {"token": token}

            retrying(job, lambda key=key, run=run: job.run(key, run), key)  # type: ignore[misc]
        self._hold(job)
        self._fire(job, "succeed")

    def run(self, job: Job) -> None:
        self._claimed(job)
        time.sleep(random.uniform(0, 2 * self.work_s))
        self._fire(job, "test_fail" if fails(job.id) else "test_pass")


def worker_main(args: argparse.Namespace) -> None:
    store = open_store(args.url)
    pipelines = Engine(Release, store, policy=policy(args.ttl), owner=f"{args.region}{args.index}:{os.getpid()}")
    engine = pipelines.region(args.region)
    log = Log(Path(args.dir) / f"worker-{os.getpid()}.log")
    handlers = Handlers(log, args.work_ms / 1000)
    table = (
        {"running": handlers.running, "finalizing": handlers.finalizing}
        if args.region == "build"
        else {"run": handlers.run}
    )
    worker = Worker(engine, table, concurrency=4, poll_interval=timedelta(seconds=0.1), grace=timedelta(seconds=2))
    log.write("start", args.index)
    worker.run()


def reaper_main(args: argparse.Namespace) -> None:
    from fsm.reaping import Reaper

    store = open_store(args.url)
    reaper = Reaper(
        store,
        {Release: policy(args.ttl)},
        {"interval": timedelta(seconds=0.3), "batch_size": 200},
        owner=f"reaper{args.index}:{os.getpid()}",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    reaper.start()
    stop.wait()
    reaper.stop()


# -- the runner ---------------------------------------------------------------------------------


@dataclass
class Summary:
    store: str
    pipelines: int
    problems: list[str] = field(default_factory=list)
    kills: int = 0
    stops: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    reaped_regions: int = 0
    """Regions the reaper ended (a final state entered by a reaper move): its joins raced."""
    reclaimed_finalizers: int = 0
    replays: int = 0
    """Finalizers that were reclaimed, resumed (their recorded effects replayed) and finished."""
    elapsed_s: float = 0.0
    deaths: dict[int, float] = field(default_factory=dict)
    """Worker pid -> when it was killed or paused."""
    checked_moves: int = 0
    planned: int = 0
    """Planned deaths: a tests holder in ``run``, a build holder in ``finalizing``."""
    """Reaper moves whose holder's death was checked (I1)."""

    def text(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        lines = [
            f"parallel regions [{self.store}]: {self.pipelines} pipelines in {self.elapsed_s:.1f} s; "
            f"{self.kills} kills ({self.planned} planned), {self.stops} pauses; regions ended by the reaper "
            f"{self.reaped_regions}, finalizers reclaimed {self.reclaimed_finalizers}, finalizers resumed to the end "
            f"{self.replays}, reaper moves checked against their holder's death {self.checked_moves}; {outcomes}",
            f"  {len(self.problems)} problems",
            *(f"  - {p}" for p in self.problems[:30]),
        ]
        return "\n".join(lines)


class Fleet:
    def __init__(self, url: str, directory: Path, ttl: float, work_ms: float) -> None:
        self.url, self.dir, self.ttl, self.work_ms = url, directory, ttl, work_ms
        self.workers: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.reapers: list[subprocess.Popen[bytes]] = []
        self.unexpected: list[str] = []
        self.spawned = 0

    def spawn(self, role: str, index: int, region: str = "") -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.faults.parallel", role, self.url, str(self.dir), str(index)]
        argv += ["--ttl", str(self.ttl), "--work-ms", str(self.work_ms), "--region", region or "build"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
        err = open(self.dir / f"{role}{region}{index}-{self.spawned}.err", "wb")  # noqa: SIM115 - the child owns it
        self.spawned += 1
        try:
            return subprocess.Popen(argv, cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT)
        finally:
            err.close()

    def start(self) -> None:
        self.reapers = [self.spawn("reaper", i) for i in range(2)]
        for region in REGIONS:
            for i in range(2):
                self.workers[(region, i)] = self.spawn("worker", i, region)

    def check_alive(self) -> None:
        for (region, i), proc in list(self.workers.items()):
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                self.unexpected.append(f"{region} worker {i} exited on its own with {proc.returncode}")
                self.workers[(region, i)] = self.spawn("worker", i, region)
        for i, proc in enumerate(self.reapers):
            if proc.poll() is not None:
                self.unexpected.append(f"reaper {i} exited on its own with {proc.returncode}")
                self.reapers[i] = self.spawn("reaper", i)

    def chaos(self, rng: random.Random, summary: Summary) -> None:
        """SIGKILL (and respawn) a random region worker, or pause it past its lease TTL."""
        (region, i), proc = rng.choice(sorted(self.workers.items(), key=lambda kv: kv[0]))
        if summary.kills == 0 or rng.random() < 0.6:
            summary.deaths[proc.pid] = time.time()
            proc.kill()
            proc.wait()
            summary.kills += 1
            self.workers[(region, i)] = self.spawn("worker", i, region)
        else:
            summary.deaths.setdefault(proc.pid, time.time())
            os.kill(proc.pid, signal.SIGSTOP)
            summary.stops += 1
            pause = self.ttl + rng.uniform(0.3, 1.0)
            threading.Timer(pause, lambda pid=proc.pid: _cont(pid)).start()

    def kill_holder(self, store: Any, region: str, state: str, summary: Summary) -> bool:
        """SIGKILL (and respawn) a worker of ``region`` that holds a row in ``state`` now:
        the planned deaths (a region's ``run`` holder, whose region the reaper then ends
        while its sibling may join; a ``finalizing`` holder, reclaimed and resumed)."""
        for (name, i), proc in sorted(self.workers.items(), key=lambda kv: kv[0]):
            if name != region:
                continue
            log = self.dir / f"worker-{proc.pid}.log"
            if not log.exists():
                continue
            for line in log.read_text().splitlines():
                fields = line.split("\t")
                if fields[0] != "claim" or fields[4] != state:
                    continue
                row = store.get(fields[2])
                if row.state == state and row.lease_token == int(fields[3]):
                    summary.deaths[proc.pid] = time.time()
                    proc.kill()
                    proc.wait()
                    summary.kills += 1
                    summary.planned += 1
                    self.workers[(name, i)] = self.spawn("worker", i, name)
                    return True
        return False

    def stop(self) -> None:
        everyone = [*self.workers.values(), *self.reapers]
        for proc in everyone:
            _cont(proc.pid)
            if proc.poll() is None:
                proc.terminate()
        for proc in everyone:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended
        os.kill(pid, signal.SIGCONT)


def run(store_kind: str, pipelines: int = 30, seed: int = 1, timeout: float = 150.0) -> Summary:
    """One run of the scenario (see the module doc)."""
    from stores.sql import SqlStore

    rng = random.Random(seed)
    summary = Summary(store_kind, pipelines)
    directory = Path(tempfile.mkdtemp(prefix=f"fsm-parallel-{store_kind}-"))
    server = None
    if store_kind == "postgres":
        from .postgres import PrivateServer

        server = PrivateServer()
        server.start()
        url = server.url
    else:
        url = f"sqlite:///{directory}/fsm.db"
    store = SqlStore(url, busy_timeout=10.0)
    ttl = 1.0
    engine = Engine(Release, store, policy=policy(ttl), owner="runner")
    fleet = Fleet(url, directory, ttl, work_ms=150)
    try:
        for n in range(pipelines):
            engine.create(f"rel-{n:04d}", data={"n": n})
            engine.fire(f"rel-{n:04d}", "begin")
        fleet.start()
        plans = [("tests", "run"), ("build", "finalizing"), ("tests", "run"), ("build", "finalizing")]
        started = time.time()
        next_chaos = started + 1.5
        while True:
            counts = engine.counts()
            if counts.get("released", 0) >= pipelines:
                break
            if time.time() - started > timeout:
                summary.problems.append(f"timeout: {counts} after {timeout:.0f} s")
                break
            fleet.check_alive()
            if plans and fleet.kill_holder(store, *plans[0], summary):
                plans.pop(0)
            if time.time() >= next_chaos and counts.get("released", 0) < 0.9 * pipelines:
                fleet.chaos(rng, summary)
                next_chaos = time.time() + rng.uniform(0.3, 1.2)
            time.sleep(0.05)
        summary.elapsed_s = time.time() - started
        fleet.check_alive()
        fleet.stop()
        summary.problems += fleet.unexpected
        _analyse(engine, directory, summary)
    finally:
        fleet.stop()
        store.close()
        if server is not None:
            server.destroy()
    if not summary.problems:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    else:
        summary.problems.append(f"logs kept in {directory}")
    return summary


def _lines(directory: Path) -> list[tuple[int, list[str]]]:
    """Every worker's log lines, each with the pid of the worker that wrote it."""
    found: list[tuple[int, list[str]]] = []
    for path in directory.glob("worker-*.log"):
        pid = int(path.stem.split("-")[1])
        found += [(pid, line.split("\t")) for line in path.read_text().splitlines() if line]
    return found


def _analyse(engine: Engine, directory: Path, summary: Summary) -> None:
    store = engine.store
    lines = _lines(directory)
    acks: dict[str, list[tuple[int, str]]] = defaultdict(list)
    executions: dict[tuple[str, str], list[int]] = defaultdict(list)
    holders: dict[tuple[str, int], int] = {}  # (row, lease token) -> the pid that claimed it
    holds: dict[tuple[str, int], list[float]] = defaultdict(list)  # when each lease lapses at the latest
    for pid, fields in lines:
        if fields[0] == "claim":
            holders[(fields[2], int(fields[3]))] = pid
        elif fields[0] == "hold":
            holds[(fields[2], int(fields[3]))].append(float(fields[4]))
        elif fields[0] == "ack":
            acks[fields[2]].append((int(fields[3]), fields[4]))
        elif fields[0] == "effect":
            executions[(fields[2], fields[3])].append(int(fields[4]))
    for n in range(summary.pipelines):
        entity_id = f"rel-{n:04d}"
        snap = store.get(entity_id)
        history = store.history(entity_id)
        summary.problems += history_problems(Release, snap, history)
        joins = [r for r in history if r.event == "done.state.checks"]
        if snap.state != "released" or len(joins) != 1:
            summary.problems.append(f"{entity_id} is in {snap.state!r} with {len(joins)} joins")
            continue
        outcome = []
        for region, cls in Release.regions["checks"].items():
            row_id = region_row_id(entity_id, region)
            row = store.get(row_id)
            rows = store.history(row_id)
            summary.problems += history_problems(cls, row, rows)
            summary.problems += acknowledged_problems(row_id, acks.get(row_id, []), rows)
            outcome.append(row.state)
            final = [r for r in rows if r.target in cls.table.finals]
            if not final or final[0].at > joins[0].at:
                summary.problems.append(f"{entity_id} joined at {joins[0].at} before {row_id} ended ({final})")
            if final and final[0].actor == "reaper":
                summary.reaped_regions += 1
            for record in rows:
                if record.actor != "reaper":
                    continue
                if record.source == "finalizing" and record.reason == "reclaimed":
                    summary.reclaimed_finalizers += 1
                # I1: a reaper move out of finalizing took away a lease that was not fresh:
                # its holder was killed or paused before the move, or the lease had lapsed
                # (a holder alive but starved of CPU lets its lease lapse: then the fence
                # refuses its writes).  A reclaim's row records the new token: the old is one less.
                if record.source != "finalizing":
                    continue
                token = record.lease_token
                tokens = [] if token is None else [token, token - 1] if record.reason == "reclaimed" else [token]
                found = next(((t, holders[(row_id, t)]) for t in tokens if (row_id, t) in holders), None)
                if found is None:
                    continue
                held_token, pid = found
                died = summary.deaths.get(pid)
                moved_at = record.at.timestamp()
                summary.checked_moves += 1
                fresh = [u for u in holds.get((row_id, held_token), []) if u > moved_at + CLOCK_SLACK_S]
                if (died is None or died > moved_at) and fresh:
                    summary.problems.append(
                        f"I1: the reaper moved {row_id} out of finalizing (seq {record.seq}, {record.reason}) while "
                        f"its holder (pid {pid}) held a lease fresh until {max(fresh):.3f}, "
                        f"{max(fresh) - moved_at:.3f} s after the move"
                    )
            if region == "build":
                effects = store.effects(row_id)
                summary.problems += effect_problems(row_id, [e for e in effects if e.key in EFFECTS])
                recorded = {e.key: e.result["token"] for e in effects if e.key in EFFECTS}
                for key, token in recorded.items():
                    ran = executions.get((row_id, key), [])
                    if token not in ran:
                        summary.problems.append(f"I4: {row_id} {key} recorded under {token}, ran under {ran}")
                    if any(t > token for t in ran):
                        summary.problems.append(f"I4: {row_id} {key} ran again after recorded ({ran} vs {token})")
                if row.state == "built" and any(r.reason == "reclaimed" for r in rows):
                    summary.replays += 1  # a finalizer resumed after its holder died, and finished
                if row.state == "built" and set(recorded) != set(EFFECTS):
                    summary.problems.append(f"{row_id} built with effects {sorted(recorded)}")
        summary.outcomes["+".join(outcome)] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.parallel")
    parser.add_argument("role", choices=["worker", "reaper", "run"])
    parser.add_argument("url", nargs="?", default="")
    parser.add_argument("dir", nargs="?", default="")
    parser.add_argument("index", nargs="?", type=int, default=0)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--work-ms", type=float, default=150)
    parser.add_argument("--region", choices=REGIONS, default="build")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pipelines", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"%(asctime)s {args.role} %(message)s")
    if args.role == "run":
        summary = run(args.store, args.pipelines, args.seed)
        print(summary.text())
        return 1 if summary.problems else 0
    try:
        (worker_main if args.role == "worker" else reaper_main)(args)
    except (StoreUnavailable, Fenced):  # pragma: no cover - logged by the worker already
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
