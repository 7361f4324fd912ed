"""The tables the SQL store owns, their indexes, and how a timestamp is stored.

Three tables, named ``{prefix}entities``, ``{prefix}history`` and ``{prefix}effects``
(DESIGN section 5), plus ``{prefix}alembic_version`` for migrations.  The entity table is
replaced by an application's own table when the store is bound to one
(:mod:`stores.sql.binding`); history and effects are always the library's.

Timestamps: PostgreSQL stores ``timestamptz`` (microseconds, compared and added in SQL).
SQLite has no timestamp type, so a timestamp is fixed-width ISO-8601 text in UTC,
``YYYY-MM-DD HH:MM:SS.ffffff+00:00``: text order is time order (the reaper's range scans
and ``<`` guards work on the index), it round-trips microseconds exactly, and it stays
readable in the ``sqlite3`` shell.

The schema here and the Alembic migrations in ``stores/migrations`` must agree; a test
compares the two with SQLAlchemy inspection.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from stores.sql.feed_mark import drop_feed_mark_ddl, feed_mark_ddl

HEAD_REVISION = "0012"
"""The newest migration; a schema stamped with it needs no upgrade."""

ENTITY_COLUMNS = (
    "id",
    "kind",
    "state",
    "version",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "state_entered_at",
    "created_at",
    "updated_at",
    "deleted",
    "concurrency_key",
    "attempt",
    "reclaims",
    "data",
    "run_after",
    "timer_since",
    "priority",
    "parent_id",
    "definition",
    "memory",
)
"""Logical entity columns, in :class:`fsm.records.Snapshot` field order (rows decode positionally)."""
AFTER_ENTITY = len(ENTITY_COLUMNS)
"""Where a statement's first column after the entity's columns is (its ``now``, a part number)."""

HISTORY_COLUMNS = (
    "entity_id",
    "seq",
    "event",
    "source",
    "target",
    "actor",
    "lease_token",
    "reason",
    "idempotency_key",
    "at",
    "data",
    "owner",
    "error",
)
"""History columns, in :class:`fsm.records.HistoryRecord` field order."""
HISTORY_MOVE_COLUMNS = HISTORY_COLUMNS[:11]
"""What a reaper's batch writes of a history row: no owner, no error (both stay NULL)."""

TIME_COLUMNS = frozenset(
    {"lease_expires_at", "state_entered_at", "created_at", "updated_at", "run_after", "timer_since"}
)

ID_LENGTH = 255
NAME_LENGTH = 64


def encode_sqlite_time(value: datetime) -> str:
    """An aware datetime as the fixed-width UTC text SQLite stores."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: the store only takes aware (UTC) datetimes")
    return value.astimezone(UTC).isoformat(" ", "microseconds")


def decode_time(value: Any) -> datetime:
    """A stored timestamp (SQLite text, or a driver datetime) as an aware UTC datetime.

    A naive value (a bound application column of type ``timestamp without time zone``,
    read on a UTC session) is taken as UTC.
    """
    if value.__class__ is str:
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
    return value  # type: ignore[no-any-return]


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC timestamp: ``timestamptz`` on PostgreSQL, fixed-width text on SQLite."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.String(32))
        return dialect.type_descriptor(sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None or dialect.name != "sqlite":
            return value
        return encode_sqlite_time(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else decode_time(value)


class JsonDocument(TypeDecorator[Any]):
    """A JSON document: ``jsonb`` on PostgreSQL, text on SQLite (TEXT affinity, kept as written)."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(sa.Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, str):
            return json.loads(value)
        return value


def json_default() -> sa.TextClause:
    """Server default of a data column: an empty object."""
    return sa.text("'{}'")


