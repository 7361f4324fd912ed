"""PostgreSQL wake-ups: ``NOTIFY`` in the write, one ``LISTEN`` connection per process.

- **Sending**: the PostgreSQL store sends ``NOTIFY`` on the lifecycle's channel
  (:func:`stores.notices.channel`: the table prefix and the kind, so stores sharing a
  database never wake each other's workers) in the statement or transaction that makes
  work claimable (``create``, ``create_many``, ``release_lease``, ``notify_work``):
  PostgreSQL delivers it only if that write commits, so a rolled-back write wakes nobody.
- **Listening**: :class:`Listener` owns one connection of its own that listens (``LISTEN``) on
  every channel somebody subscribed to, and fans each notification out to the
  subscribers' callbacks (after River's ``internal/notifier``: one connection per process
  and database, :func:`listener_for`, not one per worker).  When the connection drops it
  reconnects with a backoff, listens again, and calls every callback once, since what was
  sent meanwhile is lost.

Polling stays the fallback (every worker still polls), so a lost notification or a
reconnect never loses work.  The feed's wake-ups (``engine.watch``, the inspector's
``/events``: :meth:`stores.sql.SqlStore.feed_wakeup`) are one more channel on the same
connection, so a process listens once, however many workers and watchers it runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from stores.notices import Callback, Subscribers

log = logging.getLogger("fsm.notify")

RECONNECT_DELAYS = (0.05, 0.2, 1.0, 5.0)
"""Seconds between reconnection attempts, the last one repeated."""
POLL = 0.1
"""How long the listener's thread waits for a notification before looking at its
subscriptions again (a new channel is listened to within this)."""
SUBSCRIBE_WAIT = 5.0
"""The longest :meth:`Listener.subscribe` waits for its channel to be listened to."""


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier (for ``LISTEN``, which takes no parameter)."""
    return '"' + name.replace('"', '""') + '"'


class Listener:
    """One ``LISTEN`` connection of its own on a thread, fanned out to subscribers.

    ``connect`` opens a new autocommit psycopg connection (called again to reconnect).
    The thread starts with the first subscription and stops at :meth:`close` (or when
    the last subscriber leaves).  ``on_reconnect`` is called after every reconnection
    (tests wait on it)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.subscribers = Subscribers()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._conn: Any = None
        self._listened: dict[str, threading.Event] = {}
        self.reconnects = 0
        self.on_reconnect: Callback | None = None

    def subscribe(self, name: str, callback: Callback) -> Callable[[], None]:
        """Call ``callback`` (on the listener's thread) on each notification of ``name``,
        and once after each reconnection; returns the function that unsubscribes."""
        remove = self.subscribers.add(name, callback)
        with self._lock:
            listened = self._listened.get(name)
            if listened is None:
                listened = self._listened[name] = threading.Event()
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="fsm-listener", daemon=True)
                self._thread.start()
        # return once the channel is listened to, so what commits from now on is heard; a
        # database that cannot be reached leaves the subscriber polling, not blocked
        listened.wait(SUBSCRIBE_WAIT)
        return remove

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def drop_connection(self) -> None:
        """Close the listening connection under the thread (tests: a lost connection)."""
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a connection that is going anyway
                conn.close()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        attempt = 0
        first = True
        while not self._stop.is_set():
            try:
                conn = self._conn = self._connect()
            except Exception as err:
                delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
                attempt += 1
                log.warning("cannot connect to listen (retrying in %.2f s): %s", delay, err)
                self._stop.wait(delay)
                continue
            attempt = 0
            try:
                listening: set[str] = set()
                self._listen(conn, listening)
                if not first:
                    self.reconnects += 1
                    self.subscribers.call(None)  # what was sent while we were away is lost
                    if self.on_reconnect is not None:
                        self.on_reconnect()
                first = False
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=POLL, stop_after=64):
                        self.subscribers.call(note.channel)
                    self._listen(conn, listening)
            except Exception as err:
                if not self._stop.is_set():
                    log.warning("listening connection lost, reconnecting: %s", err)
                    self._stop.wait(RECONNECT_DELAYS[0])
            finally:
                self._conn = None
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    conn.close()

    def _listen(self, conn: Any, listening: set[str]) -> None:
        """``LISTEN`` to the channels subscribed since, ``UNLISTEN`` the abandoned ones."""
        wanted = self.subscribers.channels()
        for name in wanted - listening:
            conn.execute(f"LISTEN {quote(name)}")
        for name in listening - wanted:
            conn.execute(f"UNLISTEN {quote(name)}")
        listening.clear()
        listening.update(wanted)
        with self._lock:
            for name in wanted:
                event = self._listened.get(name)
                if event is not None:
                    event.set()
            for name in set(self._listened) - wanted:
                del self._listened[name]


def conninfo_of(engine: Any) -> str:
    """The libpq connection string of a SQLAlchemy engine (the key of :func:`listener_for`:
    every store on one database shares its listener)."""
    return str(engine.url.set(drivername="postgresql").render_as_string(hide_password=False))


_LISTENERS: dict[str, Listener] = {}
_LISTENERS_LOCK = threading.Lock()


def listener_for(conninfo: str) -> Listener:
    """This process's one :class:`Listener` on the database ``conninfo`` names (a libpq
    connection string or URL), made at the first call."""
    with _LISTENERS_LOCK:
        found = _LISTENERS.get(conninfo)
        if found is None:

            def connect() -> Any:
                import psycopg

                return psycopg.connect(conninfo, autocommit=True)

            found = _LISTENERS[conninfo] = Listener(connect)
        return found


__all__ = ["Listener", "conninfo_of", "listener_for", "quote"]
