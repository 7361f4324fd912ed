"""The worker: a small runtime that claims work and runs a handler per state.

Apps that run their own loop use ``engine.claim``, ``engine.keep`` and ``engine.run``
directly; apps that want a runtime write handlers::

    def run_agent(job: Job) -> str:
        job.progress({"phase": "agent"})
        return "exited"                      # the outcome event, fired under the lease

    def run_gates(job: Job) -> str:
        for gate in GATES:
            job.run(gate, lambda key, gate=gate: call_gate(gate, key))  # recorded once
        return "complete"

    worker = Worker(engine, {"running": run_agent, "finalizing": run_gates}, concurrency=4)
    worker.run()                             # until SIGTERM or worker.stop()

Each claimed entity runs on a pool thread under a lease keeper.  A handler returns the
event to fire (or ``(event, data)``, or ``None`` when it fired itself); if the entity
then sits in another state with a handler, that handler runs next under the same lease
(``running -> finalizing``).  A handler that raises is logged with the entity id and the
entity is failed (the state's ``fail`` event, if the lifecycle lets the worker fire it),
or its lease is released for another worker; a handler never kills the worker.  A
handler whose lease is lost is told at its next ``job.run`` / ``job.fire`` (``Fenced``)
and simply stops.

``stop()`` (or SIGTERM under ``run()``) stops claiming, lets running handlers finish
within ``grace``, then releases the leases still held, so another worker can claim
them at once instead of waiting for the reaper.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from fsm.errors import ConfigError, Fenced, FsmError
from fsm.records import Actor, Snapshot
from fsm.work.keeper import HeldLease, LeaseKeeper
from fsm.work.report import COMPLETED, FAILED, FENCED, RELEASED, report

if TYPE_CHECKING:
    from fsm.engine import Engine, FireResult
    from fsm.table import CompiledTable

log = logging.getLogger("fsm.worker")

M = TypeVar("M", bound=BaseModel)

DEFAULT_CONCURRENCY = 4
DEFAULT_POLL_INTERVAL = timedelta(seconds=1)
DEFAULT_GRACE = timedelta(seconds=30)

Outcome = str | tuple[str, Mapping[str, Any]] | None
Handler = Callable[["Job"], Outcome]


def check_worker(
    table: CompiledTable,
    kind: str,
    handlers: Mapping[str, Any],
    concurrency: object,
    poll_interval: object,
    grace: object,
) -> None:
    """Refuse a worker's configuration with every problem named (both faces' worker)."""
    problems = []
    unknown = sorted(set(handlers) - set(table.leaves))
    if unknown:
        problems.append(f"no such leaf state of {kind}: {', '.join(unknown)}")
    finals = sorted(set(handlers) & table.finals)
    if finals:
        problems.append(f"final states have no work to do: {', '.join(finals)}")
    if not all(callable(h) for h in handlers.values()):
        problems.append("every handler must be callable")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
        problems.append(f"concurrency must be an integer from 1 to 1024, not {concurrency!r}")
    for name, value in (("poll_interval", poll_interval), ("grace", grace)):
        if not isinstance(value, timedelta) or value < timedelta() or value > timedelta(days=1):
            problems.append(f"{name} must be a timedelta from 0 to 1 day, not {value!r}")
    if problems:
        raise ConfigError("invalid worker: " + "; ".join(problems), problems=problems)


def parse_outcome(outcome: Outcome) -> tuple[str, Mapping[str, Any] | None]:
    """A handler's outcome as ``(event, data)``."""
    return (outcome, None) if isinstance(outcome, str) else outcome  # type: ignore[return-value]


class HeldEntity:
    """What every handler's job shares, on both faces: the entity it works on and its held
    lease (the sync :class:`Job` and ``fsm.aio``'s ``AsyncJob`` add the engine calls)."""

    def __init__(self, snapshot: Snapshot, held: HeldLease) -> None:
        self.snapshot = snapshot
        self.held = held

    @property
    def id(self) -> str:
        return self.snapshot.id

    @property
    def state(self) -> str:
        return self.snapshot.state

    @property
    def data(self) -> dict[str, Any]:
        return self.snapshot.data

    @property
    def lost(self) -> bool:
        """True once the lease is lost: a long handler should check it between steps."""
        return self.held.lost

    def progress(self, details: Any) -> None:
        """Progress details for the next renewal; the next owner reads them."""
        self.held.progress(details)


class Job(HeldEntity):
    """What a handler gets: the entity, its held lease, and the ledger bound to both."""

    def __init__(self, engine: Engine, snapshot: Snapshot, held: HeldLease) -> None:
        super().__init__(snapshot, held)
        self.engine = engine

    def run(
        self, key: str, fn: Callable[[str], Any], *, model: type[M] | None = None, retry_failed: bool = True
    ) -> Any:
        """An effect under this job's lease, recorded once (see :meth:`Engine.run`)."""
        return self.engine.run(self.id, key, fn, self.held.check(), model=model, retry_failed=retry_failed)

    def fire(
        self, event: str, *, data: Mapping[str, Any] | None = None, idempotency_key: str | None = None
    ) -> FireResult:
        """Fire ``event`` under this job's lease; the job's snapshot follows."""
        result = self.engine.fire(self.id, event, lease=self.held.check(), data=data, idempotency_key=idempotency_key)
        self.snapshot = result.snapshot
        return result

    def previous_progress(self) -> Any:
        """What the previous holder's keeper recorded, for a resumed job."""
        return self.engine.progress(self.id)


