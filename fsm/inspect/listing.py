"""The entity table's query: filters, keyset pages, a data field search, each on an index.

At 1,000,000 entities the table must never sort or scan the whole store, so the query is
built from index walks the store already has (DESIGN section 5):

- the default list, most recently updated first, is one ``ORDER BY updated_at DESC, id
  DESC LIMIT`` walk of the ``recent`` index ``(kind, state, updated_at, id)`` *per (kind,
  state) pair* (the pairs come from the cached counts and the lifecycles), merged: it
  reads at most ``limit + 1`` rows per pair, whatever the store's size, and sorts none.
  Pages go on by keyset, a seek to ``(updated_at, id) < (the last row shown)`` (a row
  value comparison, the index's own order: exact through rows sharing one
  ``updated_at``), never by ``OFFSET``;
- the id search is a prefix: a range on the primary key;
- the lease filters (expired leases, one holder's leases) walk the lease index
  ``(kind, state, lease_expires_at, ...)``, soonest expiry first: their cost is the rows
  that hold a lease, not the store;
- the data field search (``data.path = value``) filters a bounded window of the same
  walks: at most :data:`SCAN` rows of each pair from the page's position, down to one
  cursor that every pair has reached, with the JSON path and the value bound as
  parameters (``jsonb_extract_path_text`` on PostgreSQL, ``json_extract`` on SQLite).
  The page says how far it searched and links on from there.

Every value is a bound parameter; the SQL is built only from the store's own names.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsm.records import Snapshot
from stores.sql.rows import snapshot_of

SCAN = 1000
"""Rows of each (kind, state) a data field search examines per page, at most."""


@dataclass(frozen=True)
class Listed:
    """One page of the entity table."""

    rows: list[Snapshot]
    more: tuple[str, str] | None = None
    """The keyset position to go on from (``updated_at`` text, id), when there is more."""
    order: str = "updated"
    """``updated`` (most recent first), ``id`` (the id search) or ``expiry`` (lease filters)."""
    searched_to: str = ""
    """How far the data field search went: ``all``, or the ``updated_at`` it stopped at ('': none)."""


def json_path(path: str) -> list[str]:
    """``a.b.c`` as its keys (each non-empty)."""
    return path.split(".")


class ListingSql:
    """Builds and runs the entity table's query on one store (see the module docstring)."""

    def __init__(self, store: Any, live: str, base_params: dict[str, Any]) -> None:
        self.store = store
        sql = store._sql
        self.lay, self.f, self.E = sql.L, store._f, sql.E
        self.pg = self.f.name == "postgresql"
        self.cols = sql.cols_e
        self.live = live
        self.base = base_params
        self.byte_order = self._byte_ordered()

    def ref(self, name: str) -> str:
        return str(self.lay.ref(name, "e"))

    def _byte_ordered(self) -> bool:
        """Whether ids compare by code point (SQLite always; PostgreSQL under a C collation),
        so that a prefix is a range of the primary key."""
        if not self.pg:
            return True
        rows = self.store._run("SELECT 'B' < 'a' AND 'ab-1' < 'ab.' AND 'ab.' < 'abc'", {})
        return bool(rows and rows[0][0])

    def now_params(self, params: dict[str, Any]) -> None:
        now = self.store._now()
        if now is not None:
            params["now"] = self.f.time(now)

    def data_match(self, column: str, params: dict[str, Any], path: str, value: str) -> str:
        """SQL true when the data field at ``path`` of ``column`` equals ``value`` (as text)."""
        p = self.f.p
        params["dvalue"] = value
        if self.pg:
            params["dpath"] = json_path(path)
            return f"jsonb_extract_path_text({column}, VARIADIC CAST({p('dpath')} AS text[])) = {p('dvalue')}"
        params["dpath"] = "$" + "".join(f'."{key}"' for key in json_path(path))
        typed = (
            f"CASE json_type({column}, {p('dpath')}) WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' "
            f"ELSE CAST(json_extract({column}, {p('dpath')}) AS TEXT) END"
        )
        found = f"CASE WHEN json_valid({column}) THEN {typed} END = {p('dvalue')}"
        if value and all(c not in value for c in '"\\') and all(ord(c) >= 0x20 for c in value):
            # a value JSON writes as it is appears verbatim in the row's text: a C-level
            # substring test skips most rows before any JSON is parsed
            found = f"instr({column}, {p('dvalue')}) > 0 AND {found}"
        return found

    def run(
        self,
        pairs: list[tuple[str, str]],
        *,
        limit: int,
        prefix: str = "",
        holder: str = "",
        expired: bool = False,
        data_path: str = "",
        data_value: str = "",
        after: tuple[str, str] | None = None,
    ) -> Listed:
        params: dict[str, Any] = dict(self.base)
        p, ref = self.f.p, self.ref
        extra = ""
        if prefix:
            return self._by_id(pairs, params, limit, prefix, after)
        if expired or holder:
            extra = f" AND {ref('lease_owner')} IS NOT NULL AND {ref('lease_expires_at')} IS NOT NULL"
            if expired:
                extra += f" AND {ref('lease_expires_at')} < {self.f.now}"
                self.now_params(params)
            if holder:
                extra += f" AND {ref('lease_owner')} = {p('holder')}"
                params["holder"] = holder
            order = f"{ref('lease_expires_at')}, {ref('id')}"
            rows = self._merged(pairs, params, extra, order, "fsm_x, fsm_i", limit + 1)
            return Listed(self._decode(rows[:limit]), order="expiry")
        if after is not None:  # a seek in the index's order (a time alone has id '': only earlier rows)
            extra += f" AND ({ref('updated_at')}, {ref('id')}) < ({p('au')}, {p('ai')})"
            params["au"], params["ai"] = after
        order = f"{ref('updated_at')} DESC, {ref('id')} DESC"
        outer = "fsm_u DESC, fsm_i DESC"
        if not data_path:
            rows = self._merged(pairs, params, extra, order, outer, limit + 1)
            more = self._key(rows[limit - 1]) if len(rows) > limit else None
            return Listed(self._decode(rows[:limit]), more=more)
        # the data search: each pair's walk stops at the cursor, the newest of the full pairs'
        # SCAN-th ``updated_at``, so each examines about SCAN rows, and every row updated at
        # or after the cursor is examined in every pair; the next page starts strictly
        # before it (no gap, no repeat, ties at the cursor included here)
        newest_first = f"{ref('updated_at')} DESC"
        ends = self._merged(pairs, dict(params), extra, newest_first, "fsm_u DESC", 1, keys_only=True, offset=SCAN - 1)
        cursor = max((u for u, _ in ends), default=None)
        bound = ""
        if cursor is not None:
            params["wu"] = cursor
            bound = f" AND {ref('updated_at')} >= {p('wu')}"
        match = " AND " + self.data_match(ref("data"), params, data_path, data_value)
        rows = self._merged(pairs, params, extra + bound + match, order, outer, limit + 1)
        window = self._text(cursor) if cursor is not None else ""
        if len(rows) > limit:
            return Listed(self._decode(rows[:limit]), more=self._key(rows[limit - 1]), searched_to=window or "all")
        more = (window, "") if cursor is not None else None
        return Listed(self._decode(rows), more=more, searched_to=window or "all")

    @staticmethod
    def _text(u: Any) -> str:
        return u.isoformat() if isinstance(u, datetime) else str(u)

    def _key(self, row: Any) -> tuple[str, str]:
        """The keyset position of a row (its ``updated_at`` as the database gives it, its id)."""
        return (self._text(row[-2]), str(row[-1]))

    def _merged(
        self,
        pairs: list[tuple[str, str]],
        params: dict[str, Any],
        extra: str,
        order: str,
        outer: str,
        limit: int,
        *,
        keys_only: bool = False,
        offset: int = 0,
    ) -> list[Any]:
        """One index walk per (kind, state) pair, each stopping after ``limit`` rows, merged."""
        if not pairs:
            return []
        p, ref = self.f.p, self.ref
        what = f"{ref('updated_at')} AS fsm_u, {ref('id')} AS fsm_i"
        if order.startswith(ref("lease_expires_at")):
            what = f"{ref('lease_expires_at')} AS fsm_x, " + what
        cols = what if keys_only else f"{self.cols}, {what}"
        parts = []
        for i, (kind, state) in enumerate(pairs):
            params[f"k{i}"], params[f"s{i}"] = kind, state
            parts.append(
                f"SELECT * FROM (SELECT {cols} FROM {self.E} AS e WHERE {ref('kind')} = {p(f'k{i}')} "
                f"AND {ref('state')} = {p(f's{i}')} AND {self.live}{extra} ORDER BY {order} LIMIT {p('limit')}"
                f"{' OFFSET ' + p('offset') if offset else ''}) AS p{i}"
            )
        if offset:
            params["offset"] = offset
        params["limit"] = limit
        last = f" LIMIT {p('total')}" if not offset else ""
        params["total"] = limit
        sql = f"SELECT * FROM ({' UNION ALL '.join(parts)}) AS m ORDER BY {outer}{last}"
        if keys_only:
            return [(r[0], r[1]) for r in self.store._run(sql, params)]
        return list(self.store._run(sql, params))

    def held(self, ids: tuple[str, ...], holder: str, limit: int, pairs: list[tuple[str, str]]) -> Listed:
        """The entities ``ids`` still held by ``holder``, soonest expiry first (primary key reads)."""
        if not ids:
            return Listed([], order="expiry")
        p, ref = self.f.p, self.ref
        params: dict[str, Any] = {**self.base, "ids": self.f.ids(list(ids[: 10 * limit])), "holder": holder}
        params["limit"] = limit
        rows = self.store._run(
            f"SELECT {self.cols} FROM {self.E} AS e WHERE {self.f.in_ids(ref('id'), 'ids')} AND {self.live} "
            f"AND {ref('lease_owner')} = {p('holder')} ORDER BY {ref('lease_expires_at')}, {ref('id')} "
            f"LIMIT {p('limit')}",
            params,
        )
        wanted = set(pairs)
        return Listed([s for s in self._decode(rows) if (s.kind, s.state) in wanted], order="expiry")

    def _by_id(
        self,
        pairs: list[tuple[str, str]],
        params: dict[str, Any],
        limit: int,
        prefix: str,
        after: tuple[str, str] | None,
    ) -> Listed:
        p, ref = self.f.p, self.ref
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params["pattern"] = escaped + "%"
        where = f"{self.live} AND {ref('id')} LIKE {p('pattern')} ESCAPE '\\'"
        if self.byte_order and ord(prefix[-1]) < 0x10FFFF:  # the prefix as a range of the primary key
            where += f" AND {ref('id')} >= {p('lo')} AND {ref('id')} < {p('hi')}"
            params["lo"], params["hi"] = prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
        kinds = sorted({k for k, _ in pairs})
        states = sorted({s for _, s in pairs})
        # SQLite: a unary + keeps these terms off the (kind, state, ...) indexes.  Without
        # statistics (or with none yet for one index) SQLite would rather walk one of those
        # for every pair and sort the rows it finds by id: the whole store, not the prefix
        unindexed = "+" if not self.pg else ""
        for name, values in (("kind", kinds), ("state", states)):
            marks = ", ".join(p(f"{name}{i}") for i in range(len(values)))
            where += f" AND {unindexed}{ref(name)} IN ({marks})" if values else " AND 1 = 0"
            params.update({f"{name}{i}": v for i, v in enumerate(values)})
        if after is not None:
            where += f" AND {ref('id')} > {p('ai')}"
            params["ai"] = after[1]
        params["limit"] = limit + 1
        rows = self.store._run(
            f"SELECT {self.cols}, {ref('updated_at')}, {ref('id')} FROM {self.E} AS e WHERE {where} "
            f"ORDER BY {ref('id')} LIMIT {p('limit')}",
            params,
        )
        more = ("", str(rows[limit - 1][-1])) if len(rows) > limit else None
        # kinds x states is wider than the pairs: keep only the pairs asked for
        wanted = set(pairs)
        return Listed([s for s in self._decode(rows[:limit]) if (s.kind, s.state) in wanted], more=more, order="id")

    @staticmethod
    def _decode(rows: list[Any]) -> list[Snapshot]:
        found = []
        for row in rows:
            try:
                found.append(snapshot_of(row))
            except Exception:  # a malformed row is shown in the counts, not in the table
                continue
        return found


__all__ = ["SCAN", "Listed", "ListingSql", "json_path"]
