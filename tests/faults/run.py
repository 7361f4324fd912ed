"""The fault suite: real worker and reaper processes, killed and paused at random.

    python -m tests.faults.run                      # short run, SQLite and a private PostgreSQL
    python -m tests.faults.run --long               # thousands of jobs on each
    python -m tests.faults.run --store sqlite --jobs 500 --seed 7

(``FSM_FAULTS=long pytest tests/faults -s -n 0`` runs the long version through pytest.)

What runs: ``workers`` processes, each an :class:`fsm.Worker` (see :mod:`tests.faults.proc`),
and two reaper processes, all on one database: a SQLite file, or a PostgreSQL server
this suite starts for itself (``initdb`` + ``pg_ctl`` in a temporary directory) because it
stops and restarts it mid-run; the shared server is never touched.  This process feeds
jobs (keeping a short queue, as a producer would), and a chaos loop SIGKILLs random
workers (respawning them) or SIGSTOPs them and SIGCONTs them after more than a lease TTL.
A fraction of the jobs (``--waits``, 0.3 by default) park on the way (durable waits): half
``job.wait_for`` a message that this process sends at a random moment after creating the
job (before the wait begins, or while the job is parked; a third of them twice with one
idempotency key), half ``job.sleep`` a short random time between two effects; a worker
killed or paused while jobs it parked are asleep leaves them to any other.

At the end it checks and prints (see :class:`Summary`):

- every job is final;
- each effect key has at most one recorded result (I4), the recorded result came from an
  execution of that key, no execution started under a later lease than the recorded one
  (a replay never re-executes), and every completed job recorded all its effects;
- history is gap-free (I6) and no entity entered a final state twice (I5);
- every acknowledged fire (a worker logged what ``fire()`` returned) is in history;
- durable waits (W): a waiting job took its own message, once (one ledger row per key
  however many sends; never a timeout), and every replay of the wait returned the same
  payload; a sleeping job ran no effect after its sleep before its wake time (the store's
  clock) and recorded its sleep once; a job that never parks recorded no step; each job
  parked by a worker that was then killed was resumed by another;
- the per-key limit (L): jobs are spread over ``--keys`` concurrency keys and the workers
  keep ``Limits(per_key=...)`` (2 of their 12 slots per key: it binds); at no instant did
  more jobs of one key hold their leases than the limit, by intervals read from the
  workers' logs that lie inside each lease (see :func:`_limit_problems`); a SIGKILLed
  worker's limited slots free with its leases: each job it held is claimed again, within
  the bound below;
- no worker or reaper process died of its own (a store outage is never fatal);
- the longest time from a holder's death (the kill or stop) to the reaper moving its
  entity (I2) and to a worker claiming it again, against ``TTL + interval``.  The claim
  bound adds an allowance for scheduling on a loaded machine (``--allowance``, default
  5 s): the reaper's tick itself, the worker's poll (0.1 s), the wait of an expired job
  behind the short queue (claims take the longest-unchanged rows first), and CPU
  contention (two cores, other test runs).  A respawned worker's start-up is *not* in it:
  the chaos loop always leaves a warmed-up worker running, and any live worker may claim.
  A pause (SIGSTOP) longer than the TTL replaces the TTL in its bound: a process stopped
  inside a transaction keeps its locks until SIGCONT (on SQLite, the database's one write
  lock: every writer, the reapers too, waits for it; on PostgreSQL, row locks).
  Deaths whose window overlaps the PostgreSQL restart are listed apart, not held to it.
- the throughput (jobs/s), a figure printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsm import Engine, JobLifecycle
from fsm.errors import EntityExists, StoreUnavailable
from fsm.records import PARKED_KEY
from fsm.testing.checks import acknowledged_problems, effect_problems, history_problems

from .proc import MESSAGE, SLEEP, WAIT, parks, payload_for, policy

REPO = Path(__file__).resolve().parents[2]
FINALS = JobLifecycle.table.finals


@dataclass
class Config:
    store: str = "sqlite"
    jobs: int = 200
    workers: int = 3
    concurrency: int = 4
    reapers: int = 2
    effects: int = 3
    effect_ms: float = 20
    run_ms: float = 20
    ttl: float = 1.0
    interval: float = 0.3
    poll: float = 0.1
    chaos_every: float = 1.0
    """Mean seconds between two chaos actions."""
    backlog: int = 0
    """Queued jobs the feeder keeps at most (0: one per worker slot)."""
    allowance: float = 5.0
    """Seconds added to TTL + interval for scheduling on a loaded machine (see the module doc)."""
    timeout: float = 240.0
    restart_server: bool = True
    seed: int = 0
    waits: float = 0.3
    """The fraction of jobs that park (durable waits; see the module doc); 0: none."""
    send_within: float = 2.5
    """A waiting job's message is sent up to this many seconds after the job is created."""
    keys: int = 4
    """Jobs are spread over this many concurrency keys (0: none, and no limit)."""
    per_key: int = 2
    """The workers keep ``Limits(per_key=...)``: fewer slots than the workers have, so the
    limit binds, and a killed or paused worker holds limited slots."""

    @classmethod
    def short(cls, store: str) -> Config:
        return cls(store=store, jobs=300, chaos_every=0.5)

    @classmethod
    def long(cls, store: str) -> Config:
        return cls(store=store, jobs=3000, workers=4, effects=5, chaos_every=1.5, timeout=1800.0)


