"""The thread worker's handler threads: a fixed pool fed by one queue.

``concurrent.futures.ThreadPoolExecutor`` makes a ``Future`` (a condition and a lock)
per submitted call and the worker never reads it: every claimed job paid for two Python
objects and their notifications.  :class:`HandlerPool` hands each job to one of
``size`` threads through a :class:`queue.SimpleQueue` (a C queue) and nothing more; the
worker counts its slots itself, so a job never waits in the queue for long.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("fsm.worker")

T = TypeVar("T")


class HandlerPool(Generic[T]):
    """Calls ``work(item)`` on one of ``size`` threads for each :meth:`submit`ted item."""

    def __init__(self, work: Callable[[T], None], size: int, name: str) -> None:
        self._work = work
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, item: T) -> None:
        """Run ``work(item)`` on a pool thread; ``RuntimeError`` once shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler pool is shut down")
            if len(self._threads) < self._size:  # one more thread per job until the pool is full
                thread = threading.Thread(target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._queue.put(item)

    def shutdown(self) -> list[T]:
        """Take no more items; the threads end once their current item is done.  Returns
        the items submitted but not started (their owner gives them back).  Idempotent."""
        with self._lock:
            self._closed = True
            left: list[T] = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    left.append(item)
            for _ in self._threads:
                self._queue.put(None)
        return left

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._work(item)
            except Exception:  # the worker's own bookkeeping failed: the thread keeps serving
                log.exception("a handler thread's job failed")


__all__ = ["HandlerPool"]
