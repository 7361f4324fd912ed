"""Reaper leadership is per lifecycle kind, with real processes.

A worker process runs ``Worker(..., reap=...)`` for jobs: its embedded reaper leads
``job``.  Beside it an ``fsm reaper --leader`` process reaps pipelines.  With one global
leader lease the pipeline reaper stayed a standby for as long as the worker lived, and a
pipeline whose webhook was lost (``running``, never touched again) was never expired;
with a lease per kind each kind has exactly one leader, and the zombie fails as
``expired``.

Runs on a SQLite file and on PostgreSQL (tables of its own, a unique prefix).  No duration
is asserted: the waits only bound how long the test may take before it fails on a machine
where the zombie is never expired.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import SqlTarget

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from fsm.reaping.leader import LEADER_KIND
from stores import Store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 30.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
STALE_S = 2
"""The pipeline reaper's ``stale_after``: a running pipeline idle this long is a zombie."""
INTERVAL_S = 0.5
"""Both reapers tick this often."""
JOB_LEADER = "fsm-reaper-leader:job"
PIPELINE_LEADER = "fsm-reaper-leader:pipeline"

QUICK_PIPELINE = textwrap.dedent(
    f"""
    from datetime import timedelta

    from fsm import PipelineLifecycle


    class QuickPipeline(PipelineLifecycle):
        '''The built-in pipeline (same kind, same rows), stale after {STALE_S} s idle.'''

        policy = PipelineLifecycle.policy.replace(stale_after=timedelta(seconds={STALE_S}))
    """
)

WORKER = textwrap.dedent(
    f"""
    import logging, sys
    from datetime import timedelta

    from fsm import Engine, JobLifecycle
    from fsm.reaping import ReaperConfig
    from fsm.work import Worker
    from stores.sql import SqlStore

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    url, prefix, owner = sys.argv[1:4]
    store = SqlStore(url, table_prefix=prefix, create=False)
    worker = Worker(
        Engine(JobLifecycle, store, owner=owner),
        {{"running": lambda job: "exited", "finalizing": lambda job: "complete"}},
        poll_interval=timedelta(milliseconds=100),
        # a stalled tick on a loaded machine never lets its lease lapse: under one global
        # lease the pipeline reaper would then lead, and hide what this test is about
        reap=ReaperConfig(interval=timedelta(seconds={INTERVAL_S}), leader_ttl=timedelta(seconds=20)),
    )
    worker.run(install_signals=True)
    store.close()
    """
)

CLI = "import sys; from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
"""``fsm ...`` in a child (the package has no ``__main__``)."""


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def leaders(store: Store) -> dict[str, str | None]:
    """Each leader row's id and the owner of its lease (``None``: resigned)."""
    return {snap.id: snap.lease_owner for snap in store.entities(LEADER_KIND, limit=100)}


def tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        return "(no output)"


