"""Durable waits with real processes: a worker SIGKILLed while its jobs sleep or wait for a
message, and one SIGKILLed inside a handler before its sleep; a second worker process
finishes every job.

Every test runs on a SQLite file and on PostgreSQL (tables of its own, a unique prefix).
The workers are child processes (:mod:`test_waits.proc_handlers`) that log each execution
of a ``job.run`` function (with the store's clock) into files of their own.  What is
asserted is behaviour: each recorded step ran once (or, cut before it was recorded, at
most once more), each job resumed no earlier than its wake time, each message was
delivered once whatever the number of sends, and every job completed with a gap-free
history.  No duration is asserted: the waits only bound how long a test may take before
it fails.
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
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine, JobLifecycle
from fsm.records import EffectRecord
from fsm.testing.checks import history_problems
from fsm.work.waits import SLEEP, WAIT, step_key
from stores import Store

from .proc_handlers import HOLD_FILE, MESSAGE, QuickJob, blocks_inside_before

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 30.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
TESTS_DIR = Path(__file__).resolve().parents[1]
"""On the children's path: they import ``test_waits.proc_handlers``."""
JOBS = 8
SLEEP_STEP = step_key(SLEEP, 1, "running")
WAIT_STEP = step_key(WAIT, 1, "running")


# -- children ----------------------------------------------------------------------------------


class Child(ChildProcess):
    """A child process with ``tests/`` on its path; output in ``directory/name.out``/``.err``."""

    def __init__(self, argv: list[str], directory: Path, name: str) -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *filter(None, sys.path)])}
        command = [sys.executable, "-m", "test_waits.proc_handlers", *argv]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, cwd=directory, env=env, stdout=out, stderr=err)

    def tail(self) -> str:
        out = self.out.read_text(errors="replace") if self.out.exists() else ""
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.name} (pid {self.proc.pid}, rc {self.proc.poll()}):\n{out[-1500:]}{err[-2500:]}"

    def printed(self, marker: str) -> bool:
        return self.out.exists() and marker in self.out.read_text(errors="replace")


def worker(target: SqlTarget, directory: Path, owner: str, mode: str, *, reap: bool = False) -> Child:
    argv = ["worker", target.url, target.prefix, str(directory), owner, mode] + (["--reap"] if reap else [])
    return Child(argv, directory, owner)


def sender(target: SqlTarget, directory: Path, name: str, plan: list[tuple[str, Any, str]]) -> list[Any]:
    """Run a sender process over ``plan`` to its end; what each ``send`` returned."""
    plan_path, out_path = directory / f"{name}.plan.json", directory / f"{name}.json"
    plan_path.write_text(json.dumps(plan))
    child = Child(["send", target.url, target.prefix, str(plan_path), str(out_path)], directory, name)
    try:
        child.proc.wait(PATIENT)
    finally:
        child.stop()
    assert child.proc.returncode == 0 and out_path.exists(), child.tail()
    results: list[Any] = json.loads(out_path.read_text())
    return results


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def logs(children: Iterable[Child]) -> str:
    return "\n".join(child.tail() for child in children)


def events(directory: Path) -> list[dict[str, Any]]:
    """Every event line the children wrote (each a whole line: one ``os.write``)."""
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("events-*.log")):
        found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


def executions(found: list[dict[str, Any]], what: str) -> dict[str, list[dict[str, Any]]]:
    by_id: dict[str, list[dict[str, Any]]] = {}
    for line in found:
        if line["what"] == what:
            by_id.setdefault(line["id"], []).append(line)
    return by_id


# -- the store's view ----------------------------------------------------------------------------


def create_jobs(engine: Engine) -> list[str]:
    return [engine.create(f"job-{i}").id for i in range(JOBS)]


def parked(store: Store, entity_id: str, step: str) -> bool:
    """Whether the job is parked on ``step`` (state kept, no lease, the step recorded)."""
    snap = store.get(entity_id)
    return snap.state == "running" and snap.lease is None and store.effect(entity_id, step) is not None


def until_of(record: EffectRecord | None) -> datetime:
    assert record is not None
    return datetime.fromisoformat(record.result["until"])


def completed(store: Store, ids: Iterable[str]) -> bool:
    return all(store.get(i).state in JobLifecycle.table.finals for i in ids)


def assert_completed(store: Store, ids: Iterable[str], events_expected: list[str]) -> None:
    """Every job completed, its history gap-free and exactly ``events_expected``."""
    for entity_id in ids:
        snap = store.get(entity_id)
        history = store.history(entity_id)
        assert snap.state == "completed", (snap, history)
        assert history_problems(QuickJob, snap, history) == []
        assert [h.event for h in history] == events_expected, (entity_id, history)


