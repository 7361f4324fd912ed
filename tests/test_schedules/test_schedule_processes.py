"""Schedules with real processes: reaping workers racing a per-second schedule, one SIGKILLed.

Every test runs on a SQLite file and on PostgreSQL (tables of its own, a unique prefix);
the workers are child processes, each ``Worker(Engine(JobLifecycle, store), ..., reap=...)``
whose embedded reaper leads its lifecycle (so it runs the lifecycle's schedules), killed
with SIGKILL where the test says so.  What is asserted is behaviour: one run entity per due
second, none missing in the span and none doubled (by id, by due second, by the schedule
row's history), a gap caught up as the schedule's ``catch_up`` says, every run worked to
its end once (or still held by the killed worker).  No duration is asserted: the waits only
bound how long a test may take before it fails.

``FSM_TEST_LONG=1`` runs the acceptance test for the full minute the issue asks for.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine, JobLifecycle, UnknownEntity
from fsm.reaping.leader import leader_key
from fsm.records import Snapshot
from fsm.scheduling import Schedule, Schedules
from fsm.scheduling.service import schedule_row_id
from stores import Store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 60.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
LONG = os.environ.get("FSM_TEST_LONG") == "1"
RUN_S = 60.0 if LONG else 12.0
"""How long the acceptance test's workers run the schedule (the victim dies halfway)."""
WORKERS = 4
SECOND = timedelta(seconds=1)
SHORT_REAP_S = 1.0
"""The embedded reapers' interval when a killed leader must be replaced within the test:
its lease (three intervals) runs out in seconds (``reap=True`` ticks every 10 s and holds
leadership for 30 s: replaced within the 60 s run of ``FSM_TEST_LONG=1``, not the short one)."""
GRACE = timedelta(seconds=2)
"""The restart test's ``grace``: a due time older than this when a step runs is missed."""
GAP = timedelta(seconds=7)
"""How long after its last run the restart test's schedule has no live worker."""
SLACK = timedelta(milliseconds=500)
"""What an on-time run's creation may lag behind ``grace`` (the step reads the time, then writes)."""
KIND = JobLifecycle.kind
SCHEDULE = "tick"
ROW_ID = schedule_row_id(KIND, SCHEDULE)
FINAL = "completed"
HELD = ("running", "finalizing")

WORKER = textwrap.dedent(
    """
    import json, logging, sys, time
    from datetime import timedelta

    from fsm import Engine, JobLifecycle
    from fsm.reaping import ReaperConfig
    from fsm.scheduling import Schedule, Schedules
    from fsm.work import Worker
    from stores.sql import SqlStore

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url, prefix, reap, schedule = sys.argv[1:5]
    store = SqlStore(url, table_prefix=prefix, create=False)
    engine = Engine(JobLifecycle, store)  # the default owner id: host:pid:random
    if schedule != "-":  # every process adds its schedules at start: the same one again changes nothing
        Schedules(engine).add(Schedule.from_data("tick", json.loads(schedule)))


    def running(job):
        time.sleep(0.05)
        return "exited"


    worker = Worker(
        engine,
        {"running": running, "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=50),
        reap=True if reap == "true" else ReaperConfig(interval=timedelta(seconds=float(reap))),
    )
    print(f"worker {engine.owner} ready", flush=True)
    worker.run(install_signals=True)
    store.close()
    print("worker stopped", flush=True)
    """
)
"""A reaping worker of ``JobLifecycle``; ``reap``: ``true`` or the reaper's interval in
seconds; ``schedule``: a schedule's stored form to add at start, or ``-``."""


# -- children ----------------------------------------------------------------------------------


