"""The inspector's live feed: ``GET /events``, server-sent events over the store's feed.

A transition made in another process (a reaper's, a worker's) reaches the page through the
store's feed of committed transitions (:meth:`stores.Store.feed`, the feed that
``engine.watch`` reads), not through signals, which are in-process:

- each event is ``id: <feed position>``, ``event: transition`` and ``data:`` the
  :class:`signals.FeedPayload` as JSON.  A browser that reconnects sends the last id it
  saw as ``Last-Event-ID`` and the stream goes on just after it: nothing lost, nothing
  twice.  Without one, the stream starts at what commits from now on (``feed_head``),
  and says where that is at once (an ``id:`` line with no event), so even a reconnect
  before the first transition resumes without a gap.  ``?after=<position>`` does the same
  for clients that cannot set the header;
- ``?id=<entity>`` keeps only one entity's transitions (the entity page), ``?kind=`` one
  lifecycle's.  The stream's id still moves past the others (an ``id:`` line alone), so a
  resume does not read them again;
- a comment line every ``heartbeat`` seconds keeps proxies from closing an idle stream;
- the reads are the feed's keyset reads (:mod:`fsm.engine.watch`'s pacing): one every
  ``poll`` seconds while nothing is new, at once while pages come back full, and on
  PostgreSQL as soon as a ``NOTIFY`` arrives (``store.enable_feed_notify()``).

Bounded per connection and per server: one page (:data:`fsm.engine.watch.PAGE` entries)
held at a time, written as the client reads it; at most ``max_streams`` streams at once
(more get 503, and the page falls back to polling); each stream ends after ``max_age``
seconds and the browser resumes from its ``Last-Event-ID``.  :meth:`Streams.close` ends
every stream at once, so a server that shuts down is not held open by its browsers.

A bad ``Last-Event-ID``, ``after``, ``id`` or ``kind`` gets a 400 before the stream starts
(the store's own checks: :func:`stores.feed.feed_args`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fsm.engine.watch import PAGE, Pacer
from fsm.errors import ConfigError
from fsm.records import FeedEntry

log = logging.getLogger("fsm.inspect")

RETRY_MS = 2000
"""How long a browser waits before reconnecting a stream that ended (the ``retry:`` field)."""


@dataclass(frozen=True)
class StreamLimits:
    """How ``/events`` streams are paced and bounded (see the module docstring)."""

    poll: float = 1.0
    heartbeat: float = 15.0
    max_streams: int = 32
    max_age: float = 300.0

    def __post_init__(self) -> None:
        for name in ("poll", "heartbeat", "max_age"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.001 <= value <= 86400:
                raise ConfigError(f"{name} must be a number of seconds from 0.001 to 86400, not {value!r}")
        if isinstance(self.max_streams, bool) or not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ConfigError(f"max_streams must be a positive integer, not {self.max_streams!r}")


class Streams:
    """The open streams of one inspector: counted against ``max_streams``, all ended by
    :meth:`close` (from any thread)."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._next = 0
        self.closed = False

    def opened(self) -> int:
        """How many streams are open now."""
        with self._lock:
            return len(self._open)

    def enter(self, stop: asyncio.Event) -> int | None:
        """Register a new stream; ``None`` when the server is full or closing."""
        with self._lock:
            if self.closed or len(self._open) >= self.limits.max_streams:
                return None
            self._next += 1
            self._open[self._next] = (asyncio.get_running_loop(), stop)
            return self._next

    def leave(self, key: int) -> None:
        with self._lock:
            self._open.pop(key, None)

    def close(self) -> None:
        """End every open stream now and refuse new ones (idempotent)."""
        with self._lock:
            self.closed = True
            found = list(self._open.values())
        for loop, stop in found:
            if not loop.is_closed():
                loop.call_soon_threadsafe(stop.set)


def transition_event(entry: FeedEntry) -> str:
    """One feed entry as a server-sent event (JSON has no raw line break: one ``data:`` line)."""
    from signals.payloads import FeedPayload

    return f"id: {entry.position}\nevent: transition\ndata: {FeedPayload.of(entry).model_dump_json()}\n\n"


async def _wait(wake: asyncio.Event, stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or until woken or stopped; whether a wake-up came."""
    if seconds <= 0:
        return wake.is_set()
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return wake.is_set()


async def stream(
    read: Callable[[str | None], Any],
    start: str,
    *,
    entity_id: str | None,
    limits: StreamLimits,
    stop: asyncio.Event,
    subscribe: Callable[[Callable[[], None]], Callable[[], None] | None] | None,
) -> AsyncIterator[str]:
    """The event stream from just after ``start``; ``read(position)`` is an awaitable feed
    read (a page after ``position``); ``subscribe`` the store's ``feed_wakeup`` (or None)."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    unsubscribe = None
    if subscribe is not None:

        def wake_up() -> None:  # on the listener's thread
            loop.call_soon_threadsafe(wake.set)

        unsubscribe = await asyncio.to_thread(subscribe, wake_up)
    position, told = start, start
    ends = loop.time() + limits.max_age
    pacer = Pacer(limits.poll)
    quiet_since = loop.time()
    woken = False
    try:
        yield f"retry: {RETRY_MS}\nid: {start}\n: connected\n\n"
        while not stop.is_set():
            wake.clear()
            try:
                page: list[FeedEntry] = await read(position)
            except Exception as err:  # the store went away: end; the browser retries, then polls
                log.warning("fsm inspect: an event stream's read failed, ending it: %s", err)
                return
            for entry in page:
                position = entry.position
                if entity_id is None or entry.record.entity_id == entity_id:
                    yield transition_event(entry)
                    told, quiet_since = position, loop.time()
            if position != told:  # past entries the filter kept out: move the client's id on
                yield f"id: {position}\n\n"
                told = position
            if len(page) >= PAGE:
                continue
            now = loop.time()
            if now >= ends:
                return  # the browser reconnects from its Last-Event-ID
            if now - quiet_since >= limits.heartbeat:
                yield ": keep-alive\n\n"
                quiet_since = now
            wait = min(pacer.next_wait(woken, bool(page)), limits.heartbeat - (now - quiet_since), ends - now)
            woken = await _wait(wake, stop, wait)
    finally:
        if unsubscribe is not None:
            unsubscribe()


def end_streams_on_exit(server: Any, app: Any) -> None:
    """Make a ``uvicorn.Server``'s shutdown (SIGINT, SIGTERM) end ``app``'s event streams
    first: uvicorn waits for every open response before it stops, and a stream never
    ends by itself."""
    streams: Streams | None = getattr(app, "streams", None)
    original = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        if streams is not None:
            streams.close()
        original(sig, frame)

    server.handle_exit = handle_exit


__all__ = ["RETRY_MS", "StreamLimits", "Streams", "end_streams_on_exit", "stream", "transition_event"]
