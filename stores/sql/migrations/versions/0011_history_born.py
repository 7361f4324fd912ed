"""History that can be partitioned by time: each history row's entity creation time.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

PostgreSQL only: ``{prefix}history.born`` (``timestamptz``, nullable, no default), the
``created_at`` of the row's entity, written by every history insert from then on.  Adding
it rewrites nothing (no default), so the upgrade is instant at any size; rows written
before it keep NULL until :func:`stores.sql.partition_history` converts the table (it
fills them in from their entities while it copies).  SQLite needs nothing.

Downgrade: a partitioned history is turned back into a plain table first (one copy,
:func:`stores.sql.partitions.unpartition_history`), then the column is dropped.
"""

from __future__ import annotations

from alembic import context, op

from stores.sql.schema import BORN, born_ddl

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _table() -> tuple[str, str | None, str]:
    attrs = context.config.attributes
    prefix, schema = attrs["table_prefix"], attrs["schema"]
    name = f'"{prefix}history"'
    return prefix, schema, (f'"{schema}".{name}' if schema else name)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _, _, table = _table()
    op.execute(born_ddl(table))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from stores.sql.partitions import is_partitioned, unpartition_on

    prefix, schema, table = _table()
    bind = op.get_bind()
    if is_partitioned(bind, prefix, schema):
        unpartition_on(bind, prefix, schema)
    op.execute(f"ALTER TABLE {table} DROP COLUMN {BORN}")
