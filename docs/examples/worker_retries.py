"""A worker whose handler fails twice, then succeeds on its third attempt.

Each error is an attempt: the worker fires ``retry`` (the job goes back to
``queued``, due after the backoff) until the job's ``RetryPolicy`` has no
attempts left.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

from fsm import Engine, JobLifecycle, RetryPolicy
from fsm.work import Job, Worker
from stores import open_store

DB = "retries.db"
for leftover in Path(".").glob(f"{DB}*"):
    leftover.unlink()

policy = JobLifecycle.policy.replace(
    default_retry=RetryPolicy(
        max_attempts=3,
        initial_interval=timedelta(milliseconds=100),
        jitter=0.0,
    ),
)
jobs = Engine(JobLifecycle, open_store(f"sqlite:///{DB}"), policy=policy)
calls: list[str] = []  # one entry per call of the handler


def flaky(job: Job) -> tuple[str, dict[str, int]]:
    calls.append(job.id)
    if len(calls) < 3:
        raise TimeoutError(f"upstream timed out (call {len(calls)})")
    return "exited", {"exit_code": 0}


def main() -> None:
    jobs.create("job-1")
    worker = Worker(
        jobs,
        {"running": flaky, "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=50),
    )
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}
    )
    thread.start()
    deadline = time.monotonic() + 10
    while (
        jobs.get("job-1").state not in ("completed", "failed")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    worker.stop()
    thread.join()

    for row in jobs.history("job-1"):
        error = (
            f": {row.error['type']}: {row.error['message']}"
            if row.error
            else ""
        )
        print(f"{row.event}: {row.source} -> {row.target}{error}")
    job = jobs.get("job-1")
    print(f"job-1 {job.state} at attempt {job.attempt}")


if __name__ == "__main__":
    main()
