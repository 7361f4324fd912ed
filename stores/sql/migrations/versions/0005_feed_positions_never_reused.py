"""SQLite: feed positions are never given twice, even after a prune (issue 21).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

SQLite only (:mod:`stores.sql.feed_mark`): ``{prefix}feed_mark``, the largest history
rowid ever deleted, starting at the largest present, and two triggers on
``{prefix}history`` that keep a new row above it.  The rows and their positions stay as
they are.  PostgreSQL needs nothing (its positions are transaction ids).
"""

from __future__ import annotations

from alembic import context, op

from stores.sql.feed_mark import drop_feed_mark_ddl, feed_mark_ddl

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"]


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for statement in feed_mark_ddl(*_settings()):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for statement in drop_feed_mark_ddl(*_settings()):
        op.execute(statement)
