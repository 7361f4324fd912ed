"""Children and fan-in across real processes, on PostgreSQL and on a SQLite file (``sql_target``).

A parent job (:class:`~.proc_children.KidParent`) starts 50 children of another lifecycle
(:class:`~.proc_children.KidChild`) and waits for them; worker processes of their own run
the children.  What is asserted is behaviour: the parent's worker SIGKILLed while the
parent is parked leaves nothing to recover, and another worker resumes it without starting
any child again (50 child entities, 50 ledger rows, each child run once) and completes it
with the 50 results in start order; a failed child fails the parent (reason ``error``,
never retried); ``Engine.cancel`` from the test process cancels the live children.  No
duration is asserted: the waits only bound how long a test may take before it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine
from fsm.work.children import CHILD_KEY_PREFIX
from stores import Store

from .proc_children import CHILDREN, KidChild, KidParent, child_key

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 30.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
TESTS_DIR = Path(__file__).resolve().parents[1]
"""On the children's path: they import ``test_coordination.proc_children``."""
PARENT = "build"
CHILD_IDS = [f"{PARENT}/{child_key(n)}" for n in range(CHILDREN)]


class Worker(ChildProcess):
    """A worker process with ``tests/`` on its path; output in ``directory/name.out``/``.err``."""

    def __init__(
        self, target: SqlTarget, directory: Path, name: str, role: str, *, concurrency: int = 8, reap: bool = False
    ) -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        argv = ["worker", target.url, target.prefix, str(directory), name, role, f"--concurrency={concurrency}"]
        argv += ["--reap"] if reap else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *filter(None, sys.path)])}
        command = [sys.executable, "-m", "test_coordination.proc_children", *argv]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, cwd=directory, env=env, stdout=out, stderr=err)

    def tail(self) -> str:
        out = self.out.read_text(errors="replace") if self.out.exists() else ""
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.name} (pid {self.proc.pid}, rc {self.proc.poll()}):\n{out[-1500:]}{err[-2500:]}"

    def ready(self) -> bool:
        """Whether it printed ``ready`` (about to claim, its SIGTERM handler in place next)."""
        return self.out.exists() and "ready" in self.out.read_text(errors="replace")


def start(children: list[Any], worker: Worker) -> Worker:
    children.append(worker)
    return worker


def wait_ready(workers: list[Worker]) -> None:
    """Every worker started up (a loaded machine may take seconds to import): a SIGTERM
    before that would end it with Python's default handler, not the worker's stop."""
    wait_for(lambda: all(w.ready() for w in workers), lambda: logs(workers))


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def logs(workers: Iterable[Worker]) -> str:
    return "\n".join(w.tail() for w in workers)


def runs(directory: Path) -> list[dict[str, Any]]:
    """Every handler run the workers logged (each a whole line: one ``os.write``)."""
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("runs-*.log")):
        found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


# -- the store's view -----------------------------------------------------------------------------


def ledger_children(store: Store) -> list[str]:
    return sorted(e.key for e in store.effects(PARENT) if e.key.startswith(CHILD_KEY_PREFIX))


def child_entities(store: Store) -> list[str]:
    return sorted(s.id for s in store.entities(KidChild.kind, limit=1000))


def parked(store: Store) -> bool:
    """The parent parked on its wait: state kept, no lease, due later, every child recorded."""
    snap = store.get(PARENT)
    return (
        snap.state == "running"
        and snap.lease_owner is None
        and snap.run_after is not None
        and snap.run_after > store.now()
        and len(ledger_children(store)) == CHILDREN
    )


def children_final(store: Store) -> bool:
    found = store.children(PARENT, limit=1000)
    return len(found) == CHILDREN and all(s.state in KidChild.table.finals for s in found)


def final(store: Store, entity_id: str) -> bool:
    return store.get(entity_id).state in KidParent.table.finals


