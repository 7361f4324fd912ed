"""What every part of the engine shares: its lifecycle, table, store, clock, policy, owner."""

from __future__ import annotations

from typing import Any

from fsm.clock import Clock
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.table import CompiledTable
from stores.base import Store


class StoreClock:
    """The store's own clock, for judging time guards the way the store will."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def now(self) -> Any:
        return self._store.now()


class EngineBase:
    """The attributes the engine's parts (reads, leases, firing) work on."""

    lifecycle: type[Lifecycle]
    kind: str
    table: CompiledTable
    store: Store
    clock: Clock
    policy: Policy
    owner: str
    _events: frozenset[str]


__all__ = ["EngineBase", "StoreClock"]