@dataclass
class Death:
    pid: int
    at: float
    how: str  # "kill" or "stop"
    resumed_at: float | None = None
    """When a stopped process got SIGCONT."""
    held: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Summary:
    config: Config
    problems: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    """From the first claim to the last job final (the fleet's start-up left out)."""
    startup_s: float = 0.0
    first_claim_at: float | None = None
    kills: int = 0
    stops: int = 0
    server_restart_s: float | None = None
    effect_keys: int = 0
    executions: int = 0
    re_executions: int = 0
    acks: int = 0
    deaths_measured: int = 0
    deaths_in_outage: int = 0
    worst_reap_s: float | None = None
    worst_claim_s: float | None = None
    worst_claim_kill_s: float | None = None
    worst_claim_stop_s: float | None = None
    longest_pause_s: float = 0.0
    worst_claim_in_outage_s: float | None = None
    store_retries: int = 0
    tick_failures: int = 0
    sleepers: int = 0
    waiters: int = 0
    sends: int = 0
    """Calls to ``Engine.send`` (a duplicate with the same key included)."""
    sent_twice: int = 0
    parks: int = 0
    """Times a handler parked (its ``parked`` log line)."""
    replays: int = 0
    """Parks followed by a claim (a resume: a new lease, the recorded steps replayed)."""
    parked_at_kill: int = 0
    """Jobs asleep or waiting, parked by a worker, when that worker was SIGKILLed."""
    parked_at_stop: int = 0
    slots_at_kill: int = 0
    """Jobs (each holding a limited slot) held by a worker when it was SIGKILLed."""
    limited_holds: int = 0
    """Holds (claim to leaving) the per-key limit check looked at."""
    most_held: int = 0
    """The most jobs of one key held at once, among them."""

    @property
    def claim_bound_s(self) -> float:
        return self.config.ttl + self.config.interval + self.config.allowance

    def bound_for(self, death: Death) -> float:
        """TTL + interval + allowance; for a pause, the pause if longer than the TTL: a
        process stopped inside a transaction keeps its locks (SQLite's write lock, a
        PostgreSQL row lock) until SIGCONT, and the reaper's write waits for them."""
        pause = 0.0 if death.resumed_at is None else death.resumed_at - death.at
        return max(self.config.ttl, pause) + self.config.interval + self.config.allowance

    @property
    def reap_bound_s(self) -> float:
        return self.config.ttl + self.config.interval + self.config.allowance

    @property
    def throughput(self) -> float:
        return self.config.jobs / self.elapsed_s if self.elapsed_s else 0.0

    def text(self) -> str:
        c = self.config
        final = sum(n for s, n in self.states.items() if s in FINALS)
        lines = [
            f"fault suite on {c.store}: {c.jobs} jobs, {c.workers} workers x {c.concurrency}, {c.reapers} reapers, "
            f"TTL {c.ttl:g} s, reaper interval {c.interval:g} s, {c.effects} effects per job, seed {c.seed}",
            f"  chaos: {self.kills} SIGKILL (respawned), {self.stops} SIGSTOP/SIGCONT"
            + (
                f", server stopped and restarted once ({self.server_restart_s:.1f} s down)"
                if self.server_restart_s is not None
                else ""
            ),
            f"  every job final: {final}/{c.jobs} ({', '.join(f'{k} {v}' for k, v in sorted(self.states.items()))})",
            f"  effects: {self.effect_keys} keys recorded once each; {self.executions} executions, "
            f"{self.re_executions} re-executions by a later holder (at least once, recorded exactly once)",
            "  history gap-free (I6), no entity entered a final state twice (I5): "
            + ("yes" if not any(p.startswith(("I5", "I6")) for p in self.problems) else "NO"),
            f"  acknowledged fires in history: {self.acks} checked, "
            + ("all present" if not any(p.startswith("I8") for p in self.problems) else "SOME MISSING"),
            f"  durable waits (W): {self.sleepers} jobs slept, {self.waiters} waited for a message "
            f"({self.sends} sends, {self.sent_twice} sent twice with one key: one delivery each); {self.parks} parks, "
            f"{self.replays} resumes; {self.parked_at_kill} jobs parked by a worker when it was SIGKILLed, "
            f"{self.parked_at_stop} when it was SIGSTOPped: "
            + ("each resumed, no W problem" if not any(p.startswith("W") for p in self.problems) else "PROBLEMS"),
            (
                f"  per-key limit (L): {c.per_key} per key over {c.keys} keys; at most {self.most_held} of one key "
                f"held at once over {self.limited_holds} holds; {self.slots_at_kill} limited slots held by SIGKILLed "
                f"workers, each freed with its lease (its job claimed again)"
                + ("" if not any(p.startswith("L:") for p in self.problems) else ": LIMIT EXCEEDED")
                if c.keys
                else "  per-key limit: none"
            ),
            f"  store outages absorbed: {self.store_retries} handler retries logged, "
            f"{self.tick_failures} reaper ticks failed and were retried",
            f"  death -> reaped (I2): worst {_s(self.worst_reap_s)}, TTL + interval = {c.ttl + c.interval:.1f} s "
            f"(+ allowance {c.allowance:g} s = {self.reap_bound_s:.1f} s)",
            f"  death -> claimed again: worst {_s(self.worst_claim_s)} over {self.deaths_measured} deaths: "
            f"{_s(self.worst_claim_kill_s)} after a SIGKILL (bound TTL + interval + allowance = "
            f"{self.claim_bound_s:.1f} s), {_s(self.worst_claim_stop_s)} after a SIGSTOP (bound: the pause, "
            f"up to {self.longest_pause_s:.1f} s, where longer than the TTL, + interval + allowance)"
            + (
                f"; {self.deaths_in_outage} deaths overlapping the server restart: worst "
                f"{_s(self.worst_claim_in_outage_s)} (not held to the bound)"
                if self.deaths_in_outage
                else ""
            ),
            f"  throughput: {self.throughput:.1f} jobs/s ({c.jobs} jobs in {self.elapsed_s:.1f} s from the first "
            f"claim, under chaos; the fleet took {self.startup_s:.1f} s to start)",
            f"  problems: {len(self.problems)}",
        ]
        lines += [f"    - {p}" for p in self.problems[:30]]
        if len(self.problems) > 30:
            lines.append(f"    ... and {len(self.problems) - 30} more")
        return "\n".join(lines)


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


