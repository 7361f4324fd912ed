"""One keeper for every lease a worker holds: one thread, one renewal transaction a round.

A keeper per claimed job costs a thread per job and a renewal statement per lease.
:class:`LeaseKeepers` holds them all: each lease joins with :meth:`LeaseKeepers.keep`
(its :class:`~fsm.work.keeper.HeldLease` is what the holder reads, as with the single
keeper) and leaves with :meth:`LeaseKeepers.release`.  One thread wakes when the first
lease is due, takes every lease due within a quarter period after it (so leases claimed
at about the same time share their rounds), and renews them all with
:meth:`fsm.Engine.renew_leases`: one transaction, each renewal guarded by its own owner,
token, expiry and budget.  Each holder hears only its own answer:

- renewed: the holder's lease follows (``held.lease``);
- refused (taken over, expired, budget spent): that lease is lost (``held.lost``,
  ``held.check()`` raises) and ``lease_lost`` was sent, unless its holder finished the
  entity itself while the renewal was on its way;
- failed (the store unreachable): retried sooner, until the lease as last renewed would
  lapse; then it is lost.

The decisions are :class:`~fsm.work.keeper.KeeperCore`'s rules, applied per lease;
:meth:`LeaseKeepers.run_once` is one round, the unit of test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from fsm.errors import ConfigError, Fenced, FsmError, InvalidArgument, LeaseLost, StoreUnavailable
from fsm.records import Lease
from fsm.work.keeper import _NO_PROGRESS, RENEW_FRACTION, RETRY_FRACTION, HeldLease, KeepResult
from fsm.work.planning import plan_for_work

if TYPE_CHECKING:
    from fsm.aio.engine import AsyncEngine
    from fsm.engine import Engine

log = logging.getLogger("fsm.keeper")


DEFAULT_FENCE_CHECK = timedelta(seconds=1)
"""How often the keeper reads the row of each lease held longer than this, to tell its
holder promptly that the entity moved on without it (an operator's cancel, another
process's fire): ``job.lost`` turns True within about this long, not at the next renewal
(a third of the TTL).  A job done sooner is never read: the check costs nothing on a fast
queue, and one read per long-held lease per period otherwise."""


@dataclass(eq=False)
class _Kept:
    held: HeldLease
    due: float
    check: float
    """When the keeper next reads the row to see whether the entity moved on."""
    failing: bool = False
    """Whether its last renewal failed (the store unreachable): no fence check meanwhile."""


class LeaseKeepers:
    """Renews every lease it keeps from one thread (see the module doc)."""

    def __init__(
        self, engine: Engine, *, period: timedelta | None = None, fence_check: timedelta = DEFAULT_FENCE_CHECK
    ) -> None:
        ttl = engine.policy.lease_ttl
        period = ttl / RENEW_FRACTION if period is None else period
        if not isinstance(period, timedelta) or period <= timedelta() or period >= ttl:
            raise ConfigError(f"the keeper's period must be positive and below the lease TTL ({ttl}), not {period!r}")
        if not isinstance(fence_check, timedelta) or not timedelta(milliseconds=10) <= fence_check <= timedelta(
            hours=1
        ):
            raise ConfigError(f"the keeper's fence_check must be a timedelta from 10 ms to 1 hour, not {fence_check!r}")
        self.engine = engine
        self.fence_check = fence_check.total_seconds()
        self.period = period.total_seconds()
        self.ttl = ttl.total_seconds()
        self.rounds = 0
        """Renewal transactions written (tests and dashboards)."""
        self._kept: dict[str, _Kept] = {}
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- the holders' side ---------------------------------------------------------------

    def keep(self, lease: Lease, *, asked_at: float | None = None) -> HeldLease:
        """Keep ``lease`` renewed from now on; the holder reads the returned ``HeldLease``.

        ``asked_at`` is when (on :func:`time.monotonic`) the claim that granted it was sent:
        its TTL counts from there, as the store's does, so the holder's :attr:`HeldLease.lost`
        never trusts a lease longer than the store keeps it (from now when not given)."""
        (held,) = self.keep_many([lease], asked_at=asked_at)
        return held

    def keep_many(self, leases: list[Lease], *, asked_at: float | None = None) -> list[HeldLease]:
        """:meth:`keep` for each of ``leases`` (a claim's), under one lock; their
        ``HeldLease`` in order."""
        if not isinstance(leases, list | tuple):
            raise InvalidArgument(f"keep_many needs a list of Lease, not {leases!r:.80}")
        for lease in leases:
            if not isinstance(lease, Lease):
                raise InvalidArgument(f"keep needs a Lease, not {lease!r}")
        if asked_at is not None and (
            asked_at.__class__ not in (int, float) or not math.isfinite(asked_at)  # NaN, inf, bool
        ):
            raise InvalidArgument(f"asked_at must be a time.monotonic() reading, not {asked_at!r}")
        now = time.monotonic()
        deadline = (now if asked_at is None else min(asked_at, now)) + self.ttl
        due, check = now + self.period, now + self.fence_check
        helds = [HeldLease(lease, deadline) for lease in leases]
        with self._changed:
            # the thread sleeps until the earliest due lease, and at most a period when none
            # is due; a new lease is due a period from now, after every kept one (and after
            # an idle thread's next look), so keeping it never wakes the thread: no thread
            # switch on the way from a claim to its handler
            kept = self._kept
            for held in helds:
                kept[held.entity_id] = _Kept(held, due, check)
            if not self._stopped:
                self._ensure_running()
        return helds

    def _ensure_running(self) -> None:
        """Start the loop's thread if it is not running (called under the lock)."""
        if self._thread is None:
            name = f"fsm-keepers-{self.engine.kind}"
            self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
            self._thread.start()

    def release(self, held: HeldLease) -> None:
        """Stop renewing ``held`` (the lease is kept, not given back); idempotent."""
        with self._changed:
            kept = self._kept.get(held.entity_id)
            if kept is not None and kept.held is held:
                del self._kept[held.entity_id]

    def __len__(self) -> int:
        with self._changed:
            return len(self._kept)

    # -- one round -----------------------------------------------------------------------

    def run_once(self, *, all_of_them: bool = False) -> dict[str, KeepResult]:
        """Renew, in one transaction, every kept lease due now (or within a quarter period;
        every one with ``all_of_them``); the result of each, by entity id."""
        now = time.monotonic()
        horizon = float("inf") if all_of_them else now + self.period / RETRY_FRACTION
        with self._changed:
            due = [k for k in self._kept.values() if k.due <= horizon and not k.held.lost]
        if not due:
            return {}
        started = time.monotonic()
        progress = {k.held.entity_id: k.held._take_progress() for k in due}
        try:
            answers: list[Lease | FsmError] = self.engine.renew_leases([k.held.lease for k in due])
        except FsmError as err:  # the whole round failed (the store is down): each retries
            answers = [err] * len(due)
        self.rounds += 1
        results: dict[str, KeepResult] = {}
        for kept, answer in zip(due, answers, strict=True):
            entity_id = kept.held.entity_id
            details = progress[entity_id]
            results[entity_id] = self._answer(kept, answer, details, started)
        return results

    def _answer(self, kept: _Kept, answer: Lease | FsmError, details: object, started: float) -> KeepResult:
        held = kept.held
        kept.failing = not isinstance(answer, Lease | Fenced)
        if isinstance(answer, Lease):
            held._renewed(answer, started + self.ttl)
            kept.due = time.monotonic() + self.period
            if details is not _NO_PROGRESS:
                try:
                    self.engine.record_progress(answer, details)
                except FsmError as err:  # a progress note is best effort; the renewal stands
                    log.info("progress of %s not recorded: %s", held.entity_id, err)
            return KeepResult(renewed=True)
        if details is not _NO_PROGRESS:
            held.progress(details)  # with the next renewal
        if isinstance(answer, Fenced):
            if self._finished_by_holder(held):
                self.release(held)
                return KeepResult(renewed=False, lost=True, reason="finished by its holder")
            held._lose(answer)
            self.release(held)
            log.warning("lease of %s lost: %s", held.entity_id, answer)
            return KeepResult(renewed=False, lost=True, reason=str(answer))
        retry = self.period / RETRY_FRACTION
        if time.monotonic() + retry >= held.deadline:
            lost = LeaseLost(
                held.entity_id,
                expected_token=held.lease.token,
                found_token=None,
                owner=held.lease.owner,
                detail=f"renewals kept failing until the lease would lapse ({answer})",
            )
            held._lose(lost)
            self.release(held)
            self.engine._lease_lost(held.lease, lost, "renew")
            log.warning("lease of %s given up: %s", held.entity_id, lost)
            return KeepResult(renewed=False, lost=True, reason=str(lost))
        kept.due = time.monotonic() + max(0.0, min(retry, held.deadline - time.monotonic()))
        log.info("renewal of %s failed, retrying: %s", held.entity_id, answer)
        return KeepResult(renewed=False, retry=True, reason=str(answer))

    def check_once(self) -> dict[str, KeepResult]:
        """Read the row of every lease held past its check time, and tell each holder
        whose entity moved on without it (``held.lost``, with the fencing error naming
        what moved it); the result of each lost one, by entity id.  A row that cannot be
        read is left to the next check or renewal."""
        now = time.monotonic()
        with self._changed:
            if any(k.failing for k in self._kept.values()):
                return {}  # the store is unreachable: the renewals' retries come first
            due = [k for k in self._kept.values() if k.check <= now and not k.held.lost]
            for kept in due:
                kept.check = now + self.fence_check
        results: dict[str, KeepResult] = {}
        for kept in due:
            held = kept.held
            try:
                snap = self.engine.store.get(held.entity_id)
                self.engine._check_holder(snap, held.lease)
            except StoreUnavailable as err:  # never hold up the next renewal round on reads
                log.debug("fence check stopped: %s", err)
                break
            except Fenced as err:
                if self._moved_by_holder(held):
                    self.release(held)  # its own retry, release or finish, not yet forgotten
                    continue
                held._lose(err)
                self.release(held)
                self.engine._lease_lost(held.lease, err, "fence check")
                log.warning("lease of %s lost while its handler runs: %s", held.entity_id, err)
                results[held.entity_id] = KeepResult(renewed=False, lost=True, reason=str(err))
            except FsmError as err:  # unreachable, deleted: the renewal decides
                log.debug("fence check of %s skipped: %s", held.entity_id, err)
        return results

    def _moved_by_holder(self, held: HeldLease) -> bool:
        """Whether the entity's last move was its holder's own (a retry or a release that
        gave the lease back, a finish), made after the row was read or before the holder
        left the keeper: the newest history row names the holder's owner and token."""
        try:
            history = self.engine.store.history(held.entity_id)
        except FsmError:
            return False
        last = history[-1] if history else None
        return last is not None and last.owner == held.lease.owner and last.lease_token == held.lease.token

    def _finished_by_holder(self, held: HeldLease) -> bool:
        """Whether the lease's own holder finished the entity (the engine's fencing rule)."""
        try:
            snap = self.engine.store.get(held.entity_id)
            self.engine._check_holder(snap, held.lease)
        except FsmError:
            return False
        return snap.state in self.engine.table.finals

    # -- the thread ----------------------------------------------------------------------

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop renewing every lease (they are kept, not released); idempotent."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _next_wait(self) -> float | None:
        """Seconds until the earliest kept lease is due (<= 0: now), None when none is
        (called under the lock)."""
        # a lease its holder already lost is never renewed (run_once skips it): counting
        # its due time would wake the loop at once, forever
        first = min((min(k.due, k.check) for k in self._kept.values() if not k.held.lost), default=None)
        return None if first is None else first - time.monotonic()

    def _round_failed(self) -> None:
        log.exception("the lease keepers' round failed")
        with self._changed:
            for kept in self._kept.values():
                kept.due = max(kept.due, time.monotonic() + self.period / RETRY_FRACTION)

    def _loop(self) -> None:
        plan_for_work(self.engine.store)
        while True:
            with self._changed:
                while not self._stopped:
                    wait = self._next_wait()
                    if wait is not None and wait <= 0:
                        break
                    self._changed.wait(self.period if wait is None else wait)
                if self._stopped:
                    return
            try:
                self.run_once()
                self.check_once()
            except Exception:  # never let the keeper die silently: retried next round
                self._round_failed()


class AsyncLeaseKeepers(LeaseKeepers):
    """The asyncio face of :class:`LeaseKeepers`: one task renews every lease an
    :class:`~fsm.aio.AsyncWorker` holds, one transaction a round, through the async
    engine's greenlet bridge (the same rounds and answers as the thread face's)."""

    def __init__(
        self, engine: AsyncEngine, *, period: timedelta | None = None, fence_check: timedelta = DEFAULT_FENCE_CHECK
    ) -> None:
        super().__init__(engine.sync, period=period, fence_check=fence_check)
        self.aengine = engine
        self._task: asyncio.Task[None] | None = None
        self._look = asyncio.Event()

    def _ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"fsm-keepers-{self.engine.kind}")

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop renewing every lease (they are kept, not released); idempotent.  The task
        ends at its next look; :meth:`aclose` waits for it."""
        with self._changed:
            self._stopped = True
            self._look.set()

    async def aclose(self) -> None:
        """:meth:`stop`, and wait for the task to end."""
        self.stop()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            with self._changed:
                if self._stopped:
                    return
                wait = self._next_wait()
            if wait is None or wait > 0:
                self._look.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.period if wait is None else wait):
                        await self._look.wait()
                continue
            try:
                await self.aengine._call(self.run_once)
                await self.aengine._call(self.check_once)
            except Exception:  # never let the keeper die silently: retried next round
                self._round_failed()


__all__ = ["DEFAULT_FENCE_CHECK", "AsyncLeaseKeepers", "LeaseKeepers"]
