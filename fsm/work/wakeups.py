"""A worker's wake-ups: subscribe it to its store's notices of claimable work.

A store with the :class:`stores.base.WorkNotices` capability (memory, SQLite, PostgreSQL
and their async faces) calls the worker's ``wake()`` when work of its lifecycle may have
become claimable (PostgreSQL: a ``NOTIFY`` heard on the process's one ``LISTEN``
connection).  Polling stays: a store without the capability, or a subscription that
fails, leaves the worker polling at its interval, as before.
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


__all__ = ["subscribe_wakeups"]
