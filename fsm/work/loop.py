"""The worker's one logic, free of threads and asyncio: both faces drive it.

A worker does two things, each written once here as a generator of :class:`Call` steps:

- :meth:`WorkerCore.loop` claims while there is room, up to every free slot in one
  claim.  When every slot is busy it waits for a slot to free (never a poll interval: a
  full worker must not sleep past its handlers), then up to ``claim_gather`` for more
  slots to free, so that handlers finishing together (they do: their outcomes share a
  commit) are replaced by one claim instead of one claim each.  When the queue had less
  than the room, it waits for a wake-up (:meth:`~fsm.work.Worker.wake`, a ``NOTIFY``),
  the next due time of a row waiting out its backoff (read off the claim index), or the
  poll interval, whichever comes first; a stop ends every wait at once.
- :meth:`WorkerCore.handle` runs one claimed entity's handlers state after state and
  fires their outcomes; a handler error becomes the policy's retry, a failure with
  reason ``error``, or a released lease; a fenced handler stops.

A step names a callable and its arguments.  The thread face (:class:`fsm.work.Worker`)
calls it (:func:`drive`); the asyncio face (:class:`fsm.aio.AsyncWorker`) calls and
awaits it (:func:`drive_async`), its job methods being coroutines.  What is raised by a
step is thrown back into the generator at the ``yield``, so ``try``/``except`` around a
step reads as it would around a call.  This is psycopg 3's shape (protocol generators
under sync or async waiters), so a rule changed here changes both faces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Generator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from fsm.engine.work import claim_plan
from fsm.errors import ConfigError, Fenced, FsmError, StoreUnavailable
from fsm.policy import Policy, RetryPolicy
from fsm.records import Actor, Snapshot, error_record
from fsm.table import CompiledTable
from fsm.work.report import COMPLETED, FAILED, FENCED, PARKED, RELEASED, RETRY, report
from fsm.work.waits import Parked

log = logging.getLogger("fsm.worker")

DEFAULT_CONCURRENCY = 32
"""Handlers at once, and so the largest claim and outcome batch.  With one process the
worker and its database mostly take turns: a claim, then the batch of ``exited``, then the
batch of ``complete`` beside the next claim, each about a millisecond whatever its size, so
the rate grows with the batch.  Drain of no-op jobs against pgqueuer on one PostgreSQL (2
cores): 1 process 0.91x at 16, 1.11x at 24, 1.22x at 32 (client CPU per job 0.113, 0.097,
0.087 ms); 4 processes 0.97x, 1.03x, 1.16x.  A slot costs a thread on the thread face, not
a connection: handler threads share at most :data:`DEFAULT_HANDLER_CONNECTIONS`."""
DEFAULT_HANDLER_CONNECTIONS = 5
"""The most PostgreSQL connections a thread worker's handlers hold at once: each call
through a handler's ``job`` (``job.run``, ``job.progress``, a retry's fire) takes one and
gives it back when it returns, an effect's ``fn`` running with none (a handler's own
engine calls give theirs back when its thread is free).  A handler holds one for a few
milliseconds per call, so 5 serve 32 slots; a handler that waits longer for one (30 s)
meets ``StoreUnavailable``, which the worker retries without spending an attempt.  On
SQLite each thread keeps its own (no server counts them)."""
MAX_WORKER_CONNECTIONS = DEFAULT_HANDLER_CONNECTIONS + 5
"""The most PostgreSQL connections a default thread worker process holds: its handlers'
5, plus one each for the claim loop, the completer, the lease keeper, the ``LISTEN`` and
(``reap=True``) the reaper.  Four such processes hold 40 of PostgreSQL's default 100."""
DEFAULT_POLL_INTERVAL = timedelta(seconds=1)
"""The fallback when no wake-up comes (a lost ``NOTIFY``, a store without notices, work
another process made claimable without telling): wake-ups and due times do the rest."""
DEFAULT_GRACE = timedelta(seconds=30)
"""How long :meth:`stop` lets running handlers finish before their leases are released."""
DEFAULT_CLAIM_GATHER = timedelta(milliseconds=2)
"""After a slot frees on a full worker, how long the loop waits for more to free before
it claims: the completer's own delay, so a batch that committed together is claimed
again together.  A long handler pays it once per claim, never per job."""
MIN_POLL_INTERVAL = timedelta(milliseconds=5)
"""The shortest poll interval a worker accepts: a drained worker claims once per interval,
and a zero would spin a core."""
MIN_DUE_WAIT = 0.001
LIMITED_WAIT = 0.005
"""Seconds a worker with limits waits after a claim that took less than its room but
something (see :meth:`WorkerCore.limited_wait`)."""
"""The shortest wait for a due time (a row due now but not claimed is another claimer's)."""
OUTAGE_PAUSE = 0.05
"""The first wait before a handler error's record is written again after the store failed
to take it (doubled each time, up to :data:`MAX_OUTAGE_PAUSE`, while the lease is held)."""
MAX_OUTAGE_PAUSE = 2.0
MAX_OUTAGE_RETRIES = 20
"""How many store outages a job waits out in one state without spending attempts (with
the default backoff, about an hour); past them an outage is an attempt like any error."""
TRANSIENT_RETRY = RetryPolicy()
"""The backoff of a store outage met by a handler in a state without a RetryPolicy: the
defaults (an outage is retried whatever the state's policy; it spends no attempt)."""
STOPPING = "worker stopping"
"""``job.held.reason`` of a handler still running when :meth:`Worker.stop`'s grace ran out."""

