"""The seeds/002 scenarios with real processes: the parent's side.

A :class:`Stage` is one database (SQLite file or PostgreSQL tables), a reaper ticking on a
thread of this process, an event log the child processes append to, and the children
themselves (:mod:`fsm.demo.proc`).  Each scenario creates one job and lets worker
processes do the work:

- :func:`slow_but_alive`: the gates take far longer than the TTL and the reaper's interval;
  the keeper renews, the reaper ticks all the time and touches nothing;
- :func:`killed`: the finalizer is SIGKILLed once its second gate is recorded; the reaper
  reclaims the job, a standby worker process claims it, gates 1-2 replay from the ledger;
- :func:`paused`: the finalizer is SIGSTOPped in its second gate past its TTL, reclaimed
  and claimed by the standby, then SIGCONTed: its late writes are refused.

``fsm demo`` and ``tests/test_work/test_processes.py`` run the same code; each returns a
:class:`JobStory` with what the store and the event log say happened, which
:mod:`fsm.demo.checks` judges and :mod:`fsm.demo.timeline` draws.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from fsm.demo.proc import EVENTS, GATE_LOG, GATES, Log, child_main, policy_of
from fsm.engine import Engine
from fsm.errors import FsmError
from fsm.lifecycles import JobLifecycle
from fsm.policy import Policy
from fsm.reaping import Reaper, ReaperConfig
from fsm.reaping.ticklog import TickLog
from fsm.records import EFFECT_SUCCEEDED, EffectRecord, HistoryRecord
from stores.sql import SqlStore, create_engine


@dataclass(frozen=True)
class Timing:
    """The scenario's clock, in seconds: short TTLs so that a run takes seconds."""

    ttl: float
    """Lease TTL; the keeper renews every third of it."""
    interval: float
    """Time between two reaper ticks."""
    slow_gate: float
    """Each gate of the slow-but-alive finalizer (longer than the TTL)."""
    gate: float
    """Each gate of the killed and paused finalizers."""
    budget: float = 120.0
    """Renewal budget of ``running`` and ``finalizing``: far above any scenario."""
    max_reclaims: int = 5
    """Reclaims before ``expire``: room for a slow machine to start the standby late."""
    timeout: float = 120.0
    """The longest one wait may take before the scenario is declared stuck."""
    slack: float = 10.0
    """I2's tolerance for a loaded machine: a reclaim may come this late after TTL + interval."""

    def policy(self) -> Policy:
        return policy_of(self.config())

    def config(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "budget": self.budget, "max_reclaims": self.max_reclaims}


QUICK = Timing(ttl=2.0, interval=0.3, slow_gate=2.2, gate=0.4)
"""For the test suite and ``fsm demo --quick``: a 2 s TTL, so that a child process starved
for well over half a second on a loaded machine (the keeper renews every 0.67 s) keeps its lease."""
FULL = Timing(ttl=2.0, interval=0.5, slow_gate=3.0, gate=1.0)
"""``fsm demo``: a 12-second finalization against a 2-second TTL."""


class ScenarioStuck(FsmError):
    """A scenario did not reach its next step in time, or a child process died on its own."""


def process_context() -> Any:
    """How children start: a fork server that imported :mod:`fsm.demo.proc` once forks
    each of them (milliseconds, instead of an interpreter importing SQLAlchemy, pydantic
    and python-statemachine per child).  The server itself is a fresh, single-threaded
    interpreter, so no thread or connection of this process is forked; the children are
    real processes, and the signals they get are real signals."""
    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not POSIX
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["fsm.demo.proc"])
    return ctx