def state(engine: Engine, extra: Callable[[], str] = lambda: "") -> Callable[[], str]:
    def told() -> str:
        snap = engine.store.get(PARENT)
        kids = Counter(s.state for s in engine.store.children(PARENT, limit=1000))
        return f"parent {snap.state} lease {snap.lease_owner} due {snap.run_after}; children {dict(kids)}\n{extra()}"

    return told


def assert_children_once(store: Store) -> None:
    """No duplicate child entity and no child recorded twice: 50 of each, the same ids."""
    assert child_entities(store) == CHILD_IDS
    assert [s.id for s in store.children(PARENT, limit=1000)] == CHILD_IDS
    assert ledger_children(store) == sorted(CHILD_KEY_PREFIX + child_key(n) for n in range(CHILDREN))
    assert all(store.get(i).parent_id == PARENT for i in CHILD_IDS)


# -- a. the parent's worker SIGKILLed while the parent waits ---------------------------------------------


def test_a_parent_parked_when_its_worker_is_killed_is_resumed_by_another_and_starts_no_child_twice(
    sql_target: SqlTarget, tmp_path: Path, children: list[Worker]
) -> None:
    store = sql_target.store()  # creates the tables: the workers open the store without creating any
    parents = Engine(KidParent, store, owner="test")
    parents.create(PARENT, data={"children": CHILDREN, "poll": 5.0, "child_sleep": 0.01})
    first = start(children, Worker(sql_target, tmp_path, "first", "parent"))
    wait_for(lambda: parked(store), state(parents, lambda: logs([first])))
    first.kill()
    snap = store.get(PARENT)  # still parked after the kill: nothing of it to recover
    assert (snap.state, snap.lease_owner) == ("running", None), snap
    assert snap.run_after is not None and snap.run_after > store.now(), snap
    assert [h.event for h in store.history(PARENT)] == ["start"]
    assert_children_once(store)
    assert {s.state for s in store.children(PARENT, limit=1000)} == {"queued"}  # no child worker yet

    # the children's workers and a new parent worker (no reaper: a parked parent holds no lease)
    kids = [start(children, Worker(sql_target, tmp_path, f"kids-{n}", "child")) for n in (1, 2)]
    second = start(children, Worker(sql_target, tmp_path, "second", "parent"))
    everyone = [first, *kids, second]
    wait_ready([*kids, second])
    wait_for(lambda: final(store, PARENT), state(parents, lambda: logs(everyone)))
    for worker in everyone:
        worker.stop()
    assert [w.proc.returncode for w in everyone] == [-signal.SIGKILL, 0, 0, 0], logs(everyone)

    snap = store.get(PARENT)
    assert snap.state == "completed", state(parents, lambda: logs(everyone))()
    assert snap.data["results"] == [[i, "completed", n, False] for n, i in enumerate(CHILD_IDS)]
    history = store.history(PARENT)
    assert [h.event for h in history] == ["start", "exited", "complete"], history
    assert history[0].owner == "first" and history[1].owner == "second"
    assert_children_once(store)
    for child in CHILD_IDS:  # each child started and ended once
        assert [h.event for h in store.history(child)] == ["start", "exited", "complete"], child
    found = runs(tmp_path)
    parent_runs = [r["pid"] for r in found if r["role"] == "parent"]
    assert parent_runs[0] == first.proc.pid and parent_runs.count(first.proc.pid) >= 1
    assert parent_runs.count(second.proc.pid) >= 1  # resumed (woken, maybe more than once) by the second
    assert set(parent_runs) == {first.proc.pid, second.proc.pid}
    child_runs = Counter(r["id"] for r in found if r["role"] == "child")
    assert child_runs == Counter(dict.fromkeys(CHILD_IDS, 1))
    assert {r["pid"] for r in found if r["role"] == "child"} <= {k.proc.pid for k in kids}


# -- b. a failed child fails its parent ----------------------------------------------------------------


