"""Typed payloads of the signals: pydantic models carrying the full snapshot.

A bridge (WebSocket, SSE, a message bus) can forward ``payload.model_dump_json()`` as it
is: the dashboard of seeds/000 gets the pipeline with its steps in one message.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from fsm.records import FeedEntry, HistoryRecord, Lease, Snapshot


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True)


class SnapshotModel(_Payload):
    """The entity as stored (every column of :class:`fsm.records.Snapshot`)."""

    id: str
    kind: str
    state: str
    version: int
    lease_owner: str | None
    lease_token: int
    lease_expires_at: datetime | None
    state_entered_at: datetime
    created_at: datetime
    updated_at: datetime
    deleted: bool
    concurrency_key: str | None
    attempt: int
    reclaims: int
    data: dict[str, Any]
    run_after: datetime | None = None
    timer_since: datetime | None = None
    priority: int = 0
    parent_id: str | None = None
    definition: int | None = None
    memory: dict[str, str] | None = None

    @classmethod
    def of(cls, snapshot: Snapshot) -> SnapshotModel:
        return cls.model_validate(snapshot._asdict())


class HistoryModel(_Payload):
    """One history row (every column of :class:`fsm.records.HistoryRecord`)."""

    entity_id: str
    seq: int
    event: str
    source: str
    target: str
    actor: str
    lease_token: int | None
    reason: str | None
    idempotency_key: str | None
    at: datetime
    data: dict[str, Any] | None
    owner: str | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: HistoryRecord) -> HistoryModel:
        return cls.model_validate(record._asdict())


class FeedPayload(_Payload):
    """One entry of ``engine.watch`` as JSON for a bridge: an SSE bridge sends
    ``id: {position}``, ``event: transition`` and ``data: {model_dump_json()}``, and resumes
    from the browser's ``Last-Event-ID`` with ``engine.watch(after=...)``."""

    position: str
    kind: str
    record: HistoryModel

    @classmethod
    def of(cls, entry: FeedEntry) -> FeedPayload:
        return cls(position=entry.position, kind=entry.kind, record=HistoryModel.of(entry.record))


class LeaseModel(_Payload):
    """A lease: who holds the entity, with which fencing token, until when."""

    entity_id: str
    owner: str
    token: int
    expires_at: datetime

    @classmethod
    def of(cls, lease: Lease | None) -> LeaseModel | None:
        return None if lease is None else cls.model_validate(lease._asdict())


class TransitionPayload(_Payload):
    """Sent with ``transitioned``, ``expired`` and ``reclaimed``: the entity after the
    transition and the history row that recorded it."""

    kind: str
    snapshot: SnapshotModel
    record: HistoryModel

    @classmethod
    def of(cls, kind: str, snapshot: Snapshot, record: HistoryRecord) -> TransitionPayload:
        return cls(kind=kind, snapshot=SnapshotModel.of(snapshot), record=HistoryModel.of(record))


class LeasePayload(_Payload):
    """Sent with ``lease_acquired``, ``lease_renewed`` and ``lease_lost``."""

    kind: str
    entity_id: str
    owner: str | None
    token: int | None
    lease: LeaseModel | None
    snapshot: SnapshotModel | None = None
    detail: str | None = None

    @classmethod
    def of(
        cls, kind: str, snapshot: Snapshot, *, lease: Lease | None = None, detail: str | None = None
    ) -> LeasePayload:
        """For ``lease``'s holder (default: the snapshot's current lease)."""
        held = lease if lease is not None else snapshot.lease
        return cls(
            kind=kind,
            entity_id=snapshot.id,
            owner=held.owner if held is not None else None,
            token=held.token if held is not None else snapshot.lease_token,
            lease=LeaseModel.of(held),
            snapshot=SnapshotModel.of(snapshot),
            detail=detail,
        )


class EffectPayload(_Payload):
    """Sent with ``effect_recorded``: one side effect's result, recorded exactly once."""

    entity_id: str
    key: str
    lease_token: int
    result: Any = None


class RefusedPayload(_Payload):
    """Sent with ``write_refused``: a holder's late write that the fence refused.

    ``operation`` names the write (``"fire"``, ``"effect"``, ``"renew"``, ``"release"``);
    ``event`` is the event a refused fire tried, or a refused effect's key; ``error`` the refusal's type
    (``LeaseLost``, ``StaleVersion``...).  No snapshot: building it would cost a read."""

    kind: str
    entity_id: str
    owner: str
    token: int
    operation: str
    error: str
    detail: str
    event: str | None = None


class HandledPayload(_Payload):
    """Sent with ``handled`` after each worker handler: what it led to and how long it ran.

    ``outcome``: ``"completed"`` (its event fired), ``"failed"`` (it raised; the entity
    was failed or released), ``"retry"`` (it raised and will run again), ``"fenced"``
    (its lease was lost), ``"released"`` (it returned no outcome).  ``duration_s`` is the
    handler's own time plus the firing of its event, on this process's monotonic clock."""

    kind: str
    entity_id: str
    state: str
    owner: str
    token: int
    outcome: str
    duration_s: float
    event: str | None = None
    error: str | None = None


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
    "FeedPayload",
    "HandledPayload",
    "HistoryModel",
    "LeaseModel",
    "LeasePayload",
    "ReaperErrorPayload",
    "ReaperTickPayload",
    "RefusedPayload",
    "SnapshotModel",
    "TransitionPayload",
]
