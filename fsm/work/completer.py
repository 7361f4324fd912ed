"""The batch completer: handlers' outcomes written together, each still fenced on its own.

A worker's handlers return their outcome events at about the same time; writing each one
in a transaction of its own costs a commit each (pgqueuer acknowledges ten jobs in one
statement; River's ``BatchCompleter`` sets many rows in one).  The completer buffers the
outcomes a few milliseconds, or until every busy handler is waiting on it, and fires them
with :meth:`fsm.Engine.fire_many`: one transaction, each write guarded by its own version
and lease token, each refusal (``LeaseLost``, ``EntityMovedOn``...) raised in its own
handler.  A handler's ``fire`` returns only once its write committed: an outcome is never
acknowledged before it is durable.  The backlog is bounded by the handlers (each waits
for its answer), so a slow store slows the handlers down instead of piling up outcomes.

Two faces share the buffer (:class:`_Batcher`: when a batch is due, which outcomes it
takes, how it is written): :class:`BatchCompleter` flushes from a thread, and
:class:`AsyncBatchCompleter` from an asyncio task, writing through the async engine's
greenlet bridge.  ``run_once`` writes what is pending now (the unit of test); the thread
or task only schedules it.  After ``stop`` an outcome is fired on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from fsm.engine.many import Fire, Fired
from fsm.errors import ConfigError
from fsm.records import EffectRecord, Lease, Snapshot
from fsm.work.planning import plan_for_work
from stores.ledger import EffectWrite, HolderAndEffect, LedgerRun, record_one

if TYPE_CHECKING:
    from fsm.aio.engine import AsyncEngine
    from fsm.engine import Engine, FireResult

log = logging.getLogger("fsm.worker")

DEFAULT_MAX_BATCH = 64
"""The most outcomes one transaction writes."""
DEFAULT_MAX_DELAY = timedelta(milliseconds=2)
"""The longest an outcome waits for others to share its commit (when some handler is still
busy; an outcome that every running handler waits on is written at once)."""


class _Probe(NamedTuple):
    """A handler's step asking for its entity's lease holder and recorded effect."""

    entity_id: str
    key: str


class _Pending:
    """One outcome (or a step's ledger ask) waiting for its batch.  ``done`` is a bare lock
    held until the answer is in (thread face: a lock is a C object, an Event two Python
    objects per outcome), or a future (asyncio face), or ``None`` when ``then`` is called
    with the answer instead."""

    __slots__ = ("done", "item", "result", "then")

    def __init__(
        self, item: Fire | _Probe | EffectWrite, done: Any, then: Callable[[Fired | BaseException], None] | None = None
    ) -> None:
        self.item = item
        self.result: Any = None
        self.done = done
        self.then = then


class _Batcher:
    """The buffer both faces share: what is pending, when it is due, how a batch is written."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_delay: timedelta = DEFAULT_MAX_DELAY,
        all_waiting: Callable[[int], bool] | None = None,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= 1000:
            raise ConfigError(f"max_batch must be an integer from 1 to 1000, not {max_batch!r}")
        if not isinstance(max_delay, timedelta) or not timedelta() <= max_delay <= timedelta(seconds=1):
            raise ConfigError(f"max_delay must be a timedelta from 0 to 1 second, not {max_delay!r}")
        self.engine = engine
        self.max_batch = max_batch
        self.max_delay = max_delay.total_seconds()
        self.all_waiting = all_waiting or (lambda n: False)
        self.batches = 0
        """Transactions written (tests and dashboards: outcomes / batches is the batching)."""
        self.outcomes = 0
        self.steps = 0
        """Ledger asks answered in batches (a handler's durable steps: its reads and records)."""
        self._pending: list[_Pending] = []
        self._first_at = 0.0
        self._changed = threading.Condition()
        self._stopped = False

    def _add(self, pending: _Pending) -> bool:
        """Queue ``pending`` (under the lock); whether the flusher must look again: for the
        first outcome (its delay starts) and when the batch is due at once, not for each
        outcome in between (a wake-up each is a thread switch each)."""
        queued = self._pending
        queued.append(pending)
        n = len(queued)
        if n == 1:
            self._first_at = time.monotonic()
        return n == 1 or n >= self.max_batch or self.all_waiting(n)

    def _due(self) -> float | None:
        """Seconds until the pending batch must be written (0: now), None when empty."""
        n = len(self._pending)
        if not n:
            return None
        if self._stopped or n >= self.max_batch or self.all_waiting(n):
            return 0.0
        return max(0.0, self._first_at + self.max_delay - time.monotonic())

    def _take(self) -> list[_Pending]:
        with self._changed:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            if self._pending:
                self._first_at = time.monotonic()
        return batch

    def _write(self, batch: list[_Pending]) -> None:
        """Answer ``batch``: the steps' ledger asks first (one read for the probes, one
        write for the records), then the outcomes, fired in one transaction; each pending
        item gets its own answer."""
        fires: list[_Pending] = []
        probes: list[_Pending] = []
        records: list[_Pending] = []
        for pending in batch:
            kind = type(pending.item)
            (fires if kind is Fire else probes if kind is _Probe else records).append(pending)
        store: Any = self.engine.store  # a LedgerRun when asks were queued (BatchCompleter.batches_steps)
        if probes:
            self._answer(probes, "ledger reads", lambda: store.holders_and_effects([p.item for p in probes]))
        if records:
            self._answer(records, "ledger records", lambda: store.record_effects([p.item for p in records]))
        if fires:
            self._answer(fires, "outcomes", lambda: self.engine.fire_many([p.item for p in fires]))  # type: ignore[misc]
        self.batches += 1
        self.outcomes += len(fires)
        self.steps += len(probes) + len(records)

    @staticmethod
    def _answer(batch: list[_Pending], what: str, write: Callable[[], Sequence[Any]]) -> None:
        try:
            results: list[Any] = list(write())
        except BaseException as err:  # the store failed the whole batch: every handler hears it
            log.warning("a batch of %d %s failed: %s", len(batch), what, err)
            results = [err] * len(batch)
        for pending, result in zip(batch, results, strict=True):
            pending.result = result

    @property
    def running(self) -> bool:  # pragma: no cover - each face says
        raise NotImplementedError

    @property
    def batches_steps(self) -> bool:
        """Whether handlers' durable steps can be answered here: the store is one whose
        ledger answers in batches (every store of the library), and the batches are being
        flushed."""
        return isinstance(self.engine.store, LedgerRun) and self.running

    @property
    def _ledger(self) -> LedgerRun:
        store = self.engine.store
        assert isinstance(store, LedgerRun)  # asked only when batches_steps said so
        return store

    def holder_and_effect(self, entity_id: str, key: str) -> HolderAndEffect:
        """The store's :meth:`~stores.ledger.LedgerRun.holder_and_effect`, read with the
        other handlers' asks of the next batch (one statement for all on PostgreSQL)."""
        found: HolderAndEffect = self._asked(
            _Probe(entity_id, key), lambda: self._ledger.holder_and_effect(entity_id, key)
        )
        return found

    def record_effect(
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]:
        """The store's :meth:`~stores.Store.record_effect`, written with the other handlers'
        records of the next batch (one guarded insert for all on PostgreSQL, each row under
        its own lease); returns once committed, or raises its own refusal."""
        write = EffectWrite(entity_id, key, owner, token, status, result, replace)
        recorded: tuple[EffectRecord, bool] = self._asked(write, lambda: record_one(self._ledger, write))
        return recorded

    def _asked(self, item: _Probe | EffectWrite, alone: Callable[[], Any]) -> Any:  # pragma: no cover - each face
        raise NotImplementedError

    def _all_waiting_now(self) -> bool:
        with self._changed:
            return bool(self._pending) and self.all_waiting(len(self._pending))


class BatchCompleter(_Batcher):
    """Fires handlers' outcomes in batches from a thread (see the module doc).

    ``all_waiting(n)``: whether ``n`` pending outcomes are all that can come now (the
    worker: every running handler waits on the completer); then the batch is written at
    once instead of after ``max_delay``."""

    _thread: threading.Thread | None = None

    # -- the handlers' side ------------------------------------------------------------

    def fire(
        self, entity: Snapshot | FireResult, event: str, *, lease: Lease | None, data: Mapping[str, Any] | None = None
    ) -> FireResult:
        """Fire ``event`` from the held ``entity`` in the next batch; returns once it
        committed, or raises its own refusal (what :meth:`Engine.fire` would raise)."""
        done = _allocate_lock()
        done.acquire()
        item = Fire(entity, event, lease, data)
        pending = _Pending(item, done)
        with self._changed:
            running = not self._stopped and self._thread is not None
            if running and self._add(pending):
                self._changed.notify()
        if not running:  # not running: on its own, as fire_many would write it
            (alone,) = self.engine.fire_many([item])
            return _answer(alone)
        done.acquire()
        return _answer(pending.result)

    def fire_then(
        self,
        entity: Snapshot | FireResult,
        event: str,
        *,
        lease: Lease | None,
        data: Mapping[str, Any] | None,
        then: Callable[[Fired | BaseException], None],
    ) -> bool:
        """Fire ``event`` in the next batch without waiting for it: once the batch
        committed, ``then`` is called on the completer's thread with the outcome's
        :class:`FireResult` or its own refusal (what :meth:`fire` would return or raise).
        ``False`` when the completer is not running: nothing was queued, fire it yourself.

        The thread worker hands its handlers' returned events over this way, so that a
        handler's thread is free at once and no thread is woken per outcome to learn it
        committed; ``then`` must be quick (it runs between two batches)."""
        pending = _Pending(Fire(entity, event, lease, data), None, then)
        with self._changed:
            if self._stopped or self._thread is None:
                return False
            if self._add(pending):
                self._changed.notify()
        return True

    # -- a handler's durable steps: the ledger's asks, answered in the next batch -----------

    @property
    def running(self) -> bool:
        """Whether a thread flushes the batches (else every ask is answered alone)."""
        return not self._stopped and self._thread is not None

    def _asked(self, item: _Probe | EffectWrite, alone: Callable[[], Any]) -> Any:
        """The answer to ``item`` from the next batch, waited for on this thread."""
        done = _allocate_lock()
        done.acquire()
        pending = _Pending(item, done)
        with self._changed:
            # asked on the completer's own thread (a batch's continuation): answered here,
            # since that thread would otherwise wait for itself
            running = not self._stopped and self._thread is not None and self._thread is not threading.current_thread()
            if running and self._add(pending):
                self._changed.notify()
        if not running:
            return alone()
        done.acquire()
        if isinstance(pending.result, BaseException):
            raise pending.result
        return pending.result

    def wake(self) -> None:
        """Look again whether every handler waits (the worker calls it when one finishes)."""
        with self._changed:
            if self._pending and self.all_waiting(len(self._pending)):
                self._changed.notify()

    # -- one batch -----------------------------------------------------------------------

    after_batch: Callable[[], None] | None = None
    """Called once after each batch's answers were handed out (the thread worker tells its
    loop in one notification how many slots the batch's ``then`` calls freed)."""

    def run_once(self) -> int:
        """Write the outcomes pending now, at most ``max_batch``, in one transaction; how
        many were written (refusals included)."""
        batch = self._take()
        if not batch:
            return 0
        self._write(batch)
        for pending in batch:
            if pending.then is None:
                pending.done.release()
        for pending in batch:
            if pending.then is not None:
                assert pending.result is not None
                try:
                    pending.then(pending.result)
                except Exception:  # the worker's own bookkeeping failed: the batch's others still hear
                    log.exception("an outcome's continuation failed")
        if self.after_batch is not None:
            self.after_batch()
        return len(batch)

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> BatchCompleter:
        with self._changed:
            if self._thread is None:
                self._stopped = False
                self._thread = threading.Thread(
                    target=self._loop, name=f"fsm-completer-{self.engine.kind}", daemon=True
                )
                self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Write what is pending, then stop (idempotent); later outcomes are fired alone."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        while self.run_once():  # anything left behind by a thread that did not finish
            pass

    def _loop(self) -> None:
        plan_for_work(self.engine.store)
        while True:
            with self._changed:
                while True:
                    due = self._due()
                    if due == 0.0:
                        break
                    if due is None and self._stopped:
                        return
                    self._changed.wait(due)
            try:
                self.run_once()
            except Exception:  # pragma: no cover - run_once answers every handler itself
                log.exception("the batch completer failed")


class AsyncBatchCompleter(_Batcher):
    """The asyncio face: handlers' outcomes in batches, flushed by a task (module doc).

    Built on an :class:`~fsm.aio.AsyncEngine`; a batch is written by its synchronous engine
    through the greenlet bridge (``fire_many`` as the thread face writes it), so only the
    flushing task waits on the store.  Everything runs on the event loop's thread."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_delay: timedelta = DEFAULT_MAX_DELAY,
        all_waiting: Callable[[int], bool] | None = None,
    ) -> None:
        super().__init__(engine.sync, max_batch=max_batch, max_delay=max_delay, all_waiting=all_waiting)
        self.aengine = engine
        self._task: asyncio.Task[None] | None = None
        self._look = asyncio.Event()

    async def fire(
        self, entity: Snapshot | FireResult, event: str, *, lease: Lease | None, data: Mapping[str, Any] | None = None
    ) -> FireResult:
        """:meth:`BatchCompleter.fire`, awaited."""
        item = Fire(entity, event, lease, data)
        if self._stopped or self._task is None:
            (alone,) = await self.aengine.fire_many([item])
            return _answer(alone)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(item, done)
        with self._changed:
            if self._add(pending):
                self._look.set()
        await asyncio.shield(done)  # a cancelled handler leaves its outcome to be written
        return _answer(pending.result)

    def wake(self) -> None:
        if self._all_waiting_now():
            self._look.set()

    # -- a handler's durable steps, asked from the engine's greenlet bridge ----------------

    @property
    def running(self) -> bool:
        """Whether a task flushes the batches (else every ask is answered alone)."""
        return not self._stopped and self._task is not None

    def _asked(self, item: _Probe | EffectWrite, alone: Callable[[], Any]) -> Any:
        """The answer to ``item`` from the next batch, for code under the greenlet bridge
        (the synchronous engine's ``run`` that an :class:`~fsm.aio.AsyncEngine` calls): it
        waits on the event loop, suspending only its own greenlet."""
        from stores.aio.greenlets import bridged, wait  # the asyncio extra's: this face has it

        if not self.running or not bridged():
            return alone()
        return wait(self._ask(item))

    async def _ask(self, item: _Probe | EffectWrite) -> Any:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(item, done)
        with self._changed:
            if self._add(pending):
                self._look.set()
        await asyncio.shield(done)  # a cancelled handler's ask is still answered (and its record kept)
        if isinstance(pending.result, BaseException):
            raise pending.result
        return pending.result

    async def run_once(self) -> int:
        """:meth:`BatchCompleter.run_once`, awaited."""
        batch = self._take()
        if not batch:
            return 0
        await self.aengine._call(self._write, batch)
        for pending in batch:
            if not pending.done.done():
                pending.done.set_result(None)
        return len(batch)

    def start(self) -> AsyncBatchCompleter:
        if self._task is None:
            self._stopped = False
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="fsm-completer")
        return self

    async def stop(self) -> None:
        """Write what is pending, then stop (idempotent); later outcomes are fired alone."""
        self._stopped = True
        self._look.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while await self.run_once():
            pass

    async def _loop(self) -> None:
        while True:
            with self._changed:
                due = self._due()
            if due is None and self._stopped:
                return
            if due != 0.0:
                self._look.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due):
                        await self._look.wait()
                continue
            try:
                await self.run_once()
            except Exception:  # pragma: no cover - run_once answers every handler itself
                log.exception("the batch completer failed")


def _answer(result: Fired | BaseException | None) -> FireResult:
    if isinstance(result, BaseException):
        raise result
    assert result is not None
    return result


__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_DELAY", "AsyncBatchCompleter", "BatchCompleter"]
