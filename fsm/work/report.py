"""What a worker tells about each handler it ran: one log line and the ``handled`` signal.

Both faces' workers (:mod:`fsm.work.worker`, :mod:`fsm.aio.worker`) call :func:`report`
once per handler, so the lines, their ``extra`` fields and the signal are the same on
both.  Logger ``fsm.worker``: INFO when a handler's event fired (``completed``) or it
will run again (``retry``), WARNING when its holder learns it was fenced or it returned
no outcome, ERROR with the stack when it raised and the entity was failed.

Every line carries ``entity``, ``kind``, ``owner``, ``token``, ``state`` and ``outcome``
as ``extra`` fields (a JSON log formatter emits them as keys), plus ``event``,
``duration_ms`` and ``error`` where they apply.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import signals
from fsm.records import Lease
from signals import HandledPayload

log = logging.getLogger("fsm.worker")

COMPLETED = "completed"
FAILED = "failed"
RETRY = "retry"
FENCED = "fenced"
RELEASED = "released"
PARKED = "parked"

_LEVELS = {
    COMPLETED: logging.INFO,
    RETRY: logging.INFO,
    FENCED: logging.WARNING,
    RELEASED: logging.WARNING,
    PARKED: logging.INFO,
}


def report(
    kind: str,
    job: Any,
    state: str,
    outcome: str,
    started: float,
    *,
    event: str | None = None,
    error: BaseException | None = None,
) -> None:
    """Log one handler's outcome and send ``handled``; ``started`` is its
    :func:`time.perf_counter` at the call.  ``job`` is either face's job: its held lease
    names the holder (its snapshot's, for a job that holds none)."""
    level = _LEVELS.get(outcome, logging.ERROR)
    logged = log.isEnabledFor(level)
    if not logged and not signals.handled.receivers:
        return  # nobody listens: nothing to build (the common case of a busy worker)
    duration = time.perf_counter() - started
    lease = _holder(job)
    if logged:
        extra = {
            "entity": lease.entity_id,
            "kind": kind,
            "owner": lease.owner,
            "token": lease.token,
            "state": state,
            "outcome": outcome,
            "event": event,
            "duration_ms": round(duration * 1000, 3),
            "error": None if error is None else f"{type(error).__name__}: {error}",
        }
        if outcome == COMPLETED:
            log.info(
                "handled %s %s in %s: fired %s (%.1f ms)",
                kind,
                lease.entity_id,
                state,
                event,
                duration * 1000,
                extra=extra,
            )
        elif outcome == RETRY:
            log.info("handler for %s of %s raised, will retry: %s", state, lease.entity_id, error, extra=extra)
        elif outcome == FENCED:
            log.warning("lease of %s lost in %s, the handler stops: %s", lease.entity_id, state, error, extra=extra)
        elif outcome == PARKED:
            log.info("parked %s %s in %s: %s", kind, lease.entity_id, state, error, extra=extra)
        elif outcome == RELEASED:
            log.warning("handler for %s of %s returned no outcome; releasing it", state, lease.entity_id, extra=extra)
        else:
            log.error("handler for %s of %s raised", state, lease.entity_id, exc_info=error, extra=extra)
    if signals.handled.receivers:
        signals.send(
            signals.handled,
            kind,
            lambda: HandledPayload(
                kind=kind,
                entity_id=lease.entity_id,
                state=state,
                owner=lease.owner,
                token=lease.token,
                outcome=outcome,
                duration_s=duration,
                event=event,
                error=None if error is None else f"{type(error).__name__}: {error}",
            ),
        )


def _holder(job: Any) -> Lease:
    held = getattr(job, "held", None)
    lease = getattr(held, "lease", None)
    if isinstance(lease, Lease):
        return lease
    snap = job.snapshot
    return Lease(snap.id, snap.lease_owner or "", snap.lease_token, snap.lease_expires_at or snap.updated_at)


__all__ = ["COMPLETED", "FAILED", "FENCED", "RELEASED", "RETRY", "report"]
