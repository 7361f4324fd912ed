"""The feed's order on PostgreSQL: the writing transaction's id on each history row (issue 21).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

PostgreSQL only (``Store.feed``, ``Engine.watch``): ``{prefix}history.txid``, filled by
``pg_current_xact_id()`` on every insert, and ``ix_{prefix}history_feed (txid, entity_id,
seq)``.  Existing rows get this migration's transaction id (one table rewrite): they come
first in the feed, in key order.  SQLite needs nothing (its rowid is the order).
"""

from __future__ import annotations

from alembic import context, op

from stores.sql.schema import FEED_TXID, feed_ddl

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _table() -> tuple[str, str]:
    attrs = context.config.attributes
    prefix, schema = attrs["table_prefix"], attrs["schema"]
    name = f'"{prefix}history"'
    return prefix, (f'"{schema}".{name}' if schema else name)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    prefix, table = _table()
    for statement in feed_ddl(prefix, table):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    prefix, table = _table()
    schema = context.config.attributes["schema"]
    index = f'"{schema}".ix_{prefix}history_feed' if schema else f"ix_{prefix}history_feed"
    op.execute(f"DROP INDEX {index}")
    op.execute(f"ALTER TABLE {table} DROP COLUMN {FEED_TXID}")
