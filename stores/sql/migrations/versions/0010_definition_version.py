"""Lifecycle evolution: the definition version each entity last moved under.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

- ``{prefix}entities.definition`` (integer, nullable): the version of the lifecycle
  definition under which the row was created, last claimed by a worker, or last
  migrated.  A claim of version ``n`` takes only rows at ``n`` or below, so a worker of
  an older definition never takes a row a newer one wrote.  Existing rows get NULL
  (written before versions were recorded: any worker may take them).  No index: a claim
  filters on it among the rows its index walk reads.

With a bound application table the entity columns belong to the application's
migrations (``add_binding_columns``, or ``add_missing_columns``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    if BOUND:
        return
    op.add_column(f"{PREFIX}entities", sa.Column("definition", sa.Integer(), nullable=True), schema=SCHEMA)


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    if BOUND:
        return
    with op.batch_alter_table(f"{PREFIX}entities", schema=SCHEMA) as batch:
        batch.drop_column("definition")
