"""Schema creation and upgrades of the library's tables, through Alembic.

The upgrade path: every schema change ships as an Alembic revision in
``stores/sql/migrations/versions``.  ``upgrade(url)`` (or ``python -m stores.migrations
upgrade URL``) brings a database to the newest revision; ``SqlStore(create=True)`` does the
same on start, taking a fast path when the database is already current (one query) or
empty (``create_all`` plus stamping the head revision, identical to the migrations, which a
test checks).  The version is kept in ``{prefix}alembic_version``, apart from the
application's own Alembic history.

A store bound to an application table (:mod:`stores.sql.binding`) migrates only its
history and effects tables here; the columns it adds to the application table belong to
the application's migrations (``add_binding_columns(op, binding)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from fsm.errors import ConfigError
from stores.sql.binding import TableBinding
from stores.sql.connections import create_engine, reaching
from stores.sql.schema import HEAD_REVISION, build_metadata

MIGRATIONS = Path(__file__).with_name("migrations")
"""Alembic's script directory for the library's tables."""


def metadata_for(prefix: str, schema: str | None, binding: TableBinding | None) -> sa.MetaData:
    """The library's tables for this prefix and (optional) binding."""
    if binding is None:
        return build_metadata(prefix, schema=schema)
    return build_metadata(
        prefix, schema=schema or binding.schema, bound_table=binding.table, bound_id_column=binding.columns["id"]
    )


def alembic_config(
    connection: sa.Connection, *, table_prefix: str, schema: str | None = None, binding: TableBinding | None = None
) -> Any:
    """An Alembic ``Config`` for the library's migrations, run on ``connection``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes.update(
        connection=connection,
        table_prefix=table_prefix,
        schema=schema if binding is None else (schema or binding.schema),
        bound_table=None if binding is None else binding.table,
        bound_id_column="id" if binding is None else binding.columns["id"],
    )
    return cfg


def upgrade(
    url_or_engine: str | sa.Engine,
    *,
    table_prefix: str = "fsm_",
    schema: str | None = None,
    binding: TableBinding | None = None,
    revision: str = "head",
) -> None:
    """Migrate the library's tables to ``revision`` (default: the newest)."""
    _run("upgrade", url_or_engine, table_prefix, schema, binding, revision)


def downgrade(
    url_or_engine: str | sa.Engine,
    revision: str,
    *,
    table_prefix: str = "fsm_",
    schema: str | None = None,
    binding: TableBinding | None = None,
) -> None:
    """Migrate the library's tables down to ``revision`` (``base`` drops them)."""
    _run("downgrade", url_or_engine, table_prefix, schema, binding, revision)


def stamp(
    url_or_engine: str | sa.Engine,
    *,
    table_prefix: str = "fsm_",
    schema: str | None = None,
    binding: TableBinding | None = None,
    revision: str = "head",
) -> None:
    """Record ``revision`` as applied without running it (tables created by other means)."""
    _run("stamp", url_or_engine, table_prefix, schema, binding, revision)


def current_revision(
    url_or_engine: str | sa.Engine, *, table_prefix: str = "fsm_", schema: str | None = None
) -> str | None:
    """The revision the database is at, or ``None`` when the library's tables are absent."""
    engine = _engine(url_or_engine)
    try:
        with reaching(engine.url, "read the migration revision of"), engine.connect() as conn:
            return _revision(conn, table_prefix, schema) or None
    finally:
        if engine is not url_or_engine:
            engine.dispose()


def ensure_schema(engine: sa.Engine, *, table_prefix: str, schema: str | None, binding: TableBinding | None) -> None:
    """What ``SqlStore(create=True)`` runs: nothing when current, ``create_all`` + stamp on
    an empty database, Alembic otherwise."""
    md = metadata_for(table_prefix, schema, binding)
    with engine.connect() as conn:
        current = _revision(conn, table_prefix, md.schema)
    if current == HEAD_REVISION:
        return
    if current is not None:  # an older revision, or a version table emptied by `downgrade base`
        upgrade(engine, table_prefix=table_prefix, schema=schema, binding=binding)
        return
    tables = [t for t in md.sorted_tables if not t.info.get("bound")]
    try:
        with engine.begin() as conn:
            inspector = sa.inspect(conn)
            present = [t.name for t in tables if inspector.has_table(t.name, schema=t.schema)]
            if present:
                raise ConfigError(
                    f"tables {', '.join(present)} exist without a migration version",
                    problems=["stamp them with `python -m stores.migrations stamp URL` or drop them"],
                )
            md.create_all(conn, tables=tables, checkfirst=False)
            version = md.tables[_version_key(table_prefix, md.schema)]
            conn.execute(version.insert().values(version_num=HEAD_REVISION))
    except sa.exc.DBAPIError:
        # a concurrent process may have created the schema first: fine if it did
        with engine.connect() as conn:
            if _revision(conn, table_prefix, md.schema) == HEAD_REVISION:
                return
        raise


def drop_schema(
    engine: sa.Engine, *, table_prefix: str, schema: str | None = None, binding: TableBinding | None = None
) -> None:
    """Drop the library's tables for this prefix (tests, and ``downgrade base`` by hand)."""
    md = metadata_for(table_prefix, schema, binding)
    with reaching(engine.url, "drop the tables of"), engine.begin() as conn:
        md.drop_all(conn, tables=[t for t in md.sorted_tables if not t.info.get("bound")], checkfirst=True)


def _run(
    command_name: str,
    url_or_engine: str | sa.Engine,
    table_prefix: str,
    schema: str | None,
    binding: TableBinding | None,
    revision: str,
) -> None:
    from alembic import command
    from alembic.util.exc import CommandError

    engine = _engine(url_or_engine)
    try:
        with reaching(engine.url, f"{command_name} the tables of"), engine.begin() as conn:
            cfg = alembic_config(conn, table_prefix=table_prefix, schema=schema, binding=binding)
            getattr(command, command_name)(cfg, revision)
    except CommandError as err:  # an unknown revision, a downgrade past base...
        raise ConfigError(f"cannot {command_name} to {revision!r}: {err}") from err
    finally:
        if engine is not url_or_engine:
            engine.dispose()


def _engine(url_or_engine: str | sa.Engine) -> sa.Engine:
    if isinstance(url_or_engine, sa.Engine):
        return url_or_engine
    return create_engine(url_or_engine)


def _version_key(prefix: str, schema: str | None) -> str:
    return f"{schema}.{prefix}alembic_version" if schema else f"{prefix}alembic_version"


def _revision(conn: sa.Connection, prefix: str, schema: str | None) -> str | None:
    """The stamped revision; ``""`` for an empty version table, ``None`` for none at all."""
    name = f"{prefix}alembic_version"
    if not sa.inspect(conn).has_table(name, schema=schema):
        return None
    table = sa.table(name, sa.column("version_num"), schema=schema)
    value = conn.execute(sa.select(table.c.version_num)).scalar()
    return "" if value is None else str(value)


__all__ = [
    "MIGRATIONS",
    "alembic_config",
    "current_revision",
    "downgrade",
    "drop_schema",
    "ensure_schema",
    "metadata_for",
    "stamp",
    "upgrade",
]
