"""The processes the fault suite starts, kills, pauses and respawns.

``python -m tests.faults.proc worker URL DIR INDEX --ttl S --effects N --waits F ...``
    an :class:`fsm.Worker` over :class:`JobLifecycle` with handlers ``running -> exited``
    and ``finalizing -> N ledger effects, then complete``.  A fraction ``F`` of the jobs
    (chosen by id: :func:`parks`) park on the way: half of them ``job.wait_for`` a message
    (:data:`MESSAGE`, which the runner sends) in ``running``, half ``job.sleep`` a short
    random time in ``finalizing`` after the first effect (a resume replays it).
``python -m tests.faults.proc reaper URL DIR INDEX --ttl S --interval S``
    a :class:`fsm.reaping.Reaper` ticking on its thread until SIGTERM.

Both write what the checks need into ``DIR`` with one unbuffered ``os.write`` per line
(a SIGKILL loses nothing written before it), in files of their own (``*-PID.log``):

- ``claim  t entity token state``  a handler chain started under a new lease;
- ``end    t entity token how``    it ended (``done``, ``lost``: fenced, ``error``);
- ``ack    t entity seq event``    ``fire()`` returned: the transition is committed;
- ``effect t entity key token``    an effect function ran (executions counted from outside);
- ``parked t entity token step``   ``job.sleep``/``job.wait_for`` parked the job (``end`` follows,
  how ``parked``): the lease is back in the store, the handler stopped;
- ``got    t entity token payload``  ``job.wait_for`` returned (the payload as JSON; at every
  replay too: a recorded wait returns its recorded message);
- ``leaving t entity token until``  the handler is about to make a call that may end its hold
  (the ``complete`` fire, a wait, a sleep), its lease not lost; ``until`` is when that lease
  lapses at the latest (``job.held.deadline`` on the wall clock).  The hold runs from
  ``claim`` to the earlier of the two, inside the lease, which the per-key limit check
  relies on: a handler that ran on past its lease (its keeper stuck in an outage, the
  process paused) holds no slot in the store's eyes, and writes no ``leaving``.

With ``--per-key N`` the worker keeps ``Limits(per_key=N)`` (the runner gives every job a
concurrency key).

A store that is down (``StoreUnavailable``) is retried, never fatal: the worker's claim
loop and the reaper's tick already log and go on; the handlers here retry their own
store calls while their lease lasts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from fsm import Engine, JobLifecycle, Limits, Policy
from fsm.errors import Fenced, StoreUnavailable
from fsm.work import Job, Parked, Worker

T = TypeVar("T")

STORE_RETRY_S = 0.2
MESSAGE = "go"
"""The message a waiting job waits for; its payload is :func:`payload_for` the job."""
SLEEP_S = (0.1, 1.5)
"""A sleeping job's sleep, drawn once (a replay reads the recorded wake time back)."""
WAIT_TIMEOUT_S = 60.0
"""A backstop only: the runner sends every message within seconds (a timeout is a problem)."""
SLEEP, WAIT = "sleep", "wait"


def parks(entity_id: str, fraction: float) -> str | None:
    """How the job parks, the same in every process (by its id): ``"wait"`` for a message
    in ``running``, ``"sleep"`` in ``finalizing``, or ``None`` (a fraction ``1 - fraction``)."""
    draw = zlib.crc32(entity_id.encode()) % 10_000
    if draw >= fraction * 10_000:
        return None
    return WAIT if draw % 2 else SLEEP


def payload_for(entity_id: str) -> dict[str, str]:
    return {"for": entity_id}


def policy(ttl: float) -> Policy:
    """Short leases, and budgets large enough that chaos alone never fails a job."""
    return Policy(
        lease_ttl=timedelta(seconds=ttl),
        renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1)},
        max_attempts=1000,
        max_reclaims=1000,
    )


