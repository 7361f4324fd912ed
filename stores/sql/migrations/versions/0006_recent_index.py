"""The inspector's index: entities most recently updated first (issue 21).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

- ``ix_{prefix}entities_recent`` ``(kind, state, updated_at, id)``: the inspector's entity
  table walks it, one ``ORDER BY updated_at DESC, id DESC LIMIT`` walk per (kind, state),
  keyset pages and the data field search's bounded window included
  (:mod:`fsm.inspect.listing`).  Revision 0004 dropped ``ix_{prefix}entities_idle``
  ``(kind, state, updated_at)`` saying only the claim read it; without it every walk
  sorted its whole pair (over a second per page at 1,000,000 entities).  The trailing
  ``id`` keeps the keyset exact through rows sharing one ``updated_at``.

Building it reads the table once (about 3 s per million rows); writes to the entity table
wait for it.  On SQLite with statistics (``ANALYZE``) the new index is analyzed too.

With a bound application table the entity indexes belong to the application's
migrations: ``add_missing_columns(engine, binding)`` adds the indexes the table lacks,
this one included (``add_binding_columns`` adds them all); nothing changes here.
"""

from __future__ import annotations

from alembic import context, op

revision = "0006"
down_revision = "0005"
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
    op.create_index(f"ix_{stem}_recent", stem, ["kind", "state", "updated_at", "id"], schema=SCHEMA)
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and not context.is_offline_mode():
        # statistics (ANALYZE) that describe every other index but not the new one would
        # make SQLite take it for a very selective one: describe it too (PostgreSQL's are
        # per table, kept by autovacuum)
        q = bind.dialect.identifier_preparer
        where = f"{q.quote_schema(SCHEMA)}." if SCHEMA else ""
        stats = bind.exec_driver_sql(f"SELECT name FROM {where}sqlite_master WHERE name = 'sqlite_stat1'").first()
        if (
            stats is not None
            and bind.exec_driver_sql(f"SELECT 1 FROM {where}sqlite_stat1 WHERE tbl = ? LIMIT 1", (stem,)).first()
        ):
            bind.exec_driver_sql(f"ANALYZE {where}{q.quote(f'ix_{stem}_recent')}")


def downgrade() -> None:
    PREFIX, SCHEMA, BOUND = _settings()  # noqa: N806
    if BOUND:
        return
    stem = f"{PREFIX}entities"
    op.drop_index(f"ix_{stem}_recent", table_name=stem, schema=SCHEMA)
