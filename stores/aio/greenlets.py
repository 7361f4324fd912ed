"""The bridge between the synchronous store and engine code and asyncio: greenlets.

This is how SQLAlchemy's asyncio extension runs its synchronous core over async drivers:
:func:`spawn` runs a plain function in a greenlet from a coroutine, and inside it
:func:`wait` suspends that greenlet until an awaitable is done, letting the event loop run
other tasks meanwhile.  So the transition logic, the SQL statements and their
diagnosis exist once; the async faces only supply connections that wait this way.

Unlike SQLAlchemy's ``greenlet_spawn``, which creates a greenlet per call, :func:`spawn`
reuses idle greenlets (a few per thread): creating and finishing one costs about ten
microseconds, more than the engine's whole in-memory fire, and every async engine call
is one spawn.  A reused greenlet runs each call in the calling task's context (its
``contextvars``), as a new one would.  Its class carries SQLAlchemy's greenlet marker, so
SQLAlchemy's own ``await_`` also works under :func:`spawn`.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

try:
    from greenlet import GreenletExit, getcurrent, greenlet
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("the async engine and stores need greenlet: pip install 'fsm-lifecycles[asyncio]'") from err

T = TypeVar("T")

IDLE_PER_THREAD = 64
"""Idle greenlets kept per thread for reuse (more concurrent calls create more, then drop them)."""


class _Done:
    """What a bridge greenlet hands back when its call returned or raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


class _Bridge(greenlet):  # type: ignore[misc]
    """A greenlet that runs calls handed to it by :func:`spawn`, one after another."""

    __sqlalchemy_greenlet_provider__ = True  # SQLAlchemy's await_ accepts it as a spawn


def _serve(job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> None:
    """The body of a bridge greenlet: run the job, hand its outcome to the spawner, wait
    for the next job.  A greenlet dropped while suspended gets ``GreenletExit`` and ends."""
    while True:
        fn, args, kwargs = job
        try:
            done = _Done(fn(*args, **kwargs), None)
        except GreenletExit:
            raise
        except BaseException as err:  # handed to the spawner, which raises it
            done = _Done(None, err)
        del fn, args, kwargs
        job = getcurrent().parent.switch(done)


_local = threading.local()


def _idle() -> list[_Bridge]:
    idle: list[_Bridge] | None = getattr(_local, "idle", None)
    if idle is None:
        idle = _local.idle = []
    return idle


async def spawn(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a greenlet; it may :func:`wait` on awaitables."""
    idle = _idle()
    driver = getcurrent()
    bridge = idle.pop() if idle else _Bridge(_serve)
    bridge.parent = driver
    bridge.gr_context = driver.gr_context  # the calling task's contextvars
    msg: Any = bridge.switch((fn, args, kwargs))
    while msg.__class__ is not _Done:
        # fn waits on an awaitable: await it here, on the loop, and hand back the outcome
        try:
            value = await msg
        except BaseException:
            bridge.parent = getcurrent()  # the greenlet resuming this frame (a finalizer may run it elsewhere)
            msg = bridge.throw(*sys.exc_info())
        else:
            bridge.parent = getcurrent()
            msg = bridge.switch(value)
    bridge.gr_context = None  # an idle greenlet keeps no task's context variables alive
    if len(idle) < IDLE_PER_THREAD:
        idle.append(bridge)
    value, error = msg.value, msg.error
    msg.value = msg.error = None
    if error is not None:
        raise error
    return value  # type: ignore[no-any-return]


def wait(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, from synchronous code running under :func:`spawn`."""
    current = getcurrent()
    if not getattr(current, "__sqlalchemy_greenlet_provider__", False):
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never awaited: do not leave a warning behind
        raise RuntimeError("wait() outside spawn(): async store calls must run under AsyncEngine or an async store")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


def resolved(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (an async callback's result)."""
    if inspect.isawaitable(value):
        return wait(value)
    return value


def bridged() -> bool:
    """Whether the calling code runs under :func:`spawn` (and so may :func:`wait`)."""
    return bool(getattr(getcurrent(), "__sqlalchemy_greenlet_provider__", False))


__all__ = ["bridged", "resolved", "spawn", "wait"]
