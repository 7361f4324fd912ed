"""Alembic migrations of the tables fsm-lifecycles owns (history, effects, and entities
unless the store is bound to an application table).

Run them with :func:`stores.sql.migrate.upgrade` or ``python -m stores.migrations upgrade URL``.
"""
