"""The lease keeper: renews a held lease in the background, and says when it is lost.

A holder that works for longer than its lease's TTL (a finalizer's gates, an agent run)
must renew; if it forgets, the reaper rightly takes the entity over (seeds/002).  The
keeper renews at a third of the TTL, always with the latest :class:`Lease`, within the
state's renewal budget (the store caps every renewal, so a live-but-hung holder cannot
keep an entity forever).  It stops, and sends ``lease_lost``, when

- a renewal is refused (taken over, expired, budget spent): ``reason`` says which;
- renewals keep failing (the store is down) until the lease would lapse.

The holder's own clock has the last word: ``held.lost`` also turns True, by itself, once the
lease as last confirmed would lapse (its TTL from just before the write that granted or
renewed it, on this process's monotonic clock), whatever the keeper is doing: a renewal
stuck in a dead connection, a keeper thread starved of the interpreter lock, or the whole
process paused (SIGSTOP, a VM freeze) cannot leave a holder working on a lease that the
store already counts as free (the reaper may take the entity over, and a concurrency
limit gives its slot to another entity).  A holder that cannot prove its lease stops.

The holder finds out at its next step: ``held.lost`` is a flag it can read,
``held.check()`` raises, and leaving ``with LeaseKeeper(engine, lease) as held:`` raises the
fencing error if the lease was lost inside the block.  Progress details given to
``held.progress(...)`` travel with the next renewal (as a Temporal heartbeat carries
them) and the next owner reads them with ``engine.progress(entity_id)``.

The decisions live in :class:`KeeperCore`, free of threads and I/O, so that the thread
driver here and the asyncio driver (:class:`AsyncLeaseKeeper`) share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import signals
from fsm.errors import ConfigError, Fenced, FsmError, InvalidArgument, LeaseLost
from fsm.records import Lease
from signals import LeasePayload

if TYPE_CHECKING:
    from fsm.engine import Engine

log = logging.getLogger("fsm.keeper")

RENEW_FRACTION = 3
"""Renew every ``ttl / RENEW_FRACTION``: two renewals can fail before the lease lapses."""
RETRY_FRACTION = 4
"""After a failed renewal (store unreachable), retry every ``period / RETRY_FRACTION``."""
_NO_PROGRESS = object()


@dataclass(frozen=True, slots=True)
class KeepResult:
    """What one renewal step did: ``renewed``, or why the keeper stopped or will retry."""

    renewed: bool
    lost: bool = False
    retry: bool = False
    reason: str | None = None


class HeldLease:
    """What the holder reads while its keeper runs: the latest lease and whether it is lost."""

    def __init__(self, lease: Lease, deadline: float = float("inf")) -> None:
        self._lease = lease
        self._deadline = deadline
        self._lost = False
        self._lost_event: threading.Event | None = None
        """Made by the first :meth:`wait_lost` only: an Event is two more objects per
        claimed job, and most holders only read :attr:`lost`."""
        self._lock = threading.Lock()
        self._error: Fenced | None = None
        self._reason: str | None = None
        self._progress: Any = _NO_PROGRESS
        self.renewals = 0

    @property
    def lease(self) -> Lease:
        """The latest lease: always fire and run effects with this one."""
        return self._lease

    @property
    def entity_id(self) -> str:
        return self._lease.entity_id

    @property
    def deadline(self) -> float:
        """When the lease, as last confirmed, lapses at the latest, on :func:`time.monotonic`:
        the TTL from just before the write that granted or renewed it, so never after the
        store's own expiry (``inf`` for a lease no keeper tracks)."""
        return self._deadline

    @property
    def lost(self) -> bool:
        """True once the lease is no longer the holder's: the keeper learnt it (taken over,
        refused, given up), or this process's clock passed :attr:`deadline` with no renewal
        confirmed.  Stop working."""
        if self._lost:
            return True
        if time.monotonic() < self._deadline:
            return False
        self._lapse()
        return True

    @property
    def reason(self) -> str | None:
        """Why the lease was lost (taken over, expired, budget spent, store unreachable,
        ``"worker stopping"``)."""
        if self._error is None:
            return None
        return self._reason or str(self._error)

    @property
    def error(self) -> Fenced | None:
        return self._error

    def check(self) -> Lease:
        """The latest lease, or the fencing error if it was lost: call it between steps."""
        if self._error is not None or self.lost:
            assert self._error is not None
            raise self._error
        return self._lease

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost or ``timeout`` seconds pass; True if lost."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._lost_event is None:
                self._lost_event = threading.Event()
            event = self._lost_event
        while not self.lost:
            # woken by the keeper's verdict, or at the deadline to lapse by the clock
            now = time.monotonic()
            wait = self._deadline - now if end is None else min(end, self._deadline) - now
            if end is not None and now >= end:
                return False
            event.wait(None if wait == float("inf") else max(wait, 0.0))
        return True

    def progress(self, details: Any) -> None:
        """Progress details for the next renewal to record (JSON); the next owner reads them."""
        with self._lock:
            self._progress = details

    # -- the keeper's side ---------------------------------------------------------------

    def _take_progress(self) -> Any:
        with self._lock:
            details, self._progress = self._progress, _NO_PROGRESS
            return details

    def _renewed(self, lease: Lease, deadline: float) -> None:
        """A renewal confirmed (asked for at ``deadline - ttl``); a lease already lapsed by
        the clock stays lost: the store may have freed it in between."""
        self._lease = lease
        self._deadline = max(self._deadline, deadline)
        self.renewals += 1

    def _lapse(self) -> None:
        lease = self._lease
        self._lose(
            LeaseLost(
                lease.entity_id,
                expected_token=lease.token,
                found_token=None,
                owner=lease.owner,
                detail="no renewal was confirmed before the lease would lapse (this process's clock)",
            )
        )

    def _lose(self, error: Fenced, reason: str | None = None) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
                self._reason = reason
            self._lost = True
            event = self._lost_event
        if event is not None:
            event.set()


