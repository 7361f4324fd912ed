"""Alembic environment of the library's migrations.

Driven programmatically (:mod:`stores.sql.migrate` passes the connection, table prefix,
schema and bound table in ``config.attributes``), or from the ``alembic`` command line with
``-x url=... -x prefix=...``.  The version table is ``{prefix}alembic_version``, so the
library's history never mixes with the application's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

config = context.config
x_args = context.get_x_argument(as_dictionary=True)
attributes = config.attributes
attributes.setdefault("table_prefix", x_args.get("prefix", "fsm_"))
attributes.setdefault("schema", x_args.get("schema"))
attributes.setdefault("bound_table", x_args.get("bound_table"))
attributes.setdefault("bound_id_column", x_args.get("bound_id_column", "id"))
VERSION_TABLE = f"{attributes['table_prefix']}alembic_version"


def _configure(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=attributes["schema"],
        # SQLite alters tables by copying them: Alembic's batch mode does that for us
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=x_args.get("url") or config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        version_table=VERSION_TABLE,
        version_table_schema=attributes["schema"],
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = x_args.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database with -x url=... (or sqlalchemy.url in alembic.ini)")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            _configure(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
