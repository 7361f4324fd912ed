"""Why a waiting entity is not claimed although due: the limit that holds it back, for
``fsm show`` and the inspector (the store counts the slots as a limited claim does)."""

from __future__ import annotations

from typing import Any

from fsm.coordination import Limits
from fsm.engine.work import claim_plan, leased_states


def limit_wait(lifecycle: Any, snap: Any, store: Any) -> str | None:
    """Why a waiting entity is not claimed although due, when a limit holds it back:
    ``"waiting for its key 'acme': 2 of 2 slots held"`` (or the lifecycle's ``total``);
    ``None`` when no limit stops it (or it does not wait for a worker)."""
    limits: Limits | None = getattr(lifecycle, "limits", None)
    if limits is None or snap.deleted or snap.lease_owner is not None:
        return None
    starts, resumes = claim_plan(lifecycle.table)
    if snap.state not in {s.source for s in starts} | set(resumes):
        return None
    leased = list(leased_states(lifecycle.table))
    key = snap.concurrency_key
    if key is not None and limits.per_key is not None:
        held = store.slots(snap.kind, leased, key)
        if held >= limits.per_key:
            return f"waiting for its key {key!r}: {held} of {limits.per_key} slots held"
    if limits.total is not None:
        held = store.slots(snap.kind, leased)
        if held >= limits.total:
            return f"waiting for a slot of {snap.kind!r}: {held} of {limits.total} held"
    return None


__all__ = ["limit_wait"]
