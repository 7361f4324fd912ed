"""Signals of fsm-lifecycles: one blinker namespace, each signal documented.

Every signal is sent **after** the commit of what it reports, with the lifecycle's kind
(``"pipeline"``, ``"job"``...) or ``"reaper"`` as sender and a typed pydantic payload as
the ``payload`` keyword.  A receiver that raises is logged (logger ``fsm.signals``) and
changes nothing: the transition it reports is committed already, and the other receivers
still run.

::

    from signals import transitioned

    @transitioned.connect_via("pipeline")
    def forward(sender, payload):
        websocket.broadcast("pipeline.updated", payload.model_dump_json())
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from blinker import Namespace, Signal

from signals.payloads import (
    EffectPayload,
    FeedPayload,
    HandledPayload,
    HistoryModel,
    LeaseModel,
    LeasePayload,
    ReaperErrorPayload,
    ReaperTickPayload,
    RefusedPayload,
    SnapshotModel,
    TransitionPayload,
)

log = logging.getLogger("fsm.signals")

namespace = Namespace()
"""The namespace holding every signal of the library."""

transitioned: Signal = namespace.signal(
    "transitioned", doc="An entity changed state (any actor). Payload: TransitionPayload."
)
expired: Signal = namespace.signal(
    "expired", doc="The reaper expired an entity (event 'expire'). Payload: TransitionPayload."
)
reclaimed: Signal = namespace.signal(
    "reclaimed",
    doc="The reaper reclaimed a finalizer whose lease went stale; the snapshot carries the new "
    "owner and token, so finalization can resume. Payload: TransitionPayload.",
)
lease_acquired: Signal = namespace.signal(
    "lease_acquired", doc="A lease was taken (acquire, or a transition that takes it). Payload: LeasePayload."
)
lease_renewed: Signal = namespace.signal(
    "lease_renewed",
    doc="A holder extended its lease (renew_lease, the lease keeper); sent after the commit, with the "
    "new expiry. Payload: LeasePayload.",
)
lease_lost: Signal = namespace.signal(
    "lease_lost",
    doc="A holder tried to renew or use a lease that is no longer current. Payload: LeasePayload.",
)
effect_recorded: Signal = namespace.signal(
    "effect_recorded", doc="A side effect's result was recorded for its key. Payload: EffectPayload."
)
write_refused: Signal = namespace.signal(
    "write_refused",
    doc="The fence refused a holder's late write (a fire, an effect's result, a renewal or a release under a "
    "lease that is no longer current); nothing it wrote stands. Sent after the refusal, before the caller gets "
    "the error. Payload: RefusedPayload.",
)
handled: Signal = namespace.signal(
    "handled",
    doc="A worker's handler finished (both faces' workers): its outcome, its event and its duration. "
    "Payload: HandledPayload.",
)
reaper_tick: Signal = namespace.signal(
    "reaper_tick", doc="A reaper tick finished. Sender 'reaper'. Payload: ReaperTickPayload."
)
reaper_error: Signal = namespace.signal(
    "reaper_error", doc="A reaper tick or row failed; the reaper goes on. Payload: ReaperErrorPayload."
)


def send(signal: Signal, sender: str, payload: Callable[[], Any]) -> int:
    """Deliver to every receiver of ``signal`` for ``sender``; return how many raised.

    ``payload`` is built only when somebody listens, so an unobserved transition pays
    nothing for it.  Each receiver runs in its own ``try``: one that raises is logged with
    its stack and the others still run.
    """
    if not signal.receivers:
        return 0
    held = _held.get()
    if held is not None:  # inside the caller's transaction: sent after its commit (release)
        held.items.append((signal, sender, payload))
        return 0
    built = None
    failures = 0
    for receiver in signal.receivers_for(sender):
        if built is None:
            try:
                built = payload()
            except Exception:  # what it reports is committed: log, never raise into the caller
                log.exception(
                    "payload of signal %r could not be built; no receiver called", getattr(signal, "name", "?")
                )
                return 1
        try:
            result = receiver(sender, payload=built)
            if inspect.isawaitable(result):
                _defer(signal, receiver, result)
        except Exception:
            failures += 1
            log.exception(
                "receiver %r of signal %r raised; what it reports stands", receiver, getattr(signal, "name", "?")
            )
    return failures


class Held:
    """Signals held until the caller's transaction commits (:meth:`fsm.Engine.within`):
    :func:`release` sends them, a rollback clears them."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[tuple[Signal, str, Callable[[], Any]]] = []


