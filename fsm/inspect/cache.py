"""A value the page shows from a cache whose age it shows, recomputed off the request path.

Counting every entity of a store costs a scan of its index (~0.1-0.5 s at 1,000,000 rows),
and the page refreshes every 2 s in every open browser: the scan must not run per refresh.
So the counts (and the activity sample) are kept here: a request reads the last value at
once; when that value is older than its ``max_age``, the request starts *one* background
recount (never two at a time) and still answers with the old value, whose age the page
shows ("counts as of 4s ago").  ``max_age`` grows with the cost, so a slow count runs
rarely: at least ``floor`` seconds, and at least ``factor`` times the last count's time
(a 300 ms count is redone at most every 6 s at the default factor 20, whatever the number
of browsers).  Only the very first read waits for a value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("fsm.inspect")


@dataclass(frozen=True)
class Cached(Generic[T]):
    """A computed value, when it was computed (monotonic seconds), and how long it took."""

    value: T
    at: float
    took: float

    def age(self) -> float:
        return max(0.0, time.monotonic() - self.at)


class Recomputed(Generic[T]):
    """``compute()`` cached (see the module docstring); thread-safe."""

    def __init__(self, compute: Callable[[], T], *, floor: float = 5.0, factor: float = 20.0) -> None:
        self.compute = compute
        self.floor, self.factor = floor, factor
        self._last: Cached[T] | None = None
        self._lock = threading.Lock()
        self._running = False
        self.problem: str | None = None
        """Why the last background recount failed (the page shows the older value and this)."""

    def max_age(self) -> float:
        last = self._last
        return self.floor if last is None else max(self.floor, self.factor * last.took)

    def _run(self) -> Cached[T]:
        start = time.monotonic()
        value = self.compute()
        done = time.monotonic()
        found = Cached(value, done, done - start)
        with self._lock:
            self._last = found
        return found

    def _background(self) -> None:
        try:
            self._run()
            self.problem = None
        except Exception as err:  # shown on the page with the older value; the next read retries
            log.warning("fsm inspect: a background recount failed: %s", err)
            self.problem = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        finally:
            with self._lock:
                self._running = False

    def get(self) -> Cached[T]:
        """The cached value (computed now only when there is none yet)."""
        with self._lock:
            last = self._last
            stale = last is not None and last.age() > self.max_age() and not self._running
            if stale:
                self._running = True
        if last is None:
            return self._run()
        if stale:
            threading.Thread(target=self._background, name="fsm-inspect-recount", daemon=True).start()
        return last

    def refresh(self) -> Cached[T]:
        """Recompute now, on the calling thread (tests, and a page that just changed the store)."""
        return self._run()


__all__ = ["Cached", "Recomputed"]
