"""Shared fixtures: a manual clock, and stores parametrized over every adapter.

``any_store`` runs a test against each store adapter; adapters that need a server skip
with a reason when it is absent, unless ``FSM_REQUIRE_POSTGRES=1`` (set in CI) turns the
skip into a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.records import HistoryRecord, Snapshot
from stores import MemoryStore, Store

StoreFactory = Callable[[ManualClock], Store]


def _memory(clock: ManualClock) -> Store:
    return MemoryStore(clock=clock)


STORE_FACTORIES: dict[str, StoreFactory] = {"memory": _memory}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=sorted(STORE_FACTORIES))
def any_store(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[Store]:
    store = STORE_FACTORIES[request.param](clock)
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def pipelines(store: MemoryStore, clock: ManualClock) -> Engine:
    return Engine(PipelineLifecycle, store, clock=clock, owner="worker-1")


@pytest.fixture
def jobs(store: MemoryStore, clock: ManualClock) -> Engine:
    return Engine(JobLifecycle, store, clock=clock, owner="worker-1")


def frozen(engine: Engine, entity_id: str) -> tuple[Snapshot, list[HistoryRecord]]:
    """The entity and its history, to check a refused write changed nothing (I10)."""
    return engine.store.get(entity_id, include_deleted=True), engine.store.history(entity_id)
