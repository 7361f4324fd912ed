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
from datetime import datetime
from typing import Any

from fsm.errors import ConstraintViolated, EntityExists
from fsm.limits import check_new_entities
from fsm.records import NewEntity, Snapshot
from stores.sql.children import split_data
from stores.sql.connections import reason_of, unavailable
from stores.sql.core import SqliteWrite
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.schema import decode_time
from stores.sql.wakeups import WakeOps


class _Short(Exception):
    """Fewer rows landed than the batch holds: undo the transaction."""


class CreateOps(WakeOps):
    """``create_many`` of :class:`stores.sql.SqlStore`."""

    def _create_many_sql(self) -> str:
        found: str | None = getattr(self, "_create_many_statement", None)
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        names = ["id", "kind", "state", "version", "lease_token", "state_entered_at", "created_at", "updated_at"]
        names += ["deleted", "concurrency_key", "attempt", "reclaims", "data", "run_after"]
        cols = ", ".join(c[n] for n in names)
        if self._sqlite:
            item = "json_extract(j.value, '$[{}]')".format
            values = [item(0), item(1), item(2), "0", "0", f.now, f.now, f.now, "0", item(3), "0", "0", item(4), f.now]
            found = (
                f"INSERT INTO {sql.E} AS e ({cols}) SELECT {', '.join(values)} FROM json_each({f.p('rows')}) AS j "
                f"WHERE 1 ON CONFLICT ({c['id']}) DO NOTHING RETURNING {c['id']}"  # WHERE: SQLite's upsert rule
            )
        else:
            # one JSON document of rows, [[id, kind, state, key, data], ..]: one parameter and
            # one json.dumps for the whole batch; the snapshots are built from the batch, so
            # the statement returns only how many rows landed and their (shared) timestamp
            values = ["r->>0", "r->>1", "r->>2", "0", "0", f.now, f.now, f.now, "FALSE", "r->>3", "0", "0", "r->4"]
            values.append(f.now)  # due at once (a batch with due times goes row by row)
            found = (
                f"WITH i AS (INSERT INTO {sql.E} AS e ({cols}) SELECT {', '.join(values)} "
                f"FROM jsonb_array_elements(CAST(%(rows)s AS jsonb)) AS r "
                f"ON CONFLICT ({c['id']}) DO NOTHING RETURNING {c['created_at']} AS at) "
                "SELECT count(*), max(i.at) FROM i, (SELECT pg_notify(%(ntf)s, '')) AS n"
            )
        self._create_many_statement = found
        return found

    def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        """See :meth:`stores.Store.create_many`."""
        return self.create_many_checked(check_new_entities(entities))

    def create_many_checked(self, batch: Sequence[NewEntity]) -> list[Snapshot]:
        """:meth:`create_many` of a batch already checked by
        :func:`fsm.limits.check_new_entities`' rules (the engine checks every item with the
        same limits when it validates it; see ``stores.base.unchecked_create_many``)."""
        if (
            self.binding is not None  # type: ignore[attr-defined]
            or self._children
            or any(e.columns or e.run_after is not None for e in batch)
        ):
            return self._create_each(list(batch))
        now = self._now()
        params: dict[str, Any] = {}
        self._time_params(params, now, None)
        rows_json: list[list[Any]]
        if self._sqlite:
            rows_json = [[e.id, e.kind, e.state, e.concurrency_key, dumps_data(e.data, e.id)] for e in batch]
        else:
            rows_json = [[e.id, e.kind, e.state, e.concurrency_key, e.data] for e in batch]
            params["ntf"] = self._channel(batch[0].kind)
        try:
            params["rows"] = json.dumps(rows_json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):  # name the entity whose data is not JSON
            for e in batch:
                dumps_data(e.data, e.id)
            raise
        sql = self._create_many_sql()
        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_create_many") as cur:
                    cur.execute(sql, params)
                    if len(cur.fetchall()) != len(batch):
                        raise _Short
            else:
                with slot.conn.transaction():
                    cur = slot.cursor
                    cur.execute(sql, params)
                    landed, at = cur.fetchone()
                    if landed != len(batch):
                        raise _Short
        except _Short:
            raise self._exists(batch) from None
        except self._integrity as err:
            raise ConstraintViolated(batch[0].id, detail=reason_of(err)) from err
        except self._errors as err:
            raise unavailable(err, self._conns, batch[0].id) from err
        self._created_notices({e.kind for e in batch}, sent=batch[0].kind)
        if self._sqlite:
            assert now is not None  # SQLite's time is always this process's
            when = decode_time(self._f.time(now))
        else:
            when = decode_time(at)
        return [
            Snapshot(
                e.id, e.kind, e.state, 0, None, 0, None, when, when, when, False, e.concurrency_key, 0, 0, e.data, when
            )
            for e in batch
        ]

    def _exists(self, batch: Sequence[NewEntity]) -> EntityExists:
        """The refusal of a batch that did not land whole (already undone): the first of
        its ids that exists."""
        c, table = self._sql.L.col, self._sql.E
        found: set[str] = set()
        ids = [e.id for e in batch]
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ", ".join(self._f.p(f"x{n}") for n in range(len(chunk)))
            rows = self._run(
                f"SELECT {c['id']} FROM {table} WHERE {c['id']} IN ({marks})", {f"x{n}": v for n, v in enumerate(chunk)}
            )
            found.update(r[0] for r in rows)
        return EntityExists(next((i for i in ids if i in found), ids[0]))

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
                now = self._now()
                self._time_params(params, now, None)
                due: str | None = None
                if isinstance(entity.run_after, datetime):
                    due, params["due"] = "at", self._f.time(entity.run_after)
                elif entity.run_after is not None:
                    due, params["due"] = "in", self._f.offset(now, entity.run_after)
                status = getattr(self, "_status", None)
                if status is not None:
                    params["status"] = status(entity.state)
                extra: tuple[str, ...] = ()
                if entity.columns:
                    extra = self._column_params(entity.columns, params)  # type: ignore[attr-defined]
                rows = self._write_children(cur, self._sql.create(extra, due), params, entity.id, children)  # type: ignore[attr-defined]
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
