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

Each claimed entity runs on a pool thread, its lease renewed by the worker's one keeper
(:class:`~fsm.work.keepers.LeaseKeepers`: one thread, one renewal transaction a round).
On PostgreSQL the pool threads share at most ``handler_connections`` of the store's
connections: each call through a handler's ``job`` takes one and gives it back when it
returns, an effect's ``fn`` running with none
(:class:`stores.sql.connections.ConnectionLender`), so a slot costs a thread, not a
connection.
A handler returns the event to fire (or ``(event, data)``, or ``None`` when it fired
itself); if the entity then sits in another state with a handler, that handler runs next
under the same lease (``running -> finalizing``); the job's slot is free once its last
outcome is handed to the completer, so the next claim does not wait for that commit.  A
handler that raises is logged with the entity id and the entity is failed (the state's
``fail`` event, if the lifecycle lets the worker fire it), or its lease is released for
another worker; a handler never kills the worker.  A handler whose lease is lost is told
at its next ``job.run`` / ``job.fire`` (``Fenced``) and simply stops; one whose entity
was moved on without it (an operator's ``cancel``) sees ``job.lost`` within about a
second, the keeper's fence check (:data:`fsm.work.keepers.DEFAULT_FENCE_CHECK`).  A
store outage met by a handler is retried without spending an attempt, never failed.
The worker claims only into states it has a handler for.

The loop never sleeps while it is full: it waits for a slot to free, and when the queue
is drained for :meth:`Worker.wake` (which a ``NOTIFY`` listener calls) or the poll
interval, whichever comes first.  Its logic is :class:`fsm.work.loop.WorkerCore`'s,
shared with the asyncio face.

``Worker(..., reap=True)`` also runs the reaper, under the leader lease, while ``run()``
runs: a deployment of workers alone recovers from dead holders without a ``fsm reaper``
process (see :func:`worker_reaper`).

``stop()`` (or SIGTERM under ``run()``) stops claiming, lets running handlers finish
within ``grace``, then releases the leases still held, so another worker can claim
them at once instead of waiting for the reaper; a handler still running then sees
``job.lost`` with ``job.held.reason == "worker stopping"``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from fsm.coordination import Limits, check_limits
from fsm.engine.many import Fired
from fsm.errors import ConfigError, Fenced, FsmError, LeaseLost, StoreUnavailable
from fsm.observe.serving import release_worker_metrics, worker_metrics
from fsm.records import HistoryRecord, Snapshot
from fsm.work.children import (
    DEFAULT_POLL,
    FAILED_STATES,
    ChildResult,
    check_child_data,
    check_child_key,
    check_wait_args,
    child_engine,
    start_child,
    wait_children,
    wake_parent,
)
from fsm.work.completer import BatchCompleter
from fsm.work.keeper import HeldLease
from fsm.work.keepers import LeaseKeepers
from fsm.work.loop import (
    DEFAULT_CLAIM_GATHER,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_HANDLER_CONNECTIONS,
    DEFAULT_POLL_INTERVAL,
    STOPPING,
    Call,
    CoreFace,
    Driver,
    Outcome,
    WorkerCore,
    WorkerStats,
    check_worker,
    drive,
    parse_outcome,
)
from fsm.work.planning import plan_for_work
from fsm.work.pool import HandlerPool
from fsm.work.waits import MISSING, check_duration_arg, check_message_name, steps_of, wait_result
from fsm.work.wakeups import due_in, subscribe_wakeups

if TYPE_CHECKING:
    from fsm.engine import Engine, FireResult
    from fsm.reaping import Reaper, ReaperConfig
    from stores.base import Store
    from stores.sql.connections import ConnectionLender

log = logging.getLogger("fsm.worker")

M = TypeVar("M", bound=BaseModel)

Handler = Callable[["Job"], Outcome]


WORKER_REAP_INTERVAL = timedelta(seconds=10)
"""The longest interval of a ``reap=True`` worker's reaper: a standby's tick is one leader
lease attempt, and the leader's a few index probes."""


def worker_reaper(
    engine: Engine, reap: bool | ReaperConfig | Mapping[str, object], *, store: Store | None = None
) -> Reaper:
    """The reaper a ``Worker(..., reap=...)`` runs: the engine's lifecycle and policy (one
    source of truth with the claim window), under the leader lease of that lifecycle, so
    that of many workers one reaps it at a time and a standby takes over when the leader
    dies (reapers of other lifecycles lead their own: leadership is per lifecycle).  Each
    tick it leads is recorded in the store's tick log (``fsm inspect`` shows it).

    ``reap=True``: a tick every lease TTL, at most :data:`WORKER_REAP_INTERVAL` (a dead
    holder's entity is reaped within a TTL and an interval of its last renewal, and when
    the leading worker dies another leads within three intervals: the leader lease lives
    three intervals, so the schedules and delayed fires it served move on within about
    half a minute); a :class:`~fsm.reaping.ReaperConfig` (or its mapping) sets the
    interval and batch size, ``leader`` is always on.  ``store``: the store the reaper's
    thread uses, when not the engine's (the asyncio worker's: a sync twin of its store)."""
    from fsm.reaping import Reaper, ReaperConfig  # the reaper's layer, imported when asked for
    from fsm.reaping.service import validated_config

    if isinstance(reap, bool):
        config = ReaperConfig(interval=min(engine.policy.lease_ttl, WORKER_REAP_INTERVAL), leader=True)
    elif isinstance(reap, ReaperConfig | Mapping):
        config = validated_config(reap).model_copy(update={"leader": True})
    else:
        raise ConfigError(f"reap must be a bool or a ReaperConfig, not {type(reap).__name__}")
    from fsm.reaping.ticklog import TickLog

    on = engine.store if store is None else store
    reaper = Reaper(on, {engine.lifecycle: engine.policy}, config, clock=engine.clock, owner=engine.owner)
    reaper.tick_log = TickLog(on)  # its ticks show in ``fsm inspect`` as the CLI reaper's do
    return reaper


def alone(idempotency_key: str | None, reason: str | None, error: object, run_after: timedelta | None) -> bool:
    """Whether a job's fire needs a write of its own (an idempotency key, a retry's reason,
    record and backoff), rather than a place in the completer's next batch (both faces)."""
    return idempotency_key is not None or reason is not None or error is not None or run_after is not None


def stopping_error(held: HeldLease) -> LeaseLost:
    """What a handler still running after the stop's grace is told (``job.held.error``)."""
    lease = held.lease
    return LeaseLost(lease.entity_id, expected_token=lease.token, found_token=None, owner=lease.owner, detail=STOPPING)


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
        """True once the lease is lost (taken over, expired, or the worker stopping past
        its grace): a long handler should check it between steps; ``held.reason`` says why."""
        return self.held.lost


class Job(HeldEntity):
    """What a handler gets: the entity, its held lease, and the ledger bound to both.

    Under a worker with a :class:`~stores.sql.connections.ConnectionLender` (PostgreSQL),
    each of these calls holds one of the handlers' connections only while it runs, and an
    effect's ``fn`` runs holding none: a handler waiting on a slow external call keeps no
    other handler from the store."""

    def __init__(
        self,
        engine: Engine,
        snapshot: Snapshot,
        held: HeldLease,
        completer: BatchCompleter | None = None,
        lender: ConnectionLender | None = None,
    ) -> None:
        super().__init__(snapshot, held)
        self.engine = engine
        self.completer = completer
        self.lender = lender

    def _given_back(self) -> None:
        """After a call: this thread's connection back to the handlers' set (if it took one)."""
        if self.lender is not None:
            self.lender.give_back()

    def run(
        self, key: str, fn: Callable[[str], Any], *, model: type[M] | None = None, retry_failed: bool = True
    ) -> Any:
        """An effect under this job's lease, recorded once (see :meth:`Engine.run`).

        ``fn`` runs holding none of the handlers' connections; a store call that ``fn``
        makes itself takes one and keeps it until ``run`` returns, so an effect that blocks
        after such a call holds a connection all that time."""
        effect = fn
        lender = self.lender
        if lender is not None:

            def effect(idempotency_key: str) -> Any:
                lender.give_back()  # the ledger's reads are done: the effect runs holding no connection
                return fn(idempotency_key)

        try:
            # the job's snapshot is this engine's entity: no read of the row before the ledger's
            lease = self.held.check()
            # under a running worker the ledger's asks (the holder and record read before the
            # effect, the record after) go in the completer's batches with other handlers'
            completer = self.completer
            ledger = completer if completer is not None and completer.batches_steps else None
            return self.engine._run_held(
                self.id, key, effect, lease, model=model, retry_failed=retry_failed, ledger=ledger
            )
        finally:
            self._given_back()

    def fire(
        self,
        event: str,
        *,
        data: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        error: Mapping[str, Any] | None = None,
        run_after: timedelta | None = None,
    ) -> FireResult:
        """Fire ``event`` under this job's lease, from the snapshot the job holds; the
        job's snapshot follows.  Under a running worker the write shares a transaction with
        other handlers' outcomes (:mod:`fsm.work.completer`), still fenced by this job's
        own version and token; it returns once committed.  ``reason``, ``error`` and
        ``run_after`` are :meth:`Engine.fire`'s (a retry's record and backoff): such a fire
        is written alone."""
        lease = self.held.check()
        try:
            if self.completer is not None and not alone(idempotency_key, reason, error, run_after):
                result = self.completer.fire(self.snapshot, event, lease=lease, data=data)
            else:
                result = self.engine.fire(
                    self.snapshot,
                    event,
                    lease=lease,
                    data=data,
                    idempotency_key=idempotency_key,
                    reason=reason,
                    error=error,
                    run_after=run_after,
                )
        finally:
            self._given_back()
        self.snapshot = result.snapshot
        return result

    def history(self) -> list[HistoryRecord]:
        """The entity's history (the worker counts a state's attempts in it)."""
        try:
            return self.engine.history(self.id)
        finally:
            self._given_back()

    def previous_progress(self) -> Any:
        """What the previous holder's keeper recorded, for a resumed job."""
        try:
            return self.engine.progress(self.id)
        finally:
            self._given_back()

    def progress(self, details: Any) -> None:
        """Record progress details now, in their own write under this job's lease, so they
        survive a crash right after; the next owner reads them (``previous_progress``).
        A fenced holder gets ``Fenced``; a store that cannot be reached leaves them to the
        keeper's next renewal (within a third of the TTL)."""
        try:
            self.engine.record_progress(self.held.check(), details)
        except Fenced:
            raise
        except StoreUnavailable:
            self.held.progress(details)
        finally:
            self._given_back()

    def refresh(self) -> Snapshot:
        """Read the entity again (after the handler fired through other means)."""
        try:
            self.snapshot = self.engine.get(self.id)
        finally:
            self._given_back()
        return self.snapshot

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the lease is lost first (the worker waits out a
        store outage with it)."""
        self.held.wait_lost(seconds)

    def sleep(self, duration: timedelta | float) -> None:
        """A durable sleep: return once ``duration`` (a timedelta or seconds) has passed since
        the handler first reached this step.  Until then the entity is parked (state kept,
        lease given back, due at the wake time) and :class:`~fsm.errors.Parked` stops the
        handler, freeing its slot; a claim resumes it when due and the handler replays
        (see :mod:`fsm.work.waits`: code between recorded steps must be deterministic)."""
        delay = check_duration_arg("duration", duration)
        assert delay is not None
        try:
            steps_of(self, self.engine).sleep(delay)
        finally:
            self._given_back()

    def wait_for(self, name: str, *, timeout: timedelta | float | None = None, default: Any = MISSING) -> Any:
        """A durable wait for message ``name`` (sent with :meth:`Engine.send`): its payload,
        whether it was sent before this step or during it.  Until one comes the entity is
        parked as by :meth:`sleep`, and a message wakes it at once.  After ``timeout``:
        ``default`` if given, else :class:`~fsm.errors.WaitTimedOut` (the same at every
        replay: the outcome is recorded)."""
        message = check_message_name(name)
        limit = check_duration_arg("timeout", timeout, optional=True)
        steps = steps_of(self, self.engine)
        try:
            found, payload = steps.wait_for(message, limit)
        finally:
            self._given_back()
        return wait_result(self, steps, found, payload, default, message)

    def start_child(
        self,
        key: str,
        *,
        data: Mapping[str, Any] | None = None,
        lifecycle: Any = None,
        priority: int = 0,
        concurrency_key: str | None = None,
    ) -> Snapshot:
        """Start a child entity once per ``key`` (a replay returns the same child): id
        ``{this id}/{key}``, its ``parent_id`` this entity, recorded in the ledger under
        this lease.  ``lifecycle``: the child's lifecycle class or engine (default: this
        one's).  See :mod:`fsm.work.children`."""
        name = check_child_key(key)
        engine = child_engine(self.engine, lifecycle)
        try:
            return start_child(
                steps_of(self, self.engine), self.snapshot, engine, name,
                check_child_data(data), priority, concurrency_key,
            )  # fmt: skip
        finally:
            self._given_back()

    def wait_children(
        self,
        *,
        on_failure: str = "fail",
        failed: Collection[str] = FAILED_STATES,
        poll: timedelta | float = DEFAULT_POLL,
    ) -> list[ChildResult]:
        """A durable wait for every child started so far to be final: their results
        (:class:`~fsm.work.ChildResult`: final state and data), in start order.  Until
        then the entity is parked (no lease, no slot) and :class:`~fsm.errors.Parked` stops
        the handler; a child's end wakes it (and it looks again every ``poll``).
        ``on_failure="fail"``: a child ending in one of ``failed`` raises
        :class:`~fsm.errors.ChildFailed` (never retried); ``"wait"``: wait for all."""
        states, policy = check_wait_args(failed, on_failure)
        every = check_duration_arg("poll", poll)
        assert every is not None
        try:
            return wait_children(steps_of(self, self.engine), states, policy, every)
        finally:
            self._given_back()

    def wake_parent(self) -> None:
        """Wake the parked parent of this entity once it is final (the worker calls it)."""
        try:
            wake_parent(self.engine, self.snapshot)
        finally:
            self._given_back()

    def release(self) -> Snapshot:
        """Give the lease back, so another worker can claim the entity at once."""
        try:
            return self.engine.release_lease(self.held.lease)
        finally:
            self._given_back()


class _Run:
    """A job's steps and where they stand: what a pool thread carries out next (``call``;
    ``None``: the next step of ``driver``).  ``slot``: whether the job still counts
    against the worker's concurrency (a last outcome gives its slot back at hand-over)."""

    __slots__ = ("call", "driver", "job", "slot")

    def __init__(self, job: Job, driver: Driver, call: Call | None = None) -> None:
        self.job = job
        self.driver = driver
        self.call = call
        self.slot = True

    def close(self) -> None:
        """End the steps (a ``finally`` in them runs); idempotent."""
        self.driver.steps.close()


class Worker(CoreFace):
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
        reap: bool | ReaperConfig | Mapping[str, object] = False,
        claim_gather: timedelta = DEFAULT_CLAIM_GATHER,
        metrics_port: int | None = None,
        handler_connections: int = DEFAULT_HANDLER_CONNECTIONS,
        limits: Limits | None = None,
    ) -> None:
        self.core = WorkerCore.of(engine, handlers, concurrency, poll_interval, grace, claim_gather, self.wake)
        self.limits = check_limits(limits)
        """The limits this worker's claims keep instead of the lifecycle's own (``limits=``), or ``None``."""
        kept = self.limits if self.limits is not None else engine.lifecycle.limits
        self.core.limited = kept is not None and kept.counts
        if (
            isinstance(handler_connections, bool)
            or not isinstance(handler_connections, int)
            or not 1 <= handler_connections <= 1000
        ):
            raise ConfigError(f"handler_connections must be an integer from 1 to 1000, not {handler_connections!r}")
        lend = getattr(engine.store, "lend_connections", None)
        # handler threads share a bounded set of the store's connections, each thread's given
        # back between jobs: slots cost threads, not connections (see DEFAULT_HANDLER_CONNECTIONS)
        self.lender: ConnectionLender | None = None if lend is None else lend(handler_connections)
        """The bounded connections the handler threads share (SQL stores), or ``None``."""
        self.engine = engine
        self.keeper_period = keeper_period
        self._pool: HandlerPool[_Run] = HandlerPool(self._work, concurrency, f"fsm-worker-{engine.kind}")
        # one entry per claim, keyed by its HeldLease (not the entity id): a parked entity
        # woken while its last run still winds down is claimed again before that run's
        # ``_done``, and must not take (and leak) that run's entry and slot
        self._running: dict[HeldLease, str] = {}
        # one keeper thread renews every lease this worker holds, one transaction a round
        self.keepers = LeaseKeepers(engine, period=keeper_period)
        # one condition for every wait of the loop: a freed slot, a wake-up, a stop.  An
        # RLock, because SIGTERM's handler runs on the main thread, maybe inside it.
        self._changed = threading.Condition(threading.RLock())
        self._stopping = threading.Event()
        self._woken = False
        self.reaper: Reaper | None = None if reap is False else worker_reaper(engine, reap)
        """The reaper this worker runs under the leader lease (``reap=``), or ``None``."""
        # outcomes of handlers finishing together share one commit; written at once when
        # every running handler waits on it
        self.completer = BatchCompleter(engine, all_waiting=lambda n: n >= len(self._running))
        self.completer.after_batch = self._slots_freed
        self.metrics = worker_metrics(metrics_port)
        """This process's Prometheus endpoint (``metrics_port=``, :mod:`fsm.observe.serving`), or ``None``."""

    # -- one step ------------------------------------------------------------------------

    def run_once(self) -> int:
        """Claim as many entities as there are free slots and start their handlers.

        Returns how many were claimed; the unit of work and of test."""
        with self._changed:
            self._woken = False  # a wake-up from here on is for the next claim
            free = self.core.free()
        if self._stopping.is_set() or free <= 0:
            return 0
        asked_at = time.monotonic()  # each lease's TTL counts from the claim's write
        try:
            claimed = self.engine.claim(free, into=self.core.claim_into, limits=self.limits)
        except FsmError as err:  # the store is down: try again at the next poll
            log.warning("claim failed: %s", err)
            return 0
        if claimed:
            self._start(claimed, asked_at)
        return len(claimed)

    def _start(self, claimed: list[Snapshot], asked_at: float) -> None:
        """Keep the claimed leases and start a handler for each (one lock for the claim)."""
        leases = [snap.lease for snap in claimed]
        helds = self.keepers.keep_many(leases, asked_at=asked_at)  # type: ignore[arg-type]  # a claim's rows are held
        core = self.core
        core.count("claimed", n=len(claimed))
        with self._changed:
            core.running += len(claimed)
            running = self._running
            for snap, held in zip(claimed, helds, strict=True):
                running[held] = snap.id
        engine, completer, lender, handle = self.engine, self.completer, self.lender, core.handle
        for snap, held in zip(claimed, helds, strict=True):
            job = Job(engine, snap, held, completer, lender)
            self._submit(_Run(job, Driver(handle(job))))

    def _submit(self, run: _Run) -> None:
        try:
            self._pool.submit(run)
        except RuntimeError:  # stop() shut the pool down while this job was on its way
            run.close()
            self._work_refused(run.job.id, run.job.held)

    def _forget(self, entity_id: str, held: HeldLease) -> None:
        """A claimed job whose handler never ran: out of the keeper and the slot count."""
        self.keepers.release(held)
        with self._changed:
            if self._running.pop(held, None) is not None:
                self.core.running -= 1
            self._changed.notify_all()

    def _work_refused(self, entity_id: str, held: HeldLease) -> None:
        self._forget(entity_id, held)
        try:
            self.engine.release_lease(held.lease)
        except FsmError as err:
            log.info("lease of %s not released: %s", entity_id, err)

    # -- a job's steps: on a pool thread, handed to the completer at each outcome ---------

    def _work(self, run: _Run) -> None:
        """Carry out ``run``'s steps on this pool thread until the job is done or its
        handler returned an event: that outcome goes to the completer with
        :meth:`_resumed` as its continuation, and the thread is free at once (it would
        otherwise sleep until the batch commits, then be woken for a little bookkeeping:
        a thread switch per outcome under one interpreter lock)."""
        lender = self.lender
        if lender is None:
            self._steps(run)
            return
        lender.join()
        try:
            self._steps(run)
        finally:
            lender.give_back()  # this thread goes back to the pool: so does its connection

    def _steps(self, run: _Run) -> None:
        driver, call = run.driver, run.call
        try:
            while True:
                if call is None:
                    call = driver.next()
                    if call is None:
                        break
                if call.outcome and self._hand_over(run, call):
                    return  # the completer's thread resumes the steps after the commit
                try:
                    driver.value = call.fn(*call.args, **call.kwargs)
                except Exception as err:
                    driver.error = err
                call = None
        except BaseException:
            log.exception("the steps of %s failed", run.job.id)
        self._done(run, notify=True)

    def _hand_over(self, run: _Run, call: Call) -> bool:
        """Queue an outcome step in the completer's next batch; ``False``: carry it out
        here (the completer is not running, or the lease is lost: ``job.fire`` says so).

        An outcome after which no handler can run (every branch of the event leads to a
        state without one: ``complete``, ``fail``) gives the job's slot back at once, as
        River's producer does when it hands a job to its completer: the next claim then
        runs while this batch commits, on another connection, instead of after it.  The
        job stays held (its lease kept, ``stop`` waits for it) until its commit; the
        completer's backlog stays bounded, since a new job's first outcome keeps its slot
        until committed."""
        job = run.job
        if job.held.lost:
            return False
        (event,) = call.args
        # given back before it is queued: the batch may commit (and the job be done) first
        gives_back = run.slot and self.core.ends(job.state, event)
        if gives_back:
            self._give_back(run)
        queued = self.completer.fire_then(
            job.snapshot,
            event,
            lease=job.held.lease,
            data=call.kwargs.get("data"),
            then=lambda result: self._resumed(run, result),
        )
        if gives_back and not queued:
            self._take_back(run)
        return queued

    def _give_back(self, run: _Run) -> None:
        with self._changed:
            run.slot = False
            self.core.running -= 1
            self._changed.notify_all()

    def _take_back(self, run: _Run) -> None:
        with self._changed:
            run.slot = True
            self.core.running += 1

    def _resumed(self, run: _Run, result: Fired | BaseException) -> None:
        """On the completer's thread, after the batch holding ``run``'s outcome committed:
        the answer goes back into the steps (as ``job.fire`` would return or raise it),
        which run on until their next call; that call, a handler's above all, goes back to
        a pool thread, and a job with none left is done here."""
        driver = run.driver
        if isinstance(result, Exception):
            driver.error = result
        elif isinstance(result, BaseException):  # pragma: no cover - a batch answers with Exceptions
            raise result
        else:
            run.job.snapshot = result.snapshot
            driver.value = result
        try:
            call = driver.next()
        except BaseException:
            log.exception("the steps of %s failed", run.job.id)
            call = None
        if call is None:
            self._done(run, notify=False)  # the loop hears of every slot the batch freed at once
        else:
            if not run.slot:  # the outcome was refused or failed: its handling needs a slot again
                self._take_back(run)
            self._submit(_Run(run.job, driver, call))

    def _done(self, run: _Run, *, notify: bool) -> None:
        run.close()
        self.keepers.release(run.job.held)
        with self._changed:
            if self._running.pop(run.job.held, None) is not None and run.slot:
                self.core.running -= 1
            if notify:
                self._changed.notify_all()
        self.completer.wake()  # one fewer handler to wait for before a batch is written

    def _slots_freed(self) -> None:
        """After a batch's continuations ran: one notification for the slots they freed."""
        with self._changed:
            self._changed.notify_all()

    # -- the loop's waits (WorkerCore.loop calls them) ---------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_slot(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._stopping.is_set() or self.core.free() > 0)

    def wait_slot_more(self, need: int, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._stopping.is_set() or self.core.free() >= need, timeout)

    def next_due(self) -> float | None:
        return due_in(self.engine.store, self.core.kind, self.core.claimable)

    def wait_work(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._stopping.is_set() or self._woken, timeout)

    def wake(self) -> None:
        """Claim now instead of at the next poll: work became claimable (a ``NOTIFY``, a
        create in this process).  Thread-safe; a wake-up while full waits for a slot."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    # -- running and stopping ----------------------------------------------------------

    @property
    def running(self) -> int:
        with self._changed:
            return self.core.running

    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Claim and work until :meth:`stop` (or SIGTERM/SIGINT when ``install_signals``)."""
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stop_claiming())
        if self.reaper is not None:
            self.reaper.start()
        unsubscribe = subscribe_wakeups(self.engine.store, self.engine.kind, self.wake)
        self.completer.start()
        plan_for_work(self.engine.store)  # this thread claims
        try:
            drive(self.core.loop(self))
        finally:
            unsubscribe()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
            self.completer.stop()
        return self.stats

    def _stop_claiming(self) -> None:
        with self._changed:
            self._stopping.set()
            self._changed.notify_all()

    def stop(self, grace: timedelta | None = None) -> None:
        """Stop claiming, wait up to ``grace`` for running handlers, release the rest.

        Idempotent.  Handlers still running after the grace period keep running on their
        threads, but are told (``job.lost``, reason ``"worker stopping"``) and their leases
        are released: their next write is refused (``Fenced``).
        """
        self._stop_claiming()
        wait = self.grace if grace is None else grace.total_seconds()
        with self._changed:
            self._changed.wait_for(lambda: not self._running, timeout=wait)
            left = [(entity_id, held) for held, entity_id in self._running.items()]
        for entity_id, held in left:
            if held.lost:
                continue  # told already (a second stop), or lost on its own
            held._lose(stopping_error(held), STOPPING)
            self.keepers.release(held)
            try:
                self.engine.release_lease(held.lease)
                self.core.count("released")
                log.info("released %s at stop", entity_id)
            except FsmError as err:
                log.info("lease of %s not released at stop: %s", entity_id, err)
        self.keepers.stop()
        if self.lender is not None:
            self.lender.close()  # a stopped worker keeps no idle connection
        for run in self._pool.shutdown():  # waiting for a thread: their leases were released above
            run.close()
            self._forget(run.job.id, run.job.held)
        if self.reaper is not None:
            self.reaper.stop()  # resigns the leader lease: another worker's reaper takes over
        self.metrics = release_worker_metrics(self.metrics)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GRACE",
    "DEFAULT_HANDLER_CONNECTIONS",
    "DEFAULT_POLL_INTERVAL",
    "Handler",
    "HeldEntity",
    "Job",
    "Outcome",
    "Worker",
    "WorkerStats",
    "check_worker",
    "parse_outcome",
    "stopping_error",
    "worker_reaper",
]