def test_a_failed_child_fails_its_parent_across_processes(
    sql_target: SqlTarget, tmp_path: Path, children: list[Worker]
) -> None:
    store = sql_target.store()
    parents = Engine(KidParent, store, owner="test")
    parents.create(PARENT, data={"children": CHILDREN, "poll": 5.0, "child_sleep": 0.02, "fail_at": 7})
    everyone = [
        start(children, Worker(sql_target, tmp_path, "parents", "parent")),
        start(children, Worker(sql_target, tmp_path, "kids", "child")),
    ]
    wait_ready(everyone)
    wait_for(lambda: final(store, PARENT), state(parents, lambda: logs(everyone)))
    wait_for(lambda: children_final(store), state(parents, lambda: logs(everyone)))  # the others go on
    for worker in everyone:
        worker.stop()
    assert [w.proc.returncode for w in everyone] == [0, 0], logs(everyone)

    snap = store.get(PARENT)
    assert snap.state == "failed" and "results" not in snap.data
    history = store.history(PARENT)
    assert [h.event for h in history] == ["start", "fail"], history  # never retried
    failed = history[-1]
    assert failed.reason == "error" and failed.error is not None
    assert failed.error["type"] == "ChildFailed" and f"{PARENT}/{child_key(7)}" in failed.error["message"]
    assert_children_once(store)
    states = {s.id: s.state for s in store.children(PARENT, limit=1000)}
    assert states == {i: "failed" if n == 7 else "completed" for n, i in enumerate(CHILD_IDS)}


# -- c. cancelling a parent cancels its live children ------------------------------------------------------


def test_cancelling_a_parent_cancels_its_queued_and_running_children(
    sql_target: SqlTarget, tmp_path: Path, children: list[Worker]
) -> None:
    store = sql_target.store()
    parents = Engine(KidParent, store, owner="test")
    parents.create(PARENT, data={"children": CHILDREN, "poll": 5.0, "child_sleep": 0.4})
    everyone = [
        start(children, Worker(sql_target, tmp_path, "parents", "parent")),
        start(children, Worker(sql_target, tmp_path, "kids", "child", concurrency=4)),
    ]
    wait_ready(everyone)

    def some_running() -> bool:
        return parked(store) and any(
            s.state == "running" and s.lease_owner is not None for s in store.children(PARENT, limit=1000)
        )

    wait_for(some_running, state(parents, lambda: logs(everyone)))
    cancelled = parents.cancel(PARENT, lifecycles=[KidChild])
    assert cancelled.result.state == "failed"
    wait_for(lambda: children_final(store), state(parents, lambda: logs(everyone)))
    time.sleep(0.6)  # a cancelled child's handler wakes from its sleep, and is fenced
    for worker in everyone:
        worker.stop()
    assert [w.proc.returncode for w in everyone] == [0, 0], logs(everyone)

    parent_history = store.history(PARENT)
    assert (parent_history[-1].event, parent_history[-1].reason) == ("cancel", "cancelled")
    assert store.get(PARENT).state == "failed"
    assert_children_once(store)
    states = {s.id: s.state for s in store.children(PARENT, limit=1000)}
    failed = {i for i, s in states.items() if s == "failed"}
    assert failed == set(cancelled.children), (cancelled, states)
    left = {i for i, _ in cancelled.left}
    assert all(states[i] == "completed" for i in left), (cancelled.left, states)  # ended on their own
    was_running: set[str] = set()
    was_queued: set[str] = set()
    for child in failed:
        history = store.history(child)
        last = history[-1]
        assert (last.event, last.reason) == ("cancel", f"parent {PARENT} cancelled"), history
        (was_running if history[0].event == "start" else was_queued).add(child)
    assert was_running and was_queued, (was_running, was_queued)  # running and queued ones, both cancelled
    child_runs = Counter(r["id"] for r in runs(tmp_path) if r["role"] == "child")
    assert not (set(child_runs) & was_queued)  # a child cancelled while queued never ran
    assert all(count == 1 for count in child_runs.values()), child_runs
    assert states.keys() - failed == {i for i, s in states.items() if s == "completed"}
