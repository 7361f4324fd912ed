"""asyncio faces of the engine and the worker.

- :class:`AsyncEngine`: :class:`fsm.Engine`'s operations as coroutines over an async store
  (:mod:`stores.aio`), running the engine's one transition logic;
- :class:`AsyncWorker`: claims work and runs a coroutine handler per state, each under an
  asyncio lease keeper, with bounded concurrency and a graceful stop.
"""

from __future__ import annotations

from fsm.aio.engine import AsyncEngine
from fsm.aio.worker import AsyncJob, AsyncWorker

__all__ = ["AsyncEngine", "AsyncJob", "AsyncWorker"]
