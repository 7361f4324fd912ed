"""Coordination: a claim priority per entity, and the parent of a child entity.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

- ``{prefix}entities.priority`` (smallint, default 0): claims take higher priorities
  first, then the longest due.  Existing rows get 0, the order they had.
- ``{prefix}entities.parent_id`` (nullable): the entity that started this one as its
  child; existing rows have none.
- ``ix_{prefix}entities_priority`` ``(kind, state, priority DESC, run_after)``, partial on
  ``priority <> 0``: the claim's walk of raised and lowered rows; rows at the default
  priority are not in it.
- ``ix_{prefix}entities_parent`` ``(parent_id, id)``, partial on ``parent_id IS NOT NULL``:
  a parent's children.
- ``{prefix}starts`` ``(kind, key, at)``: the starts a rate limit counts, per lifecycle
  (key ``''``) and per key, kept for one period.

With a bound application table the entity columns and indexes belong to the
application's migrations (``add_binding_columns``, or ``add_missing_columns``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from stores.sql.schema import ID_LENGTH, NAME_LENGTH, UtcDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    op.create_table(
        f"{PREFIX}starts",
        sa.Column("kind", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("key", sa.String(ID_LENGTH), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        schema=SCHEMA,
    )
    op.create_index(f"ix_{PREFIX}starts_window", f"{PREFIX}starts", ["kind", "key", "at"], schema=SCHEMA)
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    priority = sa.Column("priority", sa.SmallInteger(), nullable=False, server_default=sa.text("0"))
    op.add_column(stem, priority, schema=SCHEMA)
    op.add_column(stem, sa.Column("parent_id", sa.String(ID_LENGTH), nullable=True), schema=SCHEMA)
    op.create_index(
        f"ix_{stem}_priority",
        stem,
        ["kind", "state", sa.text("priority DESC"), "run_after"],
        schema=SCHEMA,
        sqlite_where=sa.text("priority <> 0"),
        postgresql_where=sa.text("priority <> 0"),
    )
    parented = sa.text("parent_id IS NOT NULL")
    op.create_index(
        f"ix_{stem}_parent", stem, ["parent_id", "id"], schema=SCHEMA, sqlite_where=parented, postgresql_where=parented
    )


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    op.drop_index(f"ix_{PREFIX}starts_window", table_name=f"{PREFIX}starts", schema=SCHEMA)
    op.drop_table(f"{PREFIX}starts", schema=SCHEMA)
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.drop_index(f"ix_{stem}_parent", table_name=stem, schema=SCHEMA)
    op.drop_index(f"ix_{stem}_priority", table_name=stem, schema=SCHEMA)
    with op.batch_alter_table(stem, schema=SCHEMA) as batch:
        batch.drop_column("parent_id")
        batch.drop_column("priority")
