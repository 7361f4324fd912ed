"""The asyncio worker: claims work and runs a coroutine handler per state.

::

    async def run_agent(job: AsyncJob) -> str:
        await job.run("agent", call_agent)        # recorded once; call_agent may be async
        return "exited"

    worker = AsyncWorker(engine, {"running": run_agent, "finalizing": run_gates}, concurrency=8)
    await worker.run()                            # until worker.stop()

The same logic as :class:`fsm.work.Worker`: both drive :class:`fsm.work.loop.WorkerCore`
(its claim loop, its handling of outcomes, errors and fencing), this face awaiting each
step.  Each claimed entity runs as a task; one task renews every lease the worker holds
(:class:`fsm.work.keepers.AsyncLeaseKeepers`, one transaction a round) and handlers'
outcomes share transactions (:class:`fsm.work.completer.AsyncBatchCompleter`), as on the
thread face.  At most ``concurrency`` handlers run at once; a full worker waits for a
slot, a drained one for :meth:`AsyncWorker.wake`, a due time, or the poll interval.
:meth:`AsyncWorker.stop` stops claiming, lets running handlers finish within ``grace``,
then tells the rest (``job.lost``, reason ``"worker stopping"``), cancels them and releases
their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from fsm.aio.engine import AsyncEngine
from fsm.coordination import Limits, check_limits
from fsm.engine import FireResult
from fsm.errors import ConfigError, FsmError, StoreUnavailable
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
from fsm.work.completer import AsyncBatchCompleter
from fsm.work.keeper import HeldLease
from fsm.work.keepers import AsyncLeaseKeepers
from fsm.work.loop import (
    DEFAULT_CLAIM_GATHER,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_POLL_INTERVAL,
    STOPPING,
    CoreFace,
    Outcome,
    WorkerCore,
    WorkerStats,
    drive_async,
)
from fsm.work.waits import MISSING, check_duration_arg, check_message_name, steps_of, wait_result
from fsm.work.wakeups import due_in_async, subscribe_wakeups
from fsm.work.worker import HeldEntity, alone, stopping_error, worker_reaper

if TYPE_CHECKING:
    from fsm.reaping import Reaper, ReaperConfig

log = logging.getLogger("fsm.worker")

M = TypeVar("M", bound=BaseModel)


class AsyncJob(HeldEntity):
    """What an async handler gets: the entity, its held lease, the ledger bound to both."""

    def __init__(
        self,
        engine: AsyncEngine,
        snapshot: Snapshot,
        held: HeldLease,
        completer: AsyncBatchCompleter | None = None,
    ) -> None:
        super().__init__(snapshot, held)
        self.engine = engine
        self.completer = completer
        self._writes: set[asyncio.Task[None]] = set()  # progress writes under way (kept alive)

    async def run(
        self, key: str, fn: Callable[[str], Any], *, model: type[M] | None = None, retry_failed: bool = True
    ) -> Any:
        """An effect under this job's lease, recorded once (see :meth:`AsyncEngine.run`).
        Under a running worker the ledger's asks (the holder and record read before the
        effect, the record after) go in the completer's batches with other handlers'."""
        lease = self.held.check()
        completer = self.completer
        if completer is not None and completer.batches_steps:
            return await self.engine._run_held(
                self.id, key, fn, lease, model=model, retry_failed=retry_failed, ledger=completer
            )
        return await self.engine.run(self.id, key, fn, lease, model=model, retry_failed=retry_failed)

    async def fire(
        self,
        event: str,
        *,
        data: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        error: Mapping[str, Any] | None = None,
        run_after: timedelta | None = None,
    ) -> FireResult:
        """:meth:`fsm.work.Job.fire`, awaited: from the held snapshot, in the completer's
        next batch when no ``idempotency_key``, ``reason``, ``error`` or ``run_after`` asks
        for a write of its own; returns once committed."""
        lease = self.held.check()
        if self.completer is not None and not alone(idempotency_key, reason, error, run_after):
            result = await self.completer.fire(self.snapshot, event, lease=lease, data=data)
        else:
            result = await self.engine.fire(
                self.snapshot,
                event,
                lease=lease,
                data=data,
                idempotency_key=idempotency_key,
                reason=reason,
                error=error,
                run_after=run_after,
            )
        self.snapshot = result.snapshot
        return result

    async def history(self) -> list[HistoryRecord]:
        """The entity's history (the worker counts a state's attempts in it)."""
        return await self.engine.history(self.id)

    async def previous_progress(self) -> Any:
        """What the previous holder's keeper recorded, for a resumed job."""
        return await self.engine.progress(self.id)

    def progress(self, details: Any) -> asyncio.Task[None]:
        """Record progress details now: a task writes them at once under this job's lease
        (``await job.progress(...)`` waits for the commit and raises ``Fenced`` for a fenced
        holder); a store that cannot be reached leaves them to the keeper's next renewal."""
        task = asyncio.get_running_loop().create_task(self._record_progress(details))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _record_progress(self, details: Any) -> None:
        try:
            await self.engine.record_progress(self.held.check(), details)
        except StoreUnavailable:
            self.held.progress(details)

    async def refresh(self) -> Snapshot:
        """Read the entity again (after the handler fired through other means)."""
        self.snapshot = await self.engine.get(self.id)
        return self.snapshot

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the lease is lost first (the worker waits out a
        store outage with it; the lease is looked at every 50 ms)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.held.lost and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(left, 0.05))

    async def release(self) -> Snapshot:
        """Give the lease back, so another worker can claim the entity at once."""
        return await self.engine.release_lease(self.held.lease)

    async def sleep(self, duration: timedelta | float) -> None:
        """:meth:`fsm.work.Job.sleep`, awaited: a durable sleep that parks the entity."""
        delay = check_duration_arg("duration", duration)
        await self.engine._call(steps_of(self, self.engine.sync).sleep, delay)

    async def wait_for(self, name: str, *, timeout: timedelta | float | None = None, default: Any = MISSING) -> Any:
        """:meth:`fsm.work.Job.wait_for`, awaited: a durable wait for message ``name``."""
        message = check_message_name(name)
        limit = check_duration_arg("timeout", timeout, optional=True)
        steps = steps_of(self, self.engine.sync)
        found, payload = await self.engine._call(steps.wait_for, message, limit)
        return wait_result(self, steps, found, payload, default, message)

    async def start_child(
        self,
        key: str,
        *,
        data: Mapping[str, Any] | None = None,
        lifecycle: Any = None,
        priority: int = 0,
        concurrency_key: str | None = None,
    ) -> Snapshot:
        """:meth:`fsm.work.Job.start_child`, awaited."""
        name = check_child_key(key)
        engine = child_engine(self.engine.sync, lifecycle)
        steps = steps_of(self, self.engine.sync)
        payload = check_child_data(data)
        made: Snapshot = await self.engine._call(
            start_child, steps, self.snapshot, engine, name, payload, priority, concurrency_key
        )
        return made

    async def wait_children(
        self,
        *,
        on_failure: str = "fail",
        failed: Collection[str] = FAILED_STATES,
        poll: timedelta | float = DEFAULT_POLL,
    ) -> list[ChildResult]:
        """:meth:`fsm.work.Job.wait_children`, awaited: a durable wait for the children."""
        states, policy = check_wait_args(failed, on_failure)
        every = check_duration_arg("poll", poll)
        assert every is not None
        steps = steps_of(self, self.engine.sync)
        found: list[ChildResult] = await self.engine._call(wait_children, steps, states, policy, every)
        return found

    async def wake_parent(self) -> None:
        """Wake the parked parent of this entity once it is final (the worker calls it)."""
        await self.engine._call(wake_parent, self.engine.sync, self.snapshot)