class Fleet:
    """The worker and reaper processes, spawned from ``python -m tests.faults.proc``.

    A paused worker is resumed (SIGCONT) by a thread of its own, on time whatever the main
    loop is doing: on SQLite a worker stopped inside a write transaction keeps the
    database's write lock, so any write of the main loop (a create, a send) waits for that
    worker; were the SIGCONT sent by the main loop, the two would wait for each other."""

    def __init__(self, config: Config, url: str, directory: Path) -> None:
        self.config = config
        self.url = url
        self.dir = directory
        self.workers: dict[int, subprocess.Popen[bytes]] = {}  # index -> process
        self.reapers: list[subprocess.Popen[bytes]] = []
        self.stopped: dict[int, tuple[float, Death]] = {}  # index -> when to SIGCONT, the pause
        self.spawned = 0
        self.unexpected: list[str] = []
        self._lock = threading.RLock()  # the processes and pauses, between the main loop and the resumer
        self._done = threading.Event()
        self._resumer: threading.Thread | None = None

    def _spawn(self, role: str, index: int) -> subprocess.Popen[bytes]:
        c = self.config
        argv = [sys.executable, "-m", "tests.faults.proc", role, self.url, str(self.dir), str(index)]
        argv += ["--ttl", str(c.ttl), "--interval", str(c.interval), "--poll", str(c.poll)]
        argv += ["--concurrency", str(c.concurrency), "--effects", str(c.effects)]
        argv += ["--effect-ms", str(c.effect_ms), "--run-ms", str(c.run_ms), "--waits", str(c.waits)]
        argv += ["--per-key", str(c.per_key if c.keys else 0)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
        stderr = open(self.dir / f"{role}{index}-{self.spawned}.err", "wb")  # noqa: SIM115 - the child owns it
        self.spawned += 1
        try:
            return subprocess.Popen(argv, cwd=REPO, env=env, stdout=stderr, stderr=subprocess.STDOUT)
        finally:
            stderr.close()

    def start(self) -> None:
        with self._lock:
            self.reapers = [self._spawn("reaper", i) for i in range(self.config.reapers)]
            for i in range(self.config.workers):
                self.workers[i] = self._spawn("worker", i)
        self._resumer = threading.Thread(target=self._resume_loop, name="faults-resumer", daemon=True)
        self._resumer.start()

    def _resume_loop(self) -> None:
        while not self._done.wait(0.02):
            self.resume_due(time.time())

    def check_alive(self) -> None:
        """A process that exited without being killed by us died of its own: a problem."""
        with self._lock:
            self._check_alive()

    def _check_alive(self) -> None:
        for i, proc in list(self.workers.items()):
            if proc.poll() is not None:
                self.unexpected.append(f"worker {i} (pid {proc.pid}) exited on its own with {proc.returncode}")
                self.workers[i] = self._spawn("worker", i)
        for i, proc in enumerate(self.reapers):
            if proc.poll() is not None:
                self.unexpected.append(f"reaper {i} (pid {proc.pid}) exited on its own with {proc.returncode}")
                self.reapers[i] = self._spawn("reaper", i)

    def has_claimed(self, index: int) -> bool:
        try:
            return "claim\t" in (self.dir / f"worker-{self.workers[index].pid}.log").read_text()
        except FileNotFoundError:
            return False

    def resume_due(self, now: float) -> None:
        with self._lock:
            for i, (due, death) in list(self.stopped.items()):
                if now >= due:
                    os.kill(self.workers[i].pid, signal.SIGCONT)
                    death.resumed_at = time.time()
                    del self.stopped[i]

    def chaos(self, rng: random.Random, deaths: list[Death]) -> None:
        """SIGKILL (and respawn) or SIGSTOP one random worker, leaving at least one working."""
        with self._lock:
            self._chaos(rng, deaths)

    def _chaos(self, rng: random.Random, deaths: list[Death]) -> None:
        # only warmed-up workers (they have claimed something; one still starting holds
        # nothing), and at least one of them is left running: the bound measures how soon
        # the reaper and a live worker take over, not how long a respawn takes to start
        candidates = [i for i in self.workers if i not in self.stopped and self.has_claimed(i)]
        if len(candidates) < 2:
            return
        i = rng.choice(candidates)
        proc = self.workers[i]
        # the first action is a SIGKILL: every run kills a worker at least once (with jobs
        # it parked asleep or waiting, as a rule, when --waits is on)
        if not any(d.how == "kill" for d in deaths) or rng.random() < 0.5:
            proc.kill()
            deaths.append(Death(proc.pid, time.time(), "kill"))
            proc.wait()
            self.workers[i] = self._spawn("worker", i)
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            death = Death(proc.pid, time.time(), "stop")
            deaths.append(death)
            self.stopped[i] = (time.time() + self.config.ttl + rng.uniform(0.3, 1.0), death)

    def stop(self) -> None:
        self._done.set()
        if self._resumer is not None:
            self._resumer.join()
        with self._lock:
            for i, (_, death) in list(self.stopped.items()):
                os.kill(self.workers[i].pid, signal.SIGCONT)
                death.resumed_at = time.time()
            self.stopped.clear()
            everyone = [*self.workers.values(), *self.reapers]
        for proc in everyone:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for proc in everyone:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _retry(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """This process's own store calls ride out the server restart too."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return fn(*args, **kwargs)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run(config: Config, *, out: Any = None) -> Summary:
    """One run of the fault suite; ``out`` gets progress lines (None: quiet)."""
    from stores.sql import SqlStore

    def say(text: str) -> None:
        if out is not None:
            print(text, file=out, flush=True)

    rng = random.Random(config.seed)
    summary = Summary(config)
    directory = Path(tempfile.mkdtemp(prefix=f"fsm-faults-{config.store}-"))
    server = None
    if config.store == "postgres":
        from .postgres import PrivateServer

        server = PrivateServer()
        server.start()
        url = server.url
    else:
        url = f"sqlite:///{directory}/fsm.db"
    store = SqlStore(url, busy_timeout=10.0)
    engine = Engine(JobLifecycle, store, policy=policy(config.ttl), owner="feeder")
    fleet = Fleet(config, url, directory)
    deaths: list[Death] = []
    outage: tuple[float, float] | None = None
    backlog = config.backlog or config.workers * config.concurrency
    sends: list[tuple[float, str]] = []  # (when, job): the messages waiting jobs wait for
    sent: dict[str, list[bool]] = defaultdict(list)
    say(f"[{config.store}] run dir {directory}")
    try:
        fleet.start()
        started = time.time()
        created = 0
        final = 0
        next_chaos = started + 2.0 + rng.expovariate(1 / config.chaos_every)  # let the fleet start first
        restart_at = config.jobs * rng.uniform(0.3, 0.5) if server is not None and config.restart_server else None
        last_report = started
        while True:
            now = time.time()
            if now - started > config.timeout:
                summary.problems.append(f"timeout: {final}/{config.jobs} jobs final after {config.timeout:.0f} s")
                break
            counts = _retry(engine.counts)
            final = sum(n for s, n in counts.items() if s in FINALS)
            if final >= config.jobs:
                break
            if created < config.jobs and counts.get("queued", 0) < backlog:
                for _ in range(min(backlog, config.jobs - created)):
                    entity_id = f"job-{created:06d}"
                    with contextlib.suppress(EntityExists):  # an ambiguous create, retried
                        _retry(engine.create, entity_id, concurrency_key=key_of(created, config))
                    created += 1
                    if parks(entity_id, config.waits) == WAIT:
                        first = time.time() + rng.uniform(0, config.send_within)
                        sends.append((first, entity_id))
                        if rng.random() < 1 / 3:  # again, with the same key: no second delivery
                            sends.append((first + rng.uniform(0, 1.0), entity_id))
            for due in [item for item in sends if item[0] <= now]:
                sends.remove(due)
                entity_id = due[1]
                sent[entity_id].append(
                    _retry(engine.send, entity_id, MESSAGE, payload_for(entity_id), idempotency_key=f"go-{entity_id}")
                )
            fleet.check_alive()
            if final < 0.95 * config.jobs and now >= next_chaos:
                fleet.chaos(rng, deaths)
                next_chaos = time.time() + rng.expovariate(1 / config.chaos_every)
            if restart_at is not None and final >= restart_at and server is not None:
                restart_at = None
                down = time.time()
                server.stop("immediate")
                say(f"[{config.store}] server stopped at {final} final jobs")
                time.sleep(rng.uniform(1.5, 3.0))
                server.start()
                outage = (down, time.time())
                summary.server_restart_s = outage[1] - outage[0]
                say(f"[{config.store}] server restarted after {summary.server_restart_s:.1f} s")
            if now - last_report > 5:
                last_report = now
                say(f"[{config.store}] {now - started:5.1f} s: {final}/{config.jobs} final, {created} created")
            time.sleep(0.05)
        finished = time.time()
        fleet.check_alive()
        fleet.stop()
        summary.kills = sum(d.how == "kill" for d in deaths)
        summary.stops = sum(d.how == "stop" for d in deaths)
        summary.problems += fleet.unexpected
        _analyse(engine, config, directory, deaths, outage, summary)
        _analyse_waits(engine, config, directory, deaths, sent, summary)
        summary.startup_s = summary.first_claim_at - started if summary.first_claim_at else 0.0
        summary.elapsed_s = finished - (summary.first_claim_at or started)
    finally:
        fleet.stop()
        store.close()
        if server is not None:
            server.destroy()
    if not summary.problems and not os.environ.get("FSM_FAULTS_KEEP"):
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    else:
        say(f"[{config.store}] logs kept in {directory}")
    return summary


def key_of(n: int, config: Config) -> str | None:
    """The concurrency key of the ``n``-th job."""
    return f"key-{n % config.keys}" if config.keys else None


def _limit_problems(
    config: Config, logs: dict[str, list[tuple[int, list[str]]]], keys: dict[str, str | None], summary: Summary
) -> list[str]:
    """L: at no instant did more than ``per_key`` jobs of one key run their handlers.

    Each hold is taken from the workers' logs as ``claim`` (written once the claim had
    committed) to the first ``leaving`` of that lease (written while it is not lost), or
    the lease's deadline written with it if that is earlier (the handler was preempted or
    paused between its check and the write): an interval inside the lease, so any overlap
    found is real.  Holds that end otherwise (the worker killed, the lease lost or lapsed)
    are left out: the check may miss some overlaps, never report one that did not happen."""
    if not config.keys:
        return []
    leaving: dict[tuple[str, int], list[float]] = defaultdict(list)
    for _, (t, entity, token, until) in logs["leaving"]:
        leaving[entity, int(token)].append(min(float(t), float(until)))
    edges: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for _, (t, entity, token, _state) in logs["claim"]:
        start = float(t)
        ends = sorted(x for x in leaving.get((entity, int(token)), []) if x >= start)
        key = keys.get(entity)
        if not ends or key is None:
            continue
        edges[key] += [(start, 1), (ends[0], -1)]
        summary.limited_holds += 1
    problems = []
    for key, points in edges.items():
        points.sort(key=lambda p: (p[0], p[1]))  # an end and a start at one instant do not overlap
        now = 0
        for at, step in points:
            now += step
            summary.most_held = max(summary.most_held, now)
            if now > config.per_key:
                problems.append(f"L: {now} jobs of {key} held at once at {at:.6f} (limit {config.per_key})")
                break
    return problems


def _read_lines(directory: Path) -> dict[str, list[tuple[int, list[str]]]]:
    """Every worker log line by kind: ``(pid, fields)`` with fields[0] the time."""
    lines: dict[str, list[tuple[int, list[str]]]] = defaultdict(list)
    for path in directory.glob("worker-*.log"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            kind, *fields = line.split("\t")
            lines[kind].append((pid, fields))
    return lines


def _analyse(
    engine: Engine,
    config: Config,
    directory: Path,
    deaths: list[Death],
    outage: tuple[float, float] | None,
    summary: Summary,
) -> None:
    logs = _read_lines(directory)
    acks: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for _, (_, entity, seq, event) in logs["ack"]:
        acks[entity].append((int(seq), event))
    summary.acks = sum(len(a) for a in acks.values())
    executions: dict[tuple[str, str], list[int]] = defaultdict(list)
    for _, (_, entity, key, ran_token) in logs["effect"]:
        executions[entity, key].append(int(ran_token))
    summary.executions = sum(len(t) for t in executions.values())
    claims: dict[str, list[tuple[float, int, int]]] = defaultdict(list)  # entity -> (t, token, pid)
    for pid, (t, entity, claim_token, _state) in logs["claim"]:
        claims[entity].append((float(t), int(claim_token), pid))
    ends: dict[tuple[str, int], float] = {}
    for _, (t, entity, end_token, _how) in logs["end"]:
        ends[entity, int(end_token)] = float(t)
    for entries in claims.values():
        entries.sort()
    summary.first_claim_at = min((e[0][0] for e in claims.values() if e), default=None)

    states: dict[str, int] = defaultdict(int)
    histories: dict[str, list[Any]] = {}
    keys: dict[str, str | None] = {}
    seen_ids: set[str] = set()
    after: str | None = None
    while True:
        page = engine.entities(limit=1000, after_id=after)
        if not page:
            break
        after = page[-1].id
        for snap in page:
            seen_ids.add(snap.id)
            keys[snap.id] = snap.concurrency_key
            states[snap.state] += 1
            if snap.state not in FINALS:
                summary.problems.append(f"not final: {snap.id} is in {snap.state!r}")
            history = engine.history(snap.id)
            histories[snap.id] = history
            summary.problems += history_problems(JobLifecycle, snap, history)
            summary.problems += acknowledged_problems(snap.id, acks.get(snap.id, []), history)
            effects = engine.effects(snap.id)
            summary.problems += effect_problems(snap.id, effects)
            summary.effect_keys += len(effects)
            for record in effects:
                ran = executions.get((snap.id, record.key), [])
                if record.lease_token not in ran:
                    summary.problems.append(
                        f"I4: {snap.id} {record.key} recorded under token {record.lease_token}, which never ran it"
                    )
                later = [t for t in ran if record.lease_token is not None and t > record.lease_token]
                if later:
                    summary.problems.append(f"I4: {snap.id} {record.key} re-executed after its record by {later}")
                summary.re_executions += len(ran) - 1
            if snap.state == "completed":
                missing = {f"effect-{i}" for i in range(config.effects)} - {e.key for e in effects}
                if missing:
                    summary.problems.append(f"{snap.id} completed without recording {sorted(missing)}")
    summary.states = dict(states)
    if len(seen_ids) != config.jobs:
        summary.problems.append(f"{len(seen_ids)} jobs in the store, {config.jobs} fed")
    for entity in acks:
        if entity not in seen_ids:
            summary.problems.append(f"I8: acknowledged fires of {entity}, which is not in the store")

    # death -> reaped and death -> claimed again
    summary.longest_pause_s = max((d.resumed_at - d.at for d in deaths if d.resumed_at is not None), default=0.0)
    worst_reap: float | None = None
    worst_claim: float | None = None
    worst_outage: float | None = None
    for death in deaths:
        for entity, entries in claims.items():
            held = [(t, token) for t, token, pid in entries if pid == death.pid and t <= death.at]
            if not held:
                continue
            claimed_at, token = held[-1]
            ended = ends.get((entity, token))
            if ended is not None and ended <= death.at:
                continue
            if any(tok > token and t <= death.at for t, tok, _ in entries):
                continue  # taken over before the death: the process no longer held it
            history = histories.get(entity, [])
            if any(r.actor == "reaper" and claimed_at < _ts(r.at) <= death.at for r in history):
                continue  # reaped before the death (a paused holder, a store outage)
            if any(r.lease_token == token and r.target in FINALS for r in history):
                continue  # it finished before the death; its log line did not make it
            if _parked_under(engine, entity, token) and not any(
                r.actor == "reaper" and _ts(r.at) > death.at for r in history
            ):
                continue  # it parked before the death (its log line did not make it): it held no lease
            death.held.append((entity, token))
            reaped = [_ts(r.at) for r in history if r.actor == "reaper" and _ts(r.at) > death.at]
            again = [t for t, tok, _ in entries if tok > token and t > death.at]
            if not again:
                summary.problems.append(f"{entity} held by dead pid {death.pid} (token {token}) never claimed again")
                continue
            claim_s = again[0] - death.at
            reap_s = (min(reaped) - death.at) if reaped else None
            in_outage = outage is not None and death.at <= outage[1] + config.ttl and again[0] >= outage[0]
            if in_outage:
                summary.deaths_in_outage += 1
                worst_outage = max(worst_outage or 0.0, claim_s)
                continue
            summary.deaths_measured += 1
            worst_claim = max(worst_claim or 0.0, claim_s)
            if death.how == "kill":
                summary.worst_claim_kill_s = max(summary.worst_claim_kill_s or 0.0, claim_s)
            else:
                summary.worst_claim_stop_s = max(summary.worst_claim_stop_s or 0.0, claim_s)
            if reap_s is not None:
                worst_reap = max(worst_reap or 0.0, reap_s)
                if reap_s > summary.bound_for(death):
                    summary.problems.append(
                        f"I2: {entity} reaped {reap_s:.2f} s after its holder's {death.how} "
                        f"(bound {summary.bound_for(death):.1f} s)"
                    )
            bound = summary.bound_for(death)
            if claim_s > bound:
                summary.problems.append(
                    f"I2: {entity} claimed again {claim_s:.2f} s after its holder's {death.how} (bound {bound:.1f} s)"
                )
    summary.slots_at_kill = sum(len(d.held) for d in deaths if d.how == "kill")
    summary.problems += _limit_problems(config, logs, keys, summary)
    summary.worst_reap_s = worst_reap
    summary.worst_claim_s = worst_claim
    summary.worst_claim_in_outage_s = worst_outage
    for path in directory.glob("*.err"):
        text = path.read_text(errors="replace")
        summary.store_retries += text.count("store unavailable, retrying")
        summary.tick_failures += text.count("reaper tick failed")


def _ts(at: datetime) -> float:
    return at.timestamp()


def _steps(engine: Engine, entity_id: str) -> dict[str, Any]:
    """The entity's durable-wait rows (steps and messages), by key."""
    return {e.key: e for e in engine.store.effects(entity_id) if e.key.startswith(("fsm:step:", "fsm:msg:"))}


