"""PostgreSQL wake-ups for the feed: an opt-in ``NOTIFY`` per history insert statement, and
one ``LISTEN`` connection per store that wakes its watchers.

Opt-in (:meth:`FeedNotifyOps.enable_feed_notify`), not part of the schema: PostgreSQL
serializes the commits of transactions that sent ``NOTIFY`` (one lock on the notification
queue, held through the commit), so a trigger on every transition would cap the writers'
throughput that the batched paths work for.  Without it ``watch`` polls its keyset read
every ``poll`` seconds; with it a watcher reads as soon as a transition commits.  Either
way the keyset read decides what is new, so a missed or coalesced notification loses
nothing: at most one ``poll`` of latency.

The issue-22 notifier (``stores.sql.notify.Listener``, workers' wake-ups) is the same
shape; when both are on main, this listener should become a subscription to that one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from stores.sql.core import SqlCore

log = logging.getLogger("fsm.notify")

POLL = 0.2
"""Seconds the listening thread waits for a notification before checking it should stop."""
RECONNECT = 0.5


def channel(prefix: str) -> str:
    """The feed's channel of the store with this table prefix."""
    return f"{prefix}feed"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class FeedListener:
    """One autocommit psycopg connection of its own, listening on one channel on a thread;
    each notification (and each reconnection, which may have missed some) calls every
    subscriber."""

    def __init__(self, connect: Callable[[], Any], name: str) -> None:
        self._connect = connect
        self.channel = name
        self._subscribers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on each notification; returns the function that unsubscribes.
        Returns once the channel is listened to (or after 5 s if the server cannot be reached)."""
        with self._lock:
            self._subscribers.append(callback)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="fsm-feed-listener", daemon=True)
                self._thread.start()
        self._listening.wait(5)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _wake(self) -> None:
        with self._lock:
            callbacks = list(self._subscribers)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a watcher's wake-up never stops the others'
                log.exception("feed wake-up callback failed")

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as err:
                log.warning("cannot connect to listen for the feed (retrying): %s", err)
                self._stop.wait(RECONNECT)
                continue
            try:
                conn.execute(f"LISTEN {_quote(self.channel)}")
                self._listening.set()
                if not first:
                    self._wake()  # what was sent while we were away is lost: read now
                first = False
                while not self._stop.is_set():
                    if any(True for _ in conn.notifies(timeout=POLL, stop_after=64)):
                        self._wake()
            except Exception as err:
                if not self._stop.is_set():
                    log.warning("feed listening connection lost, reconnecting: %s", err)
                    self._stop.wait(RECONNECT)
            finally:
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    conn.close()


class FeedNotifyOps(SqlCore):
    """``enable_feed_notify``, ``disable_feed_notify`` and ``feed_wakeup`` of a PostgreSQL
    :class:`stores.sql.SqlStore` (SQLite: the feed is polled; these refuse or do nothing)."""

    def _feed_names(self) -> tuple[str, str, str]:
        prefix = self.table_prefix  # type: ignore[attr-defined]
        return f"{prefix}feed_notify", channel(prefix), self._sql.H

    def enable_feed_notify(self) -> None:
        """Install the statement trigger that sends ``NOTIFY`` after each history insert
        (idempotent; PostgreSQL only, else ``ConfigError``).  Mind the cost (module doc)."""
        from fsm.errors import ConfigError

        if self._f.name != "postgresql":
            raise ConfigError("feed notifications are PostgreSQL's; SQLite's feed is polled")
        function, name, table = self._feed_names()
        schema = getattr(self, "schema", None)
        qualified = f"{_quote(schema)}.{_quote(function)}" if schema else _quote(function)
        statements = (
            f"CREATE OR REPLACE FUNCTION {qualified}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$fsm$ BEGIN PERFORM pg_notify('{name}', ''); RETURN NULL; END $fsm$",
            f"CREATE OR REPLACE TRIGGER {_quote(function)} AFTER INSERT ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {qualified}()",
        )
        with self.engine.begin() as conn:  # type: ignore[attr-defined]
            for statement in statements:
                conn.exec_driver_sql(statement)

    def disable_feed_notify(self) -> None:
        """Remove the trigger (idempotent; a no-op on SQLite)."""
        if self._f.name != "postgresql":
            return
        function, _, table = self._feed_names()
        with self.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {_quote(function)} ON {table}")

    def feed_wakeup(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` when the feed may have grown (PostgreSQL, with the trigger on);
        returns the unsubscribe function, or None where there is nothing to listen to."""
        if self._f.name != "postgresql":
            return None
        listener: FeedListener | None = getattr(self, "_feed_listener", None)
        if listener is None:
            import psycopg

            url = self.engine.url.set(drivername="postgresql")  # type: ignore[attr-defined]
            dsn = url.render_as_string(hide_password=False)
            listener = FeedListener(lambda: psycopg.connect(dsn, autocommit=True), self._feed_names()[1])
            self._feed_listener: FeedListener | None = listener
        return listener.subscribe(callback)

    def _close_feed_listener(self) -> None:
        listener: FeedListener | None = getattr(self, "_feed_listener", None)
        if listener is not None:
            listener.close()
            self._feed_listener = None


__all__ = ["FeedListener", "FeedNotifyOps", "channel"]
