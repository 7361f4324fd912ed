"""Store factories for the kit: open a store, and reopen the same data after a "restart".

A restart in the kit is a new engine and a new store object over the data the old one
wrote (I8: nothing the guarantees depend on may live only in the old objects).  A SQLite
factory reopens the same file; the memory factory hands a new ``MemoryStore`` the old
one's tables (its lock and everything else are new).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Protocol

from fsm.clock import ManualClock
from stores.base import Store
from stores.memory import MemoryStore


class StoreFactory(Protocol):
    """Opens a store for one hypothesis example and reopens its data after a restart."""

    def open(self, clock: ManualClock) -> Store:
        """A fresh, empty store whose ``now`` is ``clock``."""
        ...

    def reopen(self, old: Store, clock: ManualClock) -> Store:
        """A new store object over ``old``'s data (``old`` may be closed first)."""
        ...

    def close(self, store: Store) -> None:
        """Close ``store`` and remove what :meth:`open` created."""
        ...


class MemoryStores:
    """Memory stores; a reopened one shares the old one's tables, nothing else."""

    name = "memory"

    def open(self, clock: ManualClock) -> Store:
        return MemoryStore(clock=clock)

    def reopen(self, old: Store, clock: ManualClock) -> Store:
        if not isinstance(old, MemoryStore):
            raise TypeError(f"MemoryStores reopens a MemoryStore, not {old!r}")
        new = MemoryStore(clock=clock)
        for table in ("_rows", "_history", "_keys", "_effects", "_by_concurrency_key"):
            setattr(new, table, getattr(old, table))
        return new

    def close(self, store: Store) -> None:
        return None


class SqlStores:
    """SQL stores on a URL made per example (``url_for(directory)``); reopen = same URL."""

    def __init__(self, name: str, url_for: Callable[[str], str], **options: object) -> None:
        self.name = name
        self.url_for = url_for
        self.options = options
        self._dirs: dict[int, str] = {}

    def open(self, clock: ManualClock) -> Store:
        from stores.sql import SqlStore

        directory = tempfile.mkdtemp(prefix="fsm-kit-")
        store = SqlStore(self.url_for(directory), clock=clock, **self.options)  # type: ignore[arg-type]
        self._dirs[id(store)] = directory
        return store

    def reopen(self, old: Store, clock: ManualClock) -> Store:
        from stores.sql import SqlStore

        directory = self._dirs.pop(id(old))
        close = getattr(old, "close", None)
        if close is not None:
            close()
        store = SqlStore(self.url_for(directory), clock=clock, **self.options)  # type: ignore[arg-type]
        self._dirs[id(store)] = directory
        return store

    def close(self, store: Store) -> None:
        close = getattr(store, "close", None)
        if close is not None:
            close()
        directory = self._dirs.pop(id(store), None)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def memory_stores() -> MemoryStores:
    """The in-memory store: fastest, and the same semantics (the contract suite pins it)."""
    return MemoryStores()


def sqlite_stores(**options: object) -> SqlStores:
    """A SQLite file per example, in a temporary directory removed at teardown."""
    return SqlStores("sqlite", lambda directory: f"sqlite:///{directory}/fsm.db", **options)


__all__ = ["MemoryStores", "SqlStores", "StoreFactory", "memory_stores", "sqlite_stores"]
