"""The child processes of the real-process wait tests (``test_wait_processes.py``).

``python -m test_waits.proc_handlers worker URL PREFIX DIR OWNER MODE [--reap]``
    a :class:`fsm.work.Worker` over :class:`JobLifecycle` (``hold``: :class:`QuickJob`)
    whose ``running`` handler is the mode's (``sleep``, ``wait``, ``hold``) and whose
    ``finalizing`` handler returns ``complete``; prints ``ready`` once it is about to claim.
``python -m test_waits.proc_handlers send URL PREFIX PLAN OUT``
    sends each message of the JSON plan ``[[entity_id, payload, key], ...]`` with
    :meth:`Engine.send` (a key listed twice is sent twice) and writes what each call
    returned to ``OUT`` (JSON, written whole).

The handlers write one JSON line per execution of a ``job.run`` function into
``DIR/events-PID.log`` with one ``os.write`` each (a SIGKILL loses nothing written before
it): ``{"what": "before" | "after" | "blocked", "id", "pid", "token", "at", ...}``, ``at``
the store's clock (the clock the wake times are set and judged by), read as this
machine's clock plus an offset measured once at start-up: a function that blocks must not
hold one of the worker's handler connections (a store call inside it would take one).

The children import this module as ``test_waits.proc_handlers`` (``tests/`` on their path);
the test imports it relatively: the same lifecycles, the same rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fsm import Engine, JobLifecycle
from fsm.work import Job, Worker
from stores import Store

SLEEP_S = 2.0
"""``job.sleep`` of the ``sleep`` mode: long enough to SIGKILL the worker while every job
sleeps, short enough for a real-time test."""
HOLD_SLEEP_S = 1.0
"""``job.sleep`` of the ``hold`` mode, after the step the first worker died in."""
MESSAGE = "approval"
WAIT_TIMEOUT_S = 30.0
"""The ``wait`` mode's timeout: far beyond the test's own deadline (no wait should time out)."""
HOLD_FILE = "hold"
"""While ``DIR/hold`` exists, a ``hold`` handler blocks (holding its lease) at its point."""


class QuickJob(JobLifecycle):
    """The same rows as :class:`JobLifecycle`; a lease TTL of a second, so the reaper finds a
    dead holder's job within a short test."""

    policy = JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=1))


def blocks_inside_before(entity_id: str) -> bool:
    """``hold`` mode: the jobs (every other one) that block inside the ``before`` function,
    before it is recorded; the others block after it is recorded, before the sleep."""
    return int(entity_id.rsplit("-", 1)[1]) % 2 == 0


class Events:
    """This process's event lines, one ``os.write`` each."""

    def __init__(self, directory: Path, store: Store) -> None:
        self.fd = os.open(directory / f"events-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.directory = directory
        # the store's clock minus ours, our clock read *after* the store's: an estimate no
        # later than the store's time, so a check that nothing ran early errs towards failing
        store_now = store.now()
        self.offset: timedelta = store_now - datetime.now(UTC)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def write(self, what: str, job: Job, **extra: Any) -> None:
        line = {
            "what": what,
            "id": job.id,
            "pid": os.getpid(),
            "token": job.held.lease.token,
            "at": self.now().isoformat(),
            **extra,
        }
        os.write(self.fd, (json.dumps(line) + "\n").encode())

    def hold(self, job: Job, where: str) -> None:
        """Block while the hold file exists (the keeper renews the lease meanwhile)."""
        if (self.directory / HOLD_FILE).exists():
            self.write("blocked", job, where=where)
            while (self.directory / HOLD_FILE).exists():
                time.sleep(0.02)


def handlers(mode: str, events: Events) -> dict[str, Callable[[Job], Any]]:
    def effect(job: Job, what: str, **extra: Any) -> Callable[[str], Any]:
        def run(key: str) -> Any:
            events.write(what, job, **extra)
            return {"token": job.held.lease.token, "pid": os.getpid(), "key": key}

        return run

    def sleeper(job: Job) -> str:
        job.run("before", effect(job, "before"))
        job.sleep(SLEEP_S)
        job.run("after", effect(job, "after"))
        return "exited"

    def waiter(job: Job) -> str:
        job.run("before", effect(job, "before"))
        payload = job.wait_for(MESSAGE, timeout=WAIT_TIMEOUT_S)
        job.run("after", effect(job, "after", payload=payload))
        return "exited"

    def holder(job: Job) -> str:
        def before(key: str) -> Any:
            result = effect(job, "before")(key)
            if blocks_inside_before(job.id):
                events.hold(job, "inside before")  # the worker dies here: nothing recorded
            return result

        job.run("before", before)
        if not blocks_inside_before(job.id):
            events.hold(job, "after before")  # the worker dies here: "before" recorded
        job.sleep(HOLD_SLEEP_S)
        job.run("after", effect(job, "after"))
        return "exited"

    running = {"sleep": sleeper, "wait": waiter, "hold": holder}[mode]
    return {"running": running, "finalizing": lambda job: "complete"}


def worker_main(args: argparse.Namespace) -> None:
    from stores.sql import SqlStore

    store = SqlStore(args.url, table_prefix=args.prefix, create=False, busy_timeout=10.0)
    lifecycle = QuickJob if args.mode == "hold" else JobLifecycle
    engine = Engine(lifecycle, store, owner=args.owner)
    worker = Worker(
        engine,
        handlers(args.mode, Events(Path(args.dir), store)),
        concurrency=16,
        poll_interval=timedelta(milliseconds=50),
        reap=args.reap,
    )
    print("ready", flush=True)
    stats = worker.run()
    print(f"stopped: claimed {stats.claimed}, parked {stats.parked}, failed {stats.failed}", flush=True)
    store.close()


def send_main(args: argparse.Namespace) -> None:
    from stores.sql import SqlStore

    store = SqlStore(args.url, table_prefix=args.prefix, create=False, busy_timeout=10.0)
    engine = Engine(JobLifecycle, store, owner="sender")
    results = [
        [entity_id, key, engine.send(entity_id, MESSAGE, payload, idempotency_key=key)]
        for entity_id, payload, key in json.loads(Path(args.plan).read_text())
    ]
    Path(args.out + ".tmp").write_text(json.dumps(results))
    Path(args.out + ".tmp").rename(args.out)
    store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m test_waits.proc_handlers")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker")
    for name in ("url", "prefix", "dir", "owner"):
        worker.add_argument(name)
    worker.add_argument("mode", choices=["sleep", "wait", "hold"])
    worker.add_argument("--reap", action="store_true")
    send = commands.add_parser("send")
    for name in ("url", "prefix", "plan", "out"):
        send.add_argument(name)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    (worker_main if args.command == "worker" else send_main)(args)


if __name__ == "__main__":
    main()
