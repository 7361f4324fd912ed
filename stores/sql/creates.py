"""Creating many entities in one statement (``create_many``), all or nothing.

On the store's own tables the batch is one statement: on PostgreSQL a plain ``INSERT ..
SELECT .. FROM unnest(..)`` of one array per column (binary parameters, any number of
rows, one round trip: no ``BEGIN`` or ``COMMIT`` of its own), which an id that exists
fails whole; on SQLite an ``INSERT .. SELECT .. ON CONFLICT DO NOTHING RETURNING`` over
``json_each`` of one JSON parameter inside ``BEGIN IMMEDIATE``, undone when fewer rows
come back than asked.  Either way nothing of the batch lands and ``EntityExists`` names
the first id that exists.  A store bound to an application table (its own columns, child
tables) inserts the rows one by one with the single-row statement, in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fsm.errors import ActiveDuplicate, ConstraintViolated, EntityExists
from fsm.limits import check_new_entities
from fsm.records import NewEntity, Snapshot
from stores.sql.children import split_data
from stores.sql.connections import reason_of, unavailable
from stores.sql.core import SqliteWrite
from stores.sql.rows import dumps_data, snapshot_of
from stores.sql.schema import decode_time
from stores.sql.wakeups import WakeOps

SHARED_DATA = 16
"""At most this many distinct data documents in a PostgreSQL batch: each is sent once."""

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _dumps(data: Any) -> str:
    """Data as compact JSON text (one encoder for every row; the engine and the store's
    checks already proved it JSON)."""
    text: str = _ENCODER.encode(data)
    return text


def _created_columns(arm: bool, defined: bool = False) -> list[str]:
    """The columns a batch insert writes, in its ``VALUES`` order."""
    names = ["id", "kind", "state", "version", "lease_token", "state_entered_at", "created_at", "updated_at"]
    names += ["deleted", "concurrency_key", "attempt", "reclaims", "data", "run_after"]
    names += ["timer_since"] if arm else []
    return [*names, "definition"] if defined else names


class _Short(Exception):
    """Fewer rows landed than the batch holds: undo the transaction."""


class CreateOps(WakeOps):
    """``create_many`` of :class:`stores.sql.SqlStore`."""

    _create_many_statements: dict[tuple[bool, bool, bool, bool], str]

    def _create_many_sql(self, arm: bool, defined: bool = False) -> str:
        """SQLite: the batch from one JSON document, ``[[id, kind, state, key, data], ..]``;
        ``arm``: every row starts its timer clock; ``defined``: each row's definition
        version is a sixth item (``null``: none)."""
        cache: dict[tuple[bool, bool], str] = self.__dict__.setdefault("_create_many_sqlite", {})
        found = cache.get((arm, defined))
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        cols = ", ".join(c[n] for n in _created_columns(arm, defined))
        item = "json_extract(j.value, '$[{}]')".format
        values = [item(0), item(1), item(2), "0", "0", f.now, f.now, f.now, "0", item(3), "0", "0", item(4), f.now]
        values += [f.now] if arm else []
        values += [item(5)] if defined else []
        found = cache[(arm, defined)] = (
            f"INSERT INTO {sql.E} AS e ({cols}) SELECT {', '.join(values)} FROM json_each({f.p('rows')}) AS j "
            f"WHERE 1 ON CONFLICT ({c['id']}) DO NOTHING RETURNING {c['id']}"  # WHERE: SQLite's upsert rule
        )
        return found

    def _create_many_pg(self, cols: str, *, uniform: bool, shared: bool, arm: bool, defined: bool = False) -> str:
        """PostgreSQL: the batch from one array per column (``unnest``: a few parameters for
        any number of rows, sent in binary, the statement text the same for every size).
        ``uniform``: one kind and state for the whole batch, bound once.  ``shared``: the
        rows share a few distinct data documents, each sent (and parsed by the server)
        once, a row naming its own by position; otherwise each row's data (empty data: a
        NULL stored as ``{}``).  A plain ``INSERT``: an id that exists fails the statement,
        so nothing of the batch lands.  The snapshots are built from the batch, so it
        returns only how many rows landed and their (shared) timestamp; the wake-up is
        sent in the same statement.  ``arm``: every row starts its timer clock; ``defined``:
        one more array, each row's definition version (NULL: none)."""
        key = (uniform, shared, arm, defined)
        cache: dict[tuple[bool, bool, bool, bool], str] | None = getattr(self, "_create_many_statements", None)
        if cache is None:
            cache = self._create_many_statements = {}
        found = cache.get(key)
        if found is not None:
            return found
        c, f, sql = self._sql.L.col, self._f, self._sql
        arrays = ["CAST(%(id)b AS text[])", "CAST(%(ck)b AS text[])"]
        names = ["id", "ck"]
        if shared:
            # a small array's subscript is cheap (a long one's is not: the walk to the n-th
            # element), so this shape is for a few distinct documents only
            arrays.append("CAST(%(di)b AS int[])")
            names.append("di")
            data = "(SELECT s.a FROM s)[v.di]"
            head = "WITH s AS (SELECT CAST(%(datas)b AS jsonb[]) AS a), "
        else:
            arrays.append("CAST(%(data)b AS jsonb[])")
            names.append("data")
            data = "COALESCE(v.data, '{}'::jsonb)"
            head = "WITH "
        if not uniform:
            arrays += ["CAST(%(kind)b AS text[])", "CAST(%(state)b AS text[])"]
            names += ["kind", "state"]
        if defined:
            arrays.append("CAST(%(defn)b AS int[])")
            names.append("defn")
        kind, state = ("%(kind)s", "%(state)s") if uniform else ("v.kind", "v.state")
        values = ["v.id", kind, state, "0", "0", f.now, f.now, f.now, "FALSE", "v.ck", "0", "0", data, f.now]
        values += [f.now] if arm else []
        values += ["v.defn"] if defined else []
        # due at once (a batch with due times goes row by row)
        found = cache[key] = (
            f"{head}i AS (INSERT INTO {sql.E} AS e ({cols}) SELECT {', '.join(values)} "
            f"FROM unnest({', '.join(arrays)}) AS v({', '.join(names)}) RETURNING {c['created_at']} AS at) "
            "SELECT count(*), max(i.at) FROM i, (SELECT pg_notify(%(ntf)s, '')) AS n"
        )
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
            or any(e.columns or e.run_after is not None or e.priority or e.parent_id is not None for e in batch)
            or len({e.arm_timer for e in batch}) > 1
            or any(e.unique_finals is not None for e in batch)
        ):
            return self._create_each(list(batch))
        now = self._now()
        params: dict[str, Any] = {}
        self._time_params(params, now, None)
        if not self._sqlite:
            return self._create_many_pg_run(batch, params)
        defined = any(e.definition is not None for e in batch)
        rows_json: list[list[Any]] = [
            [e.id, e.kind, e.state, e.concurrency_key, dumps_data(e.data, e.id), *((e.definition,) if defined else ())]
            for e in batch
        ]
        params["rows"] = json.dumps(rows_json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        sql = self._create_many_sql(batch[0].arm_timer, defined)
        slot = self._conns.slot()
        try:
            with SqliteWrite(slot, "fsm_create_many") as cur:
                cur.execute(sql, params)
                if len(cur.fetchall()) != len(batch):
                    raise _Short
        except _Short:
            raise self._exists(batch) from None
        except self._integrity as err:
            raise ConstraintViolated(batch[0].id, detail=reason_of(err)) from err
        except self._errors as err:
            raise unavailable(err, self._conns, batch[0].id) from err
        self._created_notices({e.kind for e in batch}, sent=None)
        assert now is not None  # SQLite's time is always this process's
        return self._made(batch, decode_time(self._f.time(now)))

    def _create_many_pg_run(self, batch: Sequence[NewEntity], params: dict[str, Any]) -> list[Snapshot]:
        """PostgreSQL: the batch in one statement, one round trip (see :meth:`_create_many_pg`)."""
        first = batch[0]
        uniform = all(e.kind == first.kind and e.state == first.state for e in batch)
        params["id"] = [e.id for e in batch]
        params["ck"] = [e.concurrency_key for e in batch]
        texts = [_dumps(e.data) if e.data else "{}" for e in batch]
        distinct: dict[str, int] = {}
        for text in texts:
            if text not in distinct:
                distinct[text] = len(distinct) + 1  # PostgreSQL arrays count from 1
                if len(distinct) > SHARED_DATA:
                    break
        shared = len(distinct) <= SHARED_DATA
        if shared:
            params["datas"] = list(distinct)
            params["di"] = [distinct[t] for t in texts]
        else:
            params["data"] = [None if t == "{}" else t for t in texts]
        if uniform:
            params["kind"], params["state"] = first.kind, first.state
        else:
            params["kind"] = [e.kind for e in batch]
            params["state"] = [e.state for e in batch]
        params["ntf"] = self._channel(first.kind)
        defined = any(e.definition is not None for e in batch)
        if defined:
            params["defn"] = [e.definition for e in batch]
        c = self._sql.L.col
        arm = first.arm_timer
        sql = self._create_many_pg(
            ", ".join(c[n] for n in _created_columns(arm, defined)),
            uniform=uniform,
            shared=shared,
            arm=arm,
            defined=defined,
        )
        slot = self._conns.slot()
        try:
            cur = slot.cursor  # one statement: its own transaction (joined: the cursor's savepoint)
            cur.execute(sql, params)
            landed, at = cur.fetchone()
        except self._integrity as err:  # an id exists (or a constraint of the table): nothing landed
            found = self._existing(batch)
            if found:
                raise EntityExists(next(e.id for e in batch if e.id in found)) from None
            raise ConstraintViolated(first.id, detail=reason_of(err)) from err
        except self._errors as err:
            raise unavailable(err, self._conns, first.id) from err
        assert landed == len(batch)  # a plain INSERT lands whole or fails
        self._created_notices({e.kind for e in batch}, sent=first.kind)
        return self._made(batch, decode_time(at))

    @staticmethod
    def _made(batch: Sequence[NewEntity], when: datetime) -> list[Snapshot]:
        """The snapshots of a batch that landed at ``when``."""
        return [
            Snapshot(
                e.id,
                e.kind,
                e.state,
                0,
                None,
                0,
                None,
                when,
                when,
                when,
                False,
                e.concurrency_key,
                0,
                0,
                e.data,
                when,
                when if e.arm_timer else None,
                e.priority,
                e.parent_id,
                e.definition,
            )
            for e in batch
        ]

    def _exists(self, batch: Sequence[NewEntity]) -> EntityExists:
        """The refusal of a batch that did not land whole (already undone): the first of
        its ids that exists."""
        found = self._existing(batch)
        return EntityExists(next((e.id for e in batch if e.id in found), batch[0].id))

    def _existing(self, batch: Sequence[NewEntity]) -> set[str]:
        """Which ids of ``batch`` exist (soft-deleted ones too)."""
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
        return found

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
                extra += self._placement_params(entity, params, len(extra))  # type: ignore[attr-defined]
                unique = entity.unique_finals is not None
                if unique:
                    params["finals"] = self._f.ids(entity.unique_finals or ())
                    if not self._sqlite:  # see SqlStore._create_unique_pg
                        lock = f"{self.table_prefix}{entity.kind}:{entity.concurrency_key}"
                        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))", {"lock": lock})
                sql = self._sql.create(extra, due, entity.arm_timer, unique)
                rows = self._write_children(cur, sql, params, entity.id, children)  # type: ignore[attr-defined]
                if not rows:
                    if unique:
                        cur.execute(self._sql.active_duplicate(self._sql.L.ref("id", "u")) + " LIMIT 1", params)
                        found = cur.fetchall()
                        if found:
                            raise ActiveDuplicate(entity.id, key=str(entity.concurrency_key), existing=found[0][0])
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
