"""A rolling deploy of a changed lifecycle, with real processes.

Workers of version 1 build while version 2 (``building`` renamed ``compiling``, ``testing``
inserted, a data field added by a data migration) is deployed beside them: one version-1
worker is SIGKILLed holding builds, two version-2 workers start (one of them reaping), new
builds are created under version 2, ``fsm migrate-rows`` runs while the last version-1
worker still works, that worker is stopped, the migration runs again to its end and
``fsm check`` passes.  What is asserted: every build completes, none is stranded, every
history is gap-free with one final entry (I5, I6), and no version-1 worker wrote to a
build created or migrated under version 2 (the claim's definition fence and the version
fence, I3).

The procedure is the one the how-to "Change a lifecycle that has entities in flight"
describes.  Runs on a SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine
from fsm.evolution.migrate import MIGRATE_EVENT
from fsm.testing.checks import history_problems
from stores import Store

from .builds import BuildV1, BuildV2

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 60.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
TESTS_DIR = Path(__file__).resolve().parents[1]
V1_JOBS, V2_JOBS = 60, 20
V1_OWNERS = {"v1a", "v1b"}


class Child(ChildProcess):
    def __init__(self, argv: list[str], directory: Path, name: str) -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        command = [sys.executable, "-m", "test_evolution.proc_builds", *argv]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, cwd=directory, env=_env(), stdout=out, stderr=err)

    def tail(self) -> str:
        out = self.out.read_text(errors="replace") if self.out.exists() else ""
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.name} (pid {self.proc.pid}, rc {self.proc.poll()}):\n{out[-1500:]}{err[-2500:]}"

    def printed(self, marker: str) -> bool:
        return self.out.exists() and marker in self.out.read_text(errors="replace")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *filter(None, sys.path)])}


def worker(target: SqlTarget, directory: Path, owner: str, version: int, *, reap: bool = False) -> Child:
    return Child(
        ["worker", target.url, target.prefix, owner, str(version)] + (["--reap"] if reap else []), directory, owner
    )


def fsm_command(target: SqlTarget, directory: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``fsm ARGV --db URL --prefix PREFIX``, run as a deploy step runs it."""
    return subprocess.run(
        [sys.executable, "-m", "fsm", *argv, "--db", target.url, "--prefix", target.prefix],
        cwd=directory,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def states(store: Store) -> dict[str, int]:
    return store.count_states("build")


def holds_building(store: Store, owner: str) -> bool:
    return any(s.lease_owner == owner for s in store.entities("build", state="building", limit=500))


def test_a_rolling_deploy_of_a_renamed_and_an_inserted_state_strands_nothing(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    store = sql_target.store()  # creates the tables: the children open the store without creating any
    v1 = Engine(BuildV1, store, owner="creator-v1")
    old = [v1.create(f"old-{i:02}", data={"target": "arm" if i % 2 else "x86"}).id for i in range(V1_JOBS)]
    v1a, v1b = worker(sql_target, tmp_path, "v1a", 1), worker(sql_target, tmp_path, "v1b", 1)
    children += [v1a, v1b]
    everyone: list[Child] = [v1a, v1b]

    def logs() -> str:
        return f"{states(store)}\n" + "\n".join(c.tail() for c in everyone)

    wait_for(lambda: states(store).get("completed", 0) >= 6 and holds_building(store, "v1b"), logs)
    v1b.kill()  # dies holding builds in `building`: only the migration can bring those to version 2

    v2a, v2b = worker(sql_target, tmp_path, "v2a", 2, reap=True), worker(sql_target, tmp_path, "v2b", 2)
    children += [v2a, v2b]
    everyone += [v2a, v2b]
    wait_for(lambda: v2a.printed("ready") and v2b.printed("ready"), logs)
    v2 = Engine(BuildV2, store, owner="creator-v2")
    new = [v2.create(f"new-{i:02}", data={"label": f"new {i}"}).id for i in range(V2_JOBS)]

    first = fsm_command(sql_target, tmp_path, "migrate-rows", "test_evolution.builds:BuildV2", "--wait", "3")
    assert first.returncode in (0, 1), f"{first.stdout}{first.stderr}\n{logs()}"  # 1: v1a still holds some
    assert "moved" in first.stdout, first.stdout

    v1a.stop()  # the last version-1 worker rolls
    last = fsm_command(sql_target, tmp_path, "migrate-rows", "test_evolution.builds:BuildV2", "--wait", "30")
    assert last.returncode == 0, f"{last.stdout}{last.stderr}\n{logs()}"
    check = fsm_command(sql_target, tmp_path, "check", "test_evolution.builds:BuildV2")
    assert check.returncode == 0 and "ok: nothing would be stranded" in check.stdout, check.stdout + check.stderr

    ids = old + new
    wait_for(lambda: states(store) == {"completed": len(ids)}, logs)
    v2a.stop()
    v2b.stop()
    assert v1a.proc.returncode == 0 and v2a.proc.returncode == 0 and v2b.proc.returncode == 0, logs()

    moved_from_building = 0
    for entity_id in ids:
        snap = store.get(entity_id)
        history = store.history(entity_id)
        assert snap.state == "completed" and snap.definition == 2, (snap, history)
        assert history_problems(BuildV2, snap, history) == [], history
        newer = entity_id.startswith("new-")  # written under version 2: version 1 never touches it again
        for row in history:
            if row.owner in V1_OWNERS:
                assert not newer, f"{entity_id}: a version-1 worker wrote after version 2 did: {history}"
            if row.event == MIGRATE_EVENT:
                newer = True
            moved_from_building += row.event == MIGRATE_EVENT and row.source == "building"
        if entity_id.startswith("new-"):
            assert not {r.owner for r in history} & V1_OWNERS, history
            assert "building" not in {r.target for r in history}
        assert snap.data.get("label"), snap.data  # the data migration reached every build
    assert moved_from_building >= 1, "the killed worker's builds were not moved by the migration"
    print(f"moved from building: {moved_from_building}; first pass:\n{first.stdout}\nlast pass:\n{last.stdout}")