def _parked_under(engine: Engine, entity_id: str, token: int) -> bool:
    """Whether a holder with lease ``token`` recorded a sleep or a wait (and so may have parked)."""
    return any(
        e.lease_token == token and (":sleep:" in e.key or e.key.endswith(":until"))
        for e in _steps(engine, entity_id).values()
    )


def _analyse_waits(
    engine: Engine,
    config: Config,
    directory: Path,
    deaths: list[Death],
    sent: dict[str, list[bool]],
    summary: Summary,
) -> None:
    """The durable-wait checks (W) of the module doc."""
    logs = _read_lines(directory)
    got: dict[str, list[Any]] = defaultdict(list)
    for _, (_, entity, _token, payload) in logs["got"]:
        got[entity].append(json.loads(payload))
    parked: dict[str, list[tuple[float, int]]] = defaultdict(list)  # entity -> (t, pid) of each park
    park_tokens: dict[str, list[int]] = defaultdict(list)  # entity -> the token each park was made under
    for pid, (t, entity, token, _step) in logs["parked"]:
        parked[entity].append((float(t), pid))
        park_tokens[entity].append(int(token))
    claims: dict[str, list[float]] = defaultdict(list)
    claim_tokens: dict[str, list[int]] = defaultdict(list)
    for _, (t, entity, token, _state) in logs["claim"]:
        claims[entity].append(float(t))
        claim_tokens[entity].append(int(token))
    effect_runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for _, (t, entity, key, _token) in logs["effect"]:
        effect_runs[entity, key].append(float(t))
    summary.parks = sum(len(p) for p in parked.values())
    summary.sends = sum(len(s) for s in sent.values())
    summary.sent_twice = sum(len(s) > 1 for s in sent.values())
    for entity, results in sent.items():
        if sum(results) > 1:
            summary.problems.append(f"W3: a message to {entity} was sent as new {sum(results)} times with one key")
    after: str | None = None
    while True:
        page = engine.entities(limit=1000, after_id=after)
        if not page:
            break
        after = page[-1].id
        for snap in page:
            how = parks(snap.id, config.waits)
            steps = _steps(engine, snap.id)
            step_keys = sorted(k for k in steps if k.startswith("fsm:step:") and k != PARKED_KEY)
            messages = sorted(k for k in steps if k.startswith("fsm:msg:"))
            if how is None:
                if steps or got.get(snap.id) or parked.get(snap.id):
                    summary.problems.append(f"W0: {snap.id} never waits, but has {sorted(steps)}")
                continue
            for (t_park, pid), token in zip(parked.get(snap.id, []), park_tokens.get(snap.id, []), strict=True):
                # resumed: a later claim took the lease (a higher token); compared by token, not
                # by log time: a message found just after the park wakes the entity, and another
                # worker may log its claim before this one has logged the park
                if any(t > token for t in claim_tokens.get(snap.id, [])):
                    summary.replays += 1
                else:
                    summary.problems.append(f"W4: {snap.id}, parked by pid {pid} at {t_park:.3f}, never resumed")
            if how == SLEEP:
                summary.sleepers += 1
                _check_sleep(snap.id, snap.state, step_keys, steps, effect_runs, config, summary)
            else:
                summary.waiters += 1
                expected = payload_for(snap.id)
                if messages != [f"fsm:msg:{MESSAGE}:go-{snap.id}"]:
                    summary.problems.append(f"W3: {snap.id} has message rows {messages}, expected one")
                taken = steps.get("fsm:step:running:wait:1")
                if snap.state == "completed" and (taken is None or taken.result.get("payload") != expected):
                    summary.problems.append(f"W2: {snap.id} went on without its message: {taken}")
                wrong = [p for p in got.get(snap.id, []) if p != expected]
                if wrong:
                    summary.problems.append(f"W2: {snap.id}'s wait returned {wrong}, expected {expected}")
                if snap.state == "completed" and not got.get(snap.id):
                    summary.problems.append(f"W2: {snap.id} completed, but no wait of it returned")
    # jobs parked (and still parked) when the worker that parked them died (each resumed: W4 above)
    for death in deaths:
        for entity, entries in parked.items():
            before = [t for t, pid in entries if pid == death.pid and t <= death.at]
            if not before or any(before[-1] < t <= death.at for t in claims.get(entity, [])):
                continue  # not parked by the dead worker, or resumed before the death
            if death.how == "kill":
                summary.parked_at_kill += 1
            else:
                summary.parked_at_stop += 1