_held: contextvars.ContextVar[Held | None] = contextvars.ContextVar("fsm_signals_held", default=None)


class holding:
    """Within, :func:`send` appends to ``held`` instead of delivering (this thread or task only)."""

    __slots__ = ("_held", "_token")

    def __init__(self, held: Held) -> None:
        self._held = held

    def __enter__(self) -> Held:
        self._token = _held.set(self._held)
        return self._held

    def __exit__(self, *exc: object) -> None:
        _held.reset(self._token)


def release(held: Held) -> int:
    """Send what ``held`` holds, in order, and empty it; returns how many receivers raised.
    Outside any :class:`holding` of its own, so the signals really go out."""
    items, held.items = held.items, []
    token = _held.set(None)
    try:
        return sum(send(signal, sender, payload) for signal, sender, payload in items)
    finally:
        _held.reset(token)


Pending = list[tuple[str, Any, Awaitable[Any]]]
_tasks: set[asyncio.Task[int]] = set()
_pending: contextvars.ContextVar[Pending | None] = contextvars.ContextVar("fsm_signals_pending", default=None)


def _defer(signal: Signal, receiver: Any, awaitable: Awaitable[Any]) -> None:
    """An async receiver's awaitable: awaited by the async engine after its call (inside
    :func:`collecting`), else run as a task on the running loop, else refused (logged)."""
    name = getattr(signal, "name", "?")
    box = _pending.get()
    if box is not None:
        box.append((name, receiver, awaitable))
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        log.error("async receiver %r of signal %r needs a running event loop (use AsyncEngine)", receiver, name)
        return
    task = loop.create_task(deliver([(name, receiver, awaitable)]))
    _tasks.add(task)  # held until done: the loop keeps only weak references to tasks
    task.add_done_callback(_tasks.discard)


class collecting:
    """Collect the awaitables of async receivers sent within, for :func:`deliver`.

    A class, not a generator context manager: the async engine enters it on every call."""

    __slots__ = ("_box", "_token")

    def __enter__(self) -> Pending:
        self._box: Pending = []
        self._token = _pending.set(self._box)
        return self._box

    def __exit__(self, *exc: object) -> None:
        _pending.reset(self._token)


async def deliver(pending: Pending) -> int:
    """Await each async receiver's awaitable in order; one that raises is logged (as a sync
    receiver's would be) and the others still run.  Returns how many raised."""
    failures = 0
    for name, receiver, awaitable in pending:
        try:
            await awaitable
        except Exception:
            failures += 1
            log.exception("receiver %r of signal %r raised; what it reports stands", receiver, name)
    return failures


__all__ = [
    "EffectPayload",
    "FeedPayload",
    "HandledPayload",
    "Held",
    "HistoryModel",
    "LeaseModel",
    "LeasePayload",
    "ReaperErrorPayload",
    "ReaperTickPayload",
    "RefusedPayload",
    "SnapshotModel",
    "TransitionPayload",
    "collecting",
    "deliver",
    "effect_recorded",
    "expired",
    "handled",
    "holding",
    "lease_acquired",
    "lease_lost",
    "lease_renewed",
    "namespace",
    "reaper_error",
    "reaper_tick",
    "reclaimed",
    "release",
    "send",
    "transitioned",
    "write_refused",
]