AsyncHandler = Callable[[AsyncJob], Awaitable[Outcome]]


class AsyncWorker(CoreFace):
    """Claims entities of one lifecycle and runs a coroutine handler per state."""

    def __init__(
        self,
        engine: AsyncEngine,
        handlers: Mapping[str, AsyncHandler],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
        grace: timedelta = DEFAULT_GRACE,
        keeper_period: timedelta | None = None,
        reap: bool | ReaperConfig | Mapping[str, object] = False,
        claim_gather: timedelta = DEFAULT_CLAIM_GATHER,
        metrics_port: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.core = WorkerCore.of(engine, handlers, concurrency, poll_interval, grace, claim_gather, self.wake)
        self.limits = check_limits(limits)
        """The limits this worker's claims keep instead of the lifecycle's own, or ``None``."""
        kept = self.limits if self.limits is not None else engine.lifecycle.limits
        self.core.limited = kept is not None and kept.counts
        self.engine = engine
        self.keeper_period = keeper_period
        # one task renews every lease this worker holds, one transaction a round
        self.keepers = AsyncLeaseKeepers(engine, period=keeper_period)
        # outcomes of handlers finishing together share one commit; written at once when
        # every running handler waits on it
        self.completer = AsyncBatchCompleter(engine, all_waiting=lambda n: n >= self.core.running)
        self._running: dict[HeldLease, tuple[str, asyncio.Task[None]]] = {}  # one entry per claim
        self._stopping = False
        self._changed = asyncio.Event()  # a slot freed, a wake-up or a stop: the loop looks again
        self._woken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reaper: Reaper | None = None
        """The reaper this worker runs under the leader lease (``reap=``), or ``None``: a
        :class:`~fsm.reaping.Reaper` on its own thread, over a synchronous twin of the
        async store (``store.sync_store()``: the same tables, connections of its own)."""
        self._reaper_store: Any = None
        self._stop_task: asyncio.Future[None] | None = None
        if reap is not False:
            twin = getattr(engine.store, "sync_store", None)
            if twin is None:
                raise ConfigError(f"reap= needs an async store with a sync twin (sync_store()), not {engine.store!r}")
            self._reaper_store = twin()
            self.reaper = worker_reaper(engine.sync, reap, store=self._reaper_store)
        self.metrics = worker_metrics(metrics_port)
        """This process's Prometheus endpoint (``metrics_port=``, :mod:`fsm.observe.serving`), or ``None``."""

    @property
    def running(self) -> int:
        return len(self._running)

    async def run_once(self) -> int:
        """Claim as many entities as there are free slots and start their handlers.

        Returns how many were claimed; the unit of work and of test."""
        self._loop = asyncio.get_running_loop()
        self._woken = False  # a wake-up from here on is for the next claim
        free = self.core.free()
        if self._stopping or free <= 0:
            return 0
        asked_at = time.monotonic()  # each lease's TTL counts from the claim's write
        try:
            claimed = await self.engine.claim(free, into=self.core.claim_into, limits=self.limits)
        except FsmError as err:  # the store is down: try again at the next poll
            log.warning("claim failed: %s", err)
            return 0
        for snap in claimed:
            lease = snap.lease
            assert lease is not None
            held = self.keepers.keep(lease, asked_at=asked_at)
            self.core.count("claimed")
            self.core.running += 1
            job = AsyncJob(self.engine, snap, held, self.completer)
            task = asyncio.create_task(drive_async(self.core.handle(job)), name=f"fsm-worker-{snap.id}")
            self._running[held] = (snap.id, task)
            task.add_done_callback(functools.partial(self._done, held))
        return len(claimed)

    def _done(self, held: HeldLease, _: object) -> None:
        self.keepers.release(held)
        if self._running.pop(held, None) is not None:
            self.core.running -= 1
        self._changed.set()
        self.completer.wake()  # one fewer handler to wait for before a batch is written

    # -- the loop's waits (WorkerCore.loop awaits them) --------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def wait_slot(self) -> None:
        while not self._stopping and self.core.free() <= 0:
            self._changed.clear()
            await self._changed.wait()

    async def wait_slot_more(self, need: int, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not self._stopping and self.core.free() < need:
                    self._changed.clear()
                    await self._changed.wait()

    async def next_due(self) -> float | None:
        return await due_in_async(self.engine.store, self.core.kind, self.core.claimable)

    async def wait_work(self, timeout: float) -> None:
        if self._stopping or self._woken:
            return
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not (self._stopping or self._woken):
                    self._changed.clear()
                    await self._changed.wait()

    def wake(self) -> None:
        """Claim now instead of at the next poll: work became claimable (a ``NOTIFY``).
        Safe to call from any thread; a wake-up while full waits for a slot."""
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or loop is here:
            self._wake_here()
        else:
            loop.call_soon_threadsafe(self._wake_here)

    def _wake_here(self) -> None:
        self._woken = True
        self._changed.set()

    # -- running and stopping ----------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Claim and work until :meth:`stop` (or the task is cancelled, which stops too)."""
        self._loop = asyncio.get_running_loop()
        unsubscribe = subscribe_wakeups(self.engine.store, self.engine.kind, self.wake)
        if self.reaper is not None:
            self.reaper.start()
        self.completer.start()
        try:
            await drive_async(self.core.loop(self))
        finally:
            unsubscribe()
            await asyncio.shield(self.stop())
        return self.stats

    async def stop(self, grace: timedelta | None = None) -> None:
        """Stop claiming, wait up to ``grace`` for running handlers, then tell the rest
        (``job.lost``, reason ``"worker stopping"``), cancel them and release their leases,
        so another worker can claim them at once.  Idempotent: a stop while another is
        under way waits for that one (``run``'s own way out stops it too), so the two never
        close what the other still uses."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace: timedelta | None) -> None:
        self._stopping = True
        self._changed.set()
        wait = self.grace if grace is None else grace.total_seconds()
        tasks = {task for _, task in self._running.values()}
        if tasks:
            await asyncio.wait(tasks, timeout=wait)
        left = list(self._running.items())
        for held, (entity_id, task) in left:
            if held.lost:
                continue
            held._lose(stopping_error(held), STOPPING)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            try:
                await self.engine.release_lease(held.lease)
                self.core.count("released")
                log.info("released %s at stop", entity_id)
            except FsmError as err:
                log.info("lease of %s not released at stop: %s", entity_id, err)
        await self.completer.stop()  # what the finished handlers fired is written first
        await self.keepers.aclose()
        if self.reaper is not None:  # resigns the leader lease: another worker's reaper takes over
            ended = await asyncio.to_thread(self.reaper.stop)
            if not ended:  # its thread may still use the twin's connections: closing them would crash it
                log.warning("the reaper's loop did not end within its stop timeout; its store is left open")
            elif self._reaper_store is not getattr(self.engine.store, "sync", None):
                self._reaper_store.close()  # a twin of its own (SQL); idempotent
        self.metrics = await asyncio.to_thread(release_worker_metrics, self.metrics)  # its server's join blocks

    async def __aenter__(self) -> AsyncWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


__all__ = ["AsyncHandler", "AsyncJob", "AsyncWorker"]
