"""Open a store from a URL: what the CLI's ``--db`` takes.

``memory://`` is a fresh in-process store; any other URL is a SQLAlchemy URL
(``sqlite:///fsm.db``, ``postgresql+psycopg://user@host/db``) handed to ``SqlStore``.
"""

from __future__ import annotations

from stores.base import Store
from stores.memory import MemoryStore

DEFAULT_URL = "sqlite:///fsm.db"
"""The embedded default: a SQLite file in the working directory."""


def open_store(url: str = DEFAULT_URL) -> Store:
    """A store for ``url``; SQL stores create their tables when missing."""
    if url == "memory://":
        return MemoryStore()
    from stores.sql import SqlStore  # imported on demand: the memory store needs no SQLAlchemy

    return SqlStore(url)


__all__ = ["DEFAULT_URL", "open_store"]
