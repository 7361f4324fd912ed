"""Delivering delayed fires (:mod:`fsm.engine.later`): the reaper's step for each lifecycle
it leads.

1. Claim the due requests: ``pending -> delivering`` with a lease (the store's claim, in
   due order, ``SKIP LOCKED`` on PostgreSQL), and take over those whose deliverer died
   (``delivering`` with an expired lease: a new lease, token + 1).
2. Fire each request's event with the idempotency key ``fsm:later:{key}`` and the fence
   :class:`~fsm.records.HeldBy` (this deliverer's lease on the request): a deliverer that
   lost the request changes nothing.
3. Record the outcome under the same lease: ``delivering -> fired`` (the transition), or
   ``delivering -> dropped`` with the chart's refusal as the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from fsm.engine import Engine
from fsm.engine.later import DELIVERING, DROPPED, FIRED, LATER_KEY_PREFIX, PENDING, later_kind
from fsm.errors import (
    ConditionFailed,
    Fenced,
    FsmError,
    GuardRejected,
    InvalidData,
    StaleVersion,
    StoreUnavailable,
    TransitionNotAllowed,
    UnknownEntity,
)
from fsm.records import (
    ClaimRequest,
    ClaimStart,
    HeldBy,
    LeaseChange,
    LeaseStale,
    Snapshot,
    TransitionWrite,
)

log = logging.getLogger("fsm.reaper")

DELIVERY_TTL = timedelta(seconds=30)
"""How long a deliverer holds a request: a dead one's requests are taken over after it."""
REFUSALS = (TransitionNotAllowed, GuardRejected, UnknownEntity, InvalidData)
"""What a delivery is dropped for: the chart (or the entity) refuses the event now."""


@dataclass
class Delivery:
    """What one step delivered: request ids fired, dropped (with why), and lost (another
    deliverer took them over)."""

    fired: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def deliver_due(
    engine: Engine, owner: str, *, limit: int = 100, ttl: timedelta = DELIVERY_TTL, takeover: bool = True
) -> Delivery:
    """Deliver up to ``limit`` due delayed fires of ``engine``'s lifecycle (see the module).
    One claim statement when nothing is due; ``takeover``: also take over the requests of
    deliverers that died (one more read; the reaper does it once per ``ttl``)."""
    store = engine.store
    kind = later_kind(engine.kind)
    done = Delivery()
    taken = store.claim(ClaimRequest(kind, owner, limit, ttl, starts=(ClaimStart(PENDING, DELIVERING, "deliver"),)))
    stale = store.candidates(kind, DELIVERING, (LeaseStale(ttl),), limit=limit) if takeover else []
    for row in stale:
        try:  # its deliverer died: take the request over (token + 1 fences the old one)
            taken.append(store.acquire_lease(row.id, owner=owner, ttl=ttl, budget=None, expect_version=row.version))
        except (Fenced, StaleVersion):
            continue  # another deliverer took it first
    for row in taken:
        try:
            _deliver(engine, row, done)
        except StoreUnavailable:
            raise
        except (FsmError, KeyError, TypeError, ValueError) as err:  # this request only (a malformed
            # row, too): logged, retried after its lease lapses; the others are still delivered
            log.error("delayed fire %s could not be delivered: %s: %s", row.id, type(err).__name__, err)
    return done


def _deliver(engine: Engine, row: Snapshot, done: Delivery) -> None:
    lease = row.lease
    assert lease is not None
    data = row.data
    fence = HeldBy(row.id, lease.owner, lease.token)
    try:
        fired = engine.fire(
            data["entity_id"],
            data["event"],
            idempotency_key=f"{LATER_KEY_PREFIX}{data['key']}",
            reason=data.get("reason"),
            data=data.get("data"),
            actor=data.get("actor", "worker"),
            fence=fence,
        )
        record = fired.record
        outcome, event = FIRED, "fired"
        reason = f"fired {record.event}: {record.source} -> {record.target} (seq {record.seq})"
    except ConditionFailed as err:
        if err.condition != fence.name:
            outcome, event, reason = DROPPED, "dropped", f"{type(err).__name__}: {err}"
        else:  # this deliverer lost the request: whoever holds it now delivers it
            done.lost.append(row.id)
            return
    except REFUSALS as err:
        outcome, event, reason = DROPPED, "dropped", f"{type(err).__name__}: {err}"
    except StaleVersion:  # the entity is contended: not a refusal; retried once this lease lapses
        log.info("delayed fire %s met a contended entity; it is retried", row.id)
        return
    write = TransitionWrite(
        row.id,
        event,
        DELIVERING,
        outcome,
        "reaper",
        row.version,
        expect_owner=lease.owner,
        expect_token=lease.token,
        lease_change=LeaseChange.CLEAR,
        reason=reason[:1000],
    )
    try:
        engine.store.apply(write)
    except (Fenced, StaleVersion, ConditionFailed):
        done.lost.append(row.id)  # taken over meanwhile: the new holder records the outcome
        return
    if outcome == FIRED:
        done.fired.append(row.id)
    else:
        done.dropped.append((row.id, reason))
        log.info("delayed fire %s dropped: %s", row.id, reason)


__all__ = ["DELIVERY_TTL", "Delivery", "deliver_due"]
