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

:meth:`BatchCompleter.run_once` writes what is pending now (the unit of test); the thread
only schedules it.  After :meth:`BatchCompleter.stop` an outcome is fired on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fsm.engine.many import Fire, Fired
from fsm.errors import ConfigError
from fsm.records import Lease, Snapshot

if TYPE_CHECKING:
    from fsm.engine import Engine, FireResult

log = logging.getLogger("fsm.worker")

DEFAULT_MAX_BATCH = 64
"""The most outcomes one transaction writes."""
DEFAULT_MAX_DELAY = timedelta(milliseconds=2)
"""The longest an outcome waits for others to share its commit."""


class _Pending:
    """One outcome waiting for its batch.  ``done`` is a bare lock, held until the answer
    is in (a lock is a C object: an Event would be two Python objects per outcome)."""

    __slots__ = ("done", "item", "result")

    def __init__(self, item: Fire) -> None:
        self.item = item
        self.result: Fired | BaseException | None = None
        self.done = _allocate_lock()
        self.done.acquire()


class BatchCompleter:
    """Fires handlers' outcomes in batches (see the module doc).

    ``all_waiting(n)``: whether ``n`` pending outcomes are all that can come now (the
    worker: every running handler waits on the completer); then the batch is written at
    once instead of after ``max_delay``."""

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
        self._pending: list[_Pending] = []
        self._first_at = 0.0
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- the handlers' side ------------------------------------------------------------

    def fire(
        self, entity: Snapshot | FireResult, event: str, *, lease: Lease | None, data: Mapping[str, Any] | None = None
    ) -> FireResult:
        """Fire ``event`` from the held ``entity`` in the next batch; returns once it
        committed, or raises its own refusal (what :meth:`Engine.fire` would raise)."""
        pending = _Pending(Fire(entity, event, lease, data))
        with self._changed:
            running = not self._stopped and self._thread is not None
            if running:
                pending_now = self._pending
                pending_now.append(pending)
                n = len(pending_now)
                if n == 1:
                    self._first_at = time.monotonic()
                # the thread sleeps until the first outcome's delay is over: woken for the
                # first one (the delay starts) and when the batch is due at once, not for
                # each outcome in between (a wake-up each is a thread switch each)
                if n == 1 or n >= self.max_batch or self.all_waiting(n):
                    self._changed.notify()
        if not running:  # not running: on its own, as fire_many would write it
            (alone,) = self.engine.fire_many([pending.item])
            return _answer(alone)
        pending.done.acquire()
        return _answer(pending.result)

    def wake(self) -> None:
        """Look again whether every handler waits (the worker calls it when one finishes)."""
        with self._changed:
            if self._pending and self.all_waiting(len(self._pending)):
                self._changed.notify()

    # -- one batch -----------------------------------------------------------------------

    def run_once(self) -> int:
        """Write the outcomes pending now, at most ``max_batch``, in one transaction; how
        many were written (refusals included)."""
        with self._changed:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            if self._pending:
                self._first_at = time.monotonic()
        if not batch:
            return 0
        try:
            results: list[Fired | BaseException] = list(self.engine.fire_many([p.item for p in batch]))
        except BaseException as err:  # the store failed the whole batch: every handler hears it
            log.warning("a batch of %d outcomes failed: %s", len(batch), err)
            results = [err] * len(batch)
        self.batches += 1
        self.outcomes += len(batch)
        for pending, result in zip(batch, results, strict=True):
            pending.result = result
            pending.done.release()
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

    def _due(self) -> float | None:
        """Seconds until the pending batch must be written (0: now), None when empty."""
        n = len(self._pending)
        if not n:
            return None
        if self._stopped or n >= self.max_batch or self.all_waiting(n):
            return 0.0
        return max(0.0, self._first_at + self.max_delay - time.monotonic())

    def _loop(self) -> None:
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


def _answer(result: Fired | BaseException | None) -> FireResult:
    if isinstance(result, BaseException):
        raise result
    assert result is not None
    return result


__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_DELAY", "BatchCompleter"]
