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
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

from fsm.errors import InvalidArgument
from fsm.records import FeedEntry
from stores.feed import counter, feed_args
from stores.sql.core import SqlCore
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


__all__ = ["FeedOps"]
