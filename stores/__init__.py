"""Store adapters: the :class:`Store` protocol and its implementations.

``SqlStore`` (SQLite, PostgreSQL) is imported on first use, so ``import stores`` does not
load SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stores.base import BriefMoves, Store, WorkNotices
from stores.factory import DEFAULT_URL, open_store, safe_url
from stores.memory import MemoryStore

if TYPE_CHECKING:
    from stores.sql import SqlStore


def __getattr__(name: str) -> Any:
    if name == "SqlStore":
        from stores.sql import SqlStore

        globals()["SqlStore"] = SqlStore
        return SqlStore
    raise AttributeError(f"module 'stores' has no attribute {name!r}")


__all__ = ["DEFAULT_URL", "BriefMoves", "MemoryStore", "SqlStore", "Store", "WorkNotices", "open_store", "safe_url"]
