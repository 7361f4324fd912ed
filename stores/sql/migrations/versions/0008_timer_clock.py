"""Timed transitions: when each entity entered its timed state.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

- ``{prefix}entities.timer_since`` (nullable): when the entity entered the state whose
  ``after=`` transitions count (a lifecycle's timed state); NULL when it is in none.  A
  timer of ``after`` is due at ``timer_since + after``.  Existing rows get NULL: no
  lifecycle had timers before this revision, and an entity already in a state that a new
  definition times starts its clock at its next transition into that state.
- ``ix_{prefix}entities_timer`` ``(kind, state, timer_since)``, partial on
  ``timer_since IS NOT NULL``: the reaper's timer rules and its earliest-due probe read a
  range of it; rows of lifecycles without timers are not in it.

With a bound application table the entity columns and indexes belong to the
application's migrations (``add_binding_columns``, or ``add_missing_columns``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from stores.sql.schema import UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.add_column(stem, sa.Column("timer_since", UtcDateTime(), nullable=True), schema=SCHEMA)
    timed = sa.text("timer_since IS NOT NULL")
    op.create_index(
        f"ix_{stem}_timer",
        stem,
        ["kind", "state", "timer_since"],
        schema=SCHEMA,
        sqlite_where=timed,
        postgresql_where=timed,
    )


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.drop_index(f"ix_{stem}_timer", table_name=stem, schema=SCHEMA)
    with op.batch_alter_table(stem, schema=SCHEMA) as batch:
        batch.drop_column("timer_since")
