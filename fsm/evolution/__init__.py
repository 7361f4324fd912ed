"""Lifecycles that change while entities are in flight.

- :mod:`fsm.evolution.declare`: a lifecycle's ``version`` and its ``migrations``
  (:class:`Renamed`, :class:`Removed`, :class:`Split`, :class:`DataMigration`);
- :mod:`fsm.evolution.check`: :func:`check_store`, what a store holds that a definition
  cannot read (``fsm check``);
- :mod:`fsm.evolution.migrate`: :func:`migrate_rows`, the declared moves carried out in
  fenced, resumable batches (``fsm migrate-rows``).

``fsm.lifecycle`` imports the declarations while a lifecycle class is created; the check
and the migration import the engine and the stores only inside their functions, so
importing this package never pulls them in.
"""

from __future__ import annotations

from fsm.evolution.check import CheckReport, check_store
from fsm.evolution.declare import (
    MAX_DEFINITION_VERSION,
    DataMigration,
    Migrations,
    Removed,
    Renamed,
    Split,
)
from fsm.evolution.migrate import MigrationReport, migrate_rows

__all__ = [
    "MAX_DEFINITION_VERSION",
    "CheckReport",
    "DataMigration",
    "MigrationReport",
    "Migrations",
    "Removed",
    "Renamed",
    "Split",
    "check_store",
    "migrate_rows",
]