class Child(ChildProcess):
    """A worker process; output in ``directory/name.out``/``.err``."""

    def __init__(self, target: SqlTarget, directory: Path, name: str, *, reap: str, schedule: str = "-") -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        argv = [sys.executable, "-c", WORKER, target.url, target.prefix, reap, schedule]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=directory, env=env, stdout=out, stderr=err)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def tail(self) -> str:
        return (
            f"--- {self.name} (pid {self.pid}, rc {self.proc.poll()}):\n{self.stdout()[-1500:]}{self.stderr()[-3000:]}"
        )

    @property
    def owner(self) -> str:
        """The owner id the worker printed when it started (its engine's, its reaper's)."""
        found = re.search(r"^worker (\S+) ready", self.stdout(), re.MULTILINE)
        assert found, self.tail()
        return found.group(1)


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def wait_ready(children: Iterable[Child]) -> None:
    """Wait until each child says it is ready (and fail at once if one exits instead)."""
    for child in children:
        wait_for(functools.partial(_ready_or_exited, child), child.tail)
        assert child.proc.poll() is None, child.tail()


def _ready_or_exited(child: Child) -> bool:
    return " ready" in child.stdout() or child.proc.poll() is not None


def wait_until(store: Store, moment: datetime) -> None:
    """Sleep until the store's clock passes ``moment``."""
    wait_for(lambda: store.now() > moment, lambda: f"the store's clock never passed {moment}")


def logs(children: Iterable[Child]) -> str:
    return "\n".join(child.tail() for child in children)


def pid_of(owner: str) -> int:
    """The pid inside a default owner id (``fsm.clock.new_owner_id``: host, pid, random)."""
    return int(owner.rsplit(":", 2)[1])


# -- the store's view ----------------------------------------------------------------------------


def due_of(run_id: str) -> datetime:
    """The due time a run's id names: ``tick@2026-12-05T07:00:01Z`` (milliseconds when the
    schedule's anchor had them)."""
    schedule_id, _, when = run_id.partition("@")
    assert schedule_id == SCHEDULE and when.endswith("Z"), run_id
    return datetime.fromisoformat(when)


def runs(store: Store) -> dict[datetime, Snapshot]:
    """Every run of the schedule by its due time; every ``job`` entity is one, and no two
    share a due second (two ids for one second would be a doubled run)."""
    rows = store.entities(KIND, limit=10_000)
    seconds = Counter(due_of(row.id).replace(microsecond=0) for row in rows)
    doubled = {second: n for second, n in seconds.items() if n > 1}
    assert not doubled, f"due seconds with more than one run: {doubled}"
    return {due_of(row.id): row for row in rows}


def leader(store: Store) -> str | None:
    """The owner of the leader lease of ``job``'s reaping (the leader row), if held."""
    try:
        row = store.get(leader_key(KIND))
    except UnknownEntity:  # no reaper started yet
        return None
    return row.lease_owner


def assert_consecutive(dues: list[datetime], what: str) -> None:
    """``dues`` (sorted) is every second from its first to its last: none missing."""
    holes = [(a, b) for a, b in itertools.pairwise(dues) if b - a != SECOND]
    assert not holes, f"{what}: runs missing between {holes[:5]}"


def assert_history_creates_once(store: Store, existing: Iterable[str]) -> list[str]:
    """The schedule row's history: each step that created runs names them (its last three),
    no run is named by two steps, and every one named exists.  Returns the events."""
    history = store.history(ROW_ID)
    named = [run_id for h in history for run_id in re.findall(r"created ([^;\s]+)", h.reason or "")]
    twice = {run_id: n for run_id, n in Counter(named).items() if n > 1}
    assert not twice, f"due times the schedule's history says were created twice: {twice}"
    assert set(named) <= set(existing), sorted(set(named) - set(existing))[:5]
    assert all(h.actor == "reaper" for h in history if h.event == "fire"), history
    return [h.event for h in history]


def assert_worked_once(store: Store, found: dict[datetime, Snapshot], victim: str) -> None:
    """Every run completed by one claim (start, exited, complete: one of each), or is
    still held by the killed worker (it claimed the run and died; its lease runs out later)."""
    for _, row in sorted(found.items()):
        events = [(h.event, h.owner) for h in store.history(row.id)]
        if row.state == FINAL:
            assert [e for e, _ in events] == ["start", "exited", "complete"], (row.id, events)
            assert len({o for _, o in events}) == 1, (row.id, events)
        else:
            assert row.state in HELD and row.lease_owner == victim, (row.id, row.state, row.lease_owner, events)
            assert {o for _, o in events} == {victim}, (row.id, events)


