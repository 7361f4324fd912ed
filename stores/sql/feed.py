"""``feed`` and ``feed_head`` of :class:`stores.sql.SqlStore`: committed transitions in an
order no concurrent commit can break.

Why not a timestamp or a sequence: ``at`` is the writing transaction's clock (PostgreSQL's
``now()`` is its start), and a sequence value is taken before the commit, so a reader that
saw row 11 may later see row 10 commit; a cursor past 11 would skip it.  A look-back window
only narrows that race and re-reads its window on every poll.

- **SQLite** has one writer at a time (``BEGIN IMMEDIATE``), so the history rows' rowid
  order is their commit order: the position is the rowid, the read a rowid range (the
  table's own key, no index to add).  SQLite reuses a rowid only when the newest rows are
  deleted (an entity's hard delete, a prune of the newest history), never in the library's
  own writes.
- **PostgreSQL**: each history row carries the id of the transaction that wrote it
  (``txid``, default ``pg_current_xact_id()``; migration 0003).  A reader takes only rows
  whose transaction is older than its snapshot's ``xmin``, the oldest transaction still
  running: every such transaction has committed or rolled back, and any transaction that
  commits later has a larger id.  So the keyset ``(txid, entity_id, seq)`` below that bound
  is final, and a cursor over it never skips a late commit.  The price: a transaction left
  open anywhere on the server holds the feed back (never loses it) until it ends.

Wake-ups (PostgreSQL, opt-in: :meth:`FeedOps.enable_feed_notify`): a statement trigger
sends ``NOTIFY`` on the ``{prefix}feed`` channel after each history insert, and watchers
hear it through the process's one ``LISTEN`` connection (:mod:`stores.sql.notify`, shared
with the workers' wake-ups; it reconnects, and calls every subscriber after a reconnect).
Opt-in, not part of the schema: PostgreSQL serializes the commits of transactions that
sent ``NOTIFY`` (one lock on the notification queue, held through the commit), so a
trigger on every transition would cap the writers' throughput.  Without it a watch polls
its keyset read; with it a watcher reads as soon as a transition commits.  Either way the
keyset read decides what is new, so a missed or coalesced notification loses nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from fsm.errors import ConfigError, InvalidArgument
from fsm.records import FeedEntry
from stores.feed import counter, feed_args
from stores.sql.core import SqlCore
from stores.sql.notify import conninfo_of, listener_for
from stores.sql.notify import quote as quote_name
from stores.sql.rows import history_of
from stores.sql.schema import FEED_TXID, HISTORY_COLUMNS

HORIZON = "(pg_snapshot_xmin(pg_current_snapshot())::text::bigint)"
"""Every transaction with a smaller id has ended (PostgreSQL)."""


class FeedOps(SqlCore):
    """``feed`` and ``feed_head``."""

    def _feed_sql(self) -> dict[str, str]:
        found: dict[str, str] | None = getattr(self, "_feed_statements", None)
        if found is not None:
            return found
        lay, f, sql = self._sql.L, self._f, self._sql
        cols = ", ".join(f"h.{c}" for c in HISTORY_COLUMNS)
        kind = lay.ref("kind", "e")
        join = f"FROM {sql.H} AS h JOIN {sql.E} AS e ON {lay.ref('id', 'e')} = h.entity_id"
        if f.name == "postgresql":
            key = f"h.{FEED_TXID}, h.entity_id, h.seq"
            where = f"({key}) > ({f.p('txid')}, {f.p('eid')}, {f.p('seq')}) AND h.{FEED_TXID} < {HORIZON}"
            pick = f"SELECT h.{FEED_TXID}, {kind}, {cols} {join} WHERE {where}"
            found = {
                "all": f"{pick} ORDER BY {key} LIMIT {f.p('limit')}",
                "kind": f"{pick} AND {kind} = {f.p('kind')} ORDER BY {key} LIMIT {f.p('limit')}",
                "head": f"SELECT {HORIZON}",
            }
        else:
            pick = f"SELECT h.rowid, {kind}, {cols} {join} WHERE h.rowid > {f.p('after')}"
            found = {
                "all": f"{pick} ORDER BY h.rowid LIMIT {f.p('limit')}",
                "kind": f"{pick} AND {kind} = {f.p('kind')} ORDER BY h.rowid LIMIT {f.p('limit')}",
                "head": f"SELECT coalesce(max(rowid), 0) FROM {sql.H}",
            }
        self._feed_statements = found
        return found

    def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        """See :meth:`stores.Store.feed` (the order: this module's docstring)."""
        pg = self._f.name == "postgresql"
        body = feed_args(after, kind, limit, "p" if pg else "s")
        params: dict[str, Any] = {"limit": limit}
        if pg:
            params.update(_pg_cursor(body))
        else:
            params["after"] = counter(body, "s")
        if kind is not None:
            params["kind"] = kind
        statements = self._feed_sql()
        rows = self._run(statements["all" if kind is None else "kind"], params, prepare=False)
        found = []
        for row in rows:
            record = history_of(row[2:])
            position = f"p{row[0]}.{record.seq}.{quote(record.entity_id, safe='')}" if pg else f"s{row[0]}"
            found.append(FeedEntry(position, row[1], record))
        return found

    def feed_head(self) -> str:
        """See :meth:`stores.Store.feed_head`."""
        (row,) = self._run(self._feed_sql()["head"], {})
        # PostgreSQL: before every row of the oldest running transaction (an entity id is
        # never empty, so ``(xmin, "", 0)`` sorts below all of its rows)
        return f"p{row[0]}.0." if self._f.name == "postgresql" else f"s{row[0]}"

    # -- wake-ups (PostgreSQL) -----------------------------------------------------------

    def _feed_names(self) -> tuple[str, str]:
        """The trigger function's name and the channel."""
        prefix = self.table_prefix  # type: ignore[attr-defined]
        return f"{prefix}feed_notify", feed_channel(prefix)

    def enable_feed_notify(self) -> None:
        """Install the statement trigger that sends ``NOTIFY`` after each history insert
        (idempotent; PostgreSQL only, else ``ConfigError``).  Mind the cost (module doc)."""
        if self._f.name != "postgresql":
            raise ConfigError("feed notifications are PostgreSQL's; SQLite's feed is polled")
        function, name = self._feed_names()
        schema = getattr(self, "schema", None)
        qualified = f"{quote_name(schema)}.{quote_name(function)}" if schema else quote_name(function)
        statements = (
            f"CREATE OR REPLACE FUNCTION {qualified}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$fsm$ BEGIN PERFORM pg_notify('{name}', ''); RETURN NULL; END $fsm$",
            f"CREATE OR REPLACE TRIGGER {quote_name(function)} AFTER INSERT ON {self._sql.H} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {qualified}()",
        )
        with self.engine.begin() as conn:  # type: ignore[attr-defined]
            for statement in statements:
                conn.exec_driver_sql(statement)

    def disable_feed_notify(self) -> None:
        """Remove the trigger (idempotent; a no-op on SQLite)."""
        if self._f.name != "postgresql":
            return
        function, _ = self._feed_names()
        with self.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {quote_name(function)} ON {self._sql.H}")

    def feed_wakeup(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (on the listener's thread) when the feed may have grown
        (PostgreSQL, with the trigger on), and after the listener reconnects; returns the
        unsubscribe function, or None where there is nothing to listen to (SQLite)."""
        if self._f.name != "postgresql":
            return None
        remove = listener_for(conninfo_of(self.engine)).subscribe(self._feed_names()[1], callback)  # type: ignore[attr-defined]
        held = self._feed_subscriptions()
        done = threading.Event()

        def unsubscribe() -> None:
            if not done.is_set():
                done.set()
                held.discard(unsubscribe)
                remove()

        held.add(unsubscribe)
        return unsubscribe

    def _feed_subscriptions(self) -> set[Callable[[], None]]:
        found: set[Callable[[], None]] | None = getattr(self, "_feed_subs", None)
        if found is None:
            found = set()
            self._feed_subs: set[Callable[[], None]] = found
        return found

    def _close_feed_listener(self) -> None:
        """At ``close``: this store's watchers stop being woken (the process's listener
        stays for the other stores and the workers)."""
        for unsubscribe in list(self._feed_subscriptions()):
            unsubscribe()


def feed_channel(prefix: str) -> str:
    """The feed's channel of the store with this table prefix (a work channel is
    ``{prefix}{kind}``: a lifecycle named ``feed`` would share it, and each side would only
    read once more for nothing)."""
    return f"{prefix}feed"


def _pg_cursor(body: str | None) -> dict[str, Any]:
    if body is None:
        return {"txid": -1, "eid": "", "seq": 0}
    txid, dot, rest = body.partition(".")
    seq, dot2, entity_id = rest.partition(".")
    ok = dot and dot2 and txid.isascii() and txid.isdigit() and seq.isascii() and seq.isdigit()
    if not ok or len(txid) > 19 or len(seq) > 19 or not entity_id.isascii():
        raise InvalidArgument(f"{'p' + body[:80]!r} is not a feed position of this store")
    try:
        decoded = unquote(entity_id, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{'p' + body[:80]!r} is not a feed position of this store") from None
    return {"txid": int(txid), "eid": decoded, "seq": int(seq)}


__all__ = ["FeedOps", "feed_channel"]