class KeeperCore:
    """The keeper's decisions, without threads or I/O: when to renew, what a failure means.

    ``period`` defaults to a third of the lifecycle's TTL.  A refused renewal ends the
    keeping; a failed one (store unreachable) is retried sooner until the lease, as last
    renewed, would have lapsed (judged on this process's monotonic clock).
    """

    def __init__(self, engine: Engine, lease: Lease, *, period: timedelta | None = None) -> None:
        if not isinstance(lease, Lease):
            raise InvalidArgument(f"keep needs a Lease, not {lease!r}")
        ttl = engine.policy.lease_ttl
        period = ttl / RENEW_FRACTION if period is None else period
        if not isinstance(period, timedelta) or period <= timedelta() or period >= ttl:
            raise ConfigError(f"the keeper's period must be positive and below the lease TTL ({ttl}), not {period!r}")
        self.engine = engine
        self.period = period.total_seconds()
        self.ttl = ttl.total_seconds()
        # from when keeping starts: the caller got the lease earlier, at a time unknown here
        self.held = HeldLease(lease, time.monotonic() + self.ttl)

    def renew(self) -> KeepResult:
        """One renewal with the latest lease (and pending progress); the unit of test."""
        held = self.held
        if held.lost:
            return KeepResult(renewed=False, lost=True, reason=held.reason)
        started = time.monotonic()
        details = held._take_progress()
        try:
            lease = self.engine.renew_lease(held.lease)  # sends lease_lost itself on refusal
            if details is not _NO_PROGRESS:
                self.engine.record_progress(lease, details)
        except Fenced as err:
            if self._finished_by_holder():
                # the holder itself fired the entity into a final state (which clears the
                # lease) while this renewal was on its way: nothing was lost, stop renewing
                return KeepResult(renewed=False, lost=True, reason="finished by its holder")
            held._lose(err)
            log.warning("lease of %s lost: %s", held.entity_id, err)
            return KeepResult(renewed=False, lost=True, reason=str(err))
        except FsmError as err:
            if details is not _NO_PROGRESS:
                held.progress(details)  # try it again with the next renewal
            if time.monotonic() + self.period / RETRY_FRACTION >= held.deadline:
                lost = LeaseLost(
                    held.entity_id,
                    expected_token=held.lease.token,
                    found_token=None,
                    owner=held.lease.owner,
                    detail=f"renewals kept failing until the lease would lapse ({err})",
                )
                held._lose(lost)
                self._announce_lost(lost)
                log.warning("lease of %s given up: %s", held.entity_id, lost)
                return KeepResult(renewed=False, lost=True, reason=str(lost))
            log.info("renewal of %s failed, retrying: %s", held.entity_id, err)
            return KeepResult(renewed=False, retry=True, reason=str(err))
        held._renewed(lease, started + self.ttl)
        return KeepResult(renewed=True)

    def _finished_by_holder(self) -> bool:
        """Whether the lease's own holder finished the entity (the engine's fencing rule)."""
        try:
            snap = self.engine.store.get(self.held.entity_id)
            self.engine._check_holder(snap, self.held.lease)
        except FsmError:
            return False
        return snap.state in self.engine.table.finals

    def next_delay(self, result: KeepResult | None) -> float:
        """Seconds until the next renewal step."""
        if result is not None and result.retry:
            return max(0.0, min(self.period / RETRY_FRACTION, self.held.deadline - time.monotonic()))
        return self.period

    def _announce_lost(self, err: Fenced) -> None:
        lease, engine = self.held.lease, self.engine
        if not signals.lease_lost.receivers:
            return
        try:
            snap = engine.store.get(lease.entity_id)
        except FsmError:
            return
        detail = str(err)
        signals.send(
            signals.lease_lost, engine.kind, lambda: LeasePayload.of(engine.kind, snap, lease=lease, detail=detail)
        )


