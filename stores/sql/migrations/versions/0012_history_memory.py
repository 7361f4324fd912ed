"""History states: where each entity left its compound states.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

- ``{prefix}entities.memory`` (JSON, nullable): the entity's history memory, ``{compound
  state id: leaf state id}`` for each compound state with a history state that the entity
  has left (``fsm.history``); a transition into a history state restores from it.
  Existing rows get NULL (no lifecycle had history states before this revision).  No index:
  only the row's own transitions read it.

With a bound application table the entity columns belong to the application's
migrations (``add_binding_columns``, or ``add_missing_columns``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from stores.sql.schema import JsonDocument

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    if BOUND:
        return
    op.add_column(f"{PREFIX}entities", sa.Column("memory", JsonDocument(), nullable=True), schema=SCHEMA)


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    if BOUND:
        return
    with op.batch_alter_table(f"{PREFIX}entities", schema=SCHEMA) as batch:
        batch.drop_column("memory")
