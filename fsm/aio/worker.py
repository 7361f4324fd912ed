"""The asyncio worker: claims work and runs a coroutine handler per state.

::

    async def run_agent(job: AsyncJob) -> str:
        await job.run("agent", call_agent)        # recorded once; call_agent may be async
        return "exited"

    worker = AsyncWorker(engine, {"running": run_agent, "finalizing": run_gates}, concurrency=8)
    await worker.run()                            # until worker.stop()

The same rules as :class:`fsm.work.Worker` (its configuration checks and outcomes are
shared): each claimed entity runs as a task under an asyncio lease keeper
(:meth:`AsyncEngine.keep`); a handler returns the event to fire (or ``(event, data)``, or
``None`` when it fired itself) and the next state's handler runs under the same lease; a
handler that raises is logged and its entity failed (``fail``, if the worker may fire it)
or its lease released; a fenced handler stops.  At most ``concurrency`` handlers run at
once.  :meth:`AsyncWorker.stop` stops claiming, lets running handlers finish within
``grace``, then cancels the rest and releases their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel

from fsm.aio.engine import AsyncEngine
from fsm.engine import FireResult
from fsm.errors import Fenced, FsmError
from fsm.records import Actor, Snapshot
from fsm.work.keeper import HeldLease
from fsm.work.report import COMPLETED, FAILED, FENCED, RELEASED, report
from fsm.work.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_POLL_INTERVAL,
    HeldEntity,
    Outcome,
    WorkerStats,
    check_worker,
    parse_outcome,
)

log = logging.getLogger("fsm.worker")

M = TypeVar("M", bound=BaseModel)


class AsyncJob(HeldEntity):
    """What an async handler gets: the entity, its held lease, the ledger bound to both."""

    def __init__(self, engine: AsyncEngine, snapshot: Snapshot, held: HeldLease) -> None:
        super().__init__(snapshot, held)
        self.engine = engine

    async def run(
        self, key: str, fn: Callable[[str], Any], *, model: type[M] | None = None, retry_failed: bool = True
    ) -> Any:
        """An effect under this job's lease, recorded once (see :meth:`AsyncEngine.run`)."""
        return await self.engine.run(self.id, key, fn, self.held.check(), model=model, retry_failed=retry_failed)

    async def fire(
        self, event: str, *, data: Mapping[str, Any] | None = None, idempotency_key: str | None = None
    ) -> FireResult:
        """Fire ``event`` under this job's lease; the job's snapshot follows."""
        result = await self.engine.fire(
            self.id, event, lease=self.held.check(), data=data, idempotency_key=idempotency_key
        )
        self.snapshot = result.snapshot
        return result

    async def previous_progress(self) -> Any:
        """What the previous holder's keeper recorded, for a resumed job."""
        return await self.engine.progress(self.id)


AsyncHandler = Callable[[AsyncJob], Awaitable[Outcome]]


class AsyncWorker:
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
    ) -> None:
        check_worker(engine.table, engine.kind, handlers, concurrency, poll_interval, grace)
        self.engine = engine
        self.handlers = dict(handlers)
        self.concurrency = concurrency
        self.poll_interval = poll_interval.total_seconds()
        self.grace = grace.total_seconds()
        self.keeper_period = keeper_period
        self.stats = WorkerStats()
        self._running: dict[str, tuple[asyncio.Task[None], HeldLease]] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    @property
    def running(self) -> int:
        return len(self._running)

    async def run_once(self) -> int:
        """Claim as many entities as there are free slots and start their handlers.

        Returns how many were claimed; the unit of work and of test."""
        if self._stopping.is_set():
            return 0
        free = self.concurrency - len(self._running)
        if free <= 0:
            return 0
        try:
            claimed = await self.engine.claim(free)
        except FsmError as err:  # the store is down: try again at the next poll
            log.warning("claim failed: %s", err)
            return 0
        for snap in claimed:
            self.stats.claimed += 1
            ready: asyncio.Future[HeldLease] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._work(snap, ready), name=f"fsm-worker-{snap.id}")
            held = await ready
            self._running[snap.id] = (task, held)
            task.add_done_callback(functools.partial(self._done, snap.id))
        return len(claimed)

    def _done(self, entity_id: str, _: object) -> None:
        self._running.pop(entity_id, None)
        self._wake.set()

    async def _work(self, snap: Snapshot, ready: asyncio.Future[HeldLease]) -> None:
        lease = snap.lease
        assert lease is not None
        async with self.engine.keep(lease, period=self.keeper_period) as held:
            ready.set_result(held)
            await self._handle(AsyncJob(self.engine, snap, held))

    async def _handle(self, job: AsyncJob) -> None:
        while True:
            handler = self.handlers.get(job.state)
            if handler is None:
                self.stats.finished += 1
                return
            state = job.state
            started = time.perf_counter()
            try:
                event: str | None = None
                outcome = await handler(job)
                if outcome is not None:
                    event, data = parse_outcome(outcome)
                    await job.fire(event, data=data)
                elif job.state == state:
                    job.snapshot = await self.engine.get(job.id)  # the handler fired through other means
                    if job.state == state:
                        report(self.engine.kind, job.held.lease, state, RELEASED, started)
                        await self._release(job.held)
                        return
                report(self.engine.kind, job.held.lease, state, COMPLETED, started, event=event)
            except Fenced as err:
                report(self.engine.kind, job.held.lease, state, FENCED, started, error=err)
                self.stats.fenced += 1
                return
            except Exception as err:
                report(self.engine.kind, job.held.lease, state, FAILED, started, error=err)
                self.stats.failed += 1
                self.stats.errors.append(f"{job.id}: {type(err).__name__}: {err}")
                await self._fail_or_release(job)
                return

    async def _fail_or_release(self, job: AsyncJob) -> None:
        try:
            if "fail" in await self.engine.allowed_events(job.snapshot, Actor.WORKER):
                await job.fire("fail", idempotency_key=f"worker-fail:{job.held.lease.token}")
                return
        except FsmError as fire_err:
            log.warning("could not fail %s after its handler raised: %s", job.id, fire_err)
        await self._release(job.held)

    async def _release(self, held: HeldLease) -> None:
        try:
            await self.engine.release_lease(held.lease)
            self.stats.released += 1
        except FsmError as err:
            log.info("lease of %s not released: %s", held.entity_id, err)

    async def run(self) -> WorkerStats:
        """Claim and work until :meth:`stop` (or the task is cancelled, which stops too)."""
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                claimed = await self.run_once()
                if not claimed or len(self._running) >= self.concurrency:
                    stop = asyncio.create_task(self._stopping.wait())
                    wake = asyncio.create_task(self._wake.wait())
                    await asyncio.wait({stop, wake}, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
                    for waiter in (stop, wake):
                        waiter.cancel()
        finally:
            await asyncio.shield(self.stop())
        return self.stats

    async def stop(self, grace: timedelta | None = None) -> None:
        """Stop claiming, wait up to ``grace`` for running handlers, then cancel the rest
        and release their leases, so another worker can claim them at once.  Idempotent."""
        self._stopping.set()
        wait = self.grace if grace is None else grace.total_seconds()
        tasks = {task for task, _ in self._running.values()}
        if tasks:
            await asyncio.wait(tasks, timeout=wait)
        left = list(self._running.items())
        for entity_id, (task, held) in left:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await self._release(held)
            log.info("released %s at stop", entity_id)

    async def __aenter__(self) -> AsyncWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


__all__ = ["AsyncHandler", "AsyncJob", "AsyncWorker"]