def drained(store: Store, victim: str) -> bool:
    """Whether every run is completed or held by the killed worker."""
    return all(row.state == FINAL or row.lease_owner == victim for row in runs(store).values())


# -- 1. the acceptance test --------------------------------------------------------------


@pytest.mark.parametrize(
    ("reap", "kill_leader"),
    [(str(SHORT_REAP_S), True), ("true", False)],
    ids=["leader-killed", "reap-true-standby-killed"],
)
def test_four_reaping_workers_create_one_run_per_second_through_a_sigkill(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child], reap: str, kill_leader: bool
) -> None:
    """Four reaping workers, a per-second schedule (overlap allow, catch-up all); one worker
    (the leader, or with ``reap=True`` a standby: a dead leader's lease would outlive the
    test) is SIGKILLed halfway; the schedule is paused at the end.  Every second from the
    first run to the last has exactly one run, each worked once."""
    store = sql_target.store()  # creates the tables: the children open the store without creating any
    schedules = Schedules(Engine(JobLifecycle, store, owner="test"))
    start = store.now().replace(microsecond=0) + 2 * SECOND
    spec = Schedule(SCHEDULE, every=SECOND, overlap="allow", catch_up="all", start=start)
    schedules.add(spec)  # and each worker adds it again at start: the same schedule, unchanged
    stored = json.dumps(spec.to_data())
    workers = [Child(sql_target, tmp_path, f"w{i}", reap=reap, schedule=stored) for i in range(WORKERS)]
    children += workers
    wait_ready(workers)
    by_owner = {child.owner: child for child in workers}
    assert all(pid_of(owner) == child.pid for owner, child in by_owner.items()), by_owner
    wait_for(lambda: leader(store) in by_owner, lambda: f"leader {leader(store)}\n{logs(workers)}")
    first_leader = by_owner[leader(store) or ""]
    began = store.now()

    wait_until(store, began + timedelta(seconds=RUN_S / 2))
    victim = first_leader if kill_leader else next(c for c in workers if c is not first_leader)
    victim.kill()
    killed_at = store.now()
    survivors = [child for child in workers if child is not victim]
    if kill_leader:  # a standby takes the lease over once it runs out, and runs the schedule
        alive = {child.owner for child in survivors}
        wait_for(lambda: leader(store) in alive, lambda: f"leader {leader(store)}\n{logs(workers)}")
    else:
        assert leader(store) == first_leader.owner
    # runs go on after the kill (and the gap a dead leader leaves is caught up)
    # (no run yet on a loaded machine is a reason to wait, not a failure: the wait has its bound)
    wait_for(lambda: max(runs(store), default=killed_at) > killed_at + 3 * SECOND, lambda: logs(workers))
    wait_until(store, began + timedelta(seconds=RUN_S))

    paused = schedules.pause(SCHEDULE)
    paused_at = store.history(ROW_ID)[-1].at
    wait_for(lambda: drained(store, victim.owner), lambda: f"{sorted(runs(store).items())[-5:]}\n{logs(workers)}")
    for child in survivors:
        child.stop()
    assert [child.proc.returncode for child in workers] == [
        -signal.SIGKILL if child is victim else 0 for child in workers
    ], logs(workers)

    found = runs(store)
    dues = sorted(found)
    assert dues[0] == start, f"the first run is not the first due time {start}: {dues[:3]}"
    assert_consecutive(dues, "between the first run and the last")
    assert dues[-1] >= paused.cursor > killed_at, (dues[-1], paused.cursor, killed_at)
    assert paused.last_run == spec.run_id(paused.cursor) and paused.cursor in found
    assert all(due <= paused_at for due in dues), "a run was created for a due time after the pause"
    events = assert_history_creates_once(store, (row.id for row in found.values()))
    assert events[-1] == "pause" and set(events) == {"fire", "pause"}, events
    assert_worked_once(store, found, victim.owner)
    claims = Counter(store.history(row.id)[0].owner for row in found.values())
    assert set(claims) <= set(by_owner), claims
    print(f"{len(dues)} runs from {dues[0]} to {dues[-1]}; killed {victim.name} at {killed_at}; claims {claims}")


