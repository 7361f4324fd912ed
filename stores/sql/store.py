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
- SQLAlchemy: the engine and its URL, schema (``stores.sql.schema``), migrations
  (``stores.sql.migrate``), inspection and the existing-table binding;
- the DBAPI connection of the calling thread (``stores.sql.connections``): every store call, with
  SQL written once per dialect (``stores.sql.dialect``).

Time: with ``clock=None`` a PostgreSQL store takes ``now`` from the server inside each
statement; SQLite (embedded: the server is this process) binds the wall clock.  With a
``clock`` (tests), its time is bound on every dialect.

Failures: an unreachable or restarting database raises ``StoreUnavailable`` (cause
chained; a broken connection is replaced on the next call); a row that cannot be decoded
raises ``MalformedRow`` naming the entity.  A connection lost *during* a commit leaves the
outcome unknown, as with any database: retry with an idempotency key to make it safe.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

from fsm.clock import Clock
from fsm.errors import (
    ActiveDuplicate,
    ConditionFailed,
    ConfigError,
    ConstraintViolated,
    EntityExists,
    FsmError,
    IdempotencyKeyReused,
    InvalidArgument,
    LeaseLost,
    MalformedRow,
    StaleVersion,
    StoreCorrupt,
    StoreUnavailable,
    UnknownEntity,
)
from fsm.limits import (
    check_chain,
    check_create_chains,
    check_group,
    check_id,
    check_new_entity,
    check_transition_write,
    text_problem,
)
from fsm.records import (
    HeldBy,
    HistoryRecord,
    LeaseChange,
    NewEntity,
    NewerSibling,
    Snapshot,
    TimerMode,
    TransitionWrite,
    condition_holds,
)
from stores.sql.batches import BatchOps
from stores.sql.binding import TableBinding, app_columns, bound_layout, missing_columns, owned_layout
from stores.sql.by_id import ByIdOps
from stores.sql.children import ChildIO, attach, split_data
from stores.sql.claims import ClaimOps
from stores.sql.connections import (
    ConnectionLender,
    Connections,
    create_engine,
    database_name,
    driver_errors,
    enable_wal,
    is_corrupt,
    is_memory,
    reason_of,
    setup_postgres,
    setup_sqlite,
    unavailable,
)
from stores.sql.core import ATTEMPTS, Positional, SqliteWrite
from stores.sql.creates import CreateOps
from stores.sql.dialect import PostgresFlavor, SqliteFlavor, Statements, condition_shape
from stores.sql.effects import EffectOps
from stores.sql.feed import FeedOps
from stores.sql.joined import JOINED, Joined, joined_sync
from stores.sql.leases import LeaseOps
from stores.sql.limited import LimitedClaimOps
from stores.sql.migrate import current_revision, ensure_schema
from stores.sql.partitions import partitions_ahead
from stores.sql.reaper_batches import ReaperOps
from stores.sql.retention import RetentionOps
from stores.sql.rows import dumps_data, history_of, snapshot_of
from stores.sql.schema import HEAD_REVISION, decode_time
from stores.sql.waits import WaitOps

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///fsm.db"
_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")
_PUBLIC = (
    "now", "create", "get", "history", "find_transition", "apply", "acquire_lease", "renew_lease",
    "release_lease", "soft_delete", "has_newer_sibling", "candidates", "apply_batch", "move_candidates",
    "effect", "effects", "record_effect", "run", "claim", "entities", "count_states", "renewals",
    "apply_checked", "move_candidates_brief", "apply_by_id", "apply_by_id_checked",
)  # fmt: skip


def _schema_of(binding: TableBinding | None) -> str | None:
    return binding.schema if binding is not None else None


_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
MAX_BUSY_TIMEOUT = 24 * 3600.0
"""Longest a SQLite writer may be told to wait for the write lock (seconds)."""


