"""Store adapters: the :class:`Store` protocol and its implementations."""

from stores.base import Store
from stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]