Outcome = str | tuple[str, Mapping[str, Any]] | None


@dataclass(slots=True)
class Call:
    """One step a face carries out: ``fn(*args, **kwargs)`` (awaited on the asyncio face).

    ``outcome``: the step fires a handler's returned event (``job.fire(event, data=..)``).
    A face may hand such a step to its batch completer and give the thread back, resuming
    the steps once the batch committed (the thread face does: see :class:`fsm.work.Worker`);
    carrying it out as a plain call is always right."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    outcome: bool = False


Steps = Generator[Call, Any, None]


def step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    return Call(fn, args, kwargs)


class Driver:
    """Feeds a generator of steps the outcome of each step (a value, or an exception to
    throw at its ``yield``); the faces' drivers only carry out the steps."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.value: Any = None
        self.error: Exception | None = None

    def next(self) -> Call | None:
        """The next step, or ``None`` once the generator is done."""
        error, self.error = self.error, None
        try:
            return self.steps.throw(error) if error is not None else self.steps.send(self.value)
        except StopIteration:
            return None


def drive(steps: Steps) -> None:
    """Run ``steps`` on this thread, calling each step."""
    driver = Driver(steps)
    try:
        while (call := driver.next()) is not None:
            try:
                driver.value = call.fn(*call.args, **call.kwargs)
            except Exception as err:
                driver.error = err
    finally:
        steps.close()


async def drive_async(steps: Steps) -> None:
    """Run ``steps`` in this task, calling and awaiting each step."""
    driver = Driver(steps)
    try:
        while (call := driver.next()) is not None:
            try:
                driver.value = await call.fn(*call.args, **call.kwargs)
            except Exception as err:
                driver.error = err
    finally:
        steps.close()


class LoopFace(Protocol):
    """What :meth:`WorkerCore.loop` needs of a face (each method may be a coroutine)."""

    @property
    def stopping(self) -> bool: ...

    def run_once(self) -> Any:
        """Claim up to the free slots and start their handlers; how many were claimed."""

    def wait_slot(self) -> Any:
        """Return once a slot is free or the worker stops."""

    def wait_slot_more(self, need: int, timeout: float) -> Any:
        """Return once ``need`` slots are free, the worker stops, or after ``timeout``."""

    def next_due(self) -> Any:
        """Seconds until the next row waiting out its backoff is due, or ``None``."""

    def wait_work(self, timeout: float) -> Any:
        """Return on a wake-up, a stop, or after ``timeout`` seconds."""


class JobFace(Protocol):
    """What :meth:`WorkerCore.handle` needs of a job (each method may be a coroutine)."""

    snapshot: Snapshot

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    def fire(
        self,
        event: str,
        *,
        data: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        error: Mapping[str, Any] | None = None,
        run_after: timedelta | None = None,
    ) -> Any: ...

    def history(self) -> Any: ...

    def refresh(self) -> Any: ...

    def release(self) -> Any: ...

    def wake_parent(self) -> Any: ...

    @property
    def lost(self) -> bool: ...

    def pause(self, seconds: float) -> Any:
        """Wait ``seconds`` (less if the lease is lost first)."""