def _check_sleep(
    entity_id: str,
    state: str,
    step_keys: list[str],
    steps: dict[str, Any],
    effect_runs: dict[tuple[str, str], list[float]],
    config: Config,
    summary: Summary,
) -> None:
    """A sleeping job recorded one sleep, and nothing after it ran before its wake time."""
    sleep = steps.get("fsm:step:finalizing:sleep:1")
    if state == "completed" and step_keys != ["fsm:step:finalizing:sleep:1"]:
        summary.problems.append(f"W1: {entity_id} completed with steps {step_keys}, expected one sleep")
    if sleep is None:
        return
    until = datetime.fromisoformat(sleep.result["until"]).astimezone(UTC).timestamp()
    for i in range(1, config.effects):
        early = [t for t in effect_runs.get((entity_id, f"effect-{i}"), []) if t < until]
        if early:
            summary.problems.append(f"W1: {entity_id} ran effect-{i} {until - min(early):.3f} s before its wake time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--long", action="store_true", help="thousands of jobs (the on-demand version)")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--allowance", type=float)
    parser.add_argument("--waits", type=float, help="the fraction of jobs that park (0.3; 0: none)")
    parser.add_argument("--keys", type=int, help="concurrency keys the jobs are spread over (4; 0: no limit)")
    parser.add_argument("--per-key", type=int, help="the workers' per-key limit (2)")
    args = parser.parse_args(argv)
    failed = False
    for store in ["sqlite", "postgres"] if args.store == "both" else [args.store]:
        config = Config.long(store) if args.long else Config.short(store)
        for name in ("jobs", "workers", "seed", "allowance", "waits", "keys", "per_key"):
            if getattr(args, name) is not None:
                setattr(config, name, getattr(args, name))
        summary = run(config, out=sys.stdout)
        print(summary.text(), flush=True)
        failed = failed or bool(summary.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
