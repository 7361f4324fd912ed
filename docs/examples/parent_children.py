"""A parent job that starts three children and waits for their results.

``job.start_child`` creates each child once per key; ``job.wait_children()``
parks the parent (no lease, no worker slot) until every child is final, then
returns their results.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

from fsm import Engine, JobLifecycle
from fsm.work import Job, Worker
from stores import open_store

DB = "children.db"
for leftover in Path(".").glob(f"{DB}*"):
    leftover.unlink()

jobs = Engine(JobLifecycle, open_store(f"sqlite:///{DB}"))
PARTS = {"lint": 0, "test": 0, "docs": 0}


def running(job: Job) -> str | tuple[str, dict[str, int]]:
    if (
        job.snapshot.parent_id is not None
    ):  # a child: its work, its result in its data
        print(f"child {job.id} ran")
        return "exited", {"exit_code": PARTS[job.id.rsplit("/", 1)[1]]}
    for part in PARTS:
        job.start_child(
            part, data={}
        )  # once per key, even when the handler runs again
    results = job.wait_children()  # parked until every child is final
    for result in results:
        code = result.data["exit_code"]
        got = f"{result.id}: {result.state}, exit code {code}"
        print(f"parent {job.id} got {got}")
    return "exited", {
        "exit_code": max(result.data["exit_code"] for result in results)
    }


def main() -> None:
    jobs.create("build-7")
    worker = Worker(
        jobs,
        {"running": running, "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=50),
    )
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}
    )
    thread.start()
    deadline = time.monotonic() + 10
    while (
        jobs.get("build-7").state not in ("completed", "failed")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    worker.stop()
    thread.join()
    print(f"build-7 {jobs.get('build-7').state} with {len(PARTS)} children")


if __name__ == "__main__":
    main()
