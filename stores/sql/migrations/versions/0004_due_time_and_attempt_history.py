"""Due times, and who made each transition and which error it records (issue 19).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

- ``{prefix}entities.run_after``: when the entity is due.  A claim takes no entity before
  it and serves due entities in its order.  Existing rows get their creation time, the
  time they first became claimable, so nobody loses their place in the line.
- ``ix_{prefix}entities_claim`` ``(kind, state, run_after)``: the claim walks it in due
  order up to now and never sorts the backlog.
  ``ix_{prefix}entities_idle`` ``(kind, state, updated_at)`` goes: only the claim read it.
- ``{prefix}history.owner`` (the lease owner beside ``lease_token``) and
  ``{prefix}history.error`` (a handler error's type, message and bounded traceback).

With a bound application table the entity columns and indexes belong to the
application's migrations (``add_binding_columns``); only history changes here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from stores.sql.schema import JsonDocument, UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    history = f"{PREFIX}history"
    op.add_column(history, sa.Column("owner", sa.String(255), nullable=True), schema=SCHEMA)
    op.add_column(history, sa.Column("error", JsonDocument(), nullable=True), schema=SCHEMA)
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.add_column(stem, sa.Column("run_after", UtcDateTime(), nullable=True), schema=SCHEMA)
    table = sa.table(stem, sa.column("run_after"), sa.column("created_at"), schema=SCHEMA)
    op.execute(table.update().values(run_after=table.c.created_at))
    op.create_index(f"ix_{stem}_claim", stem, ["kind", "state", "run_after"], schema=SCHEMA)
    op.drop_index(f"ix_{stem}_idle", table_name=stem, schema=SCHEMA)


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    history = f"{PREFIX}history"
    with op.batch_alter_table(history, schema=SCHEMA) as batch:
        batch.drop_column("error")
        batch.drop_column("owner")
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.create_index(f"ix_{stem}_idle", stem, ["kind", "state", "updated_at"], schema=SCHEMA)
    op.drop_index(f"ix_{stem}_claim", table_name=stem, schema=SCHEMA)
    with op.batch_alter_table(stem, schema=SCHEMA) as batch:
        batch.drop_column("run_after")
