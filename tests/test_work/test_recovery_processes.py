"""Workers alone recover, with real processes: the README's own ``Deploy`` lifecycle
(``recovery(...)``, ``retries(...)``, a policy changed with one ``replace``), two worker
processes with ``concurrency=2`` and ``reap=True``, six jobs whose handlers outlast the
lease TTL, one worker SIGKILLed while it holds two: all six complete, none fails.

Runs on a SQLite file and on PostgreSQL.  No duration is asserted: the waits only bound
how long the test may take before it fails on a machine that never recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SqlTarget
from test_readme import block_starting

from stores.sql import SqlStore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
ROOT = Path(__file__).resolve().parents[2]
PATIENT = 180.0

CHILD = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta

    from fsm import Engine
    from fsm.work import Worker
    from stores.sql import SqlStore
    from lifecycles import Deploy


    class QuickDeploy(Deploy):  # the same rows; a lease TTL of a second, for a short test
        policy = Deploy.policy.replace(lease_ttl=timedelta(seconds=1), stale_after=timedelta(seconds=2))


    url, prefix, owner = sys.argv[1:4]
    engine = Engine(QuickDeploy, SqlStore(url, table_prefix=prefix, create=False), owner=owner)


    def run_tests(job):
        time.sleep(2.5)  # longer than the TTL: the keeper renews
        return "promote", {"tests_passed": True}


    def finalize(job):
        job.run("deploy", lambda key: {"deployed": key})
        time.sleep(1.5)
        return "done"


    Worker(
        engine,
        {"running": run_tests, "finalizing": finalize},
        concurrency=2,
        poll_interval=timedelta(milliseconds=100),
        reap=True,
    ).run()
    """
)


def spawn(directory: Path, target: SqlTarget, owner: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT), str(ROOT / "tests")])}
    return subprocess.Popen(
        [sys.executable, str(directory / "child.py"), target.url, target.prefix, owner],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(directory / f"{owner}.log", "wb"),
    )


def wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened within {PATIENT} s: {what}")


def test_two_workers_with_reap_recover_a_sigkilled_one_and_complete_every_job(
    sql_target: SqlTarget, tmp_path: Path
) -> None:
    (tmp_path / "lifecycles.py").write_text(block_starting("# lifecycles.py"))
    (tmp_path / "child.py").write_text(CHILD)
    sys.path.insert(0, str(tmp_path))
    try:
        from lifecycles import Deploy  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    from fsm import Engine

    store = sql_target.store()
    assert isinstance(store, SqlStore)
    deploys = Engine(Deploy, store, owner="test")
    ids = [deploys.create(f"d{i}").id for i in range(6)]

    def held_by(owner: str) -> int:
        return sum(1 for i in ids if store.get(i).lease_owner == owner)

    victim = spawn(tmp_path, sql_target, "victim")
    survivor: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: held_by("victim") == 2, "the victim holds two jobs")
        survivor = spawn(tmp_path, sql_target, "survivor")
        wait_for(lambda: held_by("survivor") >= 1, "the survivor works too")
        assert held_by("victim") == 2
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(30)
        wait_for(
            lambda: all(store.get(i).state in ("deployed", "failed") for i in ids),
            "every job finished",
        )
        states = {i: store.get(i).state for i in ids}
        assert states == dict.fromkeys(ids, "deployed"), (states, (tmp_path / "survivor.log").read_text()[-3000:])
        recovered = [h for i in ids for h in store.history(i) if h.actor == "reaper"]
        assert recovered and all(h.reason in ("expired", "reclaimed") for h in recovered)  # requeued or reclaimed
        assert not any(h.reason in ("unclaimed", "error") for i in ids for h in store.history(i))
        # every deploy effect recorded once, by whoever finished the job
        assert all(len([e for e in store.effects(i) if e.key == "deploy"]) == 1 for i in ids)
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
