"""The async store protocol: :class:`stores.Store`'s operations as coroutines.

Each method has the contract of the synchronous method of the same name (see
:mod:`stores.base`): the same arguments, results, errors and order of checks.  The
adapters (:class:`~stores.aio.AsyncMemoryStore`, :class:`~stores.aio.AsyncSqlStore`) run
the synchronous stores' own logic, so they cannot drift from it; the contract suite runs
on both faces.

``run`` differs in one way: ``fn`` may be a coroutine function (or return an awaitable),
and it is awaited; no connection is held while it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from fsm.errors import FsmError
from fsm.records import (
    BatchWrite,
    ClaimRequest,
    Condition,
    EffectRecord,
    FeedEntry,
    HistoryRecord,
    Lease,
    LeaseRenewal,
    NewEntity,
    Snapshot,
    TransitionWrite,
)


@runtime_checkable
class AsyncStore(Protocol):
    """Persistence of entities, leases, history and effects, for asyncio applications."""

    async def now(self) -> datetime: ...

    async def create(self, entity: NewEntity) -> Snapshot: ...

    async def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]: ...

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]: ...

    async def apply_many(
        self, writes: Sequence[TransitionWrite]
    ) -> list[tuple[Snapshot, HistoryRecord] | FsmError]: ...

    async def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot: ...

    async def history(self, entity_id: str) -> list[HistoryRecord]: ...

    async def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None: ...

    async def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]: ...

    async def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot: ...

    async def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot: ...

    async def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot: ...

    async def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        """See :meth:`stores.Store.renewals`: the newest lease renewals, oldest first."""
        ...

    async def soft_delete(self, entity_id: str) -> Snapshot: ...

    async def has_newer_sibling(self, entity_id: str) -> bool: ...

    async def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]: ...

    async def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]: ...

    async def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]: ...

    async def effect(self, entity_id: str, key: str) -> EffectRecord | None: ...

    async def effects(self, entity_id: str) -> list[EffectRecord]: ...

    async def record_effect(
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]: ...

    async def run(
        self, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool = True
    ) -> tuple[EffectRecord, bool]: ...

    async def claim(self, request: ClaimRequest) -> list[Snapshot]: ...

    async def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]: ...

    async def count_states(self, kind: str) -> dict[str, int]: ...

    async def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int: ...

    async def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]: ...

    async def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]: ...

    async def trim_history(self, entity_id: str, keep: int) -> int: ...

    async def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        """See :meth:`stores.Store.feed`."""
        ...

    async def feed_head(self) -> str:
        """See :meth:`stores.Store.feed_head`."""
        ...

    async def close(self) -> None: ...


__all__ = ["AsyncStore"]
