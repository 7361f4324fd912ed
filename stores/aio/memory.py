"""The memory store's async face: the same dictionaries, lock and checks, awaited."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm.clock import Clock
from stores.aio.face import AsyncFace
from stores.memory import MemoryStore


class AsyncMemoryStore(AsyncFace):
    """An :class:`~stores.aio.AsyncStore` over a :class:`stores.MemoryStore` (given, or new
    with ``clock``).  Its calls never wait on I/O, so they run at once on the loop."""

    def __init__(self, store: MemoryStore | None = None, *, clock: Clock | None = None) -> None:
        self.sync = store if store is not None else MemoryStore(clock)
        self.clock = self.sync.clock

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.sync, name)(*args, **kwargs)

    async def _invoke(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.sync, name)(*args, **kwargs)  # no I/O: no greenlet needed

    def sync_store(self) -> MemoryStore:
        """The synchronous store under this one (the same rows), for a thread's work."""
        return self.sync

    def subscribe_work(self, kind: str, callback: Callable[[], None]) -> Callable[[], None]:
        """See :class:`stores.base.WorkNotices` (the memory store's subscribers)."""
        return self.sync.subscribe_work(kind, callback)

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({self.sync!r})"


__all__ = ["AsyncMemoryStore"]
