"""A schedule that creates a job every second, run by a worker that also reaps.

The worker's reaper creates one job per due time, with the id
``{schedule id}@{due time}``, and the worker runs each. After about three
seconds the program stops and lists the runs.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

from fsm import Engine, JobLifecycle, ReaperConfig, Schedule, Schedules
from fsm.work import Job, Worker
from stores import open_store

DB = "schedules.db"
for leftover in Path(".").glob(f"{DB}*"):
    leftover.unlink()

jobs = Engine(JobLifecycle, open_store(f"sqlite:///{DB}"))
schedules = Schedules(jobs)


def heartbeat(job: Job) -> tuple[str, dict[str, int]]:
    print(f"ran {job.id}")
    return "exited", {"exit_code": 0}


def main() -> None:
    schedules.add(Schedule("heartbeat", every=timedelta(seconds=1), data={}))
    worker = Worker(
        jobs,
        {"running": heartbeat, "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=50),
        reap=ReaperConfig(interval=timedelta(milliseconds=200)),
    )
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}
    )
    thread.start()
    time.sleep(3.2)
    worker.stop()
    thread.join()

    runs = [
        entity
        for entity in jobs.entities()
        if entity.id.startswith("heartbeat@")
    ]
    for run in runs:
        print(f"{run.id}: {run.state}")
    print(f"{len(runs)} runs created by the schedule")


if __name__ == "__main__":
    main()