# -- a. SIGKILLed while every job sleeps ------------------------------------------------------------


def test_jobs_asleep_when_their_worker_is_killed_resume_once_in_another_and_never_early(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    store = sql_target.store()  # creates the tables: the children open the store without creating any
    engine = Engine(JobLifecycle, store, owner="test")
    ids = create_jobs(engine)
    first = worker(sql_target, tmp_path, "first", "sleep")
    children.append(first)
    wait_for(lambda: all(parked(store, i, SLEEP_STEP) for i in ids), lambda: f"{engine.counts()}\n{logs([first])}")
    first.kill()
    killed_at = store.now()
    untils = {i: until_of(store.effect(i, SLEEP_STEP)) for i in ids}
    assert killed_at < min(untils.values()), f"the machine stalled: killed at {killed_at}, first wake {untils}"
    for entity_id in ids:  # parked: state kept, no lease, due at the wake time, no history row
        snap = store.get(entity_id)
        assert (snap.state, snap.lease_owner, snap.run_after) == ("running", None, untils[entity_id]), snap
        assert [h.event for h in store.history(entity_id)] == ["start"]
    assert not executions(events(tmp_path), "after"), "the first worker resumed a job before it was killed"

    second = worker(sql_target, tmp_path, "second", "sleep")  # no reaper: nothing of a parked job to recover
    children.append(second)
    wait_for(lambda: completed(store, ids), lambda: f"{engine.counts()}\n{logs([first, second])}")
    second.stop()
    assert (first.proc.returncode, second.proc.returncode) == (-signal.SIGKILL, 0), logs([first, second])

    found = events(tmp_path)
    before, after = executions(found, "before"), executions(found, "after")
    assert {i: len(before.get(i, [])) for i in ids} == dict.fromkeys(ids, 1), before
    assert {i: len(after.get(i, [])) for i in ids} == dict.fromkeys(ids, 1), after
    assert {line["pid"] for i in ids for line in before[i]} == {first.proc.pid}
    assert {line["pid"] for i in ids for line in after[i]} == {second.proc.pid}
    for entity_id in ids:
        (ran,) = after[entity_id]
        assert datetime.fromisoformat(ran["at"]) >= untils[entity_id], f"{entity_id} resumed early: {ran}"
        sleep = store.effect(entity_id, SLEEP_STEP)
        assert sleep is not None and until_of(sleep) == untils[entity_id]  # recorded once, by the first worker
        assert store.effect(entity_id, "before").result["pid"] == first.proc.pid  # type: ignore[union-attr]
        assert store.effect(entity_id, "after").result["pid"] == second.proc.pid  # type: ignore[union-attr]
    assert_completed(store, ids, ["start", "exited", "complete"])
    assert {store.history(i)[1].owner for i in ids} == {"second"}
    print(f"first wake {min(untils.values()) - killed_at} after the kill")


# -- b. SIGKILLed while every job waits for a message -----------------------------------------------


def test_jobs_waiting_when_their_worker_is_killed_get_each_message_once_in_another(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    store = sql_target.store()
    engine = Engine(JobLifecycle, store, owner="test")
    ids = create_jobs(engine)
    first = worker(sql_target, tmp_path, "first", "wait")
    children.append(first)
    until = f"{WAIT_STEP}:until"
    wait_for(lambda: all(parked(store, i, until) for i in ids), lambda: f"{engine.counts()}\n{logs([first])}")
    first.kill()
    assert all(store.effect(i, WAIT_STEP) is None for i in ids)  # nothing taken yet

    payloads = {i: {"approved_by": f"user-{n}", "n": n} for n, i in enumerate(ids)}
    twice = set(ids[::3])  # sent twice with the same key: delivered once

    def plan(chosen: list[str]) -> list[tuple[str, Any, str]]:
        return [(i, payloads[i], f"key-{i}") for i in chosen for _ in range(2 if i in twice else 1)]

    # half the messages while no worker runs (the jobs are due at once when one starts) ...
    early = sender(sql_target, tmp_path, "sender1", plan(ids[: JOBS // 2]))
    second = worker(sql_target, tmp_path, "second", "wait")
    children.append(second)
    wait_for(lambda: second.printed("ready"), lambda: logs([second]))
    # ... and half while the second worker runs (a send wakes the parked job at once)
    late = sender(sql_target, tmp_path, "sender2", plan(ids[JOBS // 2 :]))
    wait_for(lambda: completed(store, ids), lambda: f"{engine.counts()}\n{logs([first, second])}")
    second.stop()
    assert (first.proc.returncode, second.proc.returncode) == (-signal.SIGKILL, 0), logs([first, second])

    sent: dict[str, list[bool]] = {}
    for entity_id, _key, created in early + late:
        sent.setdefault(entity_id, []).append(created)
    assert sent == {i: [True, False] if i in twice else [True] for i in ids}, sent

    found = events(tmp_path)
    before, after = executions(found, "before"), executions(found, "after")
    assert {i: len(before.get(i, [])) for i in ids} == dict.fromkeys(ids, 1), before
    assert {i: [line["payload"] for line in after.get(i, [])] for i in ids} == {i: [payloads[i]] for i in ids}
    assert {line["pid"] for i in ids for line in after[i]} == {second.proc.pid}
    for entity_id in ids:
        messages = [e for e in store.effects(entity_id) if e.key.startswith(f"fsm:msg:{MESSAGE}:")]
        assert [e.key for e in messages] == [f"fsm:msg:{MESSAGE}:key-{entity_id}"], messages
        taken = store.effect(entity_id, WAIT_STEP)
        assert taken is not None
        assert taken.result == {"message": messages[0].key, "payload": payloads[entity_id], "name": "approval"}
    assert_completed(store, ids, ["start", "exited", "complete"])


# -- c. SIGKILLed inside a handler, before its sleep ---------------------------------------------------


def test_a_job_whose_worker_dies_before_its_sleep_is_reaped_and_finished_by_another(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    """The first worker blocks every handler before its sleep, holding the lease (half of
    them inside ``before``'s function, before it is recorded), and is SIGKILLed there.  The
    second worker's reaper requeues the jobs once their leases lapse; the second worker
    runs them again from the top: a recorded ``before`` replays, an unrecorded one runs a
    second time and is recorded once; then the sleep, the resume and the rest."""
    store = sql_target.store()
    engine = Engine(QuickJob, store, owner="test")
    ids = create_jobs(engine)
    (tmp_path / HOLD_FILE).touch()
    first = worker(sql_target, tmp_path, "first", "hold")
    children.append(first)
    try:
        wait_for(
            lambda: set(executions(events(tmp_path), "blocked")) == set(ids),
            lambda: f"{engine.counts()}\n{logs([first])}",
        )
        for entity_id in ids:  # held by the first worker; "before" recorded or not, as planned
            snap = store.get(entity_id)
            assert (snap.state, snap.lease_owner) == ("running", "first"), snap
            assert (store.effect(entity_id, "before") is None) == blocks_inside_before(entity_id)
            assert store.effect(entity_id, SLEEP_STEP) is None
        first.kill()
    finally:
        (tmp_path / HOLD_FILE).unlink()  # a failure above: the first worker's handlers end at its stop

    second = worker(sql_target, tmp_path, "second", "hold", reap=True)
    children.append(second)
    wait_for(lambda: completed(store, ids), lambda: f"{engine.counts()}\n{logs([first, second])}")
    second.stop()
    assert (first.proc.returncode, second.proc.returncode) == (-signal.SIGKILL, 0), logs([first, second])

    found = events(tmp_path)
    before, after = executions(found, "before"), executions(found, "after")
    ran_before = {i: [line["pid"] for line in before[i]] for i in ids}
    assert ran_before == {
        i: [first.proc.pid, second.proc.pid] if blocks_inside_before(i) else [first.proc.pid] for i in ids
    }, ran_before
    assert {i: [line["pid"] for line in after.get(i, [])] for i in ids} == {i: [second.proc.pid] for i in ids}
    for entity_id in ids:
        recorded = store.effect(entity_id, "before")  # one row per key: recorded once
        assert recorded is not None
        # recorded by the execution that finished it: the second worker's where the first died inside
        assert recorded.result["pid"] == before[entity_id][-1]["pid"], (entity_id, recorded)
        assert recorded.lease_token == before[entity_id][-1]["token"], (entity_id, recorded)
        (ran,) = after[entity_id]
        assert datetime.fromisoformat(ran["at"]) >= until_of(store.effect(entity_id, SLEEP_STEP)), ran
    assert_completed(store, ids, ["start", "expire", "start", "exited", "complete"])
    reaped = [store.history(i)[1] for i in ids]
    assert {(h.actor, h.reason, h.source, h.target) for h in reaped} == {("reaper", "expired", "running", "queued")}
    assert Counter(store.history(i)[2].owner for i in ids) == Counter({"second": JOBS})
