"""SQLite: feed positions that are never given twice, even after the newest history rows
were deleted (migration 0005).

SQLite's feed position is the history row's rowid (:mod:`stores.sql.feed`), and SQLite
gives a new row the largest rowid *present* plus one.  A prune, a trim or an entity's
delete that removes the newest rows would let the next transition take a rowid that a
reader has already passed: that reader would skip it for good.

The fix keeps the table and every statement that writes it as they are (``AUTOINCREMENT``
would need an ``INTEGER PRIMARY KEY`` column, rebuilding the table and changing its key on
SQLite only):

- ``{prefix}feed_mark``, one row: ``high``, the largest rowid ever deleted (or moved);
- an ``AFTER DELETE`` trigger raises ``high`` when a deleted row's rowid is above it
  (every delete, whoever runs it: a prune, a trim, a cascade from the entity);
- an ``AFTER INSERT`` trigger moves a new row whose rowid is not above ``high`` to
  ``high + 1``.  That row is then the largest, so the rows after it are numbered above it
  by SQLite itself: the trigger's update runs once after a delete of the newest rows, and
  otherwise costs each insert one read of a one-row table.

One writer at a time (``BEGIN IMMEDIATE``) and both triggers in the writing transaction:
the order is still commit order.  PostgreSQL needs none of this (its positions are
transaction ids, never reused).
"""

from __future__ import annotations

MARK = "feed_mark"


def _name(schema: str | None, name: str) -> str:
    quoted = '"' + name.replace('"', '""') + '"'
    return f'"{schema}".{quoted}' if schema else quoted


def mark_table(prefix: str) -> str:
    """The high-water table's name."""
    return f"{prefix}{MARK}"


def feed_mark_ddl(prefix: str, schema: str | None = None) -> tuple[str, ...]:
    """The high-water table, its row (from the rows present) and the two triggers."""
    history, mark = _name(None, f"{prefix}history"), _name(None, mark_table(prefix))
    return (
        f"CREATE TABLE {_name(schema, mark_table(prefix))} "
        "(id INTEGER PRIMARY KEY CHECK (id = 1), high INTEGER NOT NULL)",
        f"INSERT INTO {_name(schema, mark_table(prefix))} (id, high) "
        f"SELECT 1, coalesce(max(rowid), 0) FROM {_name(schema, prefix + 'history')}",
        f"CREATE TRIGGER {_name(schema, prefix + 'history_feed_deleted')} AFTER DELETE ON {history} "
        f"WHEN OLD.rowid > (SELECT high FROM {mark}) "
        f"BEGIN UPDATE {mark} SET high = OLD.rowid; END",
        f"CREATE TRIGGER {_name(schema, prefix + 'history_feed_inserted')} AFTER INSERT ON {history} "
        f"WHEN NEW.rowid <= (SELECT high FROM {mark}) "
        f"BEGIN UPDATE {history} SET rowid = (SELECT high FROM {mark}) + 1 WHERE rowid = NEW.rowid; END",
    )


def drop_feed_mark_ddl(prefix: str, schema: str | None = None) -> tuple[str, ...]:
    """Undo :func:`feed_mark_ddl` (migration 0005's downgrade, and dropping the schema)."""
    return (
        f"DROP TRIGGER IF EXISTS {_name(schema, prefix + 'history_feed_inserted')}",
        f"DROP TRIGGER IF EXISTS {_name(schema, prefix + 'history_feed_deleted')}",
        f"DROP TABLE IF EXISTS {_name(schema, mark_table(prefix))}",
    )


__all__ = ["MARK", "drop_feed_mark_ddl", "feed_mark_ddl", "mark_table"]
