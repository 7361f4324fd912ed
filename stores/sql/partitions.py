"""A history partitioned by time (PostgreSQL, opt-in): retention drops whole partitions.

Row-by-row retention (:meth:`stores.sql.SqlStore.prune`) deletes three history rows per
job: the dead rows stay in the table and its indexes until VACUUM, which makes the space
reusable but rarely gives it back.  :func:`partition_history` turns ``{prefix}history``
into a table partitioned by ``RANGE (born)``, with partitions of a fixed ``interval``
(default one week) aligned to :data:`ORIGIN`, plus a ``DEFAULT`` partition as a safety
net.  Retention then drops a partition whose entities all go (:func:`drop_partitions`): a
catalog change, no dead rows, the space back to the operating system at once.

**The key.** ``born`` is the entity's ``created_at``, written with every history row
(revision 0011), not the row's own ``at``: all rows of one entity are in one partition.
A unique index on a partitioned table must contain the partition key; with ``born`` the
primary key ``(entity_id, seq, born)`` and the idempotency key ``(entity_id,
idempotency_key, born)`` still mean "per entity" (``born`` is one value per entity), so
the database still refuses a second row with a taken seq or key, which the fence relies
on (DESIGN I3, I5, I6).  Partitioning by ``at`` would have made them per partition.

**Reads.** Every read names its entity (``entity_id``: one index probe per partition,
cheap with a few dozen partitions), or walks the feed's ``(txid, entity_id, seq)`` index,
which exists on every partition: PostgreSQL merges the partitions' index walks in order, so
feed positions and history order mean what they meant.

**Partitions ahead.** A store opening a partitioned history creates the partitions up to
:data:`AHEAD` intervals past now (cheap when they exist: one catalog read), and so does
each retention run; a row beyond them lands in the ``DEFAULT`` partition, never refused.

**Retention** (:func:`drop_partitions`, called by :meth:`fsm.Engine.prune` and ``fsm
prune`` before their batches): a partition entirely older than the cut goes when no entity
born in its range survives: every such entity is of a pruned lifecycle, in one of its final
states, last updated before the cut and not held (the conditions ``prune`` uses).  Its
entities and their effects are deleted set-based and the partition dropped, in one
transaction (the ``DROP`` comes last and waits at most :data:`LOCK_TIMEOUT` for its lock,
so writers stall no longer than that; on a timeout the run leaves that partition for the
batches).  A partition holding a survivor (a live entity, a held one, one updated after
the cut, or an entity of a lifecycle this run does not prune) stays, and the batches
delete its prunable rows one by one as before.  A partition holds every lifecycle's
entities: ``fsm prune`` passes all its lifecycles at once, so one run drops a partition
whose entities are all finished; :meth:`fsm.Engine.prune` passes its own lifecycle only.

Bound application tables are not partitioned (their rows are the application's to delete;
``prune`` refuses them).  SQLite has no partitions; nothing here applies to it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from fsm.errors import ConfigError, InvalidArgument
from stores.sql.schema import BORN, FEED_TXID, HEAD_REVISION, HISTORY_COLUMNS

ORIGIN = datetime(2000, 1, 3, tzinfo=UTC)
"""Partition bounds are ``ORIGIN + k * interval`` (a Monday, 00:00 UTC: weeks start on Mondays)."""
DEFAULT_INTERVAL = timedelta(weeks=1)
AHEAD = 2
"""Partitions kept ahead of now, in intervals."""
LOCK_TIMEOUT = "2s"
"""How long a partition's ``DROP`` (or ``CREATE``) waits for its lock on the history table:
while it waits, writers queue behind it."""

_log = logging.getLogger(__name__)
_BOUND = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of the history: its table name and its range of ``born`` (``[lo, hi)``)."""

    name: str
    lo: datetime
    hi: datetime


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(name: str, schema: str | None) -> str:
    return f"{_q(schema)}.{_q(name)}" if schema else _q(name)


def _utc(conn: sa.Connection) -> None:
    conn.exec_driver_sql("SET LOCAL timezone = 'UTC'")


def is_partitioned(conn: sa.Connection, prefix: str, schema: str | None) -> bool:
    """Whether ``{prefix}history`` is a partitioned table (PostgreSQL)."""
    row = conn.exec_driver_sql(
        "SELECT 1 FROM pg_partitioned_table pt JOIN pg_class c ON c.oid = pt.partrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %(t)s AND n.nspname = coalesce(%(s)s, current_schema())",
        {"t": f"{prefix}history", "s": schema},
    ).first()
    return row is not None


