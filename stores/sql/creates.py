"""Creating many entities in one statement (``create_many``), all or nothing.

On the store's own tables the batch is one ``INSERT .. SELECT .. ON CONFLICT DO NOTHING
RETURNING``: on PostgreSQL over ``unnest`` of one array per column (any number of rows,
five parameters, one round trip), on SQLite over ``json_each`` of one JSON parameter (one
statement inside ``BEGIN IMMEDIATE``).  Fewer rows back than asked means an id exists:
the transaction is undone and ``EntityExists`` names the first such id, so a batch never
half lands.  A store bound to an application table (its own columns, child tables)
inserts the rows one by one with the single-row statement, still in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fsm.errors import ConstraintViolated, EntityExists
from fsm.limits import check_new_entities
from fsm.records import NewEntity, Snapshot
from stores.sql.children import split_data
from stores.sql.connections import reason_of, unavailable
from stores.sql.core import SqliteWrite
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.wakeups import WakeOps


class CreateOps(WakeOps):
    """``create_many`` of :class:`stores.sql.SqlStore`."""

    def _create_many_sql(self) -> str:
        found: str | None = getattr(self, "_create_many_statement", None)
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        names = ["id", "kind", "state", "version", "lease_token", "state_entered_at", "created_at", "updated_at"]
        names += ["deleted", "concurrency_key", "attempt", "reclaims", "data"]
        cols = ", ".join(c[n] for n in names)
        if self._sqlite:
            item = "json_extract(j.value, '$[{}]')".format
            values = [item(0), item(1), item(2), "0", "0", f.now, f.now, f.now, "0", item(3), "0", "0", item(4)]
            source = f"json_each({f.p('rows')}) AS j WHERE 1"  # WHERE: SQLite's upsert after a SELECT
            back = sql.cols("")
        else:
            values = ["u.id", "u.kind", "u.state", "0", "0", f.now, f.now, f.now, "FALSE", "u.ck", "0", "0", "u.data"]
            source = (
                "unnest(CAST(%(ids)s AS text[]), CAST(%(kinds)s AS text[]), CAST(%(states)s AS text[]), "
                "CAST(%(cks)s AS text[]), CAST(%(datas)s AS jsonb[])) AS u(id, kind, state, ck, data)"
            )
            back = sql.cols("e")
        found = (
            f"INSERT INTO {sql.E} AS e ({cols}) SELECT {', '.join(values)} FROM {source} "
            f"ON CONFLICT ({c['id']}) DO NOTHING RETURNING {back}"
        )
        if not self._sqlite:
            found = self._with_notify(found)
        self._create_many_statement = found
        return found

    def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        """See :meth:`stores.Store.create_many`."""
        batch = check_new_entities(entities)
        if self.binding is not None or self._children or any(e.columns for e in batch):  # type: ignore[attr-defined]
            return self._create_each(batch)
        now = self._now()
        params: dict[str, Any] = {}
        self._time_params(params, now, None)
        datas = [dumps_data(e.data, e.id) for e in batch]
        if self._sqlite:
            rows_json = [[e.id, e.kind, e.state, e.concurrency_key, d] for e, d in zip(batch, datas, strict=True)]
            params["rows"] = json.dumps(rows_json, ensure_ascii=False, separators=(",", ":"))
        else:
            params |= {
                "ntf": self._channel(batch[0].kind),
                "ids": [e.id for e in batch],
                "kinds": [e.kind for e in batch],
                "states": [e.state for e in batch],
                "cks": [e.concurrency_key for e in batch],
                "datas": datas,
            }
        sql = self._create_many_sql()
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_create_many") as cur:
                    rows = self._insert_all(cur, sql, params, batch)
            else:
                with slot.conn.transaction():
                    rows = self._insert_all(slot.cursor, sql, params, batch)
        except self._integrity as err:
            raise ConstraintViolated(batch[0].id, detail=reason_of(err)) from err
        except self._errors as err:
            raise unavailable(err, self._conns, batch[0].id) from err
        by_id = {s.id: s for s in (snapshot_of(r) for r in rows)}
        self._created_notices({e.kind for e in batch}, sent=batch[0].kind)
        return [by_id[e.id] for e in batch]

    def _insert_all(self, cur: Any, sql: str, params: dict[str, Any], batch: list[NewEntity]) -> list[Any]:
        """Run the batch's insert; raise ``EntityExists`` (undoing it) unless every row landed."""
        cur.execute(sql, params)
        rows: list[Any] = cur.fetchall()
        if len(rows) != len(batch):
            landed = {snapshot_of(r).id for r in rows}
            raise EntityExists(next(e.id for e in batch if e.id not in landed))
        return rows

    def _create_each(self, batch: list[NewEntity]) -> list[Snapshot]:
        """A bound table's batch: the single-row insert per entity, in one transaction."""
        slot = self._conns.slot()
        made: list[Snapshot] = []

        def each(cur: Any) -> None:
            for entity in batch:
                data, children = split_data(self._children, entity.data) if self._children else (entity.data, {})
                params: dict[str, Any] = {
                    "id": entity.id,
                    "kind": entity.kind,
                    "state": entity.state,
                    "ck": entity.concurrency_key,
                    "data": dumps_data(data, entity.id),
                }
                self._time_params(params, self._now(), None)
                status = getattr(self, "_status", None)
                if status is not None:
                    params["status"] = status(entity.state)
                extra: tuple[str, ...] = ()
                if entity.columns:
                    extra = self._column_params(entity.columns, params)  # type: ignore[attr-defined]
                rows = self._write_children(cur, self._sql.create(extra), params, entity.id, children)  # type: ignore[attr-defined]
                if not rows:
                    raise EntityExists(entity.id)
                made.append(snapshot_of(rows[0]))

        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_create_many") as cur:
                    each(cur)
            else:
                with slot.conn.transaction():
                    each(slot.cursor)
        except self._integrity as err:
            raise ConstraintViolated(
                made[-1].id if made else batch[0].id,
                detail=f"{reason_of(err)} (a column of the table that the store does not fill: pass it in columns=)",
            ) from err
        except self._errors as err:
            raise unavailable(err, self._conns, batch[0].id) from err
        self._created_notices({e.kind for e in batch}, sent=None)
        return self._attach(made)


__all__ = ["CreateOps"]
