"""One async face for any synchronous store, and the sync view of it inside a greenlet.

:class:`AsyncFace` gives every :class:`~stores.aio.AsyncStore` method by handing the call,
by name, to :meth:`AsyncFace.call` (synchronous, run in a greenlet): the memory store
answers at once, the SQL store takes one of its async connections for the call.
:class:`BridgeStore` is the other direction: a synchronous :class:`stores.Store` for code
that runs under :func:`stores.aio.greenlets.spawn` (the engine's own logic), which calls
the same :meth:`AsyncFace.call` without a second greenlet hop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from fsm.errors import FsmError
from fsm.id_write import IdWrite
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
from stores.aio.greenlets import resolved, spawn
from stores.ledger import EffectWrite, HolderAndEffect, LedgerRun


class AsyncFace:
    """Every async store method, as one synchronous :meth:`call` run in a greenlet."""

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # pragma: no cover
        """Run the synchronous store method ``name`` (inside a greenlet); provided by adapters."""
        raise NotImplementedError

    async def _invoke(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await spawn(self.call, name, args, kwargs)

    async def now(self) -> datetime:
        result: datetime = await self._invoke("now")
        return result

    async def create(self, entity: NewEntity) -> Snapshot:
        result: Snapshot = await self._invoke("create", entity)
        return result

    async def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        result: list[Snapshot] = await self._invoke("create_many", entities)
        return result

    async def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        result: Snapshot = await self._invoke("get", entity_id, include_deleted=include_deleted)
        return result

    async def history(self, entity_id: str) -> list[HistoryRecord]:
        result: list[HistoryRecord] = await self._invoke("history", entity_id)
        return result

    async def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        result: HistoryRecord | None = await self._invoke("find_transition", entity_id, idempotency_key)
        return result

    async def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        result: tuple[Snapshot, HistoryRecord] = await self._invoke("apply", write)
        return result

    async def apply_many(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord] | FsmError]:
        result: list[tuple[Snapshot, HistoryRecord] | FsmError] = await self._invoke("apply_many", writes)
        return result

    async def apply_chain(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = await self._invoke("apply_chain", writes)
        return result

    async def create_chains(
        self, items: Sequence[tuple[NewEntity, Sequence[TransitionWrite]]]
    ) -> list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]]:
        result: list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]] = await self._invoke("create_chains", items)
        return result

    async def apply_group(
        self, writes: Sequence[TransitionWrite], creates: Sequence[NewEntity]
    ) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
        result: tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]] = await self._invoke(
            "apply_group", writes, creates
        )
        return result

    async def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        result: Snapshot = await self._invoke(
            "acquire_lease", entity_id, owner=owner, ttl=ttl, budget=budget, expect_version=expect_version
        )
        return result

    async def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        result: Snapshot = await self._invoke(
            "renew_lease", entity_id, owner=owner, token=token, ttl=ttl, budget=budget
        )
        return result

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]:
        result: list[Snapshot | FsmError] = await self._invoke("renew_leases", leases, ttl=ttl, budgets=budgets)
        return result

    async def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        result: Snapshot = await self._invoke("release_lease", entity_id, owner=owner, token=token)
        return result

    async def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        result: list[LeaseRenewal] = await self._invoke("renewals", entity_id)
        return result

    async def soft_delete(self, entity_id: str) -> Snapshot:
        result: Snapshot = await self._invoke("soft_delete", entity_id)
        return result

    async def has_newer_sibling(self, entity_id: str) -> bool:
        result: bool = await self._invoke("has_newer_sibling", entity_id)
        return result

    async def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        result: list[Snapshot] = await self._invoke("candidates", kind, state, require, limit=limit, after_id=after_id)
        return result

    async def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = await self._invoke("apply_batch", batch)
        return result

    async def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = await self._invoke("move_candidates", batch, limit=limit)
        return result

    async def move_candidates_brief(self, batch: BatchWrite, *, limit: int) -> list[HistoryRecord]:
        """:meth:`move_candidates` returning only the history rows (see :class:`stores.base.BriefMoves`)."""
        result: list[HistoryRecord] = await self._invoke("move_candidates_brief", batch, limit=limit)
        return result

    async def effect(self, entity_id: str, key: str) -> EffectRecord | None:
        result: EffectRecord | None = await self._invoke("effect", entity_id, key)
        return result

    async def effects(self, entity_id: str) -> list[EffectRecord]:
        result: list[EffectRecord] = await self._invoke("effects", entity_id)
        return result

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
    ) -> tuple[EffectRecord, bool]:
        found: tuple[EffectRecord, bool] = await self._invoke(
            "record_effect", entity_id, key, owner=owner, token=token, status=status, result=result, replace=replace
        )
        return found

    async def run(
        self, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool = True
    ) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.Store.run`; ``fn`` may be async.  The ledger's one algorithm
        (:class:`stores.ledger.LedgerRun`) runs over this store; no connection is held while
        ``fn`` runs."""
        bridge = BridgeStore(self)
        return await spawn(bridge.run, entity_id, key, lambda k: resolved(fn(k)), lease, retry_failed=retry_failed)

    async def claim(self, request: ClaimRequest) -> list[Snapshot]:
        result: list[Snapshot] = await self._invoke("claim", request)
        return result

    async def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        result: list[Snapshot] = await self._invoke("entities", kind, state=state, limit=limit, after_id=after_id)
        return result

    async def count_states(self, kind: str) -> dict[str, int]:
        result: dict[str, int] = await self._invoke("count_states", kind)
        return result

    async def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int:
        result: int = await self._invoke("slots", kind, leased, key)
        return result

    async def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        result: list[Snapshot] = await self._invoke("children", parent_id, limit=limit, after_id=after_id)
        return result

    async def notify_work(self, kind: str) -> None:
        """See :meth:`stores.base.WorkNotices.notify_work`."""
        await self._invoke("notify_work", kind)

    async def next_due(self, kind: str, states: Sequence[str]) -> float | None:
        """See :meth:`stores.base.DueTimes.next_due`."""
        result: float | None = await self._invoke("next_due", kind, states)
        return result

    async def park(self, entity_id: str, *, owner: str, token: int, until: datetime) -> Snapshot:
        """See :meth:`stores.base.Waits.park`."""
        result: Snapshot = await self._invoke("park", entity_id, owner=owner, token=token, until=until)
        return result

    async def send_message(self, entity_id: str, name: str, key: str, payload: Any) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.base.Waits.send_message`."""
        result: tuple[EffectRecord, bool] = await self._invoke("send_message", entity_id, name, key, payload)
        return result

    async def wake(self, entity_id: str) -> bool:
        """See :meth:`stores.base.Waits.wake`."""
        result: bool = await self._invoke("wake", entity_id)
        return result

    async def next_timer(self, kind: str, timers: Sequence[tuple[str, timedelta]]) -> float | None:
        """See :meth:`stores.base.TimerTimes.next_timer`."""
        result: float | None = await self._invoke("next_timer", kind, timers)
        return result

    async def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]:
        result: list[str] = await self._invoke("prune", kind, states, before, limit=limit, dry_run=dry_run)
        return result

    async def trim_history(self, entity_id: str, keep: int) -> int:
        result: int = await self._invoke("trim_history", entity_id, keep)
        return result

    async def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        result: list[FeedEntry] = await self._invoke("feed", after, kind=kind, limit=limit)
        return result

    async def feed_head(self) -> str:
        result: str = await self._invoke("feed_head")
        return result

    async def close(self) -> None:
        """Release what the store holds (connections); idempotent."""


class BridgeStore(LedgerRun):
    """A synchronous :class:`stores.Store` over an :class:`AsyncFace`, for code running
    under :func:`stores.aio.greenlets.spawn`: each call suspends only its own greenlet."""

    def __init__(self, face: AsyncFace) -> None:
        self.face = face
        self._call = face.call

    def now(self) -> datetime:
        result: datetime = self._call("now", (), {})
        return result

    def create(self, entity: NewEntity) -> Snapshot:
        result: Snapshot = self._call("create", (entity,), {})
        return result

    def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        result: list[Snapshot] = self._call("create_many", (entities,), {})
        return result

    def apply_many(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord] | FsmError]:
        result: list[tuple[Snapshot, HistoryRecord] | FsmError] = self._call("apply_many", (writes,), {})
        return result

    def apply_chain(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = self._call("apply_chain", (writes,), {})
        return result

    def create_chains(
        self, items: Sequence[tuple[NewEntity, Sequence[TransitionWrite]]]
    ) -> list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]]:
        result: list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]] = self._call("create_chains", (items,), {})
        return result

    def apply_group(
        self, writes: Sequence[TransitionWrite], creates: Sequence[NewEntity]
    ) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
        result: tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]] = self._call(
            "apply_group", (writes, creates), {}
        )
        return result

    def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]:
        result: list[Snapshot | FsmError] = self._call("renew_leases", (leases,), {"ttl": ttl, "budgets": budgets})
        return result

    def subscribe_work(self, kind: str, callback: Callable[[], None]) -> Callable[[], None]:
        """The async store's :class:`stores.base.WorkNotices` (subscribing does no I/O)."""
        subscribe: Callable[[str, Callable[[], None]], Callable[[], None]] = self.face.subscribe_work  # type: ignore[attr-defined]
        return subscribe(kind, callback)

    def notify_work(self, kind: str) -> None:
        self._call("notify_work", (kind,), {})

    def next_due(self, kind: str, states: Sequence[str]) -> float | None:
        result: float | None = self._call("next_due", (kind, states), {})
        return result

    def next_timer(self, kind: str, timers: Sequence[tuple[str, timedelta]]) -> float | None:
        result: float | None = self._call("next_timer", (kind, timers), {})
        return result

    def park(self, entity_id: str, *, owner: str, token: int, until: datetime) -> Snapshot:
        result: Snapshot = self._call("park", (entity_id,), {"owner": owner, "token": token, "until": until})
        return result

    def send_message(self, entity_id: str, name: str, key: str, payload: Any) -> tuple[EffectRecord, bool]:
        result: tuple[EffectRecord, bool] = self._call("send_message", (entity_id, name, key, payload), {})
        return result

    def wake(self, entity_id: str) -> bool:
        result: bool = self._call("wake", (entity_id,), {})
        return result

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        result: Snapshot = self._call("get", (entity_id,), {"include_deleted": include_deleted})
        return result

    def history(self, entity_id: str) -> list[HistoryRecord]:
        result: list[HistoryRecord] = self._call("history", (entity_id,), {})
        return result

    def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        result: HistoryRecord | None = self._call("find_transition", (entity_id, idempotency_key), {})
        return result

    def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        result: tuple[Snapshot, HistoryRecord] = self._call("apply", (write,), {})
        return result

    judges_by_id = True
    """Forwarded: the store on the other side judges it, or answers ``None`` (read first)."""

    def apply_by_id(self, write: IdWrite) -> tuple[Snapshot, HistoryRecord] | None:
        result: tuple[Snapshot, HistoryRecord] | None = self._call("apply_by_id", (write,), {})
        return result

    def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        kwargs = {"owner": owner, "ttl": ttl, "budget": budget, "expect_version": expect_version}
        result: Snapshot = self._call("acquire_lease", (entity_id,), kwargs)
        return result

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        kwargs = {"owner": owner, "token": token, "ttl": ttl, "budget": budget}
        result: Snapshot = self._call("renew_lease", (entity_id,), kwargs)
        return result

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        result: Snapshot = self._call("release_lease", (entity_id,), {"owner": owner, "token": token})
        return result

    def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        result: list[LeaseRenewal] = self._call("renewals", (entity_id,), {})
        return result

    def soft_delete(self, entity_id: str) -> Snapshot:
        result: Snapshot = self._call("soft_delete", (entity_id,), {})
        return result

    def has_newer_sibling(self, entity_id: str) -> bool:
        result: bool = self._call("has_newer_sibling", (entity_id,), {})
        return result

    def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        result: list[Snapshot] = self._call(
            "candidates", (kind, state, require), {"limit": limit, "after_id": after_id}
        )
        return result

    def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = self._call("apply_batch", (batch,), {})
        return result

    def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]:
        result: list[tuple[Snapshot, HistoryRecord]] = self._call("move_candidates", (batch,), {"limit": limit})
        return result

    def move_candidates_brief(self, batch: BatchWrite, *, limit: int) -> list[HistoryRecord]:
        result: list[HistoryRecord] = self._call("move_candidates_brief", (batch,), {"limit": limit})
        return result

    def effect(self, entity_id: str, key: str) -> EffectRecord | None:
        result: EffectRecord | None = self._call("effect", (entity_id, key), {})
        return result

    def effects(self, entity_id: str) -> list[EffectRecord]:
        result: list[EffectRecord] = self._call("effects", (entity_id,), {})
        return result

    def record_effect(
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]:
        kwargs = {"owner": owner, "token": token, "status": status, "result": result, "replace": replace}
        found: tuple[EffectRecord, bool] = self._call("record_effect", (entity_id, key), kwargs)
        return found

    def holder_and_effect(self, entity_id: str, key: str) -> HolderAndEffect:
        found: HolderAndEffect = self._call("holder_and_effect", (entity_id, key), {})
        return found

    def holders_and_effects(self, pairs: Sequence[tuple[str, str]]) -> list[HolderAndEffect | FsmError]:
        found: list[HolderAndEffect | FsmError] = self._call("holders_and_effects", (pairs,), {})
        return found

    def record_effects(self, writes: Sequence[EffectWrite]) -> list[tuple[EffectRecord, bool] | FsmError]:
        found: list[tuple[EffectRecord, bool] | FsmError] = self._call("record_effects", (writes,), {})
        return found

    def claim(self, request: ClaimRequest) -> list[Snapshot]:
        result: list[Snapshot] = self._call("claim", (request,), {})
        return result

    def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        kwargs = {"state": state, "limit": limit, "after_id": after_id}
        result: list[Snapshot] = self._call("entities", (kind,), kwargs)
        return result

    def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int:
        result: int = self._call("slots", (kind, leased, key), {})
        return result

    def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        result: list[Snapshot] = self._call("children", (parent_id,), {"limit": limit, "after_id": after_id})
        return result

    def count_states(self, kind: str) -> dict[str, int]:
        result: dict[str, int] = self._call("count_states", (kind,), {})
        return result

    def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]:
        result: list[str] = self._call("prune", (kind, states, before), {"limit": limit, "dry_run": dry_run})
        return result

    def trim_history(self, entity_id: str, keep: int) -> int:
        result: int = self._call("trim_history", (entity_id, keep), {})
        return result

    def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        result: list[FeedEntry] = self._call("feed", (after,), {"kind": kind, "limit": limit})
        return result

    def feed_head(self) -> str:
        result: str = self._call("feed_head", (), {})
        return result


__all__ = ["AsyncFace", "BridgeStore"]
