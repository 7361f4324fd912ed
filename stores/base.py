"""The store protocol: the only way the framework reads and writes entities.

Every adapter (memory, SQLAlchemy on SQLite or PostgreSQL) implements :class:`Store` with
the same semantics, pinned by one contract suite (``tests/test_stores/test_store_contract.py``).  A store knows
nothing of lifecycles or reaping: it applies compare-and-set writes whose guards it
re-checks at the commit point, against its own clock.

Errors are the typed ones of :mod:`fsm.errors`; a method that raises has changed nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from fsm.records import BatchWrite, Condition, HistoryRecord, NewEntity, Snapshot, TransitionWrite


@runtime_checkable
class Store(Protocol):
    """Persistence of entities, their leases and their append-only history."""

    def now(self) -> datetime:
        """The store's current time (the database server's for SQL stores), aware UTC."""
        ...

    def create(self, entity: NewEntity) -> Snapshot:
        """Insert a new entity at version 0 with no lease.

        Conflict: an entity with the same id exists (even soft-deleted) -> ``EntityExists``.
        """
        ...

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        """Read one entity.

        Not found (or soft-deleted, unless ``include_deleted``) -> ``UnknownEntity``.
        A row that cannot be read -> ``MalformedRow`` naming the entity.
        """
        ...

    def history(self, entity_id: str) -> list[HistoryRecord]:
        """The entity's transitions in ``seq`` order (1..version, gap-free).

        Not found -> ``UnknownEntity``.
        """
        ...

    def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        """The history row written under this idempotency key, or ``None``."""
        ...

    def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        """Apply one transition atomically: new row and history row in one commit.

        Checked in this order, at the commit point:
        not found or soft-deleted -> ``UnknownEntity``;
        idempotency key already used on this entity -> ``IdempotencyKeyReused``;
        version differs from ``expect_version`` -> ``StaleVersion``;
        ``expect_token`` set and owner or token differ -> ``LeaseLost``;
        a ``require`` condition fails against the store clock -> ``ConditionFailed``.
        """
        ...

    def acquire_lease(
        self,
        entity_id: str,
        *,
        owner: str,
        ttl: timedelta,
        budget: timedelta | None,
        expect_version: int,
    ) -> Snapshot:
        """Take the lease of an entity whose lease is free or expired: token + 1.

        Not a transition: version and history do not move.  The expiry is
        ``min(now + ttl, state_entered_at + budget)``.
        Not found -> ``UnknownEntity``; version moved -> ``StaleVersion``; a live lease is
        held by someone, or the renewal budget of the state is spent -> ``LeaseLost``.
        """
        ...

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        """Extend a live lease to ``min(now + ttl, state_entered_at + budget)``.

        Not a transition: only ``lease_expires_at`` moves.  Not found -> ``UnknownEntity``;
        owner or token differ, the lease already expired, or the budget is spent ->
        ``LeaseLost`` (an expired lease is never revived: the reaper may be taking over).
        """
        ...

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        """Drop a lease its holder no longer needs (owner and expiry cleared, token kept).

        Not found -> ``UnknownEntity``; owner or token differ -> ``LeaseLost``.
        """
        ...

    def soft_delete(self, entity_id: str) -> Snapshot:
        """Mark an entity deleted; deleted entities are never read nor moved again.

        Not found (or already deleted) -> ``UnknownEntity``.
        """
        ...

    def has_newer_sibling(self, entity_id: str) -> bool:
        """Whether a live entity of the same kind and concurrency key, in the same state,
        was created after this one.  Not found -> ``UnknownEntity``."""
        ...

    # -- the reaper's set-based reads and writes ---------------------------------------------

    def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        """Live entities of ``kind`` in ``state`` meeting every condition (store clock),
        ordered by id, with id > ``after_id`` (keyset paging), at most ``limit``.

        Read-only.  A row in the page that cannot be decoded -> ``MalformedRow`` naming it
        (the reaper then pages one row at a time up to it, counts it and steps over it).
        SQL stores answer from indexes on ``(kind, state, lease_expires_at)`` and
        ``(kind, state, updated_at)``.
        """
        ...

    def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        """Move every entity of ``batch.ids`` that still qualifies, in one transaction.

        A row qualifies when it is live, of ``batch.kind``, in ``batch.source`` and meets
        every condition at the commit point; others are skipped silently (the caller counts
        them as lost races).  PostgreSQL claims the rows with ``FOR UPDATE SKIP LOCKED``,
        so a row another reaper is moving right now is skipped, not waited for.  Each moved
        row gets version + 1 and a history row (``seq`` = new version) in that transaction.
        Returns the moved rows with their history rows, in ``batch.ids`` order.
        """
        ...


__all__ = ["Store"]