def _check_options(
    url: object,
    clock: object,
    prefix: object,
    create: object,
    binding: object,
    schema: object,
    busy_timeout: object,
    synchronous: object,
) -> None:
    """Refuse ill-typed or out-of-range store options with ``ConfigError``, before anything opens."""
    problems = []
    if isinstance(url, str):
        if text_problem(url, limit=None) is not None:
            problems.append(f"url {text_problem(url, limit=None)}")
    elif not isinstance(url, sa.Engine):
        problems.append(f"url_or_engine must be a URL string or a SQLAlchemy Engine, not {type(url).__name__}")
    if clock is not None and not isinstance(clock, Clock):
        problems.append(f"clock must be a Clock (with a now() method), not {clock!r}")
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        problems.append(f"table_prefix {prefix!r} must be an identifier of at most 31 characters")
    if not isinstance(create, bool):
        problems.append(f"create must be True or False, not {create!r}")
    if binding is not None and not isinstance(binding, TableBinding):
        problems.append(f"binding must be a TableBinding, not {binding!r}")
    if schema is not None and (not isinstance(schema, str) or not _SCHEMA.match(schema)):
        problems.append(f"schema {schema!r} must be an identifier of at most 63 characters")
    if (
        isinstance(busy_timeout, bool)
        or not isinstance(busy_timeout, int | float)
        or not math.isfinite(busy_timeout)
        or not 0 <= busy_timeout <= MAX_BUSY_TIMEOUT
    ):
        problems.append(
            f"busy_timeout must be a number of seconds from 0 to {MAX_BUSY_TIMEOUT:.0f}, not {busy_timeout!r}"
        )
    if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
        problems.append(f"sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
    if problems:
        raise ConfigError("invalid store options: " + "; ".join(problems), problems=problems)


def _shown_url(url: str) -> str:
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<the url>" if "@" in url else url


_T = TypeVar("_T")


class _Refused(Exception):
    """The guarded statement matched no row."""


class SqlStore(
    LeaseOps,
    ReaperOps,
    EffectOps,
    WaitOps,
    LimitedClaimOps,
    ClaimOps,
    CreateOps,
    BatchOps,
    ByIdOps,
    FeedOps,
    RetentionOps,
):
    """A :class:`stores.Store` on SQLite or PostgreSQL (psycopg 3).

    ``url_or_engine``: a URL (``sqlite:///fsm.db``, ``postgresql+psycopg://user@host/db``)
    or an engine.  ``clock``: bind this clock's time instead of the server's (tests).
    ``table_prefix``: names the tables ``{prefix}entities``/``history``/``effects``.
    ``create``: create or upgrade the library's tables (Alembic) on start; otherwise they
    must be current.  ``binding``: run on an application's existing table
    (:class:`stores.sql.binding.TableBinding`).  ``schema``: PostgreSQL schema of the tables.
    ``busy_timeout``: seconds a SQLite writer waits for the write lock.
    ``sqlite_synchronous``: ``FULL`` (default: a commit survives power loss) or ``NORMAL``
    (WAL-safe, faster; the last commits may roll back on power loss).

    Thread-safe: each thread uses its own connection (see :mod:`stores.sql.connections`).  Not
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
        _check_options(url_or_engine, clock, table_prefix, create, binding, schema, busy_timeout, sqlite_synchronous)
        if engine_options is not None and not isinstance(engine_options, dict):
            raise ConfigError(f"engine_options must be a dict, not {engine_options!r}")
        if isinstance(url_or_engine, sa.Engine):
            engine, self._owns_engine = url_or_engine, False
        else:
            try:
                engine = create_engine(url_or_engine, busy_timeout=busy_timeout, **(engine_options or {}))
            except (sa.exc.ArgumentError, TypeError, ValueError) as err:  # not a URL, or options it refuses
                raise ConfigError(f"cannot open {_shown_url(url_or_engine)}: {err}") from err
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
        self._positional: dict[str, Positional] = {}  # SQLite hot-path statements with ? parameters
        self._status = binding.status_for if binding is not None and binding.status_column else None
        self._children = (
            [ChildIO(c, engine.dialect, self._f, layout.binding.schema) for c in layout.children]
            if layout.binding
            else []
        )
        memory = self._sqlite and is_memory(engine.url)
        setup = setup_sqlite(int(busy_timeout * 1000), sqlite_synchronous) if self._sqlite else setup_postgres
        self._integrity, self._errors = driver_errors(name)
        self._conns = Connections(engine, setup, shared=memory, errors=self._errors)
        opening: tuple[type[BaseException], ...] = (sa.exc.DBAPIError, *self._errors)
        self._app_columns: frozenset[str] = frozenset()
        try:
            if self._sqlite and not memory:
                enable_wal(engine)
            if binding is not None:  # first: a missing application table is a ConfigError naming it
                self._app_columns = app_columns(engine, binding)
            if create:
                ensure_schema(engine, table_prefix=table_prefix, schema=schema, binding=binding)
            else:
                current = current_revision(engine, table_prefix=table_prefix, schema=schema or _schema_of(binding))
                if current != HEAD_REVISION:
                    upgrade = f"fsm migrate upgrade URL --prefix {table_prefix}"
                    raise ConfigError(
                        f"no fsm-lifecycles tables with prefix {table_prefix!r} here (opened without creating any): "
                        f"check the URL and the prefix, or create them with `{upgrade}`"
                        if current is None
                        else f"the store's tables ({table_prefix}*) are at revision {current or '(none)'}, not "
                        f"{HEAD_REVISION}: upgrade them first with `{upgrade}` (or stores.sql.upgrade(url))"
                    )
            if binding is not None and (absent := missing_columns(engine, binding)):
                raise ConfigError(
                    f"table {binding.table!r} lacks the binding's columns",
                    problems=[
                        f"missing: {', '.join(absent)}",
                        "add them with stores.sql.binding.add_missing_columns(engine, binding), or "
                        "add_binding_columns(op, binding) in the application's Alembic migration",
                    ],
                )
            self._check_history_owner(engine, table_prefix, schema, binding)
            if not self._sqlite and binding is None:
                partitions_ahead(engine, table_prefix, schema)
        except opening as err:
            self.close()
            if is_corrupt(err):  # not a database, or a corrupt one: say which file
                raise StoreCorrupt(database_name(engine.url), reason=str(getattr(err, "orig", err))) from err
            raise StoreUnavailable(f"cannot open the store at {engine.url!r}: {getattr(err, 'orig', err)}") from err
        except BaseException:
            self.close()
            raise
        if self._conns.lock is not None:  # one shared in-memory connection: serialise every call
            for method in _PUBLIC:
                setattr(self, method, _locked(getattr(self, method), self._conns.lock))

    @staticmethod
    def _check_history_owner(engine: sa.Engine, prefix: str, schema: str | None, binding: TableBinding | None) -> None:
        """Refuse a ``{prefix}history`` that belongs to another entity table.

        A bound store and the default store in one database with the same prefix would
        share it: its foreign key points at whichever entity table came first (the library's
        own history on PostgreSQL has none: the ``{prefix}entities`` beside it owns it), and
        the two stores' rows would mix.  Each store needs a prefix of its own.
        """
        expected = binding.table if binding is not None else f"{prefix}entities"
        where = binding.schema if binding is not None else schema
        history = f"{prefix}history"
        inspector = sa.inspect(engine)
        if not inspector.has_table(history, schema=where):
            return
        owners = {fk["referred_table"] for fk in inspector.get_foreign_keys(history, schema=where)}
        own = f"{prefix}entities"
        if not owners and inspector.has_table(own, schema=where):
            owners = {own}  # PostgreSQL: the library's own history keeps no foreign key (migration 0007)
        if owners and expected not in owners:
            raise ConfigError(
                f"table {history!r} belongs to the entity table {', '.join(sorted(owners))!r}, not {expected!r}",
                problems=[
                    f"two stores in one database share the table prefix {prefix!r}",
                    f"give this store a prefix of its own, e.g. table_prefix='{expected[:20]}_fsm_'",
                ],
            )

    def close(self) -> None:
        """Close this store's connections (and its engine, if it created it)."""
        self._close_feed_listener()
        self._conns.close()
        if self._owns_engine:
            self.engine.dispose()

    def joined(self, connection: Any) -> contextlib.AbstractContextManager[Joined]:
        """Inside the block, this store's calls in this thread run on ``connection`` (a
        SQLAlchemy ``Connection`` or ``Session`` the caller holds, begun if it is not yet)
        and inside its transaction: the caller commits or rolls them back with its own
        writes (:mod:`stores.sql.joined`).  ``ConfigError`` for another driver, an
        autocommit connection, or a call after the caller's transaction ended.  Signals are
        the engine's: use :meth:`fsm.Engine.within`, which holds them until the commit."""
        return joined_sync(self, connection)

    def lend_connections(self, limit: int, wait: float = 30.0) -> ConnectionLender | None:
        """At most ``limit`` connections shared by a group of threads, each thread's given
        back when it is idle (a worker's handler threads: :class:`~stores.sql.connections.ConnectionLender`);
        ``None`` on SQLite, where each thread keeps its own (no server counts them)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigError(f"limit must be an integer from 1 to 1000, not {limit!r}")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 3600:
            raise ConfigError(f"wait must be a number of seconds from 0 to 3600, not {wait!r}")
        return self._conns.lender(limit, float(wait))

    def plan_for_work(self) -> None:
        """Plan this thread's statements as a long-running worker's are planned, from the
        first run (a worker calls it on each of its threads; PostgreSQL only, else nothing).

        psycopg prepares a statement at its sixth run, and PostgreSQL then plans it afresh
        five more times before it settles on the generic plan: a new worker's first claims
        each paid for planning the claim (measured: 3.0 against 1.5 ms a claim, most of an
        idle pickup).  On this thread's connection statements are now prepared at their
        first run and planned generically (``plan_cache_mode = force_generic_plan``): the
        plans the work path's statements are written for (their EXPLAIN tests), which a
        worker uses after ten runs anyway.  Inside :meth:`joined` (the caller's
        connection), nothing changes."""
        if self._sqlite or JOINED.get() is not None:
            return
        slot = self._conns.slot()
        if slot.planned_for_work:
            return
        try:
            slot.conn.prepare_threshold = 0
            slot.conn.execute("SET plan_cache_mode = force_generic_plan")
        except self._errors as err:  # the first statement will say so again, typed
            log.info("could not set the work path's planning: %s", err)
            return
        slot.planned_for_work = True

    def __repr__(self) -> str:
        return f"SqlStore({self.engine.url!r}, table_prefix={self.table_prefix!r})"

    # -- plumbing ------------------------------------------------------------------------------

    # -- reads ---------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The clock's time if the store has one, else the database's (SQLite: this machine's)."""
        when = self._now()
        if when is not None:
            return when
        return decode_time(self._run(self._sql.now_query, {})[0][0])

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        """See :meth:`stores.Store.get`: one indexed read on the calling thread's connection."""
        rows = self._run(self._sql.get, {"id": check_id("entity id", entity_id)})
        if not rows or (rows[0][10] and not include_deleted):
            raise UnknownEntity(entity_id)
        snap = snapshot_of(rows[0])
        return self._attach([snap])[0] if self._children else snap

    def history(self, entity_id: str) -> list[HistoryRecord]:
        """See :meth:`stores.Store.history` (soft-deleted entities keep theirs)."""
        rows = self._run(self._sql.history, {"id": check_id("entity id", entity_id)})
        if not rows and not self._run(self._sql.exists, {"id": entity_id}):
            raise UnknownEntity(entity_id)
        return [history_of(r) for r in rows]

    def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        """See :meth:`stores.Store.find_transition`."""
        params = {"id": check_id("entity id", entity_id), "key": check_id("idempotency_key", idempotency_key)}
        rows = self._run(self._sql.find, params)
        return history_of(rows[0]) if rows else None

    def has_newer_sibling(self, entity_id: str) -> bool:
        """See :meth:`stores.Store.has_newer_sibling` (the same EXISTS the guard runs)."""
        rows = self._run(self._sql.sibling, {"id": check_id("entity id", entity_id)})
        if not rows or rows[0][0]:
            raise UnknownEntity(entity_id)
        return bool(rows[0][1])

    # -- writes --------------------------------------------------------------------------------

    def create(self, entity: NewEntity) -> Snapshot:
        """See :meth:`stores.Store.create`: ``INSERT ... ON CONFLICT DO NOTHING``, no row back
        means the id exists.  ``entity.columns`` fill a bound table's own columns; a
        constraint of that table the row breaks -> ``ConstraintViolated`` (nothing written)."""
        check_new_entity(entity)
        extra: tuple[str, ...] = ()
        data, children = split_data(self._children, entity.data) if self._children else (entity.data, {})
        now = self._now()
        params: dict[str, Any] = {
            "id": entity.id,
            "kind": entity.kind,
            "state": entity.state,
            "ck": entity.concurrency_key,
            "data": dumps_data(data, entity.id),
        }
        self._time_params(params, now, None)
        due: str | None = None
        if isinstance(entity.run_after, datetime):
            due, params["due"] = "at", self._f.time(entity.run_after)
        elif entity.run_after is not None:
            due, params["due"] = "in", self._f.offset(now, entity.run_after)
        if self._status is not None:
            params["status"] = self._status(entity.state)
        if entity.columns:
            extra = self._column_params(entity.columns, params)
        extra += self._placement_params(entity, params, len(extra))
        unique = entity.unique_finals is not None
        if unique:
            params["finals"] = self._f.ids(entity.unique_finals or ())
        sql = self._sql.create(extra, due, entity.arm_timer, unique)
        if not self._sqlite:  # the wake-up rides in the insert: sent only if it commits
            sql = self._with_notify(sql)
            params["ntf"] = self._channel(entity.kind)
        try:
            if unique and not self._sqlite:
                rows = self._create_unique_pg(sql, params, entity, children)
            else:  # SQLite: one writer at a time, so the insert's own NOT EXISTS is exact
                rows = self._write(sql, params, entity.id, children)
        except self._integrity as err:
            raise ConstraintViolated(
                entity.id,
                detail=f"{reason_of(err)} (a column of the table that the store does not fill: pass it in columns=)",
            ) from err
        if not rows:
            if unique:
                found = self._run(self._sql.active_duplicate(self._sql.L.ref("id", "u")) + " LIMIT 1", params)
                if found:
                    raise ActiveDuplicate(entity.id, key=str(entity.concurrency_key), existing=found[0][0])
            raise EntityExists(entity.id)
        made = self._attach([snapshot_of(rows[0])])[0]
        self._created_notices({entity.kind}, sent=entity.kind)
        return made

    def _create_unique_pg(
        self, sql: str, params: dict[str, Any], entity: NewEntity, children: dict[str, Any]
    ) -> list[Any]:
        """PostgreSQL: a create unique while active, in a transaction that first takes an
        advisory lock on its kind and key: concurrent creates of one key run one after the
        other, and each insert's ``NOT EXISTS`` (its snapshot taken after the lock) sees the
        one committed before it."""
        slot = self._conns.slot()
        cur = slot.cursor
        lock = f"{self.table_prefix}{entity.kind}:{entity.concurrency_key}"
        try:
            with slot.conn.transaction():
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))", {"lock": lock})
                return self._write_children(cur, sql, params, entity.id, children)
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, entity.id) from err

    def _column_params(self, columns: dict[str, Any], params: dict[str, Any]) -> tuple[str, ...]:
        """The quoted names of a bound table's own columns, their values bound as ``x0``..."""
        if self.binding is None:
            raise InvalidArgument("this store owns its entity table: it has no application columns to fill")
        unknown = sorted(set(columns) - self._app_columns)
        if unknown:
            raise InvalidArgument(
                f"table {self.binding.table!r} has no application column {', '.join(map(repr, unknown))} "
                f"(its own columns: {', '.join(sorted(self._app_columns)) or 'none'})"
            )
        quote = self.engine.dialect.identifier_preparer.quote
        names = sorted(columns)
        for i, name in enumerate(names):
            params[f"x{i}"] = columns[name]
        return tuple(quote(n) for n in names)

    def _placement_params(self, entity: NewEntity, params: dict[str, Any], first: int) -> tuple[str, ...]:
        """A create's priority, parent and definition version, when not the defaults, as
        more ``x{i}`` columns (the batch insert writes neither priority nor parent: such a
        create takes the single-row insert)."""
        c = self._sql.L.col
        names: list[str] = []
        placed = (("priority", entity.priority, 0), ("parent_id", entity.parent_id, None))
        for name, value, default in (*placed, ("definition", entity.definition, None)):
            if value != default:
                params[f"x{first + len(names)}"] = value
                names.append(c[name])
        return tuple(names)

    def _write(self, sql: str, params: dict[str, Any], entity_id: str, children: dict[str, Any]) -> list[Any]:
        """A single-statement write, plus child rows in the same transaction when given."""
        if not children:
            return self._run(sql, params)
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._sqlite:  # its own transaction, or a savepoint inside one (create_chains)
                with SqliteWrite(slot, "fsm_write") as cur:
                    return self._write_children(cur, sql, params, entity_id, children)
            with slot.conn.transaction():
                return self._write_children(cur, sql, params, entity_id, children)
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, entity_id) from err

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

    # beside apply, so a subclass overriding apply is never fired by id past it
    # (fsm.engine.by_id.by_id_of); the code is stores.sql.by_id's
    apply_by_id = ByIdOps.apply_by_id

    def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        """See :meth:`stores.Store.apply`: one guarded statement (PostgreSQL) or transaction
        (SQLite) writes the row and its history row; a refusal is diagnosed by re-reading.

        With ``write.before`` (on the library's own table) the statement returns only the
        columns the write changes and the new snapshot is built from ``before``: the data
        is neither returned nor decoded (``write.data`` when it changed, else ``before``'s)."""
        return self.apply_checked(check_transition_write(write))

    def apply_chain(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord]]:
        """See :meth:`stores.Store.apply_chain`: the writes in one transaction on this thread's
        connection (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: ``BEGIN``; inside the caller's,
        a savepoint), each the statement :meth:`apply` sends; a refusal undoes them all."""
        checked = check_chain(writes)
        self._refuse_reused_keys(checked)
        return self._in_one_transaction(lambda: [self.apply_checked(w) for w in checked])

    def create_chains(
        self, items: Sequence[tuple[NewEntity, Sequence[TransitionWrite]]]
    ) -> list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]]:
        """See :meth:`stores.Store.create_chains`: one transaction on this thread's connection
        (inside the caller's, a savepoint), each insert the statement :meth:`create` sends and
        each write the one :meth:`apply` sends; a refusal undoes them all."""
        checked = check_create_chains(items)
        return self._in_one_transaction(
            lambda: [(self.create(entity), [self.apply_checked(w) for w in writes]) for entity, writes in checked]
        )

    def apply_group(
        self, writes: Sequence[TransitionWrite], creates: Sequence[NewEntity]
    ) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
        """See :meth:`stores.Store.apply_group`: one transaction on this thread's connection
        (inside the caller's, a savepoint), each write the statement :meth:`apply` sends and
        each insert the one :meth:`create` sends; a refusal undoes them all."""
        checked, made = check_group(writes, creates)
        self._refuse_reused_keys(checked)
        return self._in_one_transaction(
            lambda: ([self.apply_checked(w) for w in checked], [self.create(e) for e in made])
        )

    def _refuse_reused_keys(self, writes: Sequence[TransitionWrite]) -> None:
        """A reused idempotency key would fail PostgreSQL's transaction before the refusal
        could be diagnosed: asked first (the unique key still refuses a racing twin)."""
        for write in writes:
            if write.idempotency_key is not None:
                recorded = self.find_transition(write.entity_id, write.idempotency_key)
                if recorded is not None:
                    raise IdempotencyKeyReused(
                        write.entity_id, key=write.idempotency_key, recorded_event=recorded.event, event=write.event
                    )

    def _in_one_transaction(self, run: Callable[[], _T]) -> _T:
        """``run()`` in one transaction on this thread's connection (SQLite: ``BEGIN
        IMMEDIATE``; PostgreSQL: ``BEGIN``; inside the caller's, a savepoint): its writes
        commit together, and an exception undoes them all."""
        slot = self._conns.slot()
        if self._sqlite:
            with SqliteWrite(slot, "fsm_chain"):
                return run()
        with slot.conn.transaction():
            return run()

    def apply_checked(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        """:meth:`apply` for a write already checked by ``fsm.limits.check_transition_write``'s
        rules (see :func:`stores.base.unchecked_apply`)."""
        entity_id = write.entity_id
        require = write.require
        before = write.before if self._sql.lean_ok else None
        if before is not None and (before.version != write.expect_version or before.id != entity_id):
            before = None  # not the snapshot this write was judged on: read the columns back
        # blind (SQLite): the caller's snapshot tells every column the write leaves, once the
        # update also requires its lease holder and token (they move without a version bump:
        # acquire_lease, release_lease); only a kept, held lease's expiry is unknown (a renewal
        # moves it), so that write reads it back.  No RETURNING: the rows written are counted.
        due = write.run_after
        blind = (
            before is not None
            and self._sqlite
            and due is None  # the due time the statement sets is read back
            and not (write.lease_change is LeaseChange.KEEP and before.lease_owner is not None)
        )
        shape = (
            write.lease_change,
            write.lease_ttl is not None,
            write.expect_token is not None,
            condition_shape(require) if require else (),
            require,
            write.bump_attempt,
            write.bump_reclaims,
            write.data is not None,
            before is not None,
        )
        timer = write.timer
        definition = write.definition
        defines = definition is not None
        memory = write.memory
        sql = self._sql.apply(*shape, blind, due is not None, timer, defines, memory is not None, write.restart)
        children: dict[str, Any] = {}
        data_text: str | None = None
        if write.data is not None:
            data = write.data
            if self._children:
                data, children = split_data(self._children, data)
            data_text = dumps_data(data, entity_id)
        patch = write.data_patch
        patch_text = None if patch is None else dumps_data(patch, entity_id)
        params: dict[str, Any] = {
            "id": entity_id,
            "version": write.expect_version,
            "owner": write.expect_owner,
            "token": write.expect_token,
            "event": write.event,
            "source": write.source,
            "target": write.target,
            "actor": write.actor,
            "reason": write.reason,
            "key": write.idempotency_key,
            "patch": patch_text,
            "data": data_text,
            "new_owner": write.new_owner,
            "howner": write.history_owner(),
            "error": None if write.error is None else dumps_data(write.error, entity_id),
        }
        if self._status is not None:
            params["status"] = self._status(write.target)
        if blind:
            assert before is not None
            params["btoken"], params["bowner"] = before.lease_token, before.lease_owner
        if defines:
            params["defn"] = definition
        if memory is not None:
            params["memory"] = dumps_data(memory, entity_id)
        integrity = False
        for _ in range(ATTEMPTS + blind):  # a refused blind write is retried lean, not counted
            now = self._now()
            self._time_params(params, now, write.lease_ttl)
            if due is not None:
                params["due"] = self._f.offset(now, due)
            if require:
                self._sql.condition_params(params, require, now)
            try:
                row: Any
                if blind:
                    assert before is not None and now is not None
                    row, at = self._blind_sqlite(sql, params, write, before), now
                else:
                    row, at = (self._apply_sqlite if self._sqlite else self._apply_pg)(
                        sql, params, now, children, before is not None
                    )
                if before is None:
                    snap = row
                else:  # positional: the hot path
                    exp, ra = row[3], row[6] if len(row) > 6 else _due_now(before.run_after, at)
                    since = before.timer_since if timer is TimerMode.KEEP else at if timer is TimerMode.ARM else None
                    snap = Snapshot(
                        entity_id, before.kind, write.target, row[0], row[1], row[2],
                        None if exp is None else decode_time(exp), at, before.created_at, at, False,
                        before.concurrency_key, row[4], row[5], before.data if write.data is None else write.data,
                        None if ra is None else decode_time(ra), since, before.priority, before.parent_id,
                        before.definition if definition is None else definition,
                        before.memory if memory is None else memory,
                    )  # fmt: skip
                record = HistoryRecord(
                    entity_id, snap.version, write.event, write.source, write.target, write.actor, snap.lease_token,
                    write.reason, write.idempotency_key, at, None if patch_text is None else json.loads(patch_text),
                    params["howner"], write.error,
                )  # fmt: skip
                return snap, record
            except _Refused:
                if blind:  # the lease moved since the caller's snapshot: write as a lean write
                    blind = False
                    sql = self._sql.apply(
                        *shape, False, due is not None, timer, defines, memory is not None, write.restart
                    )
                    continue
            except self._integrity:
                integrity = True
            failure = self._diagnose_apply(write)
            if failure is not None:
                raise failure
        if integrity:
            raise MalformedRow(entity_id, reason="history and entity row disagree (a history seq is taken)")
        raise ConditionFailed(entity_id, condition=",".join(c.name for c in require) or "compare_and_set")

    def _blind_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], write: TransitionWrite, before: Snapshot
    ) -> tuple[Any, ...]:
        """A blind write (see :meth:`apply_checked`): the update and the history row in one
        transaction, and the lean columns as the update wrote them, known without reading."""
        change = write.lease_change
        owner, token, expires = before.lease_owner, before.lease_token, before.lease_expires_at
        if change is LeaseChange.ACQUIRE:
            owner, token = write.new_owner, token + 1
            expires = None if params["ttl"] is None else decode_time(params["ttl"])  # the text written
        elif change is LeaseChange.CLEAR:
            owner = expires = None
        attempt, reclaims = before.attempt, before.reclaims
        if write.restart:
            attempt, reclaims = 0, 0
        elif write.bump_attempt:
            attempt, reclaims = attempt + 1, 0
        elif write.bump_reclaims:
            reclaims += 1
        version = write.expect_version + 1  # the guard proved the row was at expect_version
        params["seq"], params["htoken"] = version, token
        update, update_values = self._qmark(sql[0])
        insert, insert_values = self._qmark(sql[1])
        try:
            with SqliteWrite(self._conns.slot(), "fsm_apply") as cur:
                if cur.execute(update, update_values(params)).rowcount != 1:
                    raise _Refused
                cur.execute(insert, insert_values(params))
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        return version, owner, token, expires, attempt, reclaims

    def _apply_sqlite(
        self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None, children: dict[str, Any], lean: bool
    ) -> tuple[Any, datetime]:
        """The row (a Snapshot, or the lean columns) and the write's time."""
        try:
            # the update runs first: inside a claim's transaction a savepoint undoes it when
            # the history row is refused (an idempotency key taken), as a rollback does alone
            with SqliteWrite(self._conns.slot(), "fsm_apply") as cur:
                update, values = self._qmark(sql[0])
                cur.execute(update, values(params))
                rows = cur.fetchall()
                if not rows:
                    raise _Refused
                row = rows[0]
                if lean:
                    params["seq"], params["htoken"] = row[0], row[2]
                else:
                    row = snapshot_of(row)  # decoded before COMMIT: a bad row rolls back
                    params["seq"], params["htoken"] = row.version, row.lease_token
                insert, values = self._qmark(sql[1])
                cur.execute(insert, values(params))
                if not lean:
                    if children:
                        for io in self._children:
                            if io.child.key in children:
                                io.save(cur, row.id, children[io.child.key])
                    if self._children:
                        row = attach(self._children, cur, [row])[0]
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        assert now is not None
        return row, now

    def _apply_pg(
        self, sql: tuple[str, ...], params: dict[str, Any], now: datetime | None, children: dict[str, Any], lean: bool
    ) -> tuple[Any, datetime]:
        """The row (a Snapshot, or the lean columns) and the statement's time."""
        slot = self._conns.slot()
        cur = slot.cursor
        try:
            if self._children:
                with slot.conn.transaction():
                    rows = self._write_children(cur, sql[0], params, params["id"], children)
                    if rows:
                        row = attach(self._children, cur, [snapshot_of(rows[0])])[0]
            else:
                cur.execute(sql[0], params)
                rows = cur.fetchall()
                if rows:
                    row = rows[0] if lean else snapshot_of(rows[0])
        except self._integrity:
            raise
        except self._errors as err:
            raise unavailable(err, self._conns, params["id"]) from err
        if not rows:
            raise _Refused
        return row, decode_time(rows[0][-1])

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
        if row.state != write.source:  # a bound table's application changed its status column
            return ConditionFailed(entity_id, condition=f"state is {row.state!r}, not {write.source!r}")
        if write.expect_token is not None and (
            row.lease_token != write.expect_token or row.lease_owner != write.expect_owner
        ):
            return LeaseLost(
                entity_id, expected_token=write.expect_token, found_token=row.lease_token, owner=write.expect_owner
            )
        for cond in write.require:
            sibling = self.has_newer_sibling(entity_id) if isinstance(cond, NewerSibling) else None
            other = self._held_row(cond.entity_id) if isinstance(cond, HeldBy) else None
            if not condition_holds(cond, row, now, sibling, other):
                return ConditionFailed(entity_id, condition=cond.name)
        return None

    def _held_row(self, entity_id: str) -> Snapshot | None:
        """The row a :class:`~fsm.records.HeldBy` condition names, or ``None``."""
        try:
            return self.get(entity_id, include_deleted=True)
        except FsmError:
            return None

    def soft_delete(self, entity_id: str) -> Snapshot:
        """See :meth:`stores.Store.soft_delete`.  A malformed row is deleted all the same
        (it is how one gets rid of it); ``MalformedRow`` then says its content is unreadable."""
        params: dict[str, Any] = {"id": check_id("entity id", entity_id)}
        self._time_params(params, self._now(), None)
        rows = self._run(self._sql.soft_delete, params)
        if not rows:
            raise UnknownEntity(entity_id)
        return self._attach([snapshot_of(rows[0])])[0]


def _due_now(due: datetime | None, now: datetime) -> datetime | None:
    """What a transition without a due time of its own leaves (``Statements.due_now``)."""
    return now if due is not None and due > now else due


def _locked(method: Callable[..., Any], lock: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return call


__all__ = ["DEFAULT_URL", "SqlStore"]