def entity_columns(names: dict[str, str], *, kind_default: str | None = None) -> list[sa.Column[Any]]:
    """The entity columns under physical ``names`` (logical -> physical).

    Library-owned tables get them all, ``NOT NULL`` where a row always has a value; a bound
    application table gets only the missing ones, where ``kind_default`` fills ``kind``
    and the rest is nullable or has a server default, so adding them is additive.
    """
    bound = kind_default is not None
    cols: dict[str, sa.Column[Any]] = {
        "id": sa.Column(names["id"], sa.String(ID_LENGTH), primary_key=True),
        "kind": sa.Column(
            names["kind"],
            sa.String(NAME_LENGTH),
            nullable=False,
            server_default=sa.text(_sql_literal(kind_default)) if kind_default is not None else None,
        ),
        "state": sa.Column(names["state"], sa.String(NAME_LENGTH), nullable=bound),
        "version": sa.Column(names["version"], sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        "lease_owner": sa.Column(names["lease_owner"], sa.String(ID_LENGTH), nullable=True),
        "lease_token": sa.Column(names["lease_token"], sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        "lease_expires_at": sa.Column(names["lease_expires_at"], UtcDateTime(), nullable=True),
        "state_entered_at": sa.Column(names["state_entered_at"], UtcDateTime(), nullable=bound),
        "created_at": sa.Column(names["created_at"], UtcDateTime(), nullable=bound),
        "updated_at": sa.Column(names["updated_at"], UtcDateTime(), nullable=False),
        "deleted": sa.Column(names["deleted"], sa.Boolean(), nullable=False, server_default=sa.false()),
        "concurrency_key": sa.Column(names["concurrency_key"], sa.String(ID_LENGTH), nullable=True),
        "attempt": sa.Column(names["attempt"], sa.Integer(), nullable=False, server_default=sa.text("0")),
        "reclaims": sa.Column(names["reclaims"], sa.Integer(), nullable=False, server_default=sa.text("0")),
        "data": sa.Column(names["data"], JsonDocument(), nullable=False, server_default=json_default()),
        # nullable: a row written before revision 0004 (or by the application into a bound
        # table) has none; the store reads a missing due time as the row's creation time
        "run_after": sa.Column(names["run_after"], UtcDateTime(), nullable=True),
        # revision 0008: when the entity entered its timed state (NULL: in none)
        "timer_since": sa.Column(names["timer_since"], UtcDateTime(), nullable=True),
        # revision 0009: the claim's priority (higher first) and the parent of a child entity
        "priority": sa.Column(names["priority"], sa.SmallInteger(), nullable=False, server_default=sa.text("0")),
        "parent_id": sa.Column(names["parent_id"], sa.String(ID_LENGTH), nullable=True),
        # revision 0010: the lifecycle definition version the row last moved under (NULL:
        # written before versions were recorded); no index: a claim filters on it in the
        # rows its index walk reads
        "definition": sa.Column(names["definition"], sa.Integer(), nullable=True),
        # revision 0012: the history memory (fsm.history): {compound id: leaf id}, NULL when
        # the entity left no compound with a history state
        "memory": sa.Column(names["memory"], JsonDocument(), nullable=True),
    }
    return [cols[name] for name in ENTITY_COLUMNS]


def entity_indexes(table: sa.Table, stem: str, names: dict[str, str]) -> list[sa.Index]:
    """The entity table's indexes, named ``ix_{stem}_...``: the reaper's, the claim's and the
    inspector's (DESIGN sections 5, 6 and 7).

    Every index pays for itself on each write (revision 0002), and each one below has a
    reader that would otherwise sort or scan what grows with the store:

    - ``lease``: ``(kind, state, lease_expires_at, updated_at)`` finds expired leases by a
      range on the expiry, and lease-less idle rows by ``lease_expires_at IS NULL`` plus a
      range on ``updated_at`` (the trailing column makes that branch exact too); its
      ``(kind, state)`` prefix also serves a rule with counter conditions only;
    - ``claim``: ``(kind, state, run_after)`` (revision 0004), the workers' claim: a
      claimable state's rows in due order, walked from the oldest due time up to now and
      stopped after ``limit`` takers (never sorted).  Not partial on a free lease: a
      lease taken or given back would then move the row in and out of it;
    - ``recent``: ``(kind, state, updated_at, id)`` (revision 0006), the inspector's
      entity table (:mod:`fsm.inspect.listing`): most recently updated first, one
      ``ORDER BY updated_at DESC, id DESC LIMIT`` walk per (kind, state) pair, keyset
      pages seeking ``(updated_at, id) < (last shown)``, the data field search's bounded
      window, and the charts' sample of the last hour's changes.  Without it each walk
      sorts every row of its pair (over a second per page at 1,000,000 entities); with
      it each reads about a page of rows.  The trailing ``id`` is the keyset's tie-break:
      rows written by one statement (a batch of creates, a reaper batch) share their
      ``updated_at``, and the walk stays in index order through any number of them.
      ``lease`` cannot serve these walks: within a pair only its lease-less rows are in
      ``updated_at`` order, and a pair's leased rows (every running one) would be sorted.
      Revision 0004 dropped its predecessor ``idle`` ``(kind, state, updated_at)`` as
      read by the claim alone; the inspector read it too.  Its price: one more index
      entry moved per transition (each rewrites ``updated_at``), and on PostgreSQL per
      lease renewal too (a renewal moves ``lease_expires_at``, indexed in ``lease``, so
      the update is never HOT and every index gets the new row version);
    - ``siblings``: ``(kind, concurrency_key, state, created_at)`` for the ``NewerSibling``
      probe, partial (``WHERE concurrency_key IS NOT NULL``): most rows have no key, and a
      row without one can never have a sibling;
    - ``timer``: ``(kind, state, timer_since)`` (revision 0008), partial (``WHERE
      timer_since IS NOT NULL``): the reaper fires a timer of ``after`` by a range up to
      ``now - after`` and finds the earliest due timer at the start of the range.  Only
      rows in a timed state are in it, so lifecycles without timers pay nothing.
    - ``priority``: ``(kind, state, priority DESC, run_after)`` (revision 0009), partial
      (``WHERE priority <> 0``): the claim takes a state's raised rows (``priority > 0``)
      in index order before walking ``claim`` for the rest, and lowered rows after; rows
      at the default priority (most) are not in it and cost nothing more;
    - ``parent``: ``(parent_id, id)`` (revision 0009), partial (``WHERE parent_id IS NOT
      NULL``): a parent's children, for its fan-in and its cancel cascade.

    A bound application table gets the same indexes from ``add_missing_columns`` (which
    adds only those it lacks) or ``add_binding_columns`` (:mod:`stores.sql.binding`).
    """
    c = table.c
    keyed = c[names["concurrency_key"]].isnot(None)
    timed = c[names["timer_since"]].isnot(None)
    ranked = c[names["priority"]].op("<>")(0)
    parented = c[names["parent_id"]].isnot(None)
    return [
        sa.Index(
            f"ix_{stem}_lease",
            c[names["kind"]],
            c[names["state"]],
            c[names["lease_expires_at"]],
            c[names["updated_at"]],
        ),
        sa.Index(f"ix_{stem}_claim", c[names["kind"]], c[names["state"]], c[names["run_after"]]),
        sa.Index(f"ix_{stem}_recent", c[names["kind"]], c[names["state"]], c[names["updated_at"]], c[names["id"]]),
        sa.Index(
            f"ix_{stem}_siblings",
            c[names["kind"]],
            c[names["concurrency_key"]],
            c[names["state"]],
            c[names["created_at"]],
            sqlite_where=keyed,
            postgresql_where=keyed,
        ),
        sa.Index(
            f"ix_{stem}_timer",
            c[names["kind"]],
            c[names["state"]],
            c[names["timer_since"]],
            sqlite_where=timed,
            postgresql_where=timed,
        ),
        sa.Index(
            f"ix_{stem}_priority",
            c[names["kind"]],
            c[names["state"]],
            c[names["priority"]].desc(),
            c[names["run_after"]],
            sqlite_where=ranked,
            postgresql_where=ranked,
        ),
        sa.Index(
            f"ix_{stem}_parent",
            c[names["parent_id"]],
            c[names["id"]],
            sqlite_where=parented,
            postgresql_where=parented,
        ),
    ]


def build_metadata(
    prefix: str,
    *,
    schema: str | None = None,
    bound_table: str | None = None,
    bound_id_column: str = "id",
) -> sa.MetaData:
    """Tables of one store: entities (unless bound), history, effects, version table.

    With ``bound_table``, history and effects reference that application table's id
    column; a stub of it (its id only) is in the metadata for the foreign keys, and is never
    created by the library.
    """
    md = sa.MetaData(schema=schema)
    if bound_table is None:
        names = {n: n for n in ENTITY_COLUMNS}
        entities = sa.Table(f"{prefix}entities", md, *entity_columns(names))
        entity_indexes(entities, f"{prefix}entities", names)
        ref = f"{entities.fullname}.id"
    else:
        stub = sa.Table(bound_table, md, sa.Column(bound_id_column, sa.String(ID_LENGTH), primary_key=True))
        stub.info["bound"] = True
        ref = f"{stub.fullname}.{bound_id_column}"
    history_table(md, prefix, ref, own=bound_table is None)
    effects_table(md, prefix, ref)
    starts_table(md, prefix)
    version_table(md, prefix)
    return md


def history_table(md: sa.MetaData, prefix: str, entity_ref: str, *, own: bool = True) -> sa.Table:
    """Append-only history; ``(entity_id, seq)`` is the key, ``idempotency_key`` unique per entity.

    The foreign key to the entities: on PostgreSQL the library's own entity table keeps
    none (migration 0007).  Every history row is inserted from the ``RETURNING`` of the
    guarded update of its entity, in the same statement, so the row it names exists; the
    key's check on each insert (a lookup and a ``KEY SHARE`` lock of the entity row, three
    times a job) cost about a fifth of the server's CPU per job, and ``prune`` deletes
    history itself.  An application's own table (``own=False``) keeps it, with its
    ``ON DELETE CASCADE``: the application deletes its rows, the history follows.  SQLite
    keeps it (dropping it means rebuilding the table; its check is a C index probe)."""
    table = sa.Table(
        f"{prefix}history",
        md,
        sa.Column(
            "entity_id",
            sa.String(ID_LENGTH),
            sa.ForeignKey(entity_ref, ondelete="CASCADE", name=f"fk_{prefix}history_entity"),
            primary_key=True,
        ),
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("event", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("source", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("target", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("actor", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("lease_token", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(ID_LENGTH), nullable=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("data", JsonDocument(), nullable=True),
        sa.Column("owner", sa.String(ID_LENGTH), nullable=True),
        sa.Column("error", JsonDocument(), nullable=True),
    )
    if own:  # PostgreSQL: no foreign key on the library's own tables (see above)
        drop_key = f"ALTER TABLE %(fullname)s DROP CONSTRAINT fk_{prefix}history_entity"
        sa.event.listen(table, "after_create", sa.DDL(drop_key).execute_if(dialect="postgresql"))  # type: ignore[no-untyped-call]
    # PostgreSQL only: the feed's order (stores.sql.feed) and the partition key
    # (stores.sql.partitions), columns the ORM never names
    for statement in (*feed_ddl(prefix), born_ddl()):
        sa.event.listen(table, "after_create", sa.DDL(statement).execute_if(dialect="postgresql"))  # type: ignore[no-untyped-call]
    # SQLite only: positions never given twice (stores.sql.feed_mark)
    for statement in feed_mark_ddl(prefix, md.schema):
        ddl = sa.DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
        sa.event.listen(table, "after_create", ddl.execute_if(dialect="sqlite"))
    for statement in drop_feed_mark_ddl(prefix, md.schema):
        ddl = sa.DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]
        sa.event.listen(table, "after_drop", ddl.execute_if(dialect="sqlite"))
    # partial: most transitions carry no key, and NULL keys never conflict anyway
    keyed = table.c.idempotency_key.isnot(None)
    sa.Index(
        f"ux_{prefix}history_key",
        table.c.entity_id,
        table.c.idempotency_key,
        unique=True,
        sqlite_where=keyed,
        postgresql_where=keyed,
    )
    return table


FEED_TXID = "txid"
"""PostgreSQL history column: the id of the transaction that wrote the row (as bigint)."""


def feed_ddl(prefix: str, table: str = "%(fullname)s") -> tuple[str, ...]:
    """PostgreSQL: the history's ``txid`` column and the feed's index (migration 0003 runs
    the same statements; ``table`` is the quoted table name there)."""
    return (
        f"ALTER TABLE {table} ADD COLUMN {FEED_TXID} BIGINT DEFAULT (pg_current_xact_id()::text::bigint)",
        f"CREATE INDEX ix_{prefix}history_feed ON {table} ({FEED_TXID}, entity_id, seq)",
    )


BORN = "born"
"""PostgreSQL history column (revision 0011): the entity's ``created_at``, written with every
history row from the guarded update's ``RETURNING`` (so it is the same on every row of one
entity).  The key a partitioned history is partitioned by (:mod:`stores.sql.partitions`):
an entity's rows all live in one partition, and the primary key and the idempotency key's
unique index, which must contain the partition key, still mean "per entity".  NULL on rows
written before revision 0011 (the conversion fills them in)."""


def born_ddl(table: str = "%(fullname)s") -> str:
    """PostgreSQL: the history's ``born`` column (migration 0011 runs the same statement:
    nullable, no default, so adding it rewrites nothing)."""
    return f"ALTER TABLE {table} ADD COLUMN {BORN} TIMESTAMP WITH TIME ZONE"


def effects_table(md: sa.MetaData, prefix: str, entity_ref: str) -> sa.Table:
    """Recorded side-effect results (DESIGN section 7), one per ``(entity_id, key)``."""
    return sa.Table(
        f"{prefix}effects",
        md,
        sa.Column(
            "entity_id",
            sa.String(ID_LENGTH),
            sa.ForeignKey(entity_ref, ondelete="CASCADE", name=f"fk_{prefix}effects_entity"),
            primary_key=True,
        ),
        sa.Column("key", sa.String(ID_LENGTH), primary_key=True),
        sa.Column("status", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("lease_token", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("result", JsonDocument(), nullable=True),
        sa.Column("recorded_at", UtcDateTime(), nullable=True),
    )


def starts_table(md: sa.MetaData, prefix: str) -> sa.Table:
    """The starts a rate limit counts (revision 0009): one row per claim start of a
    rate-limited lifecycle, under its key (``''``: the lifecycle's own count), kept one
    period.  ``(kind, key, at)`` gives a window's count by a range; no primary key, as
    two starts may share a key and a time."""
    table = sa.Table(
        f"{prefix}starts",
        md,
        sa.Column("kind", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("key", sa.String(ID_LENGTH), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
    )
    sa.Index(f"ix_{prefix}starts_window", table.c.kind, table.c.key, table.c.at)
    return table


def version_table(md: sa.MetaData, prefix: str) -> sa.Table:
    """Alembic's version table, per prefix, laid out as Alembic creates it.

    Its own name keeps the library's migrations apart from the application's Alembic
    history in the same database.
    """
    return sa.Table(
        f"{prefix}alembic_version",
        md,
        sa.Column("version_num", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("version_num", name=f"{prefix}alembic_version_pkc"),
    )


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


__all__ = [
    "BORN",
    "ENTITY_COLUMNS",
    "HEAD_REVISION",
    "HISTORY_COLUMNS",
    "HISTORY_MOVE_COLUMNS",
    "JsonDocument",
    "UtcDateTime",
    "born_ddl",
    "build_metadata",
    "decode_time",
    "effects_table",
    "encode_sqlite_time",
    "entity_columns",
    "entity_indexes",
    "feed_ddl",
    "history_table",
    "starts_table",
    "version_table",
]
