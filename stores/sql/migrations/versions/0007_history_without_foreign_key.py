"""PostgreSQL: the history table's foreign key to the library's own entity table dropped (issue 22).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Every history row is inserted from the ``RETURNING`` of the guarded update of its entity,
in the same statement, so the entity it names exists by construction.  The key's check
ran on every insert anyway (a primary-key lookup and a ``KEY SHARE`` lock of the entity
row from a trigger, three times per job): measured on a worker draining no-op jobs, about
a fifth of the server's CPU per job (0.29 -> 0.23 ms).  ``prune`` deletes an entity's
history itself; its ``ON DELETE CASCADE`` served only a hand-written ``DELETE`` of entity
rows, which now leaves their history behind (``trim_history``/``prune`` remove it).

Not changed: SQLite (dropping a key means rebuilding the table, and its check is a C
index probe), the effects table's key, and a store bound to an application's table,
whose history keeps cascading from the application's rows.  The downgrade adds the key
back (it fails if history rows name entities that no longer exist).
"""

from __future__ import annotations

from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _settings() -> tuple[str, str | None, str | None]:
    attrs = context.config.attributes
    return attrs["table_prefix"], attrs["schema"], attrs["bound_table"]


def _applies() -> bool:
    _, _, bound = _settings()
    return not bound and op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    PREFIX, SCHEMA, _ = _settings()  # noqa: N806 - read as constants below
    if _applies():
        op.drop_constraint(f"fk_{PREFIX}history_entity", f"{PREFIX}history", type_="foreignkey", schema=SCHEMA)


def downgrade() -> None:
    PREFIX, SCHEMA, _ = _settings()  # noqa: N806
    if _applies():
        op.create_foreign_key(
            f"fk_{PREFIX}history_entity",
            f"{PREFIX}history",
            f"{PREFIX}entities",
            ["entity_id"],
            ["id"],
            ondelete="CASCADE",
            source_schema=SCHEMA,
            referent_schema=SCHEMA,
        )