def partitions(conn: sa.Connection, prefix: str, schema: str | None) -> tuple[list[Partition], bool]:
    """The ranged partitions, oldest first, and whether a ``DEFAULT`` partition exists."""
    _utc(conn)
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "JOIN pg_namespace n ON n.oid = p.relnamespace "
        "WHERE p.relname = %(t)s AND n.nspname = coalesce(%(s)s, current_schema())",
        {"t": f"{prefix}history", "s": schema},
    ).all()
    found, default = [], False
    for name, bound in rows:
        if bound == "DEFAULT":
            default = True
            continue
        match = _BOUND.search(bound)
        if match is None:  # MINVALUE / MAXVALUE: made by hand, never dropped here
            continue
        lo, hi = (_parse(text) for text in match.groups())
        found.append(Partition(name, lo, hi))
    return sorted(found, key=lambda p: p.lo), default


def _parse(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _floor(at: datetime, interval: timedelta) -> datetime:
    return ORIGIN + ((at - ORIGIN) // interval) * interval


def _name(prefix: str, lo: datetime) -> str:
    return f"{prefix}history_p{lo:%Y%m%d_%H%M}"


def _create(conn: sa.Connection, prefix: str, schema: str | None, lo: datetime, hi: datetime) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE {_qualified(_name(prefix, lo), schema)} PARTITION OF {_qualified(prefix + 'history', schema)} "
        f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
    )


def ensure_partitions(
    conn: sa.Connection,
    prefix: str,
    schema: str | None,
    until: datetime,
    interval: timedelta | None = None,
) -> int:
    """Create the partitions after the newest one, up to one containing ``until``; the
    interval is the newest partition's (or ``interval``).  Returns how many were created.
    Each is created under a savepoint with :data:`LOCK_TIMEOUT`: one that cannot be (its
    lock not granted in time, or rows of its range already in the ``DEFAULT`` partition)
    is left out, and rows of its range keep landing in ``DEFAULT``."""
    found, _ = partitions(conn, prefix, schema)
    if found:
        interval = interval or (found[-1].hi - found[-1].lo)
        lo = found[-1].hi
    else:
        interval = interval or DEFAULT_INTERVAL
        lo = _floor(until, interval)
    created = 0
    while lo <= until:
        hi = lo + interval
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                _create(conn, prefix, schema, lo, hi)
            created += 1
        except sa.exc.DBAPIError:
            break
        lo = hi
    return created


def partitions_ahead(engine: sa.Engine, prefix: str, schema: str | None) -> None:
    """At a store's open: when the history is partitioned, create the partitions ahead
    (one catalog read when they exist).  A failure (a lock not granted in time) is logged
    and left to the next open or retention run: rows beyond land in ``DEFAULT``."""
    try:
        with engine.begin() as conn:
            if not is_partitioned(conn, prefix, schema):
                return
            found, _ = partitions(conn, prefix, schema)
            interval = (found[-1].hi - found[-1].lo) if found else DEFAULT_INTERVAL
            ensure_partitions(conn, prefix, schema, _now(conn) + AHEAD * interval)
    except sa.exc.DBAPIError as err:
        _log.warning("could not create the history's partitions ahead (%s): rows beyond land in DEFAULT", err)


def _history_columns() -> list[str]:
    return [*HISTORY_COLUMNS, FEED_TXID, BORN]


def _indexes(conn: sa.Connection, prefix: str, schema: str | None, partitioned: bool) -> None:
    table = _qualified(f"{prefix}history", schema)
    key = f"entity_id, seq, {BORN}" if partitioned else "entity_id, seq"
    unique = f"entity_id, idempotency_key, {BORN}" if partitioned else "entity_id, idempotency_key"
    conn.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {_q(prefix + 'history_pkey')} PRIMARY KEY ({key})")
    conn.exec_driver_sql(
        f"CREATE UNIQUE INDEX {_q('ux_' + prefix + 'history_key')} ON {table} ({unique}) "
        "WHERE idempotency_key IS NOT NULL"
    )
    conn.exec_driver_sql(f"CREATE INDEX {_q('ix_' + prefix + 'history_feed')} ON {table} ({FEED_TXID}, entity_id, seq)")


def _trigger(conn: sa.Connection, prefix: str, schema: str | None) -> str | None:
    """The feed's notify trigger on the history (:mod:`stores.sql.feed`), if installed."""
    row = conn.exec_driver_sql(
        "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = %(t)s "
        "AND n.nspname = coalesce(%(s)s, current_schema()) AND t.tgname = %(g)s",
        {"t": f"{prefix}history", "s": schema, "g": f"{prefix}feed_notify"},
    ).first()
    return None if row is None else str(row[0])


def _rebuild(
    conn: sa.Connection,
    prefix: str,
    schema: str | None,
    partitioned: bool,
    interval: timedelta,
    start: datetime | None = None,
) -> None:
    """Copy the history into a new table, partitioned or plain, under the same names."""
    history = f"{prefix}history"
    table, old = _qualified(history, schema), _qualified(f"{prefix}history_unpartitioned_old", schema)
    trigger = _trigger(conn, prefix, schema)
    conn.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    conn.exec_driver_sql(f"ALTER TABLE {table} RENAME TO {_q(prefix + 'history_unpartitioned_old')}")
    for index in (f"{prefix}history_pkey", f"ux_{prefix}history_key", f"ix_{prefix}history_feed"):
        conn.exec_driver_sql(f"ALTER INDEX {_qualified(index, schema)} RENAME TO {_q(index + '_old')}")
    if trigger is not None:
        conn.exec_driver_sql(f"DROP TRIGGER {_q(trigger)} ON {old}")
    cols = ", ".join(_history_columns())
    if partitioned:
        conn.exec_driver_sql(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({BORN})")
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {BORN} SET NOT NULL")
        entities = _qualified(f"{prefix}entities", schema)
        first = conn.exec_driver_sql(
            f"SELECT least((SELECT min(created_at) FROM {entities}), (SELECT min(at) FROM {old}), now())"
        ).scalar_one()
        now = conn.exec_driver_sql("SELECT now()").scalar_one()
        lo = _floor(first if start is None else min(first, start), interval)
        while lo <= now + AHEAD * interval:
            _create(conn, prefix, schema, lo, lo + interval)
            lo += interval
        conn.exec_driver_sql(
            f"CREATE TABLE {_qualified(prefix + 'history_default', schema)} PARTITION OF {table} DEFAULT"
        )
        # an entity's rows go with its creation time; a row whose entity is gone, its own time
        picks = ", ".join(f"h.{c}" for c in _history_columns()[:-1])
        conn.exec_driver_sql(
            f"INSERT INTO {table} ({cols}) SELECT {picks}, coalesce(h.{BORN}, e.created_at, h.at) "
            f"FROM {old} AS h LEFT JOIN {entities} AS e ON e.id = h.entity_id"
        )
    else:
        conn.exec_driver_sql(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS)")
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {BORN} DROP NOT NULL")
        conn.exec_driver_sql(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {old}")
    conn.exec_driver_sql(f"DROP TABLE {old}")  # with its partitions, if it had any
    _indexes(conn, prefix, schema, partitioned)
    if trigger is not None:
        function = _qualified(trigger, schema)
        conn.exec_driver_sql(
            f"CREATE TRIGGER {_q(trigger)} AFTER INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
    conn.exec_driver_sql(f"ANALYZE {table}")


def partition_history(
    url_or_engine: str | sa.Engine,
    *,
    table_prefix: str = "fsm_",
    schema: str | None = None,
    interval: timedelta = DEFAULT_INTERVAL,
    start: datetime | None = None,
) -> bool:
    """Turn ``{prefix}history`` into a table partitioned by ``born`` (PostgreSQL): a
    maintenance step.  It copies the table in one transaction, holding an exclusive lock on
    it throughout (every transition waits: run it when the workers are stopped, or expect
    them to stall for the copy; about a minute per 10 million rows).  Rows written before
    revision 0011 get their entity's ``created_at`` (their own ``at`` when it is gone).
    Partitions of ``interval`` are made from the oldest row's (or ``start``, when older)
    to :data:`AHEAD` intervals past now; rows out of their range land in ``DEFAULT``.

    Returns True when it converted, False when the table was partitioned already (then it
    only makes sure the partitions ahead exist).  ``ConfigError`` on SQLite, on tables
    that are not at the head revision, and on a store bound to an application table."""
    from stores.sql.connections import create_engine
    from stores.sql.migrate import current_revision

    if isinstance(interval, bool) or not isinstance(interval, timedelta) or interval < timedelta(hours=1):
        raise InvalidArgument(f"interval must be a timedelta of an hour or more, not {interval!r:.80}")
    engine = create_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    try:
        if engine.dialect.name != "postgresql":
            raise ConfigError("partitioned history is PostgreSQL's; SQLite has no partitions")
        revision = current_revision(engine, table_prefix=table_prefix, schema=schema)
        if revision != HEAD_REVISION:
            raise ConfigError(
                f"the store's tables ({table_prefix}*) are at revision {revision or '(none)'}, not {HEAD_REVISION}: "
                f"upgrade them first (fsm migrate upgrade URL --prefix {table_prefix})"
            )
        if sa.inspect(engine).get_foreign_keys(f"{table_prefix}history", schema=schema):
            raise ConfigError(
                f"{table_prefix}history belongs to an application's table (a bound store): its rows are the "
                "application's to delete, and it is not partitioned"
            )
        with engine.begin() as conn:
            _utc(conn)
            if is_partitioned(conn, table_prefix, schema):
                ensure_partitions(conn, table_prefix, schema, _now(conn) + AHEAD * interval)
                return False
            _rebuild(conn, table_prefix, schema, True, interval, start)
        return True
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


def unpartition_on(conn: sa.Connection, prefix: str, schema: str | None) -> None:
    """Turn a partitioned history back into a plain table (one copy, in ``conn``'s
    transaction): revision 0011's downgrade."""
    _utc(conn)
    _rebuild(conn, prefix, schema, False, DEFAULT_INTERVAL)


def _now(conn: sa.Connection) -> datetime:
    value: datetime = conn.exec_driver_sql("SELECT now()").scalar_one()
    return value


def _prunable(rules: Mapping[str, Sequence[str]], params: dict[str, Any]) -> str:
    """SQL: the entity ``e`` goes under ``rules`` (kind -> final states), as ``prune`` decides."""
    parts = []
    for i, (kind, finals) in enumerate(sorted(rules.items())):
        params[f"k{i}"], params[f"f{i}"] = kind, list(finals)
        parts.append(f"(e.kind = %(k{i})s AND e.state = ANY(%(f{i})s))")
    return f"(({' OR '.join(parts)}) AND e.updated_at < %(before)s AND e.lease_owner IS NULL)"


def drop_partitions(
    engine: sa.Engine, prefix: str, schema: str | None, rules: Mapping[str, Sequence[str]], before: datetime
) -> list[tuple[str, str]]:
    """Drop every partition entirely older than ``before`` whose entities all go under
    ``rules`` (kind -> final states), with those entities and their effects; one
    transaction per partition.  Returns the ``(kind, id)`` of the entities removed.
    Also creates the partitions ahead (module doc)."""
    entities, effects = _qualified(f"{prefix}entities", schema), _qualified(f"{prefix}effects", schema)
    params: dict[str, Any] = {"before": before}
    prunable = _prunable(rules, params)
    removed: list[tuple[str, str]] = []
    with engine.begin() as conn:
        found, _ = partitions(conn, prefix, schema)
        now = _now(conn)
        ensure_partitions(
            conn, prefix, schema, now + AHEAD * ((found[-1].hi - found[-1].lo) if found else DEFAULT_INTERVAL)
        )
    survivor = (
        f"SELECT 1 FROM {entities} AS e WHERE e.created_at >= %(lo)s AND e.created_at < %(hi)s "
        f"AND NOT {prunable} LIMIT 1"
    )
    for part in found:
        if part.hi > before:
            break
        bounds = {**params, "lo": part.lo, "hi": part.hi}
        with engine.connect() as conn:
            if conn.exec_driver_sql(survivor, bounds).first() is not None:
                conn.rollback()
                continue
            conn.rollback()
            try:
                with conn.begin():
                    rows = conn.exec_driver_sql(
                        f"WITH d AS (DELETE FROM {entities} AS e WHERE e.created_at >= %(lo)s "
                        f"AND e.created_at < %(hi)s AND {prunable} RETURNING e.kind, e.id), "
                        f"x AS (DELETE FROM {effects} AS f USING d WHERE f.entity_id = d.id) SELECT kind, id FROM d",
                        bounds,
                    ).all()
                    # an entity that changed since the check (or was born in the range since)
                    if conn.exec_driver_sql(survivor, bounds).first() is not None:
                        raise _Keep
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    conn.exec_driver_sql(f"DROP TABLE {_qualified(part.name, schema)}")
            except _Keep:
                continue
            except sa.exc.OperationalError as err:  # the lock not granted in time: the batches go on
                if "lock timeout" not in str(err):
                    raise
                continue
            removed += [(str(kind), str(entity_id)) for kind, entity_id in rows]
    return removed


class _Keep(Exception):
    """A survivor found after the deletes: undo them and keep the partition."""


__all__ = [
    "AHEAD",
    "DEFAULT_INTERVAL",
    "ORIGIN",
    "Partition",
    "drop_partitions",
    "ensure_partitions",
    "is_partitioned",
    "partition_history",
    "partitions",
    "partitions_ahead",
    "unpartition_on",
]
