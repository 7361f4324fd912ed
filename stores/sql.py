"""The SQL store: SQLite (the embedded default) and PostgreSQL, on SQLAlchemy 2.

``SqlStore`` implements :class:`stores.Store` with the memory store's semantics, pinned by
the contract suite.  Each write is one statement (PostgreSQL) or one ``BEGIN IMMEDIATE``
transaction (SQLite) whose ``WHERE`` re-checks the guard: version, lease owner and token,
and every condition, against the database's clock.  A write that matches no row changed
nothing; the store then re-reads the row to raise the error the memory store would
(``UnknownEntity``, ``IdempotencyKeyReused``, ``StaleVersion``, ``LeaseLost``,
``ConditionFailed``).  If the re-read finds nothing wrong (the row changed in between,
e.g. a lease expired), the write is simply tried again.

What runs where:
- SQLAlchemy: the engine and its URL, schema (``stores.sql_schema``), migrations
  (``stores.sql_migrate``), inspection and the existing-table binding;
- the DBAPI connection of the calling thread (``stores.sql_conn``): every store call, with
  SQL written once per dialect (``stores.sql_dialect``).

Time: with ``clock=None`` a PostgreSQL store takes ``now`` from the server inside each
statement; SQLite (embedded: the server is this process) binds the wall clock.  With a
``clock`` (tests), its time is bound on every dialect.

Failures: an unreachable or restarting database raises ``StoreUnavailable`` (cause
chained; a broken connection is replaced on the next call); a row that cannot be decoded
raises ``MalformedRow`` naming the entity.  A connection lost *during* a commit leaves the
outcome unknown, as with any database: retry with an idempotency key to make it safe.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from fsm.clock import Clock
from fsm.errors import (
    ConditionFailed,
    ConfigError,
    EntityExists,
    FsmError,
    IdempotencyKeyReused,
    InvalidData,
    LeaseLost,
    MalformedRow,
    StaleVersion,
    StoreUnavailable,
    UnknownEntity,
)
from fsm.records import (
    BatchWrite,
    Condition,
    HistoryRecord,
    NewEntity,
    NewerSibling,
    Snapshot,
    TransitionWrite,
    condition_holds,
)
from stores.sql_binding import ChildRows, TableBinding, add_missing_columns, bound_layout, missing_columns, owned_layout
from stores.sql_children import ChildIO, attach, split_data
from stores.sql_conn import (
    Connections,
    driver_errors,
    enable_wal,
    install_sqlite_events,
    setup_postgres,
    setup_sqlite,
    unavailable,
)
from stores.sql_dialect import PostgresFlavor, SqliteFlavor, Statements, condition_shape
from stores.sql_migrate import current_revision, downgrade, ensure_schema, stamp, upgrade
from stores.sql_schema import HEAD_REVISION, decode_time

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///fsm.db"
_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")
_ATTEMPTS = 3
"""Tries of a write whose refusal the re-read could not explain (the row moved in between)."""
_PUBLIC = (
    "now", "create", "get", "history", "find_transition", "apply", "acquire_lease", "renew_lease",
    "release_lease", "soft_delete", "has_newer_sibling", "candidates", "apply_batch",
)  # fmt: skip


def create_engine(url: str, *, busy_timeout: float = 5.0, **options: Any) -> sa.Engine:
    """An engine for the store: ``postgresql://`` means psycopg 3; SQLite gets its pragmas
    and real transactions; an in-memory SQLite database gets one shared connection."""
    u = sa.make_url(url)
    if u.get_backend_name() not in {"sqlite", "postgresql", "postgres"}:
        raise ConfigError(f"SqlStore runs on sqlite or postgresql+psycopg, not {u.drivername!r}")
    if u.drivername in {"postgresql", "postgres"}:
        u = u.set(drivername="postgresql+psycopg")
    connect_args = dict(options.pop("connect_args", {}))
    if u.get_backend_name() == "postgresql" and "connect_timeout" not in u.query:
        connect_args.setdefault("connect_timeout", 10)
    if u.get_backend_name() == "sqlite" and _memory(u):
        options.setdefault("poolclass", sa.pool.StaticPool)
        connect_args.setdefault("check_same_thread", False)  # one connection, every thread, under a lock
    engine = sa.create_engine(u, connect_args=connect_args, **options)
    if engine.dialect.name == "sqlite":
        install_sqlite_events(engine, int(busy_timeout * 1000))
    return engine


def _schema_of(binding: TableBinding | None) -> str | None:
    return binding.schema if binding is not None else None


def _memory(url: sa.URL) -> bool:
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url)


def _dumps(value: Any, entity_id: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidData(
            lifecycle="store", entity_id=entity_id, errors=[{"loc": ("data",), "msg": f"not JSON: {err}"}]
        ) from None


def _snapshot(row: Sequence[Any]) -> Snapshot:
    """A row (entity columns in Snapshot order) as a Snapshot, or ``MalformedRow``."""
    try:
        state, data, exp = row[2], row[14], row[6]
        if state is None:
            raise ValueError("no state (leaf state column is NULL)")
        if data.__class__ is str:
            data = {} if data == "{}" else json.loads(data)
        if data.__class__ is not dict:
            raise ValueError(f"data is not a JSON object: {str(data)[:60]!r}")
        # positional: this runs on every read and write
        return Snapshot(
            row[0], row[1], state, row[3], row[4], row[5], None if exp is None else decode_time(exp),
            decode_time(row[7]), decode_time(row[8]), decode_time(row[9]), bool(row[10]), row[11],
            row[12], row[13], data,
        )  # fmt: skip
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=str(err)) from None


def _history(row: Sequence[Any]) -> HistoryRecord:
    try:
        data = row[10]
        if data.__class__ is str:
            data = json.loads(data)
        return HistoryRecord(
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], decode_time(row[9]), data
        )
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=f"history row {row[1]}: {err}") from None


class _Refused(Exception):
    """The guarded statement matched no row."""


class SqlStore:
    """A :class:`stores.Store` on SQLite or PostgreSQL (psycopg 3).

    ``url_or_engine``: a URL (``sqlite:///fsm.db``, ``postgresql+psycopg://user@host/db``)
    or an engine.  ``clock``: bind this clock's time instead of the server's (tests).
    ``table_prefix``: names the tables ``{prefix}entities``/``history``/``effects``.
    ``create``: create or upgrade the library's tables (Alembic) on start; otherwise they
    must be current.  ``binding``: run on an application's existing table
    (:class:`stores.sql_binding.TableBinding`).  ``schema``: PostgreSQL schema of the tables.
    ``busy_timeout``: seconds a SQLite writer waits for the write lock.
    ``sqlite_synchronous``: ``FULL`` (default: a commit survives power loss) or ``NORMAL``
    (WAL-safe, faster; the last commits may roll back on power loss).

    Thread-safe: each thread uses its own connection (see :mod:`stores.sql_conn`).  Not
    fork-safe: create the store in the process that uses it.
    """

    def __init__(
        self,
        url_or_engine: str | sa.Engine = DEFAULT_URL,
        *,
        clock: Clock | None = None,
        table_prefix: str = "fsm_",
        create: bool = True,
        binding: TableBinding | None = None,
        schema: str | None = None,
        busy_timeout: float = 5.0,
        sqlite_synchronous: str = "FULL",
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        if not _PREFIX.match(table_prefix):
            raise ConfigError(f"table_prefix {table_prefix!r} must be an identifier of at most 31 characters")
        if isinstance(url_or_engine, sa.Engine):
            engine, self._owns_engine = url_or_engine, False
        else:
            engine = create_engine(url_or_engine, busy_timeout=busy_timeout, **(engine_options or {}))
            self._owns_engine = True
        name = engine.dialect.name
        if name not in {"sqlite", "postgresql"} or (name == "postgresql" and engine.dialect.driver != "psycopg"):
            raise ConfigError(f"SqlStore runs on sqlite or postgresql+psycopg, not {engine.url.drivername!r}")
        self.engine = engine
        self.clock = clock
        self.table_prefix = table_prefix
        self.binding = binding
        self.schema = schema
        self._sqlite = name == "sqlite"
        self._f = SqliteFlavor(False) if self._sqlite else PostgresFlavor(db_clock=clock is None)
        layout = (
            owned_layout(engine.dialect, table_prefix, schema)
            if binding is None
            else bound_layout(engine.dialect, table_prefix, binding)
        )
        self._sql = Statements(layout, self._f)
        self._status = binding.status_for if binding is not None and binding.status_column else None
        self._children = (
            [ChildIO(c, engine.dialect, self._f, layout.binding.schema) for c in layout.children]
            if layout.binding
            else []
        )
        memory = self._sqlite and _memory(engine.url)
        setup = setup_sqlite(int(busy_timeout * 1000), sqlite_synchronous) if self._sqlite else setup_postgres
        self._integrity, self._errors = driver_errors(name)
        self._conns = Connections(engine, setup, shared=memory, errors=self._errors)
        opening: tuple[type[BaseException], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError, *self._errors)
        try:
            if self._sqlite and not memory:
                enable_wal(engine)
            if create:
                ensure_schema(engine, table_prefix=table_prefix, schema=schema, binding=binding)
            else:
                current = current_revision(engine, table_prefix=table_prefix, schema=schema or _schema_of(binding))
                if current != HEAD_REVISION:
                    raise ConfigError(
                        f"the store's tables are at revision {current or '(none)'}, not {HEAD_REVISION}: "
                        f"run `python -m stores.migrations upgrade URL` (or stores.sql.upgrade) or pass create=True"
                    )
            if binding is not None and (absent := missing_columns(engine, binding)):
                raise ConfigError(
                    f"table {binding.table!r} lacks the binding's columns",
                    problems=[
                        f"missing: {', '.join(absent)}",
                        "add them with stores.sql_binding.add_missing_columns(engine, binding), or "
                        "add_binding_columns(op, binding) in the application's Alembic migration",
                    ],
                )
        except opening as err:
            self.close()
            raise StoreUnavailable(f"cannot open the store at {engine.url!r}: {getattr(err, 'orig', err)}") from err
        except BaseException:
            self.close()
            raise
        if self._conns.lock is not None:  # one shared in-memory connection: serialise every call
            for method in _PUBLIC:
                setattr(self, method, _locked(getattr(self, method), self._conns.lock))

    def close(self) -> None:
        """Close this store's connections (and its engine, if it created it)."""
        self._conns.close()
        if self._owns_engine:
            self.engine.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self.engine.url!r}, table_prefix={self.table_prefix!r})"

    # -- plumbing ------------------------------------------------------------------------------

    def _now(self) -> datetime | None:
        """The write's ``now`` in Python: the clock's, SQLite's wall clock, or None (server)."""
        if self.clock is not None:
            return self.clock.now()
        return datetime.now(UTC) if self._sqlite else None

    def _run(self, sql: str, params: dict[str, Any]) -> list[Any]:
        """One statement (autocommit); all rows fetched, so SQLite finishes it at once."""
        cur = self._conns.slot().cursor
        try:
            cur.execute(sql, params)
            return cur.fetchall()  # type: ignore[no-any-return]
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _attach(self, snaps: list[Snapshot]) -> list[Snapshot]:
        return attach(self._children, self._conns.slot().cursor, snaps) if self._children else snaps

    def _current(self, entity_id: str) -> tuple[Snapshot | None, datetime]:
        """The row as it is now, and the store's now, for diagnosing a refused write."""
        now = self._now()
        rows = self._run(self._sql.diagnose, {"id": entity_id, "now": None if now is None else self._f.time(now)})
        if not rows:
            return None, now or datetime.now(UTC)
        return _snapshot(rows[0]), now if now is not None else decode_time(rows[0][15])

    def _time_params(self, params: dict[str, Any], now: datetime | None, ttl: timedelta | None) -> None:
        f = self._f
        if now is not None:
            params["now"] = f.time(now)
        params["ttl"] = None if ttl is None else f.offset(now, ttl)

    # -- reads ---------------------------------------------------------------------------------

    def now(self) -> datetime:
        when = self._now()
        if when is not None:
            return when
        return decode_time(self._run(self._sql.now_query, {})[0][0])

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        rows = self._run(self._sql.get, {"id": entity_id})
        if not rows or (rows[0][10] and not include_deleted):
            raise UnknownEntity(entity_id)
        snap = _snapshot(rows[0])
        return self._attach([snap])[0] if self._children else snap

    def history(self, entity_id: str) -> list[HistoryRecord]:
        rows = self._run(self._sql.history, {"id": entity_id})
        if not rows and not self._run(self._sql.exists, {"id": entity_id}):
            raise UnknownEntity(entity_id)
        return [_history(r) for r in rows]

    def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        rows = self._run(self._sql.find, {"id": entity_id, "key": idempotency_key})
        return _history(rows[0]) if rows else None

    def has_newer_sibling(self, entity_id: str) -> bool:
        rows = self._run(self._sql.sibling, {"id": entity_id})
        if not rows or rows[0][0]:
            raise UnknownEntity(entity_id)
        return bool(rows[0][1])

    def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        """See :meth:`stores.Store.candidates`.  A row that cannot be decoded is logged at
        ERROR (naming the entity) and left out, so one bad row never hides the others."""
        sql = self._sql.candidates(condition_shape(require), require, after_id is not None)
        now = self._now()
        params: dict[str, Any] = {"kind": kind, "state": state, "limit": limit, "after": after_id}
        self._time_params(params, now, None)
        self._sql.condition_params(params, require, now)
        found = []
        for row in self._run(sql, params):
            try:
                found.append(_snapshot(row))
            except MalformedRow as err:
                log.error("skipping malformed %s %r: %s", kind, err.entity_id, err.reason)
        return self._attach(found)

    # -- writes --------------------------------------------------------------------------------

    def create(self, entity: NewEntity) -> Snapshot:
        data, children = split_data(self._children, entity.data) if self._children else (entity.data, {})
        now = self._now()
        params: dict[str, Any] = {
            "id": entity.id,
            "kind": entity.kind,
            "state": entity.state,
            "ck": entity.concurrency_key,
            "data": _dumps(data, entity.id),
        }
        self._time_params(params, now, None)
        if self._status is not None:
            params["status"] = self._status(entity.state)
        rows = self._write(self._sql.create(()), params, entity.id, children)
        if not rows:
            raise EntityExists(entity.id)
        return self._attach([_snapshot(rows[0])])[0]

    def _write(self, sql: str, params: dict[str, Any], entity_id: str, children: dict[str, Any]) -> list[Any]:
        """A single-statement write, plus child rows in the same transaction when given."""
        if not children:
            return self._run(sql, params)
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._sqlite:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    rows = self._write_children(cur, sql, params, entity_id, children)
                    cur.execute("COMMIT")
                except BaseException:
                    slot.conn.rollback()
                    raise
                return rows
            with slot.conn.transaction():
                return self._write_children(cur, sql, params, entity_id, children)
        except self._errors as err:
            raise unavailable(err, self._conns) from err

    def _write_children(
        self, cur: Any, sql: str, params: dict[str, Any], entity_id: str, children: dict[str, Any]
    ) -> list[Any]:
        cur.execute(sql, params)
        rows: list[Any] = cur.fetchall()
        if rows:
            for io in self._children:
                if io.child.key in children:
                    io.save(cur, entity_id, children[io.child.key])
        return rows

    def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        entity_id = write.entity_id
        require = write.require
        sql = self._sql.apply(
            write.lease_change,
            write.lease_ttl is not None,
            write.expect_token is not None,
            condition_shape(require) if require else (),
            require,
            write.bump_attempt,
            write.bump_reclaims,
            write.data is not None,
        )
        children: dict[str, Any] = {}
        data_text: str | None = None
        if write.data is not None:
            data = write.data
            if self._children:
                data, children = split_data(self._children, data)
            data_text = _dumps(data, entity_id)
        patch = write.data_patch
        patch_text = None if patch is None else _dumps(patch, entity_id)
        params: dict[str, Any] = {
            "id": entity_id,
            "version": write.expect_version,
            "owner": write.expect_owner,
            "token": write.expect_token,
            "event": write.event,
            "target": write.target,
            "actor": write.actor,
            "reason": write.reason,
            "key": write.idempotency_key,
            "patch": patch_text,
            "data": data_text,
            "new_owner": write.new_owner,
        }
        if self._status is not None:
            params["status"] = self._status(write.target)
        integrity = False
        for _ in range(_ATTEMPTS):
            now = self._now()
            self._time_params(params, now, write.lease_ttl)
            if require:
                self._sql.condition_params(params, require, now)
            try:
                snap, source, at = (self._apply_sqlite if self._sqlite else self._apply_pg)(sql, params, now, children)
                record = HistoryRecord(
                    entity_id, snap.version, write.event, source, write.target, write.actor, snap.lease_token,
                    write.reason, write.idempotency_key, at, None if patch_text is None else json.loads(patch_text),
                )  # fmt: skip
                return snap, record
            except _Refused:
                pass
            except self._integrity:
                integrity = True
            failure = self._diagnose_apply(write)
            if failure is not None:
                raise failure
        if integrity:
            raise MalformedRow(entity_id, reason="history and entity row disagree (a history seq is taken)")
        raise ConditionFailed(entity_id, condition=",".join(c.name for c in require) or "compare_and_set")

    def _apply_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None, children: dict[str, Any]
    ) -> tuple[Snapshot, str, datetime]:
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(sql[0], params)
                inserted = cur.fetchall()
                if not inserted:
                    raise _Refused
                cur.execute(sql[1], params)
                snap = _snapshot(cur.fetchall()[0])  # decoded before COMMIT: a bad row rolls back
                if children:
                    for io in self._children:
                        if io.child.key in children:
                            io.save(cur, snap.id, children[io.child.key])
                    snap = attach(self._children, cur, [snap])[0]
                elif self._children:
                    snap = attach(self._children, cur, [snap])[0]
                cur.execute("COMMIT")
            except BaseException:
                slot.conn.rollback()
                raise
        except self._errors as err:
            raise unavailable(err, self._conns) from err
        assert now is not None
        return snap, inserted[0][0], now

    def _apply_pg(
        self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None, children: dict[str, Any]
    ) -> tuple[Snapshot, str, datetime]:
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._children:
                with slot.conn.transaction():
                    rows = self._write_children(cur, sql[0], params, params["id"], children)
                    if rows:
                        snap = attach(self._children, cur, [_snapshot(rows[0])])[0]
            else:
                cur.execute(sql[0], params)
                rows = cur.fetchall()
                if rows:
                    snap = _snapshot(rows[0])
        except self._errors as err:
            raise unavailable(err, self._conns) from err
        if not rows:
            raise _Refused
        return snap, rows[0][15], decode_time(rows[0][16])

    def _diagnose_apply(self, write: TransitionWrite) -> FsmError | None:
        """Why the guarded write matched no row, in the contract's order; None if it should pass now."""
        entity_id = write.entity_id
        row, now = self._current(entity_id)
        if row is None or row.deleted:
            return UnknownEntity(entity_id)
        key = write.idempotency_key
        if key is not None:
            recorded = self.find_transition(entity_id, key)
            if recorded is not None:
                return IdempotencyKeyReused(entity_id, key=key, recorded_event=recorded.event, event=write.event)
        if row.version != write.expect_version:
            return StaleVersion(entity_id, expected=write.expect_version, found=row.version)
        if write.expect_token is not None and (
            row.lease_token != write.expect_token or row.lease_owner != write.expect_owner
        ):
            return LeaseLost(
                entity_id, expected_token=write.expect_token, found_token=row.lease_token, owner=write.expect_owner
            )
        for cond in write.require:
            sibling = self.has_newer_sibling(entity_id) if isinstance(cond, NewerSibling) else None
            if not condition_holds(cond, row, now, sibling):
                return ConditionFailed(entity_id, condition=cond.name)
        return None

    def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "version": expect_version}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(_ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            rows = self._run(self._sql.acquire(budget is not None), params)
            if rows:
                return self._attach([_snapshot(rows[0])])[0]
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            if row.version != expect_version:
                raise StaleVersion(entity_id, expected=expect_version, found=row.version)
            exp = row.lease_expires_at
            if row.lease_owner is not None and exp is not None and exp >= now:
                detail = f"held by {row.lease_owner} until {exp.isoformat()}"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
            if budget is not None and now >= row.state_entered_at + budget:
                detail = f"renewal budget of state {row.state!r} is spent"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
        raise LeaseLost(entity_id, expected_token=None, found_token=None, owner=owner, detail="contended")

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "token": token}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(_ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            rows = self._run(self._sql.renew(budget is not None), params)
            if rows:
                return self._attach([_snapshot(rows[0])])[0]
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            lost = functools.partial(
                LeaseLost, entity_id, expected_token=token, found_token=row.lease_token, owner=owner
            )
            if row.lease_owner != owner or row.lease_token != token:
                raise lost()
            if row.lease_expires_at is None or row.lease_expires_at < now:
                raise lost(detail="the lease expired before the renewal")
            if budget is not None and now >= row.state_entered_at + budget:
                raise lost(detail=f"renewal budget of state {row.state!r} is spent")
        raise LeaseLost(entity_id, expected_token=token, found_token=None, owner=owner, detail="contended")

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        rows = self._run(self._sql.release, {"id": entity_id, "owner": owner, "token": token})
        if rows:
            return self._attach([_snapshot(rows[0])])[0]
        row, _ = self._current(entity_id)
        if row is None or row.deleted:
            raise UnknownEntity(entity_id)
        raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)

    def soft_delete(self, entity_id: str) -> Snapshot:
        """See :meth:`stores.Store.soft_delete`.  A malformed row is deleted all the same
        (it is how one gets rid of it); ``MalformedRow`` then says its content is unreadable."""
        params: dict[str, Any] = {"id": entity_id}
        self._time_params(params, self._now(), None)
        rows = self._run(self._sql.soft_delete, params)
        if not rows:
            raise UnknownEntity(entity_id)
        return self._attach([_snapshot(rows[0])])[0]

    def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        """See :meth:`stores.Store.apply_batch`.  Rows whose data is not a readable JSON
        object never qualify; a row that still fails to decode is logged and left alone."""
        if not batch.ids:
            return []
        sql = self._sql.batch(
            batch.lease_change,
            batch.lease_ttl is not None,
            condition_shape(batch.require),
            batch.require,
            (batch.bump_attempt, batch.bump_reclaims),
        )
        ids = list(dict.fromkeys(batch.ids))
        params: dict[str, Any] = {
            "kind": batch.kind,
            "source": batch.source,
            "target": batch.target,
            "event": batch.event,
            "actor": batch.actor,
            "reason": batch.reason,
            "new_owner": batch.new_owner,
        }
        if self._status is not None:
            params["status"] = self._status(batch.target)
        while ids:
            now = self._now()
            params["ids"] = self._f.ids(ids)
            self._time_params(params, now, batch.lease_ttl)
            self._sql.condition_params(params, batch.require, now)
            try:
                moved = self._batch_sqlite(sql, params, now) if self._sqlite else self._batch_pg(sql, params)
            except MalformedRow as err:  # SQLite only: rolled back; move the others without it
                log.error("skipping malformed %s %r: %s", batch.kind, err.entity_id, err.reason)
                ids.remove(err.entity_id)
                continue
            order = {entity_id: i for i, entity_id in enumerate(batch.ids)}
            snaps = self._attach(sorted((s for s, _ in moved), key=lambda s: order[s.id]))
            at = {s.id: when for s, when in moved}
            return [
                (s, HistoryRecord(s.id, s.version, batch.event, batch.source, batch.target, batch.actor,
                                  s.lease_token, batch.reason, None, at[s.id], None))
                for s in snaps
            ]  # fmt: skip
        return []

    def _batch_sqlite(self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None) -> list[Any]:
        slot = self._conns.slot()
        cur = slot.cursor
        assert now is not None
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(sql[0], params)
                moved = [(_snapshot(r), now) for r in cur.fetchall()]
                if moved:
                    cur.execute(sql[1], {**params, "moved": self._f.ids([s.id for s, _ in moved])})
                cur.execute("COMMIT")
            except BaseException:
                slot.conn.rollback()
                raise
        except self._errors as err:
            raise unavailable(err, self._conns) from err
        return moved

    def _batch_pg(self, sql: tuple[str, ...], params: dict[str, Any]) -> list[Any]:
        moved = []
        for row in self._run(sql[0], params):
            try:
                moved.append((_snapshot(row), decode_time(row[15])))
            except MalformedRow as err:  # committed already; cannot happen for jsonb objects
                log.error("moved a malformed row %r: %s", err.entity_id, err.reason)
        return moved


def _locked(method: Callable[..., Any], lock: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return call


__all__ = [
    "DEFAULT_URL",
    "ChildRows",
    "SqlStore",
    "TableBinding",
    "add_missing_columns",
    "create_engine",
    "downgrade",
    "stamp",
    "upgrade",
]
