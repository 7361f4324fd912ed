"""The child processes of the rolling-deploy test (``test_rolling_deploy.py``).

``python -m test_evolution.proc_builds worker URL PREFIX OWNER VERSION [--reap]``
    a :class:`fsm.work.Worker` of :class:`BuildV1` (``VERSION`` 1) or :class:`BuildV2`
    (2) with a handler for each of its worker states (each sleeps a little, so builds
    are in every state while the deploy goes on); prints ``ready`` once it is about to
    claim, and its counts when it stops.

The children import this module as ``test_evolution.proc_builds`` (``tests/`` on their path).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from fsm import Engine
from fsm.work import Job, Worker
from test_evolution.builds import BuildV1, BuildV2

STEP_S = 0.1
"""How long each handler works: long enough that a deploy lands on builds in flight."""


def step(event: str) -> Callable[[Job], str]:
    def handler(job: Job) -> str:
        time.sleep(STEP_S)
        return event

    return handler


HANDLERS: dict[int, dict[str, Callable[[Job], Any]]] = {
    1: {"building": step("exited"), "finalizing": step("complete")},
    2: {"compiling": step("compiled"), "testing": step("exited"), "finalizing": step("complete")},
}


def main(argv: list[str] | None = None) -> None:
    from stores.sql import SqlStore

    parser = argparse.ArgumentParser(prog="python -m test_evolution.proc_builds")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker")
    for name in ("url", "prefix", "owner"):
        worker.add_argument(name)
    worker.add_argument("version", type=int, choices=[1, 2])
    worker.add_argument("--reap", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store = SqlStore(args.url, table_prefix=args.prefix, create=False, busy_timeout=10.0)
    lifecycle = BuildV1 if args.version == 1 else BuildV2
    engine = Engine(lifecycle, store, owner=args.owner)
    running = Worker(
        engine, HANDLERS[args.version], concurrency=4, poll_interval=timedelta(milliseconds=50), reap=args.reap
    )
    print("ready", flush=True)
    stats = running.run()
    print(f"stopped: claimed {stats.claimed}, failed {stats.failed}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