def spawn(argv: list[str], directory: Path, name: str) -> subprocess.Popen[bytes]:
    """A child with ``directory`` (the lifecycle module) first on its path; its output
    goes to ``directory/name.out`` and ``.err``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), *filter(None, sys.path)])}
    with open(directory / f"{name}.out", "wb") as out, open(directory / f"{name}.err", "wb") as err:
        return subprocess.Popen([sys.executable, *argv], cwd=directory, env=env, stdout=out, stderr=err)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM this child (ours, by its pid), and kill it if it does not end in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(PATIENT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(PATIENT)


def test_a_workers_reaper_leading_job_leaves_a_cli_reaper_to_lead_pipeline_and_expire_a_zombie(
    sql_target: SqlTarget, tmp_path: Path
) -> None:
    store = sql_target.store()  # creates the tables: the CLI reaper opens the store without creating any
    (tmp_path / "quick_pipeline.py").write_text(QUICK_PIPELINE)
    worker_owner = f"worker-{uuid.uuid4().hex[:8]}"
    url, prefix = sql_target.url, sql_target.prefix
    reaper_argv = ["reaper", "--db", url, "--prefix", prefix, "--leader", "--interval", str(INTERVAL_S)]
    reaper_argv += ["--lifecycle", "quick_pipeline:QuickPipeline"]

    def logs() -> str:
        return (
            f"leaders {leaders(store)}\nworker:\n{tail(tmp_path / 'worker.err')}\n"
            f"reaper:\n{tail(tmp_path / 'reaper.out')}\n{tail(tmp_path / 'reaper.err')}"
        )

    children: list[subprocess.Popen[bytes]] = []
    try:
        children.append(spawn(["-c", WORKER, url, prefix, worker_owner], tmp_path, "worker"))
        # the worker leads first (as a worker deployed before the pipeline reaper would)
        wait_for(lambda: worker_owner in leaders(store).values(), lambda: f"the worker never led\n{logs()}")
        children.append(spawn(["-c", CLI, *reaper_argv], tmp_path, "reaper"))
        wait_for(lambda: "tick 1 " in tail(tmp_path / "reaper.out"), lambda: f"the reaper never ticked\n{logs()}")
        found = re.search(r"^reaper (\S+) on ", (tmp_path / "reaper.out").read_text(), re.MULTILINE)
        assert found, logs()
        reaper_owner = found.group(1)

        jobs = Engine(JobLifecycle, store, owner="test")
        made = [jobs.create().id for _ in range(3)]
        quick = PipelineLifecycle.policy.replace(stale_after=timedelta(seconds=STALE_S))
        pipelines = Engine(PipelineLifecycle, store, policy=quick, owner="test")
        zombie = pipelines.create(data={"steps": [{"name": "build", "status": "running"}]}).id
        pipelines.fire(zombie, "start")  # and its webhook is lost: nobody touches it again

        wait_for(
            lambda: all(jobs.get(i).state == "completed" for i in made),
            lambda: f"the worker did not complete its jobs: {[jobs.get(i).state for i in made]}\n{logs()}",
        )
        wait_for(
            lambda: pipelines.get(zombie).state == "failed",
            lambda: f"the zombie pipeline was never expired ({pipelines.get(zombie).state})\n{logs()}",
        )
        last = store.history(zombie)[-1]
        assert (last.event, last.source, last.target, last.actor, last.reason) == (
            "expire",
            "running",
            "failed",
            "reaper",
            "expired",
        ), last
        assert pipelines.get(zombie).data["steps"] == [{"name": "build", "status": "failed"}]
        # each kind has exactly one leader, and they are the two processes
        assert leaders(store) == {JOB_LEADER: worker_owner, PIPELINE_LEADER: reaper_owner}, logs()
        assert worker_owner != reaper_owner
        assert all(p.poll() is None for p in children), logs()  # both still running

        for proc in children:
            stop(proc)
        assert [p.returncode for p in children] == [0, 0], logs()
        assert leaders(store) == {JOB_LEADER: None, PIPELINE_LEADER: None}  # each resigned on its way out
    finally:
        for proc in children:
            stop(proc)


def test_a_reaper_of_two_kinds_leads_the_kind_nobody_leads_and_stands_by_for_the_other(
    any_store: Store, clock: ManualClock
) -> None:
    # a leader lease that outlives the pipeline's stale_after: only the reapers' own ticks decide
    config = ReaperConfig(leader=True, interval=timedelta(minutes=5), leader_ttl=timedelta(hours=3))
    jobs_reaper = Reaper(any_store, [JobLifecycle], config, clock=clock, owner="worker-reaper")  # a worker's
    both = Reaper(any_store, [PipelineLifecycle, JobLifecycle], config, clock=clock, owner="cli-reaper")
    pipelines_reaper = Reaper(any_store, [PipelineLifecycle], config, clock=clock, owner="third")

    first = jobs_reaper.run_once()
    assert first.leading is True and first.standby == []
    jobs = Engine(JobLifecycle, any_store, clock=clock, owner="w1")
    jobs.create("j1")
    [held] = jobs.claim()  # its holder dies: the lease runs out with the pipeline below
    pipelines = Engine(PipelineLifecycle, any_store, clock=clock)
    for entity_id in ("p1", "p2"):
        pipelines.create(entity_id, data={"steps": [{"name": "build", "status": "running"}]})
    pipelines.fire("p1", "start")
    clock.advance(PipelineLifecycle.policy.stale_after + timedelta(seconds=1))
    assert jobs.get("j1").lease_is_stale(clock.now(), jobs.policy.stale_after)

    second = both.run_once()
    assert second.leading is True and second.standby == ["job"]
    assert second.moved == {"pipeline.expire": 1}  # the zombie, never the job: the worker's reaper leads job
    assert pipelines.get("p1").state == "failed"
    assert any_store.history("p1")[-1].reason == "expired"
    assert jobs.get("j1").state == "running" and jobs.get("j1").lease_owner == held.lease_owner

    pipelines.fire("p2", "start")
    clock.advance(PipelineLifecycle.policy.stale_after + timedelta(seconds=1))
    third = pipelines_reaper.run_once()
    assert third.leading is False and third.standby == ["pipeline"] and third.total_moved == 0
    assert pipelines.get("p2").state == "running"  # the standby moved nothing
    assert both.run_once().moved == {"pipeline.expire": 1}  # the pipeline leader did

    reaped = jobs_reaper.run_once()
    assert reaped.leading is True and reaped.total_moved == 1  # the job's own leader reaps it
    assert leaders(any_store) == {JOB_LEADER: "worker-reaper", PIPELINE_LEADER: "cli-reaper"}
