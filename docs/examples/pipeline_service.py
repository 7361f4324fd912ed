"""A small CI/CD service: webhooks report pipelines, a worker runs deploys.

A pipeline whose success webhook is lost would stay ``running`` forever; here
the reaper expires it once it has been idle for ``stale_after``. Run it with
``python pipeline_service.py``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from fsm import (
    Engine,
    JobLifecycle,
    PipelineLifecycle,
    Reaper,
    ReaperConfig,
    RetryPolicy,
)
from fsm.work import Job, Worker
from sqlalchemy.orm import Session
from stores import SqlStore

# Step 1: the store, the two lifecycles and the application's own table.
DB = "pipelines.db"
for leftover in Path(".").glob(
    f"{DB}*"
):  # start from an empty database at every run
    leftover.unlink()
store = SqlStore(f"sqlite:///{DB}")

pipeline_policy = PipelineLifecycle.policy.replace(
    stale_after=timedelta(seconds=2)
)
pipelines = Engine(PipelineLifecycle, store, policy=pipeline_policy)

deploy_policy = JobLifecycle.policy.replace(
    lease_ttl=timedelta(seconds=5),
    default_retry=RetryPolicy(
        max_attempts=3,
        initial_interval=timedelta(milliseconds=200),
        jitter=0.0,
    ),
)
deploys = Engine(JobLifecycle, store, policy=deploy_policy)

app_tables = sa.MetaData()
releases = sa.Table(
    "releases",
    app_tables,
    sa.Column("pipeline_id", sa.String, primary_key=True),
    sa.Column("sha", sa.String, nullable=False),
)
app_tables.create_all(store.engine)


# Step 2: the webhooks the CI system calls.
def pipeline_queued(pipeline_id: str, branch: str) -> None:
    steps = [{"name": "build"}, {"name": "test"}]
    pipelines.create(
        pipeline_id, data={"steps": steps}, concurrency_key=branch
    )


def pipeline_started(pipeline_id: str) -> None:
    steps = [{"name": "build", "status": "running"}, {"name": "test"}]
    pipelines.fire(pipeline_id, "start", data={"steps": steps})


def pipeline_succeeded(pipeline_id: str, sha: str) -> None:
    """Record the release, complete the pipeline, queue its deploy: all or
    nothing."""
    with Session(store.engine) as session, session.begin():
        session.execute(
            releases.insert().values(pipeline_id=pipeline_id, sha=sha)
        )
        with pipelines.within(session), deploys.within(session):
            lease = pipelines.fire(pipeline_id, "finish").lease
            done = [
                {"name": "build", "status": "completed"},
                {"name": "test", "status": "completed"},
            ]
            pipelines.fire(
                pipeline_id, "succeed", lease=lease, data={"steps": done}
            )
            deploys.create(f"deploy-{pipeline_id}", data={})


# Step 3: the deploy worker; the registry times out on the first two pushes.
pushes: dict[str, int] = {}


def deploy(job: Job) -> tuple[str, dict[str, int]]:
    pushes[job.id] = pushes.get(job.id, 0) + 1
    if pushes[job.id] < 3:
        print(
            f"  {job.id}: attempt {pushes[job.id]} failed (registry timed out)"
        )
        raise ConnectionError("registry timed out")
    print(f"  {job.id}: attempt {pushes[job.id]} pushed the image")
    return "exited", {"exit_code": 0}


def finish_deploy(job: Job) -> str:
    return "complete"


worker = Worker(
    deploys,
    {"running": deploy, "finalizing": finish_deploy},
    poll_interval=timedelta(milliseconds=50),
    reap=ReaperConfig(interval=timedelta(seconds=1)),
)
reaper = Reaper(
    store,
    {PipelineLifecycle: pipeline_policy},
    ReaperConfig(interval=timedelta(milliseconds=500)),
)


# Step 4: a live dashboard, from the store's feed of committed transitions.
stop_dashboard = threading.Event()


def dashboard(engine: Engine) -> None:
    for entry in engine.watch(poll=0.05, stop=stop_dashboard):
        row = entry.record
        reason = f", reason {row.reason}" if row.reason else ""
        move = f"{row.source} -> {row.target}"
        change = f"{move} ({row.event} by {row.actor}{reason})"
        print(f"[dashboard] {entry.kind} {row.entity_id}: {change}")


# Step 5: run the story.
def main() -> None:
    watchers = [
        threading.Thread(target=dashboard, args=(engine,))
        for engine in (pipelines, deploys)
    ]
    threads = [
        *watchers,
        threading.Thread(target=worker.run, kwargs={"install_signals": False}),
    ]
    for thread in threads:
        thread.start()
    reaper.start()
    time.sleep(0.2)  # let the dashboard start watching

    print("webhooks: p-101 and p-102 queued and started")
    pipeline_queued("p-101", "main")
    pipeline_queued("p-102", "feature-x")
    pipeline_started("p-101")
    pipeline_started("p-102")
    print("webhook: p-101 succeeded (p-102's success webhook is lost)")
    pipeline_succeeded("p-101", "4f2a9c1")

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (
            pipelines.get("p-102").state == "failed"
            and deploys.get("deploy-p-101").state == "completed"
        ):
            break
        time.sleep(0.1)

    reaper.stop()
    worker.stop()
    time.sleep(0.2)  # let the dashboard print the last transitions
    stop_dashboard.set()
    for thread in threads:
        thread.join()

    print("summary:")
    for pipeline_id in ("p-101", "p-102"):
        last = pipelines.history(pipeline_id)[-1]
        steps = ", ".join(
            f"{step['name']} {step['status']}"
            for step in pipelines.get(pipeline_id).data["steps"]
        )
        reason = f"last event {last.event}, reason {last.reason}"
        print(f"  pipeline {pipeline_id}: {last.target} ({reason})")
        print(f"    steps: {steps}")
    job = deploys.get("deploy-p-101")
    print(f"  deploy-p-101: {job.state} at attempt {job.attempt}")
    with store.engine.connect() as connection:
        rows = connection.execute(
            sa.select(releases.c.pipeline_id, releases.c.sha)
        ).all()
    print(f"  releases table: {[tuple(row) for row in rows]}")
    print(f"Look closer: fsm inspect --db sqlite:///{DB}")
    print("  (the inspector needs pip install 'fsm-lifecycles[inspect]')")


if __name__ == "__main__":
    main()