@dataclass
class WorkerStats:
    """Counts of what the worker did, for tests, logs and dashboards."""

    claimed: int = 0
    finished: int = 0
    """Entities left in a state without a handler (usually final)."""
    failed: int = 0
    """Handlers that raised (the entity was failed or released)."""
    fenced: int = 0
    """Handlers stopped because their lease was lost."""
    released: int = 0
    """Leases given back at stop (or after a handler error)."""
    errors: list[str] = field(default_factory=list)


class Worker:
    """Claims entities of one lifecycle and runs a handler per state (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
        grace: timedelta = DEFAULT_GRACE,
        keeper_period: timedelta | None = None,
    ) -> None:
        check_worker(engine.table, engine.kind, handlers, concurrency, poll_interval, grace)
        self.engine = engine
        self.handlers = dict(handlers)
        self.concurrency = concurrency
        self.poll_interval = poll_interval.total_seconds()
        self.grace = grace.total_seconds()
        self.keeper_period = keeper_period
        self.stats = WorkerStats()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"fsm-worker-{engine.kind}")
        self._running: dict[str, tuple[Future[None], LeaseKeeper]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._idle = threading.Condition(self._lock)

    # -- one step ------------------------------------------------------------------------

    def run_once(self) -> int:
        """Claim as many entities as there are free slots and start their handlers.

        Returns how many were claimed; the unit of work and of test."""
        if self._stopping.is_set():
            return 0
        with self._lock:
            free = self.concurrency - len(self._running)
        if free <= 0:
            return 0
        try:
            claimed = self.engine.claim(free)
        except FsmError as err:  # the store is down: try again at the next poll
            log.warning("claim failed: %s", err)
            return 0
        for snap in claimed:
            lease = snap.lease
            assert lease is not None
            keeper = LeaseKeeper(self.engine, lease, period=self.keeper_period)
            held = keeper.start()
            with self._lock:
                self.stats.claimed += 1
                future = self._pool.submit(self._work, Job(self.engine, snap, held), keeper)
                self._running[snap.id] = (future, keeper)
        return len(claimed)

    def _work(self, job: Job, keeper: LeaseKeeper) -> None:
        try:
            self._handle(job)
        finally:
            keeper.stop()
            with self._lock:
                self._running.pop(job.id, None)
                self._idle.notify_all()

    def _handle(self, job: Job) -> None:
        while True:
            handler = self.handlers.get(job.state)
            if handler is None:
                with self._lock:
                    self.stats.finished += 1
                return
            state = job.state
            started = time.perf_counter()
            try:
                event: str | None = None
                outcome = handler(job)
                if outcome is not None:
                    event, data = parse_outcome(outcome)
                    job.fire(event, data=data)
                elif job.state == state:
                    job.snapshot = self.engine.get(job.id)  # the handler fired through other means
                    if job.state == state:
                        report(self.engine.kind, job.held.lease, state, RELEASED, started)
                        self._release(job)
                        return
                report(self.engine.kind, job.held.lease, state, COMPLETED, started, event=event)
            except Fenced as err:
                report(self.engine.kind, job.held.lease, state, FENCED, started, error=err)
                with self._lock:
                    self.stats.fenced += 1
                return
            except Exception as err:
                report(self.engine.kind, job.held.lease, state, FAILED, started, error=err)
                with self._lock:
                    self.stats.failed += 1
                    self.stats.errors.append(f"{job.id}: {type(err).__name__}: {err}")
                self._fail_or_release(job, err)
                return

    def _fail_or_release(self, job: Job, err: Exception) -> None:
        """Fail the entity if its lifecycle lets the worker fire ``fail`` from here, else
        give its lease back for another worker (the reaper's budgets bound the retries)."""
        try:
            if "fail" in self.engine.allowed_events(job.snapshot, Actor.WORKER):
                job.fire("fail", idempotency_key=f"worker-fail:{job.held.lease.token}")
                return
        except FsmError as fire_err:
            log.warning("could not fail %s after its handler raised: %s", job.id, fire_err)
        self._release(job)

    def _release(self, job: Job) -> None:
        try:
            self.engine.release_lease(job.held.lease)
            with self._lock:
                self.stats.released += 1
        except FsmError as err:
            log.info("lease of %s not released: %s", job.id, err)

    # -- running and stopping ----------------------------------------------------------

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Claim and work until :meth:`stop` (or SIGTERM/SIGINT when ``install_signals``)."""
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stopping.set())
        try:
            while not self._stopping.is_set():
                claimed = self.run_once()
                if not claimed:
                    self._stopping.wait(self.poll_interval)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        return self.stats

    def stop(self, grace: timedelta | None = None) -> None:
        """Stop claiming, wait up to ``grace`` for running handlers, release the rest.

        Idempotent.  Handlers still running after the grace period keep running on their
        threads, but their leases are released: their next write is refused (``Fenced``).
        """
        self._stopping.set()
        wait = self.grace if grace is None else grace.total_seconds()
        with self._lock:
            self._idle.wait_for(lambda: not self._running, timeout=wait)
            left = list(self._running.items())
        for entity_id, (_, keeper) in left:
            keeper.stop()
            try:
                self.engine.release_lease(keeper.held.lease)
                with self._lock:
                    self.stats.released += 1
                log.info("released %s at stop", entity_id)
            except FsmError as err:
                log.info("lease of %s not released at stop: %s", entity_id, err)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GRACE",
    "DEFAULT_POLL_INTERVAL",
    "Handler",
    "Job",
    "Outcome",
    "Worker",
    "WorkerStats",
    "check_worker",
    "parse_outcome",
]
