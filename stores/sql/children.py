"""Child rows of a bound table read into, and written from, one key of entity data.

A pipeline's steps live in the application's ``steps`` table, not in the entity's JSON:
the dashboard reads them there.  :class:`ChildIO` loads them into ``data["steps"]`` on
every read (one query per read, one per batch of rows), and a write whose data carries
``steps`` upserts them by natural key in the same transaction as the transition.  Items
missing from the list are left in place: a store never deletes an application's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from fsm.errors import InvalidData
from fsm.records import Snapshot
from stores.sql.binding import ChildRows
from stores.sql.dialect import Flavor


class ChildIO:
    """The SQL of one child table, for one dialect."""

    def __init__(self, child: ChildRows, dialect: sa.Dialect, flavor: Flavor, schema: str | None) -> None:
        q = dialect.identifier_preparer
        self.child = child
        table = f"{q.quote_schema(schema)}.{q.quote(child.table)}" if schema else q.quote(child.table)
        parent = q.quote(child.parent_column)
        self.fields = list(child.fields)
        cols = [q.quote(child.fields[f]) for f in self.fields]
        order = q.quote(child.order_by) if child.order_by else q.quote(child.fields[child.natural_key])
        p = flavor.p
        self.select = (
            f"SELECT {parent}, {', '.join(cols)} FROM {table} WHERE {flavor.in_ids(parent, 'ids')} "
            f"ORDER BY {parent}, {order}"
        )
        natural = q.quote(child.fields[child.natural_key])
        others = [(f, c) for f, c in zip(self.fields, cols, strict=True) if f != child.natural_key]
        sets = ", ".join(f"{c} = {p('f_' + f)}" for f, c in others)
        self.update = (
            f"UPDATE {table} SET {sets} WHERE {parent} = {p('parent')} AND {natural} = {p('f_' + child.natural_key)}"
            if others
            else ""
        )
        self.insert = (
            f"INSERT INTO {table} ({parent}, {', '.join(cols)}) "
            f"VALUES ({p('parent')}, {', '.join(p('f_' + f) for f in self.fields)})"
        )
        self._ids = flavor.ids
        self._q = q.quote
        self._table, self._parent, self._flavor = table, parent, flavor

    def set_where(self, cur: Any, parents: Sequence[str], field: str, when: Sequence[Any], value: Any) -> None:
        """``UPDATE child SET field = value WHERE parent IN parents AND field IN when``: a
        transition's declared change (:class:`fsm.records.SetItems`) on the child rows."""
        child = self.child
        col = self._q(child.fields[field])
        p = self._flavor.p
        olds = [child.to_column(field, w) for w in when]
        marks = ", ".join(p(f"w{i}") for i in range(len(olds)))
        sql = (
            f"UPDATE {self._table} SET {col} = {p('value')} "
            f"WHERE {self._flavor.in_ids(self._parent, 'ids')} AND {col} IN ({marks})"
        )
        params = {"ids": self._ids(parents), "value": child.to_column(field, value)}
        params.update({f"w{i}": v for i, v in enumerate(olds)})
        cur.execute(sql, params)

    def load(self, cur: Any, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The child items of each parent id, as data items."""
        found: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        cur.execute(self.select, {"ids": self._ids(ids)})
        to_field = self.child.to_field
        for row in cur.fetchall():
            item = {f: to_field(f, v) for f, v in zip(self.fields, row[1:], strict=True)}
            found.setdefault(str(row[0]), []).append(item)
        return found

    def save(self, cur: Any, parent: str, items: Any) -> None:
        """Upsert ``items`` (a list of dicts with the natural key) under ``parent``."""
        child = self.child
        if not isinstance(items, list) or not all(isinstance(i, dict) and child.natural_key in i for i in items):
            raise InvalidData(
                lifecycle=child.table,
                entity_id=parent,
                errors=[{"loc": (child.key,), "msg": f"a list of objects with {child.natural_key!r}"}],
            )
        for item in items:
            params = {"parent": parent, **{f"f_{f}": child.to_column(f, item.get(f)) for f in self.fields}}
            if self.update:
                cur.execute(self.update, params)
                if cur.rowcount:
                    continue
            else:
                cur.execute(self.select, {"ids": self._ids([parent])})
                if any(r[1 + self.fields.index(child.natural_key)] == item[child.natural_key] for r in cur.fetchall()):
                    continue
            cur.execute(self.insert, params)


def split_data(children: Sequence[ChildIO], data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what goes into the JSON column, the child keys given)."""
    keys = {c.child.key for c in children}
    own = {k: v for k, v in data.items() if k not in keys}
    given = {k: v for k, v in data.items() if k in keys}
    return own, given


def attach(children: Sequence[ChildIO], cur: Any, snaps: Iterable[Snapshot]) -> list[Snapshot]:
    """``snaps`` with each child key loaded into their data."""
    snaps = list(snaps)
    if not snaps or not children:
        return snaps
    ids = [s.id for s in snaps]
    loaded = {c.child.key: c.load(cur, ids) for c in children}
    return [s._replace(data={**s.data, **{key: rows[s.id] for key, rows in loaded.items()}}) for s in snaps]


__all__ = ["ChildIO", "attach", "split_data"]
