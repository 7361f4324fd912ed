"""The library's tables: entities, history, effects (DESIGN section 5).

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Written out column by column, as a migration should be (a snapshot, not a call into the
current schema code); ``tests/test_stores/sql/test_sql_migrations.py`` checks it matches
``stores.sql.schema``.  With a bound application table, ``entities`` is not created and
history and effects reference the bound table's id instead.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from stores.sql.schema import JsonDocument, UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None, str]:
    """Prefix, schema, bound table and its id column, from the environment (env.py)."""
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"], attrs["bound_id_column"]


def _entity_ref(prefix: str, schema: str | None, bound: str | None, bound_id: str) -> str:
    table, column = (bound, bound_id) if bound else (f"{prefix}entities", "id")
    return f"{schema}.{table}.{column}" if schema else f"{table}.{column}"


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND, BOUND_ID = _settings()  # noqa: N806 - read as constants below
    ref = _entity_ref(PREFIX, SCHEMA, BOUND, BOUND_ID)
    if not BOUND:
        entities = f"{PREFIX}entities"
        op.create_table(
            entities,
            sa.Column("id", sa.String(255), primary_key=True),
            sa.Column("kind", sa.String(64), nullable=False),
            sa.Column("state", sa.String(64), nullable=False),
            sa.Column("version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
            sa.Column("lease_owner", sa.String(255), nullable=True),
            sa.Column("lease_token", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
            sa.Column("lease_expires_at", UtcDateTime(), nullable=True),
            sa.Column("state_entered_at", UtcDateTime(), nullable=False),
            sa.Column("created_at", UtcDateTime(), nullable=False),
            sa.Column("updated_at", UtcDateTime(), nullable=False),
            sa.Column("deleted", sa.Boolean(), nullable=False, server_default=sa.false()),
            sa.Column("concurrency_key", sa.String(255), nullable=True),
            sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("0")),
            sa.Column("reclaims", sa.Integer(), nullable=False, server_default=sa.text("0")),
            sa.Column("data", JsonDocument(), nullable=False, server_default=sa.text("'{}'")),
            schema=SCHEMA,
        )
        stem = f"{PREFIX}entities"
        op.create_index(
            f"ix_{stem}_lease", entities, ["kind", "state", "lease_expires_at", "updated_at"], schema=SCHEMA
        )
        op.create_index(f"ix_{stem}_idle", entities, ["kind", "state", "updated_at"], schema=SCHEMA)
        op.create_index(
            f"ix_{stem}_siblings", entities, ["kind", "concurrency_key", "state", "created_at"], schema=SCHEMA
        )
    history = f"{PREFIX}history"
    op.create_table(
        history,
        sa.Column(
            "entity_id",
            sa.String(255),
            sa.ForeignKey(ref, ondelete="CASCADE", name=f"fk_{PREFIX}history_entity"),
            primary_key=True,
        ),
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("lease_token", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("data", JsonDocument(), nullable=True),
        schema=SCHEMA,
    )
    op.create_index(f"ux_{PREFIX}history_key", history, ["entity_id", "idempotency_key"], unique=True, schema=SCHEMA)
    op.create_table(
        f"{PREFIX}effects",
        sa.Column(
            "entity_id",
            sa.String(255),
            sa.ForeignKey(ref, ondelete="CASCADE", name=f"fk_{PREFIX}effects_entity"),
            primary_key=True,
        ),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("lease_token", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("result", JsonDocument(), nullable=True),
        sa.Column("recorded_at", UtcDateTime(), nullable=True),
        schema=SCHEMA,
    )


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND, _ = _settings()  # noqa: N806
    op.drop_table(f"{PREFIX}effects", schema=SCHEMA)
    op.drop_index(f"ux_{PREFIX}history_key", table_name=f"{PREFIX}history", schema=SCHEMA)
    op.drop_table(f"{PREFIX}history", schema=SCHEMA)
    if not BOUND:
        stem = f"{PREFIX}entities"
        for name in ("siblings", "idle", "lease"):
            op.drop_index(f"ix_{stem}_{name}", table_name=stem, schema=SCHEMA)
        op.drop_table(stem, schema=SCHEMA)
