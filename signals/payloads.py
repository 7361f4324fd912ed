"""Typed payloads of the signals: pydantic models carrying the full snapshot.

A bridge (WebSocket, SSE, a message bus) can forward ``payload.model_dump_json()`` as it
is: the dashboard of seeds/000 gets the pipeline with its steps in one message.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from fsm.records import HistoryRecord, Lease, Snapshot


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True)


class TransitionPayload(_Payload):
    """Sent with ``transitioned``, ``expired`` and ``reclaimed``: the entity after the
    transition and the history row that recorded it."""

    kind: str
    snapshot: Snapshot
    record: HistoryRecord


class LeasePayload(_Payload):
    """Sent with ``lease_acquired`` and ``lease_lost``."""

    kind: str
    entity_id: str
    owner: str | None
    token: int | None
    lease: Lease | None
    snapshot: Snapshot | None = None
    detail: str | None = None


class EffectPayload(_Payload):
    """Sent with ``effect_recorded``: one side effect's result, recorded exactly once."""

    entity_id: str
    key: str
    lease_token: int
    result: Any = None


class ReaperTickPayload(_Payload):
    """Sent with ``reaper_tick`` after each tick: counts of what the tick did."""

    counts: dict[str, int]
    duration_s: float
    dry_run: bool = False


class ReaperErrorPayload(_Payload):
    """Sent with ``reaper_error`` when a tick or one of its rows failed."""

    error: str
    entity_id: str | None = None


__all__ = [
    "EffectPayload",
    "LeasePayload",
    "ReaperErrorPayload",
    "ReaperTickPayload",
    "TransitionPayload",
]