@dataclass
class Child:
    """A child process of the stage, by the name it uses as lease owner."""

    name: str
    process: multiprocessing.process.BaseProcess
    output: Path
    signalled: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; its exit code, or minus the signal that ended it."""
        return self.process.exitcode

    def wait(self, timeout: float) -> int | None:
        self.process.join(timeout)
        return self.process.exitcode


class EventReader:
    """Reads ``events.jsonl`` incrementally: only whole lines, each once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0

    def refresh(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return self.events
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            if line.strip():
                self.events.append(json.loads(line))
        return self.events


def gate_executions(directory: Path, job_id: str) -> list[tuple[float, str, str, int]]:
    """Every execution of a gate of ``job_id``, from ``gates.log``: (time, gate, who, token)."""
    path = directory / GATE_LOG
    found = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            t, job, gate, who, _pid, token = line.split()
            if job == job_id:
                found.append((float(t), gate, who, int(token)))
    return found


@dataclass
class JobStory:
    """What happened to one job: the store's record and what the processes logged."""

    name: str
    title: str
    job_id: str
    t0: float
    t_end: float
    state: str
    history: list[HistoryRecord]
    effects: list[EffectRecord]
    executions: list[tuple[float, str, str, int]]
    events: list[dict[str, Any]]
    ticks: list[tuple[float, dict[str, int]]]
    workers: dict[str, int]
    marks: list[tuple[float, str, str]] = field(default_factory=list)
    """Signals the stage sent: (time, SIGKILL/SIGSTOP/SIGCONT, worker)."""
    in_flight: list[str] = field(default_factory=list)
    """Gates the first finalizer had started, and not recorded, when it was killed or stopped."""
    fenced_token: int | None = None
    """The first finalizer's token, when it was fenced (killed or paused)."""

    def executed(self, gate: str) -> int:
        return sum(1 for e in self.executions if e[1] == gate)

    def recorded(self, gate: str) -> int:
        return sum(1 for e in self.effects if e.key == gate and e.status == EFFECT_SUCCEEDED)

    def rows(self, event: str) -> list[HistoryRecord]:
        return [r for r in self.history if r.event == event]

    def of(self, ev: str, who: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == ev and (who is None or e["who"] == who)]

    @property
    def lapse(self) -> float | None:
        """When the fenced holder's lease lapsed: the expiry of its last claim or renewal."""
        if self.fenced_token is None:
            return None
        expiries = [
            e["expires"]
            for e in self.events
            if e["ev"] in ("claimed", "renewed") and e.get("token") == self.fenced_token and e.get("expires")
        ]
        return max(expiries) if expiries else None


class Stage:
    """A database, a reaper thread, the event log and the child processes of a run.

    ``progress`` receives a one-line status while the stage waits (the demo shows it);
    ``say`` receives the milestones.  Use as a context manager: leaving it stops the
    reaper and every child still running (each by its own process id).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        directory: Path,
        timing: Timing,
        *,
        run_id: str = "",
        progress: Callable[[str], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.timing = timing
        self.run_id = run_id
        self.progress = progress or (lambda text: None)
        self.say = say or (lambda text: None)
        self.store = SqlStore(url, table_prefix=prefix)
        self.policy = timing.policy()
        self.engine = Engine(JobLifecycle, self.store, policy=self.policy, owner="demo")
        self.reaper = Reaper(
            self.store,
            {JobLifecycle: self.policy},
            ReaperConfig(interval=timedelta(seconds=timing.interval)),
            owner="reaper",
        )
        self.tick_log = TickLog(self.store)
        self.log = Log(self.directory, "stage")
        self.reader = EventReader(self.directory / EVENTS)
        self.children: list[Child] = []
        self._context = process_context()
        self.ticks: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the reaper ------------------------------------------------------------------------

    def _reap(self) -> None:
        while not self._stop.wait(self.timing.interval):
            result = self.reaper.run_once()  # never raises (I9)
            self.tick_log.record(result, self.reaper.owner)  # fsm inspect shows the ticks; never raises
            moved = dict(result.moved)
            self.ticks.append((time.time(), moved))
            if moved or result.errors:
                self.log("tick", moved=moved, errors=result.errors)

    def __enter__(self) -> Stage:
        self._thread = threading.Thread(target=self._reap, name="demo-reaper", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for child in self.children:
            self.end(child)
        self.store.close()

    # -- children --------------------------------------------------------------------------

    def spawn(self, role: str, name: str, **extra: Any) -> Child:
        """Start a child process in ``role`` (:mod:`fsm.demo.proc`); its output goes to ``<name>.log``."""
        cfg = {
            "role": role,
            "name": name,
            "url": self.url,
            "prefix": self.prefix,
            "dir": str(self.directory),
            "parent": None,  # the child's parent is the fork server, which ends with this process
            "deadline": time.time() + self.timing.timeout * 3,
            **self.timing.config(),
            **extra,
        }
        output = self.directory / f"{name}.log"
        process = self._context.Process(target=child_main, args=(json.dumps(cfg), str(output)), name=name, daemon=False)
        process.start()
        child = Child(name, process, output)
        self.children.append(child)
        return child

    def worker(self, name: str, *, gate: float, go: Path | None = None, stubborn: bool = False) -> Child:
        return self.spawn(
            "worker",
            name,
            go=None if go is None else str(go),
            stubborn=stubborn,
            gate_seconds=dict.fromkeys(GATES, gate),
        )

    def signal(self, child: Child, sig: signal.Signals) -> None:
        os.kill(child.pid, sig)
        child.signalled.append(sig.name)
        self.log("signal", target=child.name, signal=sig.name)

    def end(self, child: Child) -> None:
        """Stop one child of ours: SIGCONT (if stopped), SIGTERM, then SIGKILL if it lingers."""
        if child.returncode is not None:
            return
        try:
            os.kill(child.pid, signal.SIGCONT)
            os.kill(child.pid, signal.SIGTERM)
            if child.wait(10) is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(10)
        except ProcessLookupError:
            pass

    def ready(self, child: Child) -> bool:
        return any(e["ev"] == "ready" and e["who"] == child.name for e in self.reader.events)

    def _check_children(self) -> None:
        for child in self.children:
            code = child.returncode
            if code is not None and not child.signalled:
                tail = child.output.read_text(errors="replace")[-2000:]
                raise ScenarioStuck(f"{child.name} (pid {child.pid}) exited on its own with code {code}:\n{tail}")

    def wait_until(self, done: Callable[[], bool], what: str, status: Callable[[], str] | None = None) -> None:
        """Poll until ``done()``; show ``status()`` meanwhile.  ``ScenarioStuck`` after the timeout."""
        deadline = time.monotonic() + self.timing.timeout
        while True:
            self.reader.refresh()
            if done():
                return
            self._check_children()
            if status is not None:
                self.progress(status())
            if time.monotonic() > deadline:
                raise ScenarioStuck(f"{what}: not within {self.timing.timeout:.0f} s (logs in {self.directory})")
            time.sleep(0.03)

    def stop_between_writes(self, child: Child) -> None:
        """SIGSTOP ``child`` at a moment it holds no database lock.

        A process stopped inside a SQLite write transaction would keep the file's write
        lock (and a PostgreSQL row lock) for as long as it is stopped, and every writer,
        the reaper included, would wait on it: that is another incident, not this one.
        So stop it, look, and if it holds the lock let it run a moment and try again."""
        for _ in range(200):
            self.signal(child, signal.SIGSTOP)
            wait_stopped(child.pid)
            if self.database_free():
                return
            self.signal(child, signal.SIGCONT)
            time.sleep(0.01)
        raise ScenarioStuck(f"{child.name} never let go of the database long enough to be stopped")

    def database_free(self) -> bool:
        """Whether a write could start now (SQLite: the write lock; PostgreSQL: the job rows)."""
        url = sa.engine.make_url(self.url)
        if url.get_backend_name() == "sqlite":
            lite = sqlite3.connect(url.database or "", timeout=0, isolation_level=None)
            try:
                lite.execute("BEGIN IMMEDIATE")  # fails at once while another process holds it
                lite.execute("ROLLBACK")
                return True
            except sqlite3.OperationalError:
                return False
            finally:
                lite.close()
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                for table in ("entities", "effects"):
                    conn.exec_driver_sql(f"SELECT 1 FROM {self.prefix}{table} FOR UPDATE NOWAIT")
                conn.rollback()
            return True
        except sa.exc.OperationalError:
            return False
        finally:
            engine.dispose()

    # -- one job ---------------------------------------------------------------------------

    def status_of(self, title: str, job_id: str, t0: float) -> Callable[[], str]:
        def status() -> str:
            try:
                snap = self.store.get(job_id)
                done = sum(1 for e in self.store.effects(job_id) if e.key in GATES)
                state, owner = snap.state, snap.lease_owner or "-"
            except FsmError:
                state, owner, done = "?", "?", 0
            renewals = sum(1 for e in self.reader.events if e["ev"] == "renewed" and e.get("job") == job_id)
            moved = sum(sum(m.values()) for t, m in self.ticks if t >= t0)
            ticks = sum(1 for t, _ in self.ticks if t >= t0)
            return (
                f"{title}: {time.time() - t0:5.1f} s | {state} (holder {owner}) | gates recorded {done}/4 | "
                f"renewals {renewals} | reaper ticks {ticks}, moved {moved}"
            )

        return status

    def story(self, name: str, title: str, job_id: str, t0: float, workers: list[Child], **extra: Any) -> JobStory:
        self.reader.refresh()
        t_end = time.time()
        ours = {c.name for c in workers}
        events = [
            e
            for e in self.reader.events
            if e.get("job") == job_id or (e["who"] in ours and "job" not in e) or e.get("target") in ours
        ]
        return JobStory(
            name=name,
            title=title,
            job_id=job_id,
            t0=t0,
            t_end=t_end,
            state=self.store.get(job_id).state,
            history=self.store.history(job_id),
            effects=[e for e in self.store.effects(job_id) if e.key in GATES],
            executions=gate_executions(self.directory, job_id),
            events=events,
            ticks=[(t, m) for t, m in self.ticks if t0 <= t <= t_end],
            workers={c.name: c.pid for c in workers},
            **extra,
        )

    def prepare(self, names: list[str]) -> None:
        """Start the worker processes of these scenarios now, all at once, so that the
        scenarios do not each wait for two interpreters to start; each waits for its go."""
        for name in names:
            for letter in "ab":
                self._worker(name, letter)

    def _worker(self, name: str, letter: str) -> Child:
        worker_name = f"{name}-worker-{letter}"
        found = next((c for c in self.children if c.name == worker_name), None)
        if found is not None:
            return found
        gate = self.timing.slow_gate if name == "slow" else self.timing.gate
        return self.worker(worker_name, gate=gate, go=self.directory / f"go-{worker_name}", stubborn=name == "paused")

    def _begin(self, name: str) -> tuple[str, float, Child, Child]:
        """Two worker processes (the finalizer, and a standby that waits for its go), one job."""
        first, standby = self._worker(name, "a"), self._worker(name, "b")
        job_id = f"job-{self.run_id}-{name}" if self.run_id else f"job-{name}"
        self.wait_until(lambda: self.ready(first) and self.ready(standby), f"{name}: worker processes start")
        t0 = time.time()
        self.engine.create(job_id)
        (self.directory / f"go-{first.name}").touch()
        status = self.status_of(name, job_id, t0)
        self.wait_until(lambda: self.store.get(job_id).lease_owner == first.name, f"{name}: claimed", status)
        self.say(f"  {job_id}: claimed by {first.name} (pid {first.pid}); standby {standby.name} (pid {standby.pid})")
        # only now may the standby claim: it must not take the job away from the first
        (self.directory / f"go-{standby.name}").touch()
        return job_id, t0, first, standby

    def _finish(
        self, job_id: str, name: str, t0: float, *children: Child, also: Callable[[], bool] | None = None
    ) -> None:
        status = self.status_of(name, job_id, t0)
        self.wait_until(
            lambda: self.store.get(job_id).state in JobLifecycle.table.finals and (also is None or also()),
            f"{name}: completion",
            status,
        )
        for child in children:
            if child.returncode is None:
                self.signal(child, signal.SIGTERM)  # a graceful stop: stop claiming, release
        for child in children:
            if child.wait(15) is None:
                self.end(child)


def wait_stopped(pid: int, timeout: float = 2.0) -> None:
    """Wait until the kernel reports ``pid`` stopped (Linux ``/proc``; elsewhere a pause)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        time.sleep(0.05)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rpartition(")")[2].split()[0] in ("T", "t"):
                return
        except OSError:
            return
        time.sleep(0.005)


# -- the three scenarios -----------------------------------------------------------------------


def slow_but_alive(stage: Stage) -> JobStory:
    """A finalizer whose gates take far longer than the TTL and the reaper's interval."""
    name, title = "slow", "live finalizer, slow gates"
    job_id, t0, first, standby = stage._begin(name)
    stage._finish(job_id, name, t0, first, standby)
    return stage.story(name, title, job_id, t0, [first, standby])


def killed(stage: Stage) -> JobStory:
    """A finalizer SIGKILLed once its second gate is recorded; a standby worker resumes it."""
    name, title = "killed", "finalizer killed after gate 2"
    job_id, t0, first, standby = stage._begin(name)
    status = stage.status_of(name, job_id, t0)
    stage.wait_until(lambda: stage.store.effect(job_id, GATES[1]) is not None, f"{name}: gate 2 recorded", status)
    token = stage.store.get(job_id).lease_token
    marks = [(time.time(), "SIGKILL", first.name)]
    stage.signal(first, signal.SIGKILL)
    first.wait(10)
    stage.say(f"  {job_id}: {first.name} killed with SIGKILL after gate 2 was recorded")
    in_flight = in_flight_gates(stage, job_id, first.name)
    stage._finish(job_id, name, t0, standby)
    return stage.story(name, title, job_id, t0, [first, standby], marks=marks, in_flight=in_flight, fenced_token=token)


def paused(stage: Stage) -> JobStory:
    """A finalizer SIGSTOPped in gate 2 past its TTL, reclaimed, claimed by the standby, then
    SIGCONTed: it goes on writing with its old lease, and every write is refused."""
    name, title = "paused", "finalizer paused past its TTL"
    job_id, t0, first, standby = stage._begin(name)
    status = stage.status_of(name, job_id, t0)

    def in_gate_2() -> bool:
        return any(
            e["ev"] == "gate-start" and e.get("gate") == GATES[1] for e in stage.reader.events if e.get("job") == job_id
        )

    stage.wait_until(in_gate_2, f"{name}: gate 2 started", status)
    token = stage.store.get(job_id).lease_token
    stage.stop_between_writes(first)
    marks = [(time.time(), "SIGSTOP", first.name)]
    stage.say(f"  {job_id}: {first.name} paused with SIGSTOP inside gate 2")
    in_flight = in_flight_gates(stage, job_id, first.name)
    stage.wait_until(lambda: any(r.event == "reclaim" for r in stage.store.history(job_id)), f"{name}: reclaim", status)
    stage.wait_until(lambda: stage.store.get(job_id).lease_owner == standby.name, f"{name}: claimed again", status)
    stage.signal(first, signal.SIGCONT)
    marks.append((time.time(), "SIGCONT", first.name))
    stage.say(f"  {job_id}: reclaimed and claimed by {standby.name}; {first.name} resumed with SIGCONT")

    def insisted() -> bool:
        return any(e["ev"] == "insisted" and e["who"] == first.name for e in stage.reader.events)

    stage._finish(job_id, name, t0, first, standby, also=insisted)
    return stage.story(name, title, job_id, t0, [first, standby], marks=marks, in_flight=in_flight, fenced_token=token)


def in_flight_gates(stage: Stage, job_id: str, who: str) -> list[str]:
    """Gates ``who`` started and had not recorded: they may run again under the next owner."""
    recorded = {e.key for e in stage.store.effects(job_id)}
    return [gate for _, gate, by, _ in gate_executions(stage.directory, job_id) if by == who and gate not in recorded]


SCENARIOS: dict[str, Callable[[Stage], JobStory]] = {"slow": slow_but_alive, "killed": killed, "paused": paused}


def moved_counts(ticks: list[tuple[float, dict[str, int]]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for _, moved in ticks:
        total.update(moved)
    return total


__all__ = [
    "FULL",
    "QUICK",
    "SCENARIOS",
    "Child",
    "EventReader",
    "JobStory",
    "ScenarioStuck",
    "Stage",
    "Timing",
    "gate_executions",
    "killed",
    "moved_counts",
    "paused",
    "slow_but_alive",
]