class LeaseKeeper:
    """Renews a lease on a background thread; a context manager giving a :class:`HeldLease`.

    ::

        with LeaseKeeper(engine, lease) as held:
            for gate in gates:
                engine.run(job_id, gate, run_gate, held.check())
            engine.fire(job_id, "complete", lease=held.check())

    Leaving the block stops the keeper (the lease is kept, not released); if the lease
    was lost inside it, the fencing error is raised there (unless another error already
    is).
    """

    def __init__(self, engine: Engine, lease: Lease, *, period: timedelta | None = None) -> None:
        self.core = KeeperCore(engine, lease, period=period)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_step: Callable[[KeepResult], None] | None = None
        """Called after every renewal step (tests wait on it instead of sleeping)."""

    @property
    def held(self) -> HeldLease:
        return self.core.held

    def start(self) -> HeldLease:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"fsm-keeper-{self.held.entity_id}", daemon=True)
            self._thread.start()
        return self.held

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing (idempotent); waits for a renewal in flight."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        result: KeepResult | None = None
        while not self._stop.wait(self.core.next_delay(result)):
            try:
                result = self.core.renew()
            except Exception:  # never let the keeper die silently: the holder must learn of it
                log.exception("lease keeper of %s failed", self.held.entity_id)
                result = KeepResult(renewed=False, retry=True, reason="keeper error")
            if self.on_step is not None:
                self.on_step(result)
            if result.lost:
                return

    def __enter__(self) -> HeldLease:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if exc_type is None and self.held.error is not None:
            raise self.held.error


class AsyncLeaseKeeper:
    """The asyncio face of :class:`LeaseKeeper`: a task renews, the event loop stays free.

    ::

        async with AsyncLeaseKeeper(engine, lease) as held:
            ...

    Renewals run in a thread (``asyncio.to_thread``) because the engine's stores are
    synchronous, or through ``runner`` (:meth:`fsm.AsyncEngine.keep` passes its greenlet
    bridge, so renewals wait on the async store); the decisions are :class:`KeeperCore`'s,
    the same as the thread keeper's.
    """

    def __init__(
        self,
        engine: Engine,
        lease: Lease,
        *,
        period: timedelta | None = None,
        runner: Callable[[Callable[[], KeepResult]], Awaitable[KeepResult]] | None = None,
    ) -> None:
        self.core = KeeperCore(engine, lease, period=period)
        self._runner = runner or asyncio.to_thread  # AsyncEngine passes its greenlet bridge
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> HeldLease:
        return self.core.held

    async def _loop(self) -> None:
        result: KeepResult | None = None
        while True:
            await asyncio.sleep(self.core.next_delay(result))
            try:
                result = await self._runner(self.core.renew)
            except Exception:
                log.exception("lease keeper of %s failed", self.held.entity_id)
                result = KeepResult(renewed=False, retry=True, reason="keeper error")
            if result.lost:
                return

    async def __aenter__(self) -> HeldLease:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"fsm-keeper-{self.held.entity_id}")
        return self.held

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if exc_type is None and self.held.error is not None:
            raise self.held.error


__all__ = [
    "RENEW_FRACTION",
    "AsyncLeaseKeeper",
    "HeldLease",
    "KeepResult",
    "KeeperCore",
    "LeaseKeeper",
]
