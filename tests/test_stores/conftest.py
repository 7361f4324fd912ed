"""The store contract runs on both faces: ``any_store`` here adds the async adapters
(:mod:`stores.aio`), each seen through a synchronous facade (``tests/async_support.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fsm import ManualClock
from stores import Store
from tests.async_support import async_memory, async_postgres, async_sqlite
from tests.conftest import STORE_FACTORIES, postgres_url

FACES = [*sorted(STORE_FACTORIES), "aio-memory", "aio-sqlite", "aio-postgres"]


@pytest.fixture(params=FACES)
def any_store(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[Store]:
    name = request.param
    if name == "aio-memory":
        store: Store = async_memory(clock)  # type: ignore[assignment]
    elif name == "aio-sqlite":
        store = async_sqlite(clock)  # type: ignore[assignment]
    elif name == "aio-postgres":
        store = async_postgres(clock, postgres_url())  # type: ignore[assignment]
    else:
        store = STORE_FACTORIES[name](clock)
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()
