"""A worker's wake-ups: subscribe it to its store's notices of claimable work.

A store with the :class:`stores.base.WorkNotices` capability (memory, SQLite, PostgreSQL
and their async faces) calls the worker's ``wake()`` when work of its lifecycle may have
become claimable (PostgreSQL: a ``NOTIFY`` heard on the process's one ``LISTEN``
connection).  Polling stays: a store without the capability, or a subscription that
fails, leaves the worker polling at its interval, as before.

A row waiting out a retry's backoff becomes claimable by the clock, with nobody to send a
wake-up: a drained worker asks the store when the next one is due
(:class:`stores.base.DueTimes`, :func:`due_in`) and sleeps no longer than that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fsm.errors import FsmError

log = logging.getLogger("fsm.worker")


def _nothing() -> None:
    return None


def subscribe_wakeups(store: object, kind: str, wake: Callable[[], None]) -> Callable[[], None]:
    """Subscribe ``wake`` to ``store``'s notices of ``kind``; returns the unsubscribe
    function (a no-op when the store has no notices or the subscription failed)."""
    subscribe = getattr(store, "subscribe_work", None)
    if subscribe is None:
        return _nothing
    try:
        unsubscribe: Callable[[], None] = subscribe(kind, wake)
    except (FsmError, OSError) as err:  # no wake-ups: the poll still finds the work
        log.warning("no wake-ups for %s, polling only: %s", kind, err)
        return _nothing
    return unsubscribe


def due_in(store: object, kind: str, states: tuple[str, ...]) -> float | None:
    """Seconds until the next row of ``kind`` in ``states`` becomes due, from ``store``'s
    ``next_due`` (``None``: none waits, the store cannot tell, or the read failed)."""
    next_due = getattr(store, "next_due", None)
    if next_due is None or not states:
        return None
    try:
        found: float | None = next_due(kind, states)
    except (FsmError, OSError) as err:  # the poll interval still bounds the wait
        log.info("could not read the next due time of %s: %s", kind, err)
        return None
    return found


async def due_in_async(store: object, kind: str, states: tuple[str, ...]) -> float | None:
    """:func:`due_in` on an async store (its ``next_due`` is a coroutine)."""
    next_due = getattr(store, "next_due", None)
    if next_due is None or not states:
        return None
    try:
        found: float | None = await next_due(kind, states)
    except (FsmError, OSError) as err:
        log.info("could not read the next due time of %s: %s", kind, err)
        return None
    return found


__all__ = ["due_in", "due_in_async", "subscribe_wakeups"]
