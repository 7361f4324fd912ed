"""Delayed fires: ``engine.fire_later(entity_id, event, after=...)``.

A delayed fire is stored, never kept in memory (I8): a reserved row of kind
``fsm.later:{lifecycle kind}`` (id ``fsm-later:{kind}:{entity id}:{key}``) in state
``pending``, due (``run_after``) when the event should fire, its data the event, actor,
reason and data patch.  The reaper of the lifecycle delivers it when due
(:mod:`fsm.reaping.later`): it claims the row (``pending -> delivering``, a lease, token +
1), fires the event on the entity with the idempotency key ``fsm:later:{key}`` and a
:class:`~fsm.records.HeldBy` fence on its own lease, then records the outcome
(``delivering -> fired``, or ``-> dropped`` with the refusal as the reason, when the chart
no longer allows the event).

Why it is fenced: the event's write is refused in its own statement unless the
deliverer still holds the delayed row's lease, and a deliverer that took over the row
(the first one died or stalled) holds a newer token.  So a late deliverer changes nothing
after another has dropped the event, and a retried delivery of a fire that did land is a
replay of its idempotency key, recorded as ``fired``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fsm.errors import ConfigError, IdempotencyKeyReused, InvalidArgument
from fsm.ids import new_id
from fsm.limits import MAX_DURATION, MAX_ID_LENGTH, check_id, check_time
from fsm.records import Actor, NewEntity, Snapshot

LATER_KIND_PREFIX = "fsm.later:"
KIND_WIDTH = 64
"""The SQL stores' kind column holds 64 characters: a lifecycle kind of at most 54 has
delayed fires."""
PENDING, DELIVERING, FIRED, DROPPED = "pending", "delivering", "fired", "dropped"
LATER_KEY_PREFIX = "fsm:later:"
"""The idempotency key of a delivered fire: ``fsm:later:{key}``."""


def later_kind(kind: str) -> str:
    """The reserved kind of ``kind``'s delayed fires."""
    return f"{LATER_KIND_PREFIX}{kind}"


def later_id(kind: str, entity_id: str, key: str) -> str:
    """The id of the delayed fire ``key`` of entity ``entity_id``."""
    return f"fsm-later:{kind}:{entity_id}:{key}"


@dataclass(frozen=True)
class Delayed:
    """A delayed fire as stored: ``state`` is ``pending``, ``delivering``, ``fired`` or
    ``dropped``; ``outcome`` is the reason its last move recorded (the fired transition, or
    why the chart refused the event)."""

    id: str
    entity_id: str
    event: str
    due: datetime
    state: str
    key: str
    outcome: str | None = None

    @classmethod
    def of(cls, row: Snapshot, outcome: str | None = None) -> Delayed:
        data = row.data
        due = row.run_after or row.created_at
        return cls(row.id, data["entity_id"], data["event"], due, row.state, data["key"], outcome)


def check_due(after: object, at: object, now: datetime) -> datetime:
    """When a delayed fire is due: exactly one of ``after`` (a timedelta or seconds, 0 to
    100 years) and ``at`` (an aware datetime)."""
    if (after is None) == (at is None):
        raise InvalidArgument("fire_later takes exactly one of after= (a delay) and at= (a time)")
    if at is not None:
        when = check_time("at", at)
        try:
            return when.astimezone(UTC)
        except (OverflowError, ValueError):
            raise InvalidArgument(f"at {at!r} is out of range") from None
    if isinstance(after, bool) or not isinstance(after, timedelta | int | float):
        raise InvalidArgument(f"after must be a timedelta or seconds, not {type(after).__name__}")
    delay = after if isinstance(after, timedelta) else None
    if delay is None:
        seconds = float(after)  # type: ignore[arg-type]
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION.total_seconds():
            raise InvalidArgument(f"after must be from 0 to {MAX_DURATION.days} days, not {after!r}")
        delay = timedelta(seconds=seconds)
    if not timedelta() <= delay <= MAX_DURATION:
        raise InvalidArgument(f"after must be from 0 to {MAX_DURATION.days} days, not {after!r}")
    return now + delay


def new_delayed(
    kind: str,
    entity_id: str,
    event: str,
    due: datetime,
    *,
    key: str | None,
    actor: Actor,
    reason: str | None,
    data: dict[str, Any] | None,
) -> NewEntity:
    """The reserved row of a delayed fire (its ids checked: ``ConfigError`` for a kind too
    long to prefix, ``InvalidArgument`` for an id and key too long together)."""
    if len(later_kind(kind)) > KIND_WIDTH:
        width = KIND_WIDTH - len(LATER_KIND_PREFIX)
        raise ConfigError(f"kind {kind!r} is too long for delayed fires (at most {width} characters)")
    chosen = new_id() if key is None else check_id("idempotency_key", key)
    row_id = later_id(kind, entity_id, chosen)
    if len(row_id) > MAX_ID_LENGTH:
        raise InvalidArgument("entity id and idempotency key are too long together for a delayed fire")
    payload: dict[str, Any] = {"entity_id": entity_id, "event": event, "key": chosen, "actor": actor.value}
    payload.update(reason=reason, data=data)
    return NewEntity(id=row_id, kind=later_kind(kind), state=PENDING, data=payload, run_after=due)


def same_request(row: Snapshot, wanted: NewEntity, *, compare_due: bool) -> None:
    """A delayed fire created again under its key: the same request, or ``IdempotencyKeyReused``.
    ``compare_due``: the request gave a time (``at=``); one given a delay (``after=``) is
    due later each time it is sent, so a retry of it matches whatever its due time."""
    mine = {k: wanted.data[k] for k in ("entity_id", "event", "actor", "reason", "data")}
    theirs = {k: row.data.get(k) for k in mine}
    differ = [k for k in mine if mine[k] != theirs[k]]
    if compare_due and row.run_after != wanted.run_after:
        differ.append("at")
    if differ:
        raise IdempotencyKeyReused(
            wanted.data["entity_id"],
            key=wanted.data["key"],
            recorded_event=f"{theirs['event']} (a delayed fire whose {', '.join(differ)} differ)",
            event=str(mine["event"]),
        )


__all__ = [
    "DELIVERING",
    "DROPPED",
    "FIRED",
    "LATER_KEY_PREFIX",
    "PENDING",
    "Delayed",
    "check_due",
    "later_id",
    "later_kind",
    "new_delayed",
    "same_request",
]
