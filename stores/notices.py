"""In-process wake-ups, shared by every store: channels and their subscribers.

A worker that drained its queue sleeps until its poll interval or a wake-up.  A store
that makes work claimable (``create``, ``create_many``, ``release_lease``,
``notify_work``) tells the subscribers of the lifecycle's :func:`channel` after its
commit: in this process through :class:`LocalNotices` (SQLite, which has no ``NOTIFY``,
and the memory store), across processes through PostgreSQL's ``NOTIFY``
(:mod:`stores.sql.notify`).  A wake-up is a hint, never a promise: workers still poll,
so a lost one only costs latency.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable

from fsm.errors import InvalidArgument

log = logging.getLogger("fsm.notify")

MAX_CHANNEL = 63
"""PostgreSQL's longest identifier (``NAMEDATALEN - 1`` bytes): a channel name's limit."""
Callback = Callable[[], None]


def channel(table_prefix: str, kind: str) -> str:
    """The notification channel of lifecycle ``kind`` in the tables named by ``table_prefix``.

    At most :data:`MAX_CHANNEL` bytes: a longer name is cut and a hash of the whole added,
    so two long names still differ."""
    name = f"{table_prefix}{kind}"
    if len(name.encode()) <= MAX_CHANNEL:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:16]
    head = name.encode()[: MAX_CHANNEL - 17].decode(errors="ignore")
    return f"{head}_{digest}"


class Subscribers:
    """Callbacks per channel, thread-safe; a failing callback is logged, the others run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_channel: dict[str, list[Callback]] = {}

    def add(self, name: str, callback: Callback) -> Callable[[], None]:
        if not callable(callback):
            raise InvalidArgument(f"a wake-up callback must be callable, not {callback!r}")
        with self._lock:
            self._by_channel.setdefault(name, []).append(callback)

        def remove() -> None:
            with self._lock:
                found = self._by_channel.get(name, [])
                if callback in found:
                    found.remove(callback)
                if not found:
                    self._by_channel.pop(name, None)

        return remove

    def channels(self) -> set[str]:
        with self._lock:
            return set(self._by_channel)

    def call(self, name: str | None) -> None:
        """Call the callbacks of channel ``name`` (of every channel when ``None``)."""
        with self._lock:
            if name is None:
                callbacks = [cb for found in self._by_channel.values() for cb in found]
            else:
                callbacks = list(self._by_channel.get(name, ()))
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one subscriber's bug never stops the others' wake-ups
                log.exception("wake-up callback %r failed", callback)


class LocalNotices:
    """In-process wake-ups: a write that made work claimable calls the channel's
    subscribers after its commit (SQLite and memory stores; see the module doc)."""

    def __init__(self) -> None:
        self.subscribers = Subscribers()

    def subscribe(self, name: str, callback: Callback) -> Callable[[], None]:
        return self.subscribers.add(name, callback)

    def notify(self, name: str) -> None:
        self.subscribers.call(name)


_LOCAL: dict[str, LocalNotices] = {}
_LOCAL_LOCK = threading.Lock()


def local_notices(database: str) -> LocalNotices:
    """The in-process notices of one database (every store on it in this process shares them)."""
    with _LOCAL_LOCK:
        found = _LOCAL.get(database)
        if found is None:
            found = _LOCAL[database] = LocalNotices()
        return found


__all__ = ["MAX_CHANNEL", "Callback", "LocalNotices", "Subscribers", "channel", "local_notices"]
