"""The SQLAlchemy store: SQLite (the embedded default) and PostgreSQL.

One module per concept, bottom to top:

- ``schema``: the tables, column types and time encoding (imports nothing of this package);
- ``binding``: mapping the entity table onto an application's existing table, its child rows;
- ``dialect``: the SQL of every statement, written once per dialect;
- ``connections``: the engine, the per-thread DBAPI connections and their failure mapping;
- ``rows``, ``children``: decoding rows into snapshots and history, child-row writes;
- ``migrate`` and ``migrations/``: Alembic migrations (``python -m stores.migrations``);
- ``core``, ``leases``, ``reaper_batches``: the store's parts, mixed into ``store.SqlStore``;
- ``partitions``: a history partitioned by time on PostgreSQL (``partition_history``), whose
  retention drops whole partitions.
"""

from __future__ import annotations

from stores.sql.binding import ChildRows, TableBinding, add_missing_columns
from stores.sql.connections import create_engine
from stores.sql.migrate import downgrade, stamp, upgrade
from stores.sql.partitions import partition_history
from stores.sql.store import DEFAULT_URL, SqlStore

__all__ = [
    "DEFAULT_URL",
    "ChildRows",
    "SqlStore",
    "TableBinding",
    "add_missing_columns",
    "create_engine",
    "downgrade",
    "partition_history",
    "stamp",
    "upgrade",
]
