"""Store adapters: the :class:`Store` protocol and its implementations."""

from stores.base import Store
from stores.factory import DEFAULT_URL, open_store
from stores.memory import MemoryStore

__all__ = ["DEFAULT_URL", "MemoryStore", "Store", "open_store"]
