"""The child processes of the real-process children tests (``test_children_processes.py``).

``python -m test_coordination.proc_children worker URL PREFIX DIR OWNER ROLE [--concurrency N] [--reap]``
    a :class:`fsm.work.Worker` over :class:`KidParent` (``ROLE`` ``parent``) or
    :class:`KidChild` (``child``); prints ``ready`` once it is about to claim, and its
    stats when SIGTERM stops it.

A parent's ``running`` handler starts ``data["children"]`` children of :class:`KidChild`
(keys ``c-00``, ``c-01``...: their order is their start order) with ``job.start_child``,
waits for them (``data["on_failure"]``, ``data["poll"]``) and exits with their results
(``[id, state, exit_code, failed]`` each) as ``data["results"]``.  A child's ``running``
handler sleeps ``data["sleep"]`` seconds and exits with ``n`` as its exit code, or fails
(``data["fail"]``).  Every ``finalizing`` handler completes.

Each handler run appends one JSON line to ``DIR/runs-PID.log`` with one ``os.write`` (a
SIGKILL loses nothing written before it): ``{"role", "id", "pid", "token"}``.

The children import this module as ``test_coordination.proc_children`` (``tests/`` on their
path); the test imports it relatively: the same lifecycles, the same rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from fsm import Engine, JobLifecycle
from fsm.work import Job, Worker

CHILDREN = 50


class KidParent(JobLifecycle):
    """A parent job; a lease of two seconds, so a dead holder is found within a short test."""

    kind = "kidparent"
    policy = JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=2))


class KidChild(JobLifecycle):
    """A child job (another lifecycle: its workers are processes of their own)."""

    kind = "kidchild"
    policy = JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=2))


def child_key(n: int) -> str:
    return f"c-{n:02d}"


class Runs:
    """This process's run lines, one ``os.write`` each."""

    def __init__(self, directory: Path, role: str) -> None:
        self.fd = os.open(directory / f"runs-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.role = role

    def write(self, job: Job) -> None:
        line = {"role": self.role, "id": job.id, "pid": os.getpid(), "token": job.held.lease.token}
        os.write(self.fd, (json.dumps(line) + "\n").encode())


def parent_handlers(runs: Runs) -> dict[str, Callable[[Job], Any]]:
    def running(job: Job) -> tuple[str, dict[str, Any]]:
        runs.write(job)
        fail_at = job.data.get("fail_at")
        for n in range(job.data["children"]):
            data: dict[str, Any] = {"n": n, "sleep": job.data.get("child_sleep", 0.0)}
            if n == fail_at:
                data["fail"] = True
            job.start_child(child_key(n), data=data, lifecycle=KidChild)
        results = job.wait_children(on_failure=job.data.get("on_failure", "fail"), poll=job.data.get("poll", 5.0))
        return "exited", {"results": [[r.id, r.state, r.data.get("exit_code"), r.failed] for r in results]}

    return {"running": running, "finalizing": lambda job: "complete"}


def child_handlers(runs: Runs) -> dict[str, Callable[[Job], Any]]:
    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        runs.write(job)
        time.sleep(job.data.get("sleep", 0.0))
        if job.data.get("fail"):
            return "fail"
        return "exited", {"exit_code": job.data["n"]}

    return {"running": running, "finalizing": lambda job: "complete"}


def worker_main(args: argparse.Namespace) -> None:
    from stores.sql import SqlStore

    store = SqlStore(args.url, table_prefix=args.prefix, create=False, busy_timeout=10.0)
    runs = Runs(Path(args.dir), args.role)
    if args.role == "parent":
        engine = Engine(KidParent, store, owner=args.owner)
        handlers = parent_handlers(runs)
    else:
        engine = Engine(KidChild, store, owner=args.owner)
        handlers = child_handlers(runs)
    worker = Worker(
        engine,
        handlers,
        concurrency=args.concurrency,
        poll_interval=timedelta(milliseconds=50),
        reap=args.reap,
    )
    print("ready", flush=True)
    stats = worker.run()
    print(f"stopped: claimed {stats.claimed}, parked {stats.parked}, failed {stats.failed}", flush=True)
    store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="proc_children")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker")
    for name in ("url", "prefix", "dir", "owner"):
        worker.add_argument(name)
    worker.add_argument("role", choices=["parent", "child"])
    worker.add_argument("--concurrency", type=int, default=8)
    worker.add_argument("--reap", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    worker_main(args)


if __name__ == "__main__":
    main()
