"""The bridge between the synchronous store and engine code and asyncio: greenlets.

This is how SQLAlchemy's asyncio extension runs its synchronous core over async drivers:
:func:`spawn` runs a plain function in a greenlet from a coroutine, and inside it
:func:`wait` suspends that greenlet until an awaitable is done, letting the event loop run
other tasks meanwhile.  So the transition logic, the SQL statements and their
diagnosis exist once; the async faces only supply connections that wait this way.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.util.concurrency import await_, greenlet_spawn, in_greenlet

T = TypeVar("T")


async def spawn(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a greenlet; it may :func:`wait` on awaitables."""
    return await greenlet_spawn(fn, *args, **kwargs)


def wait(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, from synchronous code running under :func:`spawn`."""
    return await_(awaitable)


def resolved(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (an async callback's result)."""
    if inspect.isawaitable(value):
        return await_(value)
    return value


def bridged() -> bool:
    """Whether the calling code runs under :func:`spawn` (and so may :func:`wait`)."""
    return bool(in_greenlet())


__all__ = ["bridged", "resolved", "spawn", "wait"]
