"""Column mapping: where each logical entity column lives, in the library's table or an app's.

A :class:`Layout` tells the statement builder (:mod:`stores.sql.dialect`) the physical,
quoted name of every logical column and how to read it.  The store's own table maps each
column to itself.  A :class:`TableBinding` maps them onto an application's existing table
(seeds/000's ``pipeline_queue``), so a lifecycle runs on it while the table's own columns
keep their meaning:

- ``id``, ``updated_at`` (required) and optionally ``deleted``, ``created_at``,
  ``concurrency_key`` map to columns the application has (``updatedAt``, ``del``...);
- every other column is *added* under ``added_prefix`` (``fsm_state``, ``fsm_version``...):
  nullable or with a server default, so adding them is additive and the application's
  own inserts keep working;
- the application's ``status`` column is kept in sync from the leaf state through
  ``status_of`` (``running`` and ``finalizing`` both write ``Running``), and a row the
  application inserted itself (``fsm_state`` still NULL) reads its leaf from its status
  (``state_of``, by default the first state declared for that status), its
  ``state_entered_at``/``created_at`` from ``updated_at``;
- child tables (:class:`ChildRows`: a pipeline's ``steps``) are *the* source of one data
  key: reads load the child rows into ``data[key]``, a write that carries ``data[key]``
  upserts them (by natural key) in the same transaction, and the key is never copied into
  the JSON column, so the application and the store read the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from fsm.errors import ConfigError
from stores.sql.schema import ENTITY_COLUMNS, entity_columns, entity_indexes

MAPPABLE = frozenset({"id", "updated_at", "deleted", "created_at", "concurrency_key"})
"""Logical columns that may map onto existing application columns."""


@dataclass(frozen=True)
class ChildRows:
    """A child table whose rows are one data key of the parent entity (a pipeline's steps).

    ``fields`` maps each item's keys to child columns; ``natural_key`` names the field that
    identifies an item within its parent (used to upsert); ``values`` translates field
    values between data and column (``{"status": {"running": "Running"}}``).
    """

    key: str
    table: str
    parent_column: str
    fields: Mapping[str, str]
    natural_key: str = "name"
    order_by: str | None = None
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.natural_key not in self.fields:
            raise ConfigError(f"child rows {self.key!r}: natural_key {self.natural_key!r} is not one of the fields")

    def to_column(self, name: str, value: Any) -> Any:
        return self.values.get(name, {}).get(value, value)

    def to_field(self, name: str, value: Any) -> Any:
        mapping = self.values.get(name)
        if not mapping:
            return value
        for data_value, column_value in mapping.items():
            if column_value == value:
                return data_value
        return value


@dataclass(frozen=True)
class TableBinding:
    """Run a lifecycle of ``kind`` on the application table ``table``.

    ``columns`` maps logical columns (``id``, ``updated_at``, ``deleted``, ``created_at``,
    ``concurrency_key``) to the application's columns; the others are added as
    ``{added_prefix}{name}`` by :func:`add_missing_columns` (or :func:`add_binding_columns`
    in an Alembic migration).  ``status_column``/``status_of`` keep the application's
    status in sync with the leaf state; ``state_of`` reads a leaf from a status for rows
    the application inserted itself.
    """

    table: str
    kind: str
    columns: Mapping[str, str] = field(default_factory=dict)
    status_column: str | None = None
    status_of: Mapping[str, str] = field(default_factory=dict)
    state_of: Mapping[str, str] | None = None
    added_prefix: str = "fsm_"
    children: tuple[ChildRows, ...] = ()
    schema: str | None = None

    def __post_init__(self) -> None:
        problems = [f"{name!r} cannot map to an application column" for name in self.columns if name not in MAPPABLE]
        problems += [f"the binding must map {name!r}" for name in ("id", "updated_at") if name not in self.columns]
        if self.status_column is not None and not self.status_of:
            problems.append("status_column needs status_of (leaf state -> status value)")
        if problems:
            raise ConfigError(f"invalid binding for table {self.table!r}", problems=problems)

    @property
    def physical(self) -> dict[str, str]:
        """Logical column -> physical column name on the bound table."""
        return {n: self.columns.get(n, f"{self.added_prefix}{n}") for n in ENTITY_COLUMNS}

    @property
    def reverse_status(self) -> dict[str, str]:
        """Status value -> leaf state, for rows the application wrote itself."""
        if self.state_of is not None:
            return dict(self.state_of)
        reverse: dict[str, str] = {}
        for state, status in self.status_of.items():
            reverse.setdefault(status, state)
        return reverse

    def status_for(self, state: str) -> str:
        try:
            return self.status_of[state]
        except KeyError:
            raise ConfigError(
                f"binding of {self.table!r} has no status for state {state!r}",
                problems=[f"add {state!r} to status_of"],
            ) from None

    def added_columns(self) -> list[sa.Column[Any]]:
        """The columns the binding adds to the application's table (all additive)."""
        names = self.physical
        return [
            c
            for n, c in zip(ENTITY_COLUMNS, entity_columns(names, kind_default=self.kind), strict=True)
            if n not in self.columns
        ]

    def indexes(self) -> list[sa.Index]:
        """The entity indexes (the reaper's, the claim's, the inspector's: :func:`entity_indexes`) on the bound
        table, on a detached copy of its columns."""
        names = self.physical
        table = sa.Table(self.table, sa.MetaData(schema=self.schema), *entity_columns(names, kind_default=self.kind))
        return entity_indexes(table, f"{self.added_prefix}{self.table}", names)


ENTITY_INDEXES = ("lease", "claim", "siblings", "timer", "priority", "parent")
"""The entity indexes a store names in its statements (see :func:`stores.sql.schema.entity_indexes`)."""


@dataclass(frozen=True)
class Layout:
    """Quoted table names and per-column SQL for one store (owned or bound table)."""

    entities: str
    history: str
    effects: str
    col: dict[str, str]
    fallback: dict[str, str]
    status_col: str | None = None
    binding: TableBinding | None = None
    indexes: dict[str, str] | None = None
    """Quoted names of the entity indexes (``lease``, ``claim``, ``siblings``), when the store knows them."""
    starts: str = ""
    """The quoted name of the table of starts a rate limit counts."""

    def ref(self, name: str, alias: str) -> str:
        """SQL reading logical column ``name`` of the row aliased ``alias`` ("" = unqualified)."""
        qualifier = f"{alias}." if alias else ""
        template = self.fallback.get(name)
        if template is not None:
            return template.replace("{a}", qualifier)
        return f"{qualifier}{self.col[name]}"

    @property
    def children(self) -> tuple[ChildRows, ...]:
        return self.binding.children if self.binding is not None else ()


def owned_layout(dialect: sa.Dialect, prefix: str, schema: str | None) -> Layout:
    """The layout of the library's own ``{prefix}entities`` table."""
    q = dialect.identifier_preparer
    return Layout(
        entities=_table(q, f"{prefix}entities", schema),
        history=_table(q, f"{prefix}history", schema),
        effects=_table(q, f"{prefix}effects", schema),
        starts=_table(q, f"{prefix}starts", schema),
        col={n: q.quote(n) for n in ENTITY_COLUMNS},
        fallback={},
        indexes={name: q.quote(f"ix_{prefix}entities_{name}") for name in ENTITY_INDEXES},
    )


def bound_layout(dialect: sa.Dialect, prefix: str, binding: TableBinding) -> Layout:
    """The layout of an application table bound through ``binding``."""
    q = dialect.identifier_preparer
    col = {n: q.quote(p) for n, p in binding.physical.items()}
    fallback: dict[str, str] = {}
    status_col = q.quote(binding.status_column) if binding.status_column else None
    if status_col is not None:
        leaf_of = " ".join(f"WHEN {_literal(s)} THEN {_literal(t)}" for s, t in binding.reverse_status.items())
        status_of = " ".join(f"WHEN {_literal(t)} THEN {_literal(s)}" for t, s in binding.status_of.items())
        ours, theirs = f"{{a}}{col['state']}", f"{{a}}{status_col}"
        # our leaf holds while the application's status still says what we wrote; a status the
        # application changed itself (a webhook marking Completed) or wrote alone wins
        fallback["state"] = (
            f"CASE WHEN {ours} IS NOT NULL AND CAST({theirs} AS TEXT) = (CASE {ours} {status_of} END) THEN {ours} "
            f"ELSE (CASE {theirs} {leaf_of} END) END"
        )
    updated = f"{{a}}{col['updated_at']}"
    if dialect.name == "sqlite" and "updated_at" in binding.columns:
        # the application writes its own timestamp text (``T``, ``Z``, offsets...): compare and
        # read it in the store's canonical UTC spelling, or text order would not be time order
        updated = f"fsm_ts({updated})"
        fallback["updated_at"] = updated
    for name in ("state_entered_at", "created_at"):  # NULL until the store writes them, or the app does
        fallback[name] = f"COALESCE({{a}}{col[name]}, {updated})"
    # a row the application inserted itself (or one from before the column) is due since it
    # was created
    fallback["run_after"] = f"COALESCE({{a}}{col['run_after']}, {fallback['created_at']})"
    return Layout(
        entities=_table(q, binding.table, binding.schema),
        history=_table(q, f"{prefix}history", binding.schema),
        effects=_table(q, f"{prefix}effects", binding.schema),
        starts=_table(q, f"{prefix}starts", binding.schema),
        col=col,
        fallback=fallback,
        status_col=status_col,
        binding=binding,
    )


def _table(q: Any, name: str, schema: str | None) -> str:
    return f"{q.quote_schema(schema)}.{q.quote(name)}" if schema else str(q.quote(name))


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# -- adding the binding's columns --------------------------------------------------------------


def _existing_columns(inspector: sa.Inspector, binding: TableBinding) -> set[str]:
    """The application table's column names; a missing table is a ``ConfigError`` naming it."""
    try:
        return {c["name"] for c in inspector.get_columns(binding.table, schema=binding.schema)}
    except sa.exc.NoSuchTableError:
        where = f"{binding.schema}.{binding.table}" if binding.schema else binding.table
        raise ConfigError(
            f"the bound table {where!r} does not exist",
            problems=[f"create {where!r} first (the README gives the DDL of the seed-shaped tables)"],
        ) from None


def missing_columns(bind: sa.Engine | sa.Connection, binding: TableBinding) -> list[str]:
    """Physical columns the binding needs that the application table lacks (all of them
    additive except mapped ones, which must exist already).  No such table -> ``ConfigError``."""
    existing = _existing_columns(sa.inspect(bind), binding)
    return [name for name in binding.physical.values() if name not in existing]


def app_columns(bind: sa.Engine | sa.Connection, binding: TableBinding) -> frozenset[str]:
    """The application's own columns of the bound table: neither mapped, added, nor its status."""
    ours = set(binding.physical.values()) | ({binding.status_column} if binding.status_column else set())
    return frozenset(_existing_columns(sa.inspect(bind), binding) - ours)


def add_missing_columns(bind: sa.Engine | sa.Connection, binding: TableBinding) -> list[str]:
    """Add the binding's missing columns and the entity indexes it lacks to the application table.

    Only additive DDL (``ADD COLUMN`` nullable or with a server default, ``CREATE INDEX``);
    returns the names of the added columns.  A mapped column that does not exist is a
    :class:`~fsm.errors.ConfigError`: the binding would change what it means.
    """
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from stores.sql.connections import reaching  # here: connections imports this module's users

    with reaching(bind.engine.url, "add the binding's columns to"), _begin(bind) as conn:
        inspector = sa.inspect(conn)
        existing = _existing_columns(inspector, binding)
        absent_mapped = [p for n, p in binding.columns.items() if p not in existing]
        if absent_mapped:
            raise ConfigError(
                f"table {binding.table!r} lacks mapped columns",
                problems=[f"no column {p!r}" for p in absent_mapped],
            )
        op = Operations(MigrationContext.configure(conn))
        added = []
        for column in binding.added_columns():
            if column.name not in existing:
                op.add_column(binding.table, column, schema=binding.schema)
                added.append(column.name)
        have = {ix["name"] for ix in inspector.get_indexes(binding.table, schema=binding.schema)}
        for index in binding.indexes():
            if index.name not in have:
                _create_index(op, index, binding)
    return added


def add_binding_columns(op: Any, binding: TableBinding) -> None:
    """Alembic operations adding the binding's columns and indexes, for an application's
    own migration (``upgrade()``: ``add_binding_columns(op, binding)``)."""
    for column in binding.added_columns():
        op.add_column(binding.table, column, schema=binding.schema)
    for index in binding.indexes():
        _create_index(op, index, binding)


def _create_index(op: Any, index: sa.Index, binding: TableBinding) -> None:
    """``index`` on the bound table, keeping its partial ``WHERE`` on either dialect."""
    where = {k: v for k, v in index.dialect_kwargs.items() if k.endswith("_where") and v is not None}
    op.create_index(str(index.name), binding.table, [c.name for c in index.columns], schema=binding.schema, **where)


def drop_binding_columns(op: Any, binding: TableBinding) -> None:
    """The inverse of :func:`add_binding_columns`, for the migration's ``downgrade()``."""
    for index in binding.indexes():
        op.drop_index(str(index.name), table_name=binding.table, schema=binding.schema)
    for column in reversed(binding.added_columns()):
        op.drop_column(binding.table, column.name, schema=binding.schema)


class _begin:
    """A transaction on an engine, or the caller's connection as it is."""

    def __init__(self, bind: sa.Engine | sa.Connection) -> None:
        self._bind = bind
        self._ctx: Any = None

    def __enter__(self) -> sa.Connection:
        if isinstance(self._bind, sa.Connection):
            return self._bind
        self._ctx = self._bind.begin()
        conn: sa.Connection = self._ctx.__enter__()
        return conn

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


__all__ = [
    "ChildRows",
    "Layout",
    "TableBinding",
    "add_binding_columns",
    "add_missing_columns",
    "app_columns",
    "bound_layout",
    "drop_binding_columns",
    "missing_columns",
    "owned_layout",
]