# -- 2. a restart after a gap --------------------------------------------------------------------


@pytest.mark.parametrize("catch_up", ["latest", "all"])
def test_a_restarted_worker_catches_the_gap_up_by_the_schedules_policy(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child], catch_up: str
) -> None:
    """One reaping worker is SIGKILLed; its schedule has no live process for a few seconds
    (longer than ``grace``); a new worker starts.  ``latest``: exactly one run for the
    missed due times, the latest, then on-time runs; ``all``: every missed second once."""
    store = sql_target.store()
    schedules = Schedules(Engine(JobLifecycle, store, owner="test"))
    first = Child(sql_target, tmp_path, "first", reap=str(SHORT_REAP_S))
    children.append(first)
    wait_ready([first])
    # added once the worker runs (its start-up on a loaded machine can outlast the grace,
    # and ``latest`` would then rightly skip the first due time); anchored when added:
    # the due times (and ids) carry the anchor's milliseconds
    spec = Schedule(SCHEDULE, every=SECOND, overlap="allow", catch_up=catch_up, grace=GRACE)
    added = schedules.add(spec)
    wait_for(lambda: len(runs(store)) >= 3, lambda: logs([first]))
    first.kill()
    killed_at = store.now()
    before = runs(store)
    last = max(before)
    assert_consecutive(sorted(before), "before the kill")
    assert min(before) == due_of(spec.run_id(added.cursor + SECOND)), (min(before), added)

    wait_until(store, last + GAP)
    assert runs(store).keys() == before.keys(), "a run was created while no worker was alive"
    second = Child(sql_target, tmp_path, "second", reap=str(SHORT_REAP_S))
    children.append(second)
    wait_ready([second])
    restarted_at = store.now()
    wait_for(lambda: max(runs(store), default=restarted_at) > restarted_at + 3 * SECOND, lambda: logs([first, second]))
    schedules.delete(SCHEDULE)
    wait_for(lambda: drained(store, first.owner), lambda: logs([first, second]))
    second.stop()
    assert (first.proc.returncode, second.proc.returncode) == (-signal.SIGKILL, 0), logs([first, second])

    found = runs(store)
    after = sorted(due for due in found if due > last)
    assert_consecutive(after, "after the restart")
    # the restarted worker's first step: the first history row after the kill
    step = next(h for h in store.history(ROW_ID) if h.at > killed_at)
    assert step.event == "fire", step
    made = [due for due in after if found[due].created_at <= step.at]
    assert made and made[0] == after[0], (made, after[:3])
    late = {due: found[due].created_at - due for due in after}
    missing = int((after[0] - last) / SECOND) - 1
    if catch_up == "latest":
        # one run for everything missed, the latest missed due time: the due times before it
        # have no run, it was created past its grace, and every later one within it
        assert missing >= 1, (last, after[:3])
        assert late[after[0]] > GRACE, (after[0], late[after[0]])
        assert all(late[due] <= GRACE + SLACK for due in after[1:]), sorted(late.items())[:5]
        assert len(made) >= 2, made  # the catch-up run and the on-time ones, in one step
    else:
        # every missed second, once, created late by the restarted worker's first step
        assert missing == 0, (last, after[:3])
        caught_up = [due for due in after if late[due] > GRACE + SLACK]
        assert len(caught_up) >= int((GAP - GRACE - SLACK) / SECOND), sorted(late.items())[:8]
        assert set(caught_up) <= set(made), (caught_up, made)
    events = assert_history_creates_once(store, (row.id for row in found.values()))
    assert events[-1] == "delete", events
    assert_worked_once(store, found, first.owner)
    print(
        f"catch-up {catch_up}: {len(before)} runs, then {missing} missed, then {len(after)} runs ({len(made)} at once)"
    )
