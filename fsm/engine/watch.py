"""``engine.watch``: a live feed of committed transitions, across processes.

Signals are in-process: a transition made by another process (a reaper's, a worker's)
reaches no receiver here.  ``watch`` reads the store's feed instead (:meth:`stores.Store.feed`,
keyset reads in commit order, resumable from any position it gave), so it sees every
committed transition of its lifecycle, whoever made it.  It polls every ``poll`` seconds
while nothing is new and reads again at once while pages come back full.  A missed wake-up
costs at most one ``poll`` of latency, never an entry.

Both faces: :meth:`fsm.Engine.watch` (an iterator) and :meth:`fsm.aio.AsyncEngine.watch`
(an async iterator) share :func:`watch_args` and :class:`Cursor`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator

from fsm.errors import InvalidArgument
from fsm.records import FeedEntry

DEFAULT_POLL = 0.5
"""Seconds between reads while nothing is new."""
PAGE = 500


def watch_args(
    after: object,
    poll: object,
    timeout: object,
    *,
    from_start: object = False,
    stop: object = None,
    asynchronous: bool = False,
) -> tuple[float, float | None]:
    """Check every argument of ``watch`` at call time, before anything is read
    (``InvalidArgument``); the store checks that ``after`` is one of its positions.

    ``after``: a string or None; ``from_start``: a bool; ``poll``: seconds from 0.001 to
    3600; ``timeout``: finite, non-negative seconds or None; ``stop``: see :func:`stop_arg`.
    Returns ``poll`` and ``timeout`` as floats."""
    if after is not None and not isinstance(after, str):
        raise InvalidArgument(f"after must be a feed position (a string) or None, not {type(after).__name__}")
    if not isinstance(from_start, bool):
        raise InvalidArgument(f"from_start must be True or False, not {_shown(from_start)}")
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not (0.001 <= poll <= 3600):
        raise InvalidArgument(f"poll must be a number of seconds from 0.001 to 3600, not {_shown(poll)}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout < 0
    ):
        raise InvalidArgument(
            f"timeout must be a finite, non-negative number of seconds or None (no timeout), not {_shown(timeout)}"
        )
    stop_arg(stop, asynchronous=asynchronous)
    return float(poll), None if timeout is None else float(timeout)


def stop_arg(stop: object, *, asynchronous: bool = False) -> None:
    """Check a watch's ``stop``: None, or an event the watch can wait on -- for the sync
    face a :class:`threading.Event` (or any object with ``is_set()`` and a blocking
    ``wait(timeout)``, such as a ``multiprocessing`` event), for the async face an
    :class:`asyncio.Event` (``is_set()`` and a coroutine ``wait()``).  ``InvalidArgument``
    otherwise: an event of the other face would never stop the watch (or spin it)."""
    if stop is None:
        return
    if not asynchronous and isinstance(stop, threading.Event):
        return
    if asynchronous and isinstance(stop, asyncio.Event):
        return
    is_set = getattr(stop, "is_set", None)
    wait = getattr(stop, "wait", None)
    if callable(is_set) and callable(wait) and inspect.iscoroutinefunction(wait) == asynchronous:
        return
    wanted = "an asyncio.Event" if asynchronous else "a threading.Event"
    raise InvalidArgument(f"stop must be {wanted} or None, not {_shown(stop)}")


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class Cursor:
    """Where a watch stands: the position after the last entry it yielded."""

    def __init__(self, position: str | None) -> None:
        self.position = position

    def advance(self, page: list[FeedEntry]) -> None:
        if page:
            self.position = page[-1].position


Wakeup = Callable[[Callable[[], None]], Callable[[], None] | None]
"""A store's ``feed_wakeup``: subscribe a callback called when the feed may have grown
(PostgreSQL with ``enable_feed_notify``); returns its unsubscribe, or None."""


class Pacer:
    """How long a watch waits before its next read (both faces).

    ``poll`` while nothing happens.  After a wake-up whose read found nothing, a short
    backoff (50 ms, doubling up to ``poll``): on PostgreSQL a commit may be held back by an
    older transaction still running (:mod:`stores.sql.feed`), and its notification came
    already."""

    FIRST_RETRY = 0.05

    def __init__(self, poll: float) -> None:
        self.poll = poll
        self.retry: float | None = None

    def next_wait(self, woken: bool, found: bool) -> float:
        if found or not (woken or self.retry is not None):
            self.retry = None
            return self.poll
        self.retry = self.FIRST_RETRY if self.retry is None else min(self.retry * 2, self.poll)
        return self.retry


STOP_CHECK = 0.25
"""Longest slice a woken-by-NOTIFY watch waits before looking at its ``stop`` event."""


def watch_sync(
    feed: Callable[[str | None], list[FeedEntry]],
    cursor: Cursor,
    poll: float,
    timeout: float | None,
    stop: threading.Event | None,
    wakeup: Wakeup | None = None,
) -> Iterator[FeedEntry]:
    """The sync face's loop: read pages until ``stop`` is set or ``timeout`` has passed;
    between reads, wait (:class:`Pacer`) or until the store's wake-up fires.

    Not a generator itself: ``stop`` is checked here, when the watch is made, so a bad one
    is refused by the call, not on the first ``next``."""
    stop_arg(stop)
    return _watch_loop(feed, cursor, poll, timeout, stop, wakeup)


def _watch_loop(
    feed: Callable[[str | None], list[FeedEntry]],
    cursor: Cursor,
    poll: float,
    timeout: float | None,
    stop: threading.Event | None,
    wakeup: Wakeup | None,
) -> Iterator[FeedEntry]:
    deadline = None if timeout is None else time.monotonic() + timeout
    stopped = stop if stop is not None else threading.Event()
    wake = threading.Event()
    unsubscribe = wakeup(wake.set) if wakeup is not None else None
    pacer = Pacer(poll)
    woken = False
    try:
        while not stopped.is_set():
            wake.clear()
            page = feed(cursor.position)
            for entry in page:
                cursor.position = entry.position
                yield entry
            if len(page) >= PAGE:
                continue  # more is waiting: read on at once
            wait = pacer.next_wait(woken, bool(page))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            woken = _wait(wake if unsubscribe is not None else None, stopped, wait if left is None else min(wait, left))
    finally:
        if unsubscribe is not None:
            unsubscribe()


def _wait(wake: threading.Event | None, stopped: threading.Event, seconds: float) -> bool:
    """Wait ``seconds``, or until woken or stopped; whether a wake-up came."""
    if wake is None:
        stopped.wait(seconds)
        return False
    end = time.monotonic() + seconds
    while not stopped.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        if wake.wait(min(left, STOP_CHECK)):
            return True
    return False


__all__ = ["DEFAULT_POLL", "PAGE", "STOP_CHECK", "Cursor", "Pacer", "Wakeup", "stop_arg", "watch_args", "watch_sync"]
