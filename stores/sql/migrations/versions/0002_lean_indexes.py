"""Lean indexes: every index pays for itself on each write (issue 12).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07

- ``ix_{prefix}entities_siblings`` and ``ux_{prefix}history_key`` become partial
  (``WHERE concurrency_key IS NOT NULL``, ``WHERE idempotency_key IS NOT NULL``): most rows
  carry no key, and a NULL key never has a sibling nor conflicts.

The idle index ``(kind, state, updated_at)`` stays: no reaper rule reads it, but the
workers' claim (oldest unchanged first) walks it.  With a bound
application table the entity indexes belong to the application's migrations
(``add_binding_columns``); only the history index changes here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def _where(column: str) -> dict[str, Any]:
    clause = sa.text(f"{column} IS NOT NULL")
    return {"sqlite_where": clause, "postgresql_where": clause}


def upgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806 - read as constants below
    history = f"{PREFIX}history"
    op.drop_index(f"ux_{PREFIX}history_key", table_name=history, schema=SCHEMA)
    op.create_index(
        f"ux_{PREFIX}history_key",
        history,
        ["entity_id", "idempotency_key"],
        unique=True,
        schema=SCHEMA,
        **_where("idempotency_key"),
    )
    if not BOUND:
        stem = f"{PREFIX}entities"
        op.drop_index(f"ix_{stem}_siblings", table_name=stem, schema=SCHEMA)
        op.create_index(
            f"ix_{stem}_siblings",
            stem,
            ["kind", "concurrency_key", "state", "created_at"],
            schema=SCHEMA,
            **_where("concurrency_key"),
        )


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    history = f"{PREFIX}history"
    op.drop_index(f"ux_{PREFIX}history_key", table_name=history, schema=SCHEMA)
    op.create_index(f"ux_{PREFIX}history_key", history, ["entity_id", "idempotency_key"], unique=True, schema=SCHEMA)
    if not BOUND:
        stem = f"{PREFIX}entities"
        op.drop_index(f"ix_{stem}_siblings", table_name=stem, schema=SCHEMA)
        op.create_index(f"ix_{stem}_siblings", stem, ["kind", "concurrency_key", "state", "created_at"], schema=SCHEMA)
