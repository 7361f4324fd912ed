"""The asyncio engine: :class:`fsm.Engine`'s operations as coroutines, on an async store.

There is one transition logic.  :class:`AsyncEngine` runs the synchronous engine's own code
(argument checks, the compiled table, guards, branch choice, write building, idempotent
replay, fencing, signals) in a greenlet (:mod:`stores.aio.greenlets`), over a
:class:`stores.aio.BridgeStore` whose every store call suspends only the calling task while
the async store does its I/O.  A guard that reads the store (``superseded`` asks for a
newer sibling) reads it the same way, and the store re-checks it in the write.

Signals: sync receivers run after the commit as with the sync engine; an async receiver's
coroutine is awaited after the commit, before the call returns, and one that raises is
logged and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

import signals
from fsm.clock import Clock
from fsm.coordination import Limits
from fsm.engine import Engine, FireResult
from fsm.engine.cascade import Cancelled
from fsm.engine.joined import held_on, joining
from fsm.engine.later import Delayed
from fsm.engine.many import Fire, Fired
from fsm.engine.retention import DEFAULT_PRUNE_BATCH, PruneResult
from fsm.engine.watch import DEFAULT_POLL, PAGE, Cursor, Pacer, watch_args
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.records import Actor, EffectRecord, FeedEntry, HistoryRecord, Lease, LeaseRenewal, Snapshot
from fsm.table import Branch, CompiledTable
from fsm.work.keeper import AsyncLeaseKeeper
from stores.aio import AsyncFace, BridgeStore
from stores.aio.greenlets import resolved, spawn
from stores.ledger import Ledger

if TYPE_CHECKING:
    from stores.aio import AsyncStore

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class AsyncEngine:
    """Runs one lifecycle over one async store; the same operations as :class:`fsm.Engine`.

    ::

        store = await open_async_store("postgresql+psycopg://app@db/app")
        jobs = AsyncEngine(JobLifecycle, store)
        job = await jobs.create(data={"task": "deploy"})
        [claimed] = await jobs.claim()
        async with jobs.keep(claimed.lease) as held:
            await jobs.run(job.id, "gate", run_gate, held.check())   # run_gate may be async
            await jobs.fire(job.id, "exited", lease=held.check())

    ``store`` is an :class:`~stores.aio.AsyncMemoryStore` or an
    :class:`~stores.aio.AsyncSqlStore` (any :class:`~stores.aio.AsyncFace`).  ``clock``,
    ``policy`` and ``owner`` are :class:`fsm.Engine`'s.  The errors are the sync engine's.
    """

    def __init__(
        self,
        lifecycle: type[Lifecycle],
        store: AsyncStore,
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        owner: str | None = None,
    ) -> None:
        if not isinstance(store, AsyncFace):
            raise TypeError(f"AsyncEngine needs an async store from stores.aio, got {store!r}")
        self.store = store
        self.sync = Engine(lifecycle, BridgeStore(store), clock=clock, policy=policy, owner=owner)
        """The synchronous engine whose logic runs here (only usable inside the bridge)."""

    @property
    def lifecycle(self) -> type[Lifecycle]:
        return self.sync.lifecycle

    @property
    def kind(self) -> str:
        return self.sync.kind

    @property
    def table(self) -> CompiledTable:
        return self.sync.table

    @property
    def policy(self) -> Policy:
        return self.sync.policy

    @property
    def owner(self) -> str:
        return self.sync.owner

    def region(self, name: str) -> AsyncEngine:
        """See :meth:`fsm.Engine.region`: the async engine of one region (made once)."""
        made: dict[str, AsyncEngine] = self.__dict__.setdefault("_regions", {})
        if name not in made:
            sync = self.sync.region(name)  # refuses an unknown region, naming the known ones
            made[name] = AsyncEngine(
                sync.lifecycle, self.store, clock=self.sync.clock, policy=sync.policy, owner=self.owner
            )
        return made[name]

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with signals.collecting() as pending:
            try:
                return await spawn(fn, *args, **kwargs)
            finally:
                if pending:
                    await signals.deliver(pending)

    # -- the engine's operations ------------------------------------------------------------

    def within(self, connection: Any) -> contextlib.AbstractAsyncContextManager[None]:
        """:meth:`fsm.Engine.within` for asyncio: this engine's calls in this task run inside
        the caller's transaction (a SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` on
        aiosqlite or psycopg), and its signals go out after the caller's commit::

            async with AsyncSession(app_engine) as session, session.begin():
                session.add(Order(id=order_id, paid=True))
                async with jobs.within(session):
                    await jobs.fire(job_id, "complete", lease=lease)
        """
        return self._within(connection)

    @contextlib.asynccontextmanager
    async def _within(self, target: Any) -> AsyncIterator[None]:
        async with joining(self.store, target) as joined:
            with signals.holding(held_on(joined.connection)):
                yield

    async def create(
        self,
        entity_id: str | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
        run_after: datetime | timedelta | None = None,
        unique: bool = False,
        if_active: str = "raise",
        priority: int = 0,
        parent: str | None = None,
    ) -> Snapshot:
        """See :meth:`fsm.Engine.create`."""
        return await self._call(
            self.sync.create,
            entity_id,
            data=data,
            concurrency_key=concurrency_key,
            run_after=run_after,
            unique=unique,
            if_active=if_active,
            priority=priority,
            parent=parent,
        )

    async def create_many(
        self,
        data: Sequence[Mapping[str, Any] | None],
        *,
        ids: Sequence[str] | None = None,
        concurrency_keys: Sequence[str | None] | None = None,
    ) -> list[Snapshot]:
        """See :meth:`fsm.Engine.create_many`."""
        return await self._call(self.sync.create_many, data, ids=ids, concurrency_keys=concurrency_keys)

    async def fire(
        self,
        entity: str | Snapshot | FireResult,
        event: str,
        *,
        lease: Lease | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        data: Mapping[str, Any] | None = None,
        actor: Actor | str = Actor.WORKER,
        owner: str | None = None,
        error: Mapping[str, Any] | None = None,
        run_after: timedelta | None = None,
    ) -> FireResult:
        """See :meth:`fsm.Engine.fire`: one compare-and-set write, the same refusals.  Given
        the snapshot (or the result of the last fire) the caller holds, the read is skipped."""
        return await self._call(
            self.sync.fire,
            entity,
            event,
            lease=lease,
            idempotency_key=idempotency_key,
            reason=reason,
            data=data,
            actor=actor,
            owner=owner,
            error=error,
            run_after=run_after,
        )

    async def fire_many(self, items: Sequence[Fire]) -> list[Fired]:
        """See :meth:`fsm.Engine.fire_many`: one transaction, each item fenced on its own."""
        return await self._call(self.sync.fire_many, items)

    async def get(self, entity_id: str) -> Snapshot:
        """See :meth:`fsm.Engine.get`."""
        return await self._call(self.sync.get, entity_id)

    async def history(self, entity_id: str) -> list[HistoryRecord]:
        """See :meth:`fsm.Engine.history`."""
        return await self._call(self.sync.history, entity_id)

    async def configuration(self, entity: Snapshot | str) -> tuple[str, ...]:
        """See :meth:`fsm.Engine.configuration`."""
        return await self._call(self.sync.configuration, entity)

    async def allowed_events(self, entity: Snapshot | str, actor: Actor = Actor.WORKER) -> list[str]:
        """See :meth:`fsm.Engine.allowed_events`."""
        return await self._call(self.sync.allowed_events, entity, actor)

    async def would_fire(self, entity: Snapshot, event: str, actor: Actor = Actor.WORKER) -> Branch | None:
        """See :meth:`fsm.Engine.would_fire`."""
        return await self._call(self.sync.would_fire, entity, event, actor)

    async def acquire_lease(self, entity_id: str, *, owner: str | None = None, ttl: timedelta | None = None) -> Lease:
        """See :meth:`fsm.Engine.acquire_lease`."""
        return await self._call(self.sync.acquire_lease, entity_id, owner=owner, ttl=ttl)

    async def renew_lease(self, lease: Lease, *, ttl: timedelta | None = None) -> Lease:
        """See :meth:`fsm.Engine.renew_lease`."""
        return await self._call(self.sync.renew_lease, lease, ttl=ttl)

    async def release_lease(self, lease: Lease) -> Snapshot:
        """See :meth:`fsm.Engine.release_lease`."""
        return await self._call(self.sync.release_lease, lease)

    async def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        """See :meth:`fsm.Engine.renewals`."""
        return await self._call(self.sync.renewals, entity_id)

    async def claim(
        self,
        limit: int = 1,
        *,
        owner: str | None = None,
        into: Collection[str] | None = None,
        limits: Limits | None = None,
    ) -> list[Snapshot]:
        """See :meth:`fsm.Engine.claim`."""
        return await self._call(self.sync.claim, limit, owner=owner, into=into, limits=limits)

    async def run(
        self,
        entity_id: str,
        key: str,
        fn: Callable[[str], Any],
        lease: Lease,
        *,
        model: type[M] | None = None,
        retry_failed: bool = True,
    ) -> Any:
        """See :meth:`fsm.Engine.run`.  ``fn`` may be a coroutine function: it is awaited,
        and no database connection is held while it runs."""
        call = _awaiting(fn)
        return await self._call(self.sync.run, entity_id, key, call, lease, model=model, retry_failed=retry_failed)

    async def _run_held(
        self,
        entity_id: str,
        key: str,
        fn: Callable[[str], Any],
        lease: Lease,
        *,
        model: type[M] | None = None,
        retry_failed: bool = True,
        ledger: Ledger | None = None,
    ) -> Any:
        """:meth:`fsm.Engine._run_held`, awaited: for a caller holding the entity (an async
        worker's job), the ledger's asks answered by ``ledger`` (its completer) when given."""
        call = _awaiting(fn)
        return await self._call(
            self.sync._run_held, entity_id, key, call, lease, model=model, retry_failed=retry_failed, ledger=ledger
        )

    async def cancel(
        self,
        entity: str | Snapshot,
        *,
        reason: str | None = None,
        children: bool = True,
        lifecycles: Iterable[type[Lifecycle]] | None = None,
    ) -> Cancelled:
        """See :meth:`fsm.Engine.cancel`."""
        return await self._call(self.sync.cancel, entity, reason=reason, children=children, lifecycles=lifecycles)

    async def fire_later(
        self,
        entity_id: str,
        event: str,
        *,
        after: timedelta | float | None = None,
        at: datetime | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        data: Mapping[str, Any] | None = None,
        actor: Actor | str = Actor.WORKER,
    ) -> Delayed:
        """See :meth:`fsm.Engine.fire_later`."""
        return await self._call(
            self.sync.fire_later,
            entity_id,
            event,
            after=after,
            at=at,
            idempotency_key=idempotency_key,
            reason=reason,
            data=data,
            actor=actor,
        )

    async def delayed(self, delayed_id: str) -> Delayed:
        """See :meth:`fsm.Engine.delayed`."""
        return await self._call(self.sync.delayed, delayed_id)

    async def send(self, entity_id: str, name: str, payload: Any = None, *, idempotency_key: str) -> bool:
        """See :meth:`fsm.Engine.send`."""
        return await self._call(self.sync.send, entity_id, name, payload, idempotency_key=idempotency_key)

    async def effects(self, entity_id: str) -> list[EffectRecord]:
        """See :meth:`fsm.Engine.effects`."""
        return await self._call(self.sync.effects, entity_id)

    async def progress(self, entity_id: str) -> Any:
        """See :meth:`fsm.Engine.progress`."""
        return await self._call(self.sync.progress, entity_id)

    async def record_progress(self, lease: Lease, details: Any) -> None:
        """See :meth:`fsm.Engine.record_progress`."""
        await self._call(self.sync.record_progress, lease, details)

    async def entities(
        self, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        """See :meth:`fsm.Engine.entities`."""
        return await self._call(self.sync.entities, state=state, limit=limit, after_id=after_id)

    async def counts(self) -> dict[str, int]:
        """See :meth:`fsm.Engine.counts`."""
        return await self._call(self.sync.counts)

    async def prune(
        self, older_than: timedelta | float, *, batch_size: int = DEFAULT_PRUNE_BATCH, dry_run: bool = False
    ) -> PruneResult:
        """See :meth:`fsm.Engine.prune`."""
        return await self._call(self.sync.prune, older_than, batch_size=batch_size, dry_run=dry_run)

    def watch(
        self,
        after: str | None = None,
        *,
        from_start: bool = False,
        poll: float = DEFAULT_POLL,
        timeout: float | None = None,
        stop: asyncio.Event | None = None,
    ) -> AsyncIterator[FeedEntry]:
        """See :meth:`fsm.Engine.watch`: the same feed as an async iterator
        (``async for entry in engine.watch(): ...``); ``stop`` is an :class:`asyncio.Event`.

        Every argument is checked by the call itself (``InvalidArgument``), before the
        iterator is returned; a position the store never gave is refused before the first
        entry (that check reads the store)."""
        poll_s, timeout_s = watch_args(after, poll, timeout, from_start=from_start, stop=stop, asynchronous=True)
        return self._watch(after, from_start, poll_s, timeout_s, stop)

    async def _watch(
        self, after: str | None, from_start: bool, poll_s: float, timeout_s: float | None, stop: asyncio.Event | None
    ) -> AsyncIterator[FeedEntry]:
        store, kind = self.store, self.kind
        if after is None and not from_start:
            after = await store.feed_head()
        else:
            await store.feed(after, kind=kind, limit=1)  # a bad position is refused before the first entry
        cursor = Cursor(after)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        stopped = stop if stop is not None else asyncio.Event()
        wake = asyncio.Event()
        subscribe = getattr(store, "feed_wakeup", None)
        unsubscribe = (
            await asyncio.to_thread(subscribe, lambda: loop.call_soon_threadsafe(wake.set))
            if callable(subscribe)
            else None
        )
        pacer = Pacer(poll_s)
        woken = False
        try:
            while not stopped.is_set():
                wake.clear()
                page = await store.feed(cursor.position, kind=kind, limit=PAGE)
                for entry in page:
                    cursor.position = entry.position
                    yield entry
                if len(page) >= PAGE:
                    continue
                wait = pacer.next_wait(woken, bool(page))
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return
                woke = asyncio.ensure_future(wake.wait())
                halt = asyncio.ensure_future(stopped.wait())
                await asyncio.wait(
                    {woke, halt}, timeout=wait if left is None else min(wait, left), return_when=asyncio.FIRST_COMPLETED
                )
                woken = woke.done()
                for waiter in (woke, halt):
                    waiter.cancel()
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def keep(self, lease: Lease, *, period: timedelta | None = None) -> AsyncLeaseKeeper:
        """An asyncio lease keeper: ``async with engine.keep(lease) as held: ...``.

        A task renews every ``period`` (default: a third of the TTL), within the state's
        renewal budget, on the async store; see :class:`fsm.work.keeper.AsyncLeaseKeeper`."""
        from fsm.engine.arguments import lease_arg

        return AsyncLeaseKeeper(self.sync, lease_arg(lease), period=period, runner=self._call)


def _awaiting(fn: Any) -> Any:
    """``fn`` for the synchronous engine under the greenlet bridge: a coroutine function's
    result awaited on the loop.  Anything not callable is passed on for the engine to refuse."""
    if not callable(fn):
        return fn

    def call(idempotency_key: str) -> Any:
        return resolved(fn(idempotency_key))

    return call


__all__ = ["AsyncEngine"]