@dataclass
class WorkerStats:
    """Counts of what the worker did, for tests, logs and dashboards."""

    claimed: int = 0
    finished: int = 0
    """Entities that reached a final state under this worker."""
    failed: int = 0
    """Handlers that raised (the entity was retried, failed or released)."""
    retried: int = 0
    """Handler errors the policy retried (the entity is due again after its backoff)."""
    fenced: int = 0
    """Handlers stopped because their lease was lost."""
    released: int = 0
    """Leases given back at stop (or after a handler error)."""
    parked: int = 0
    """Handlers that parked their entity (a durable sleep or wait): resumed by a later claim."""
    errors: list[str] = field(default_factory=list)


def check_worker(
    table: CompiledTable,
    kind: str,
    handlers: Mapping[str, Any],
    concurrency: object,
    poll_interval: object,
    grace: object,
) -> None:
    """Refuse a worker's configuration with every problem named (both faces' worker).

    The handlers must cover at least one state a claim leaves an entity in (``running``
    of a job, started from ``queued``; ``finalizing``, resumed after a reclaim): the
    worker claims only those (:func:`claim_states`), and a map that covers none would
    claim nothing."""
    problems = []
    if not isinstance(handlers, Mapping):
        problems.append(f"handlers must be a mapping of state name to handler, not {type(handlers).__name__}")
        handlers = {}
    not_names = [repr(k)[:80] for k in handlers if not isinstance(k, str)]
    if not_names:
        problems.append(f"handler keys must be state names (str), not {', '.join(not_names[:5])}")
    names = {k for k in handlers if isinstance(k, str)}
    unknown = sorted(names - set(table.leaves))
    if unknown:
        problems.append(f"no such leaf state of {kind}: {', '.join(u[:80] for u in unknown[:5])}")
    finals = sorted(names & table.finals)
    if finals:
        problems.append(f"final states have no work to do: {', '.join(finals)}")
    if not all(callable(h) for h in handlers.values()):
        problems.append("every handler must be callable")
    if not problems and not claim_states(table, names):
        entries = ", ".join(sorted(claim_states(table, set(table.leaves))))
        problems.append(
            f"no handler for a state a claim leaves an entity in ({entries}): the worker would claim work it cannot do"
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
        problems.append(f"concurrency must be an integer from 1 to 1024, not {concurrency!r}")
    if not isinstance(poll_interval, timedelta) or not MIN_POLL_INTERVAL <= poll_interval <= timedelta(days=1):
        problems.append(f"poll_interval must be a timedelta from 5 ms to 1 day, not {poll_interval!r}")
    if not isinstance(grace, timedelta) or grace < timedelta() or grace > timedelta(days=1):
        problems.append(f"grace must be a timedelta from 0 to 1 day, not {grace!r}")
    if problems:
        raise ConfigError("invalid worker: " + "; ".join(problems), problems=problems)


def claim_states(table: CompiledTable, handled: Collection[str]) -> frozenset[str]:
    """The states a claim leaves an entity in that have a handler: what a worker claims
    into (``Engine.claim(into=...)``).  A state a claim leaves entities in without a
    handler is left to a worker that has one."""
    starts, resumes = claim_plan(table)
    return frozenset(s.target for s in starts if s.target in handled) | frozenset(r for r in resumes if r in handled)


def _nothing() -> None:
    return None


def parse_outcome(outcome: Outcome) -> tuple[str, Mapping[str, Any] | None]:
    """A handler's outcome as ``(event, data)``."""
    return (outcome, None) if isinstance(outcome, str) else outcome  # type: ignore[return-value]


class WorkerCore:
    """A worker's configuration, its counts and its decisions, shared by both faces.

    Thread-safe where the thread face needs it: the counts are changed under a lock (pool
    threads run :meth:`handle` at once)."""

    def __init__(
        self,
        table: CompiledTable,
        kind: str,
        handlers: Mapping[str, Callable[..., Any]],
        *,
        concurrency: int,
        poll_interval: timedelta,
        grace: timedelta,
        policy: Policy | None = None,
        claim_gather: timedelta = DEFAULT_CLAIM_GATHER,
    ) -> None:
        check_worker(table, kind, handlers, concurrency, poll_interval, grace)
        if not isinstance(claim_gather, timedelta) or not timedelta() <= claim_gather <= timedelta(seconds=1):
            problem = f"claim_gather must be a timedelta from 0 to 1 second, not {claim_gather!r}"
            raise ConfigError(f"invalid worker: {problem}", problems=[problem])
        self.policy = policy if policy is not None else Policy()
        self.table = table
        self.kind = kind
        self.handlers = dict(handlers)
        self._ends: dict[tuple[str, str], bool] = {}
        self.concurrency = concurrency
        self.poll_interval = poll_interval.total_seconds()
        self.grace = grace.total_seconds()
        self.claim_gather = claim_gather.total_seconds()
        self.claim_into = claim_states(table, self.handlers)
        """The states this worker claims into (``Engine.claim(into=...)``): those it has a handler for."""
        starts, resumes = claim_plan(table, into=self.claim_into)
        self.claimable = tuple(dict.fromkeys([s.source for s in starts] + list(resumes)))
        """The states a claim takes rows from (where a row waits out its due time)."""
        self.stats = WorkerStats()
        self.running = 0
        """Handlers under way (claimed, not yet done); the faces keep it."""
        self.due_later: Callable[[], None] = _nothing
        """Called when a handler put its entity back with a due time (a retry): the faces
        wake their loop, which reads the next due time again (nothing else announces it)."""
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls,
        engine: Any,
        handlers: Mapping[str, Callable[..., Any]],
        concurrency: int,
        poll_interval: timedelta,
        grace: timedelta,
        claim_gather: timedelta,
        wake: Callable[[], None],
    ) -> WorkerCore:
        """A face's core, for either face's engine (its table, kind and policy); ``wake``
        is the face's: a handler's retry wakes the loop (:attr:`due_later`)."""
        core = cls(
            engine.table,
            engine.kind,
            handlers,
            concurrency=concurrency,
            poll_interval=poll_interval,
            grace=grace,
            policy=engine.policy,
            claim_gather=claim_gather,
        )
        core.due_later = wake
        return core

    def free(self) -> int:
        return self.concurrency - self.running

    def count(self, name: str, error: str | None = None, *, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)
            if error is not None:
                self.stats.errors.append(error)

    def ends(self, state: str, event: str) -> bool:
        """Whether no handler can run after ``event`` fires from ``state``: every branch of
        it leads to a state without a handler (a final state, mostly).  Asked at every
        outcome, and fixed for a worker (its table and handlers do not change): kept."""
        found = self._ends.get((state, event))
        if found is None:
            branches = self.table.branches_for(state, event)
            found = self._ends[(state, event)] = bool(branches) and all(b.target not in self.handlers for b in branches)
        return found

    def may_fire(self, state: str, event: str) -> bool:
        """Whether the worker may fire ``event`` from ``state`` at all (guards aside)."""
        return (event in self.table.events or self.table.knows(event)) and any(
            b.actor is Actor.WORKER for b in self.table.branches_for(state, event)
        )

    # -- the claim loop -------------------------------------------------------------------

    def loop(self, face: LoopFace) -> Steps:
        """Claim while there is room, wait for a slot when full, for work when drained."""
        while not face.stopping:
            free = self.free()
            if free <= 0:
                yield step(face.wait_slot)
                if self.claim_gather and self.free() < self.concurrency:
                    # handlers finishing together free their slots within a moment
                    yield step(face.wait_slot_more, self.concurrency, self.claim_gather)
                continue
            claimed = yield step(face.run_once)
            if claimed < free:  # the queue had less than the room (or the claim failed)
                due = yield step(face.next_due)
                wait = self.work_wait(due)
                if self.limited:  # a limit may have held due rows back: look again soon
                    wait = min(wait, self.limited_wait(claimed))
                yield step(face.wait_work, wait)

    limited = False
    """The worker's claims keep limits (its own or its lifecycle's): a short claim may have
    left due rows behind a limit, whose slots free in any process, with no wake-up."""
    _limited_wait = LIMITED_WAIT

    def limited_wait(self, claimed: int) -> float:
        """How long a limited worker waits after a short claim: :data:`LIMITED_WAIT` after
        a claim that took something, doubling after each that took nothing (up to the poll
        interval), so a limit that binds is polled, never spun on."""
        if claimed:
            self._limited_wait = LIMITED_WAIT
        else:
            self._limited_wait = min(self.poll_interval, self._limited_wait * 2)
        return self._limited_wait

    def work_wait(self, due: float | None) -> float:
        """How long a drained worker waits for work: the poll interval, or less when a row
        becomes due (a retry's backoff ends) before it."""
        if due is None:
            return self.poll_interval
        return min(self.poll_interval, max(MIN_DUE_WAIT, due))

    # -- one claimed entity ------------------------------------------------------------

    def handle(self, job: JobFace) -> Steps:
        """Run the handler of each state the entity reaches, under the claim's lease."""
        while True:
            handler = self.handlers.get(job.state)
            if handler is None:
                if job.state in self.table.finals:
                    self.count("finished")
                    if job.snapshot.parent_id is not None:  # a child that ended: its parked parent looks now
                        yield step(job.wake_parent)
                    return
                # a state another worker handles (a finalizer pool): give the lease back, so
                # that worker claims it now instead of after the reaper's reclaim
                lease = job.snapshot.lease
                log.info(
                    "released %s %s in %s: this worker has no handler for it",
                    self.kind,
                    job.id,
                    job.state,
                    extra={
                        "entity": job.id,
                        "kind": self.kind,
                        "owner": lease.owner if lease else None,
                        "token": job.snapshot.lease_token,
                        "state": job.state,
                        "outcome": "released",
                    },
                )
                yield from self.release(job)
                return
            state = job.state
            started = time.perf_counter()  # report() logs each outcome and sends ``handled``
            try:
                event: str | None = None
                outcome = yield step(handler, job)
                if outcome is not None:
                    event, data = parse_outcome(outcome)
                    yield Call(job.fire, (event,), {"data": data}, outcome=True)
                elif job.state == state:
                    yield step(job.refresh)  # the handler may have fired through other means
                    if job.state == state:
                        report(self.kind, job, state, RELEASED, started)
                        yield from self.release(job)
                        return
                report(self.kind, job, state, COMPLETED, started, event=event)
            except Parked as parked:  # the lease is back in the store; a claim resumes it when due
                report(self.kind, job, state, PARKED, started, error=parked)
                self.count("parked")
                return
            except Fenced as err:
                report(self.kind, job, state, FENCED, started, error=err)
                self.count("fenced")
                return
            except Exception as err:
                self.count("failed", f"{job.id}: {type(err).__name__}: {err}")
                retried = yield from self.after_error(job, err)
                report(self.kind, job, state, RETRY if retried else FAILED, started, error=err)
                if job.snapshot.parent_id is not None and job.state in self.table.finals:
                    yield step(job.wake_parent)
                return

    def after_error(self, job: JobFace, err: Exception) -> Generator[Call, Any, bool]:
        """A handler error is an attempt, recorded with its error in the history row of the
        transition it causes: ``retry`` (due again after the backoff) while the state's
        :class:`~fsm.policy.RetryPolicy` retries it and attempts remain, else ``fail`` with
        reason ``error``; a lifecycle that lets the worker fire neither gets the lease back
        (the reaper's budgets bound what follows).  Returns whether it retried.

        The store's own failure (``StoreUnavailable``: down, out of connections, SQLite's
        write lock held past the busy timeout) is the infrastructure's, not the job's: it
        is retried with backoff and spends no attempt (its error is recorded with
        ``"transient": true``, which the attempt count skips), and it does not fail the
        job, up to :data:`MAX_OUTAGE_RETRIES` outages in the state (then it is an attempt
        like any error: a store error that never heals ends the job).  When recording the
        outcome meets the same outage, the write is tried again with backoff while the
        lease is held; once the lease is lost, the reaper's rules take over (a requeue
        while attempts remain)."""
        state, token = job.state, job.snapshot.lease_token
        outage = isinstance(err, StoreUnavailable)
        retry = self.policy.retry_for(state)
        if outage and retry is None:
            retry = TRANSIENT_RETRY
        can_retry = retry is not None and self.may_fire(state, "retry")
        attempt, outages = 1, 0
        if can_retry:
            try:  # the n-th error in this state: each retry out of it recorded one before
                history = yield step(job.history)
                for h in history:
                    if h.event == "retry" and h.source == state:
                        if h.error is not None and h.error.get("transient"):
                            outages += 1
                        else:
                            attempt += 1
            except FsmError as read_err:
                log.warning("could not count the attempts of %s: %s", job.id, read_err)
        # an outage longer than MAX_OUTAGE_RETRIES retries (about an hour of backoff) is
        # no longer the infrastructure's: a store error that never heals (missing tables,
        # a permission) counts as an attempt like any other, so the job ends
        transient = outage and outages < MAX_OUTAGE_RETRIES
        error = error_record(err, attempt=attempt)
        if transient:
            error["transient"] = True
        if can_retry and retry is not None and (transient or (retry.retries(err) and attempt < retry.max_attempts)):
            delay = retry.backoff(outages + 1 if transient else attempt)
            done = yield from self.record(
                job, "retry", error=error, run_after=delay, idempotency_key=f"worker-retry:{token}"
            )
            if done:
                self.count("retried")
                self.due_later()  # a drained loop sleeping past the backoff reads it again
                return True
            if done is None:
                return False
        if not transient and self.may_fire(state, "fail"):
            done = yield from self.record(
                job, "fail", reason="error", error=error, idempotency_key=f"worker-fail:{token}"
            )
            if done is not False:
                return False
        yield from self.release(job)
        return False

    def record(self, job: JobFace, event: str, **kwargs: Any) -> Generator[Call, Any, bool | None]:
        """Fire a handler error's ``event`` (``retry``, ``fail``); an outage of the store is
        waited out with backoff while the lease is held.  ``True``: recorded; ``None``: the
        job is not this worker's any more (fenced, or the lease lapsed during the outage),
        told with one WARNING; ``False``: refused for another reason (logged)."""
        pause = OUTAGE_PAUSE
        while True:
            try:
                yield step(job.fire, event, **kwargs)
                return True
            except Fenced as fenced:
                log.warning("%s of %s not recorded: %s", event, job.id, fenced)
                return None
            except StoreUnavailable as outage:
                if job.lost:
                    log.warning("%s of %s not recorded: the lease lapsed during an outage (%s)", event, job.id, outage)
                    return None
                log.info("%s of %s waits out an outage of the store (%.2f s): %s", event, job.id, pause, outage)
                yield step(job.pause, pause)
                pause = min(pause * 2, MAX_OUTAGE_PAUSE)
            except FsmError as fire_err:
                log.warning("could not %s %s after its handler raised: %s", event, job.id, fire_err)
                return False

    def release(self, job: JobFace) -> Steps:
        try:
            yield step(job.release)
            self.count("released")
        except FsmError as err:
            log.info("lease of %s not released: %s", job.id, err)


class CoreFace:
    """What both faces read off their :class:`WorkerCore` (settings and counts)."""

    core: WorkerCore

    @property
    def stats(self) -> WorkerStats:
        return self.core.stats

    @property
    def handlers(self) -> dict[str, Callable[..., Any]]:
        return self.core.handlers

    @property
    def concurrency(self) -> int:
        return self.core.concurrency

    @property
    def poll_interval(self) -> float:
        return self.core.poll_interval

    @property
    def grace(self) -> float:
        return self.core.grace

    @property
    def claim_gather(self) -> float:
        return self.core.claim_gather


__all__ = [
    "DEFAULT_CLAIM_GATHER",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GRACE",
    "DEFAULT_HANDLER_CONNECTIONS",
    "DEFAULT_POLL_INTERVAL",
    "MAX_OUTAGE_RETRIES",
    "MAX_WORKER_CONNECTIONS",
    "MIN_POLL_INTERVAL",
    "STOPPING",
    "Call",
    "CoreFace",
    "Driver",
    "JobFace",
    "LoopFace",
    "Outcome",
    "Steps",
    "WorkerCore",
    "WorkerStats",
    "check_worker",
    "claim_states",
    "drive",
    "drive_async",
    "parse_outcome",
    "step",
]