class Log:
    """One process's event lines, appended with one ``os.write`` each."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *fields: object) -> None:
        os.write(self.fd, ("\t".join(str(f) for f in (fields[0], f"{time.time():.6f}", *fields[1:])) + "\n").encode())


def open_store(url: str) -> Any:
    """The runner made the tables; a process (re)started while the server is down waits for it."""
    from stores.sql import SqlStore

    deadline = time.monotonic() + 120
    while True:
        try:
            return SqlStore(url, create=False, busy_timeout=10.0)
        except StoreUnavailable as err:
            if time.monotonic() > deadline:
                raise
            logging.getLogger("faults").warning("cannot open the store yet, retrying: %s", err)
            time.sleep(STORE_RETRY_S)


def retrying(job: Job, step: Callable[[], T], what: str) -> T:
    """``step()``, retried while the store is unavailable and the lease is not known lost."""
    while True:
        try:
            return step()
        except StoreUnavailable as err:
            if job.lost:
                job.held.check()  # raises the fencing error the keeper recorded
            logging.getLogger("faults").warning("%s of %s: store unavailable, retrying: %s", what, job.id, err)
            time.sleep(STORE_RETRY_S)


class Handlers:
    def __init__(self, log: Log, effects: int, effect_s: float, run_s: float, waits: float = 0.0) -> None:
        self.log = log
        self.effects = effects
        self.effect_s = effect_s
        self.run_s = run_s
        self.waits = waits
        self.pid = os.getpid()
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def _claimed(self, job: Job) -> None:
        token = job.held.lease.token
        with self._lock:
            if self._seen.get(job.id) == token:
                return
            self._seen[job.id] = token
        self.log.write("claim", job.id, token, job.state)

    def _leaving(self, job: Job) -> None:
        held = job.held
        if held.lost:
            return
        until = time.time() + (held.deadline - time.monotonic())
        self.log.write("leaving", job.id, held.lease.token, f"{until:.6f}")

    def _guarded(self, job: Job, body: Callable[[], None]) -> None:
        token = job.held.lease.token
        try:
            body()
        except Parked as parked:  # not an error: the job waits, lease-less, in the store
            self.log.write("parked", job.id, token, parked.step)
            self.log.write("end", job.id, token, "parked")
            raise
        except Fenced:
            self.log.write("end", job.id, token, "lost")
            raise
        except BaseException:
            self.log.write("end", job.id, token, "error")
            raise

    def _fire(self, job: Job, event: str) -> None:
        token = job.held.lease.token
        result = retrying(job, lambda: job.fire(event, idempotency_key=f"{event}:{token}"), event)
        self.log.write("ack", job.id, result.record.seq, result.record.event)

    def running(self, job: Job) -> None:
        self._claimed(job)

        def body() -> None:
            if parks(job.id, self.waits) == WAIT:
                self._leaving(job)
                payload = retrying(job, lambda: job.wait_for(MESSAGE, timeout=WAIT_TIMEOUT_S, default=None), "wait")
                self.log.write("got", job.id, job.held.lease.token, json.dumps(payload, sort_keys=True))
            time.sleep(random.uniform(0, 2 * self.run_s))  # the agent's work
            self._fire(job, "exited")

        self._guarded(job, body)

    def finalizing(self, job: Job) -> None:
        self._claimed(job)
        token = job.held.lease.token

        def effect(key: str) -> Callable[[str], Any]:
            def run(idempotency_key: str) -> Any:
                self.log.write("effect", job.id, key, token)
                time.sleep(random.uniform(0, 2 * self.effect_s))
                return {"token": token, "pid": self.pid, "key": idempotency_key}

            return run

        def body() -> None:
            for i in range(self.effects):
                key = f"effect-{i}"
                retrying(job, lambda key=key: job.run(key, effect(key)), key)  # type: ignore[misc]
                if i == 0 and parks(job.id, self.waits) == SLEEP:
                    self._leaving(job)
                    retrying(job, lambda: job.sleep(random.uniform(*SLEEP_S)), "sleep")
            self._leaving(job)
            self._fire(job, "complete")
            self.log.write("end", job.id, token, "done")

        self._guarded(job, body)


def worker_main(args: argparse.Namespace) -> None:
    store = open_store(args.url)
    engine = Engine(JobLifecycle, store, policy=policy(args.ttl), owner=f"worker{args.index}:{os.getpid()}")
    log = Log(Path(args.dir) / f"worker-{os.getpid()}.log")
    handlers = Handlers(log, args.effects, args.effect_ms / 1000, args.run_ms / 1000, args.waits)
    worker = Worker(
        engine,
        {"running": handlers.running, "finalizing": handlers.finalizing},
        concurrency=args.concurrency,
        poll_interval=timedelta(seconds=args.poll),
        grace=timedelta(seconds=2),
        limits=Limits(per_key=args.per_key) if args.per_key else None,
    )
    log.write("start", args.index)
    stats = worker.run()
    log.write("stop", args.index, stats.claimed, stats.fenced, stats.failed)


def reaper_main(args: argparse.Namespace) -> None:
    from fsm.reaping import Reaper

    store = open_store(args.url)
    reaper = Reaper(
        store,
        {JobLifecycle: policy(args.ttl)},
        {"interval": timedelta(seconds=args.interval), "batch_size": 200},
        owner=f"reaper{args.index}:{os.getpid()}",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    reaper.start()
    stop.wait()
    reaper.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.proc")
    parser.add_argument("role", choices=["worker", "reaper"])
    parser.add_argument("url")
    parser.add_argument("dir")
    parser.add_argument("index", type=int)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=0.3)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--effects", type=int, default=3)
    parser.add_argument("--effect-ms", type=float, default=20)
    parser.add_argument("--run-ms", type=float, default=20)
    parser.add_argument("--waits", type=float, default=0.0, help="the fraction of jobs that park (see parks())")
    parser.add_argument("--per-key", type=int, default=0, help="Limits(per_key=N) on the workers (0: none)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format=f"%(asctime)s {args.role}{args.index} %(name)s: %(message)s"
    )
    (worker_main if args.role == "worker" else reaper_main)(args)


if __name__ == "__main__":
    main()
