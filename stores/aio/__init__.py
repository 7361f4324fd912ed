"""Async faces of the stores: the :class:`AsyncStore` protocol and its adapters.

- :class:`AsyncMemoryStore` over :class:`stores.MemoryStore`;
- :class:`AsyncSqlStore` on PostgreSQL (psycopg's ``AsyncConnection``) and SQLite
  (aiosqlite), running the SQL store's own statements and logic;
- :class:`BridgeStore`: the synchronous view of an async store inside a greenlet, on
  which :class:`fsm.AsyncEngine` runs the engine's one transition logic.

``AsyncSqlStore`` is imported on first use, so ``import stores.aio`` loads no driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stores.aio.base import AsyncStore
from stores.aio.face import AsyncFace, BridgeStore
from stores.aio.memory import AsyncMemoryStore

if TYPE_CHECKING:
    from stores.aio.sql import AsyncSqlStore, open_async_store


def __getattr__(name: str) -> Any:
    if name in {"AsyncSqlStore", "open_async_store"}:
        from stores.aio import sql

        value = getattr(sql, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stores.aio' has no attribute {name!r}")


__all__ = ["AsyncFace", "AsyncMemoryStore", "AsyncSqlStore", "AsyncStore", "BridgeStore", "open_async_store"]
