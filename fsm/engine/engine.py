"""The engine: fires a lifecycle's events on stored entities through a store.

The engine never builds a StateChart: it looks the event up in the lifecycle's compiled
table, evaluates the guards on the snapshot it read, and hands the store one
compare-and-set write (version, plus the lease token where the actor must hold the lease,
plus the store-side conditions of time- and row-dependent guards).  Signals go out after
the commit.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from fsm.clock import Clock, new_owner_id
from fsm.definition_rules import check_policy_states
from fsm.engine.announce import announce
from fsm.engine.arguments import (
    actor_arg,
    check_arguments,
    event_arg,
    lease_arg,
    optional_lease,
    optional_text,
    text,
    validate_data,
)
from fsm.engine.base import StoreClock
from fsm.engine.by_id import by_id_of, id_plans, id_write
from fsm.engine.cascade import Cancelled, cascade, check_lifecycles
from fsm.engine.chained import chain_writes, create_steps
from fsm.engine.joined import within
from fsm.engine.judge import choose, fenced
from fsm.engine.many import Fire, Fired, fire_many
from fsm.engine.parallel import (
    create_with_regions,
    enter_regions,
    exit_regions,
    join_after,
    join_refused,
    region_engine,
    region_hint,
    reserved_events,
)
from fsm.engine.result import ChainedResult, FireResult, fire_result
from fsm.engine.retention import DEFAULT_PRUNE_BATCH, PruneResult, prune
from fsm.engine.timers import DueTimer, timers_after
from fsm.engine.watch import DEFAULT_POLL, PAGE, Cursor, watch_args, watch_sync
from fsm.engine.work import EngineWork
from fsm.engine.writes import write_for
from fsm.errors import (
    ActiveDuplicate,
    ConditionFailed,
    ConfigError,
    EntityExists,
    EntityMovedOn,
    Fenced,
    FsmError,
    GuardRejected,
    IdempotencyKeyReused,
    InvalidArgument,
    LeaseLost,
    StaleVersion,
    TransitionNotAllowed,
    UnknownEvent,
)
from fsm.guards import HOLDS_LEASE
from fsm.history import kept_memory, resolve
from fsm.ids import new_id, new_ids
from fsm.lifecycle import Lifecycle
from fsm.limits import MAX_CREATE_MANY, check_id, check_priority, check_run_after, json_copy
from fsm.policy import Policy
from fsm.records import (
    Actor,
    FeedEntry,
    HeldBy,
    HistoryRecord,
    Lease,
    NewEntity,
    Snapshot,
    TransitionWrite,
    apply_changes,
)
from fsm.table import Branch
from stores.base import Store, unchecked_apply, unchecked_apply_many, unchecked_create_many
from stores.memory import MemoryStore


class Engine(EngineWork):
    """Runs one lifecycle over one store.

    Firing reads as: look the event up in the compiled table, judge its guards on the
    snapshot (:mod:`fsm.engine.judge`), hand the store one compare-and-set write
    (:mod:`fsm.engine.writes`), announce the committed transition
    (:mod:`fsm.engine.announce`).  Reads and leases are in :mod:`fsm.engine.reads` and
    :mod:`fsm.engine.leases`.

    Time guards (``lease_stale``, and any guard reading ``ctx.now``) are judged against the
    store's clock, the one the store re-checks them with at commit: an application clock
    behind the database must not keep a dead holder's entity unreaped (I2).  ``clock`` is
    kept for compatibility; it must be a :class:`~fsm.clock.Clock`.  ``owner`` is this engine's
    owner id for leases, unique per process run unless given.
    """

    def __init__(
        self,
        lifecycle: type[Lifecycle],
        store: Store,
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        owner: str | None = None,
    ) -> None:
        if not isinstance(lifecycle, type) or not issubclass(lifecycle, Lifecycle) or not hasattr(lifecycle, "table"):
            raise TypeError(f"Engine needs a Lifecycle subclass with states, got {lifecycle!r}")
        self.lifecycle = lifecycle
        self.kind: str = lifecycle.kind
        self.table = lifecycle.table
        self.store = store
        if clock is not None and not isinstance(clock, Clock):
            raise InvalidArgument(f"clock must be a Clock (with a now() method), not {clock!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidArgument(f"policy must be a Policy, not {policy!r}")
        self.clock: Clock = clock or StoreClock(store)
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a fsm.Policy, not {type(policy).__name__}")
        if policy is not None:
            check_policy_states(lifecycle.__name__, lifecycle.table, policy, ConfigError)
        self.policy: Policy = policy or lifecycle.policy
        self.owner: str = new_owner_id() if owner is None else text("owner", owner)
        self._events = frozenset(self.table.events)
        self._delays = dict(getattr(lifecycle, "delays", {}))
        # (leaf, event, actor) -> the branch taken without judging anything: the actor's
        # first branch when it has no guards (choose() would return it); the hot path's lookup
        # and the branch taken by a caller whose lease the engine just matched to the row,
        # when holding it is the actor's first branch's only guard (finalizing -> completed)
        self._unguarded: dict[tuple[str, str, Actor], Branch] = {}
        self._lease_only: dict[tuple[str, str, Actor], Branch] = {}
        for (leaf, ev), branches in self.table.branches.items():
            for who in Actor:
                mine = [b for b in branches if b.actor is who]
                if mine and not mine[0].guards:
                    self._unguarded[(leaf, ev, who)] = mine[0]
                elif mine and mine[0].guards == ((HOLDS_LEASE, True),):
                    self._lease_only[(leaf, ev, who)] = mine[0]
        # the engine checks every argument with fsm.limits before it builds a write, so a
        # store's own apply need not check them a second time (stores.base.unchecked_apply:
        # the library's stores; a subclass overriding apply, or a wrapper, gets its apply)
        self._apply: Callable[[TransitionWrite], tuple[Snapshot, HistoryRecord]] = unchecked_apply(store) or store.apply
        self._apply_many: Callable[[Sequence[TransitionWrite]], list[tuple[Snapshot, HistoryRecord] | FsmError]] = (
            unchecked_apply_many(store) or store.apply_many
        )
        self._create_many: Callable[[Sequence[NewEntity]], list[Snapshot]] = (
            unchecked_create_many(store) or store.create_many
        )
        # firing by id without a read, where the store judges the branch (fsm.engine.by_id)
        # (a lifecycle with eventless or completion transitions judges each fire's chain first)
        # (and a write into a parallel state creates its regions' rows: fsm.regions)
        self._parallel = self.table.parallel
        # the join of a parallel state is the engine's to fire, once every region is final
        self._join_events = reserved_events(self)  # (and a region's exit)
        # a region's engine joins its lifecycle's entity once its row ends (fsm.engine.parallel):
        # its final states take fire's path too, where the join follows the commit
        self._joins = lifecycle.region_of is not None
        self._heads = (
            self.table.chain_heads | frozenset(self._parallel) | (self.table.finals if self._joins else frozenset())
        )
        # (and one with history states writes the memory its transitions leave)
        self._by_id = None if self._heads or self.table.remembered else by_id_of(store)
        self._id_plans = id_plans(self.table) if self._by_id is not None else {}
        # reading by id: the engine checked the id already (text()), so a memory store whose
        # get is the library's reads its row without checking the id a second time
        plain_get = isinstance(store, MemoryStore) and type(store).get is MemoryStore.get
        self._read: Callable[[str], Snapshot] = store._live if plain_get else store.get  # type: ignore[attr-defined]

    # -- creating ------------------------------------------------------------------------

    def region(self, name: str) -> Engine:
        """The engine of region ``name`` of one of the lifecycle's parallel states: a
        lifecycle of its own (kind ``{kind}.{name}``) whose rows are this lifecycle's
        entities' regions (:mod:`fsm.regions`); give it a worker of its own to run them."""
        return region_engine(self, name)

    def within(self, connection: Any) -> contextlib.AbstractContextManager[None]:
        """Run this engine's calls inside the caller's transaction, in this thread::

            with Session(store.engine) as session, session.begin():
                session.add(Order(id=order_id, paid=True))  # the application's own write
                with jobs.within(session):
                    jobs.fire(job_id, "complete", lease=lease)
            # both committed here, together, and the signals sent; a rollback undoes both

        ``connection``: a SQLAlchemy ``Session`` or ``Connection`` on the store's database
        and driver (``store.engine`` is simplest); a Connection not yet in a transaction is
        begun, and the caller commits it.  Every store call of the block (create, fire,
        claim, run, leases, reads) runs on it, with the same compare-and-set and fencing;
        signals go out after the caller's commit and never after a rollback
        (:mod:`fsm.engine.joined`).  ``ConfigError`` for a store without SQL (memory), a
        connection of another driver or in autocommit mode, or a call after the caller's
        transaction ended inside the block.
        """
        return within(self.store, connection)

    def prune(
        self, older_than: timedelta | float, *, batch_size: int = DEFAULT_PRUNE_BATCH, dry_run: bool = False
    ) -> PruneResult:
        """Remove this lifecycle's entities in a final state last updated more than
        ``older_than`` ago (store clock), with their history, effects and renewal logs, in
        batches of ``batch_size`` (one store transaction each).  Entities in any other
        state are never touched.  ``dry_run``: what would go; nothing changes.  Nothing is
        ever removed unless pruned: run it on a schedule (``fsm prune --older-than 30d``)."""
        return prune(self, older_than, batch_size, dry_run)

    def create(
        self,
        entity_id: str | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
        columns: Mapping[str, Any] | None = None,
        run_after: datetime | timedelta | None = None,
        unique: bool = False,
        if_active: str = "raise",
        priority: int = 0,
        parent: str | None = None,
    ) -> Snapshot:
        """Create an entity in the lifecycle's initial state; ``data`` is validated first.

        ``priority``: claims take higher priorities first, then the longest due (an int
        from -100 to 100, default 0; see :class:`fsm.Limits` for the starvation rule).
        ``parent``: the id of the entity this one is a child of (``job.start_child`` sets
        it); cancelling the parent cancels it.  With the lifecycle's ``limits.key``, the
        concurrency key defaults to that data field's value.

        ``unique=True``: unique while active, by ``concurrency_key`` (required then): while
        a live entity of this lifecycle with that key is in a state that is not final,
        nothing is created and, by ``if_active``, ``ActiveDuplicate`` (an ``EntityExists``
        naming the active one, ``"raise"``) is raised or the active entity returned
        (``"return"``).  Checked in the insert itself (PostgreSQL: creates of one key take
        an advisory lock in turn), so two concurrent creates never both land; only creates
        that ask for it are checked.

        ``run_after``: when the entity becomes due, an aware time or a delay from the
        store's now; a claim takes it no earlier (default: at once).

        ``columns``: values of a bound application table's own columns (one it declares
        ``NOT NULL`` without a default); a store without such a table refuses them.
        """
        entity_id = new_id() if entity_id is None else text("entity_id", entity_id)
        optional_text("concurrency_key", concurrency_key)
        if unique is not True and unique is not False:
            raise InvalidArgument(f"unique must be True or False, not {type(unique).__name__}")
        if if_active not in ("raise", "return"):
            raise InvalidArgument(f"if_active must be 'raise' or 'return', not {str(if_active)[:40]!r}")
        check_priority(priority)
        optional_text("parent", parent)
        check_arguments(None, None, data)
        clean = self._validate({} if data is None else dict(data), entity_id=None)
        if concurrency_key is None:
            concurrency_key = self._data_key(clean)
        if unique and concurrency_key is None:
            raise InvalidArgument("create(unique=True) needs a concurrency_key: the key it is unique by")
        entity = NewEntity(
            id=entity_id,
            kind=self.kind,
            state=self.table.initial,
            concurrency_key=concurrency_key,
            data=clean,
            columns=None if columns is None else _columns(columns),
            run_after=check_run_after(run_after),
            arm_timer=self.table.arms_on_create(),
            unique_finals=tuple(sorted(self.table.finals)) if unique else None,
            priority=priority,
            parent_id=parent,
            definition=self.lifecycle.version,
        )
        try:
            if self.table.initial in self._parallel:  # it starts with its regions' rows
                return create_with_regions(self, [entity])[0]
            if self.table.initial in self._heads:  # its initial state takes steps by itself
                return self._create_chained([entity])[0]
            return self.store.create(entity)
        except ActiveDuplicate as err:
            if if_active == "return":
                return self.store.get(err.existing)
            raise

    def create_many(
        self,
        data: Sequence[Mapping[str, Any] | None],
        *,
        ids: Sequence[str] | None = None,
        concurrency_keys: Sequence[str | None] | None = None,
    ) -> list[Snapshot]:
        """Create one entity per item of ``data`` (each validated first), in one statement
        on SQL stores, all or nothing; the snapshots come back in the same order.

        ``ids`` and ``concurrency_keys``, when given, hold one value per item (ids default
        to new random ones).  At most :data:`fsm.limits.MAX_CREATE_MANY` items.  An id that
        exists, or is given twice -> ``EntityExists``, and nothing is created.
        """
        if not isinstance(data, list | tuple):
            raise InvalidArgument(f"create_many takes a list of data mappings, not {type(data).__name__}")
        n = len(data)
        if not 1 <= n <= MAX_CREATE_MANY:
            raise InvalidArgument(f"create_many takes 1 to {MAX_CREATE_MANY} items, not {n}")
        for name, values in (("ids", ids), ("concurrency_keys", concurrency_keys)):
            if values is not None and (not isinstance(values, list | tuple) or len(values) != n):
                raise InvalidArgument(f"{name} must be a list with one value per item of data ({n})")
        batch = []
        arms = self.table.arms_on_create()
        seen: set[str] = set()
        chosen = new_ids(n) if ids is None else [text("entity_id", given) for given in ids]
        for i, item in enumerate(data):
            entity_id = chosen[i]
            key = None if concurrency_keys is None else optional_text("concurrency_key", concurrency_keys[i])
            check_arguments(None, None, item)
            clean = self._validate({} if item is None else dict(item), entity_id=None)
            if key is None:
                key = self._data_key(clean)
            if entity_id in seen:
                raise EntityExists(entity_id)
            seen.add(entity_id)
            batch.append(
                NewEntity(
                    id=entity_id,
                    kind=self.kind,
                    state=self.table.initial,
                    concurrency_key=key,
                    data=clean,
                    arm_timer=arms,
                    definition=self.lifecycle.version,
                )
            )
        if self.table.initial in self._parallel:  # they start with their regions' rows
            return create_with_regions(self, batch)
        if self.table.initial in self._heads:  # its initial state takes steps by itself
            return self._create_chained(batch)
        # every item was checked above with the store's own limits: the library's stores
        # need not check them again (stores.base.unchecked_create_many)
        return self._create_many(batch)

    def _create_chained(self, entities: list[NewEntity]) -> list[Snapshot]:
        """Entities created with the steps their initial state takes by itself (judged on
        each as it would be created), in one store transaction: ``store.create_chains``."""
        items = [(entity, create_steps(self, entity)) for entity in entities]
        create_chains = getattr(self.store, "create_chains", None)
        if create_chains is None:
            raise ConfigError(
                f"{type(self.store).__name__} cannot create an entity whose initial state takes eventless or "
                "completion transitions (it has no create_chains)"
            )
        done = create_chains([(entity, writes) for entity, (writes, _) in items])
        made: list[Snapshot] = []
        for (created, results), (_, (_, branches)) in zip(done, items, strict=True):
            for (new, record), branch in zip(results, branches, strict=True):
                announce(self.kind, new, record, branch)
            made.append(results[-1][0] if results else created)
        return made

    def cancel(
        self,
        entity: str | Snapshot,
        *,
        reason: str | None = None,
        children: bool = True,
        lifecycles: Iterable[type[Lifecycle]] | None = None,
    ) -> Cancelled:
        """Fire the lifecycle's ``cancel`` on the entity, then (``children=True``) on each of
        its live children and theirs, each by its own lifecycle's ``cancel``: a child its
        lifecycle cannot cancel (a live finalizer) is left to finish and reported in
        :attr:`Cancelled.left`.  Children of another lifecycle are cancelled by that
        lifecycle (an imported one, or one of ``lifecycles``).  See :mod:`fsm.engine.cascade`."""
        given = check_lifecycles(lifecycles)
        if children is not True and children is not False:
            raise InvalidArgument(f"children must be True or False, not {type(children).__name__}")
        result = self.fire(entity, "cancel", reason=reason)
        if not children:
            return Cancelled(result, (), ())
        done, left = cascade(self, result.snapshot.id, given, 0)
        return Cancelled(result, tuple(done), tuple(left))

    def _data_key(self, data: dict[str, Any]) -> str | None:
        """The concurrency key the lifecycle's ``limits.key`` reads off ``data``."""
        limits = self.lifecycle.limits
        if limits is None or limits.key is None:
            return None
        try:
            key = limits.key_of(data)
        except ValueError as err:
            raise InvalidArgument(str(err)) from None
        return None if key is None else optional_text("concurrency_key", key)

    def _validate(self, data: dict[str, Any], entity_id: str | None) -> dict[str, Any]:
        return validate_data(self.lifecycle.data_model, self.kind, data, entity_id)

    # -- firing --------------------------------------------------------------------------

    def fire(
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
        fence: HeldBy | None = None,
    ) -> FireResult:
        """Fire ``event`` on the entity as ``actor``; one compare-and-set write.

        By id, the store judges the branch itself where the row's state decides it (no
        guard, or only ``holds_lease`` with ``lease``; no ``data`` or ``idempotency_key``):
        one write, no read first (:mod:`fsm.engine.by_id`); when it moves nothing, the row
        is read and judged as below, so the errors are the same.

        ``entity`` is an id, or the :class:`Snapshot` (or :class:`FireResult`) the caller
        holds from its last read or fire: then the engine judges that snapshot and writes
        without reading the row first (one statement on PostgreSQL).  The version
        compare-and-set keeps this safe: if the entity moved since, the store refuses with
        ``StaleVersion`` and the engine reads the row once and fires on it; an event the
        held snapshot refuses is judged again on the row read once.  Any other refusal of
        the store (``LeaseLost``, ``ConditionFailed``...) is raised as it is.  ``data`` is
        not read back: it is the held snapshot's, or the merged patch.

        ``lease`` is the caller's lease for transitions that require holding it.
        ``data`` is a patch merged into the entity's data (top-level keys) and validated
        against the lifecycle's data model; guards judge the merged data.  ``owner`` is who takes the lease on a
        transition that acquires one (default: this engine's owner id).  Firing again with
        the same ``idempotency_key`` returns the first result and writes nothing.

        ``error`` (a handler error, as :func:`fsm.records.error_record` makes it) is kept in
        the history row (``HistoryRecord.error``); ``run_after`` makes the entity due that
        long after the store's now (a retry's backoff).  The worker passes both.

        ``fence``: the write is made on behalf of another row's lease (a
        :class:`~fsm.records.HeldBy`, as a delayed fire's delivery is) and is refused with
        ``ConditionFailed`` (``held_by``) unless that lease is still held, in the statement.

        Raises ``UnknownEvent``, ``UnknownEntity``, ``TransitionNotAllowed``,
        ``GuardRejected``, ``LeaseLost``, ``StaleVersion``, ``ConditionFailed``,
        ``InvalidData`` or ``IdempotencyKeyReused``; a raise means nothing was written.
        """
        if event_arg(event) not in self._events and not self.table.knows(check_id("event", event)):
            raise UnknownEvent(event, lifecycle=self.kind, known=list(self.table.events), hint=region_hint(self, event))
        if actor is not Actor.WORKER:
            actor = actor_arg(actor)
        if self._join_events and event in self._join_events:
            raise join_refused(self, entity, event, str(actor))
        if reason is not None or idempotency_key is not None or data is not None:
            check_arguments(reason, idempotency_key, data)
        extra: Attempt | None = None
        if error is not None or run_after is not None:
            extra = _attempt(error, run_after, self.kind)
        held: Snapshot | None = None
        cls = entity.__class__
        if cls is FireResult:
            held = entity.snapshot  # type: ignore[union-attr]
        elif cls is not str:
            if isinstance(entity, FireResult):
                held = entity.snapshot
            elif isinstance(entity, Snapshot):
                held = entity
        entity_id = check_id("entity_id", entity if held is None else held.id)
        if lease is not None:
            if lease.__class__ is Lease:
                lease_arg(lease)
            else:
                optional_lease(lease)
        if owner is not None:
            text("owner", owner)
        if fence is not None and not isinstance(fence, HeldBy):
            raise InvalidArgument(f"fence must be a HeldBy, not {type(fence).__name__}")
        if fence is None and self._delays:
            self.refuse_delayed(event)  # a delivery (fenced) fires it
        try:
            if idempotency_key is None:
                return self._fire(entity_id, event, actor, lease, None, reason, data, owner, held, extra, fence=fence)
            replay = self._replay(entity_id, event, idempotency_key, lease)
            if replay is not None:
                return replay
            try:
                return self._fire(
                    entity_id, event, actor, lease, idempotency_key, reason, data, owner, held, extra, fence=fence
                )
            except (TransitionNotAllowed, GuardRejected, LeaseLost, StaleVersion, ConditionFailed):
                # a concurrent call with the same key (a retried webhook) may have committed
                # between our lookup and our read: then this is a replay, not a refusal
                replay = self._replay(entity_id, event, idempotency_key, lease)
                if replay is not None:
                    return replay
                raise
        except Fenced as err:
            if lease is not None:
                self._lease_lost(lease, err, "fire", event)
            raise

    def timers_after(self, record: HistoryRecord) -> tuple[DueTimer, ...] | None:
        """What a committed transition (a :meth:`watch` entry's ``record``) did to the
        entity's timers: the ones it started, with their due times; ``()`` when it stopped
        them; ``None`` when it kept them running (see :mod:`fsm.engine.timers`)."""
        return timers_after(self.table, record)

    def refuse_delayed(self, event: str) -> None:
        """An event declared with ``delay=`` is fired later, never at once: ``InvalidArgument``
        pointing at :meth:`fire_later` (python-statemachine queues it for its delay)."""
        delay = self._delays.get(event)
        if delay is not None:
            raise InvalidArgument(
                f"event {event!r} of {self.kind} is declared with delay={delay.total_seconds() * 1000:g} ms: "
                f"fire it with fire_later(entity, {event!r}), which waits the declared delay"
            )

    def fire_many(self, items: Sequence[Fire]) -> list[Fired]:
        """Fire many events, each from the snapshot its caller holds (``Fire(entity, event,
        lease, data)``, actor worker), their writes in one transaction (``Store.apply_many``).

        Each item is judged as :meth:`fire` judges it and written with its own version and
        token guard; the answer has one item per input, in order: its :class:`FireResult`,
        or the error :meth:`fire` would have raised for it (a fenced holder's also sends
        ``lease_lost``).  One refusal never stops the others.  At most
        :data:`fsm.limits.MAX_APPLY_MANY` items; idempotency keys are :meth:`fire`'s.  A
        malformed item (not a ``Fire``, no held snapshot, an unknown event, bad data or
        lease) is refused for the whole call (``InvalidArgument``, ``UnknownEvent``...),
        before anything is written."""
        return fire_many(self, items, self._apply_many)

    def _prepare(
        self,
        entity_id: str,
        event: str,
        actor: Actor,
        lease: Lease | None,
        idempotency_key: str | None,
        reason: str | None,
        data: Mapping[str, Any] | None,
        owner: str | None,
        held: Snapshot | None = None,
        extra: Attempt | None = None,
    ) -> tuple[TransitionWrite, Branch, Snapshot | None]:
        """Judge the event and build its write: ``(write, branch, held)``, where ``held``
        is the caller's snapshot if the write was judged on it (else the row read).
        ``extra``: a handler attempt's error and due delay, added to the write."""
        # a str check first: a hand-made snapshot's unhashable state must not reach the dict
        if (
            held is not None
            and held.kind == self.kind
            and held.state.__class__ is str
            and held.state in self.table.configurations
        ):
            snap = held
            if held.memory is not None:  # the caller's: only what this lifecycle's memory can hold
                snap = held._replace(memory=kept_memory(held.memory, self.table.remembered))
        else:
            held = None
            snap = self._read(entity_id)
            if snap.kind != self.kind or snap.state not in self.table.configurations:
                snap = self.get(entity_id)  # raises the precise error
        if lease is not None and (snap.lease_token != lease.token or snap.lease_owner != lease.owner):
            if held is not None:  # the caller's snapshot disagrees with its lease: read the row
                return self._prepare(entity_id, event, actor, lease, idempotency_key, reason, data, owner, None, extra)
            self._check_holder(snap, lease)  # a holder that lost the work never fires with it
        patch: dict[str, Any] | None = None
        new_data: dict[str, Any] | None = None
        judged = snap
        if data is not None:  # guards judge the entity as the event would leave its data
            # a JSON copy: the caller may reuse its dict, and history must not change with it
            patch = json_copy(dict(data), lifecycle=self.kind, entity_id=snap.id)
            new_data = self._validate({**snap.data, **patch}, entity_id=snap.id)
            judged = snap._replace(data=new_data)
        plan = (judged.state, event, actor)
        branch = self._unguarded.get(plan)
        if branch is None and lease is not None:  # matched to the row above: holds_lease is true
            branch = self._lease_only.get(plan)
        if branch is None:
            try:
                branch = choose(self.table, self.policy, self.clock, self.store, judged, event, actor, lease)
            except FsmError:
                if held is None:
                    raise
                # refused on the caller's snapshot, which may be stale: judge the row as it is
                return self._prepare(entity_id, event, actor, lease, idempotency_key, reason, data, owner, None, extra)
        if branch.restores is not None:  # a history target: the entity's memory picks the leaf
            branch = resolve(branch, judged.memory, judged.state)
        if branch.changes:  # the transition's declared data change, in the same write
            changed = apply_changes(branch.changes, judged.data)
            if changed is not None:
                new_data = self._validate(changed, entity_id=snap.id)
        write = write_for(self.policy, self.owner, snap, branch, lease, idempotency_key, reason, new_data, patch, owner)
        if extra is not None:
            write.error, write.run_after = extra
        return write, branch, held

    def _fire(
        self,
        entity_id: str,
        event: str,
        actor: Actor,
        lease: Lease | None,
        idempotency_key: str | None,
        reason: str | None,
        data: Mapping[str, Any] | None,
        owner: str | None,
        held: Snapshot | None = None,
        extra: Attempt | None = None,
        reread: bool = True,
        fence: HeldBy | None = None,
        joining: bool = False,
    ) -> FireResult:
        if held is None and idempotency_key is None and data is None and fence is None and self._by_id is not None:
            plan = self._id_plans.get((event, actor, lease is not None))
            if plan is not None:
                done = self._by_id(
                    id_write(plan, self.kind, self.policy, self.owner, entity_id, lease, reason, owner, extra)
                )
                if done is not None:
                    announce(self.kind, done[0], done[1], plan.branches[done[1].source])
                    return fire_result(*done)
                # the row did not qualify: read it and judge it as a read-first fire does
        write, branch, held = self._prepare(
            entity_id, event, actor, lease, idempotency_key, reason, data, owner, held, extra
        )
        if fence is not None:
            write.require = (*write.require, fence)
        chain = chain_writes(self, write, branch, lease, owner) if branch.target in self._heads else None
        try:
            if self._parallel:  # one test for every lifecycle without a parallel state
                if branch.source in self._parallel and not joining:  # leaving it by an event: its regions too
                    return exit_regions(self, *(chain or ([write], [branch])))
                if chain is not None and chain[1][-1].target in self._parallel:
                    return enter_regions(self, *chain)
            if chain is not None and len(chain[0]) > 1:
                return self._apply_chain(*chain)
            new, record = self._apply(write)
        except StaleVersion:
            if not reread:
                raise
            # the snapshot (the caller's, or the one read here) went stale before the write: read
            # the row once more and judge the event on it, so a fire that loses a race gets the
            # judgement of the row that won (TransitionNotAllowed), as a store-judged fire does
            return self._fire(
                entity_id, event, actor, lease, idempotency_key, reason, data, owner, None, extra, False, fence, joining
            )
        except IdempotencyKeyReused:
            assert idempotency_key is not None
            replay = self._replay(entity_id, event, idempotency_key, lease)
            if replay is None:  # pragma: no cover - the store said the key exists
                raise
            return replay
        announce(self.kind, new, record, branch)
        if self._joins and new.state in self.table.finals:
            join_after(self, new)
        return fire_result(new, record)

    def _apply_chain(self, writes: list[TransitionWrite], branches: list[Branch]) -> FireResult:
        """The event's write and its microsteps, committed together (:mod:`fsm.chains`)."""
        apply_chain = getattr(self.store, "apply_chain", None)
        if apply_chain is None:
            raise ConfigError(
                f"{type(self.store).__name__} cannot commit eventless or completion transitions with their event "
                "(it has no apply_chain)"
            )
        results: list[tuple[Snapshot, HistoryRecord]] = apply_chain(writes)
        for (new, record), branch in zip(results, branches, strict=True):
            announce(self.kind, new, record, branch)
        if self._joins and results[-1][0].state in self.table.finals:
            join_after(self, results[-1][0])
        return ChainedResult(results[-1][0], results[0][1], steps=tuple(record for _, record in results[1:]))

    # -- the live feed --------------------------------------------------------------------

    def watch(
        self,
        after: str | None = None,
        *,
        from_start: bool = False,
        poll: float = DEFAULT_POLL,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[FeedEntry]:
        """Committed transitions of this lifecycle, whoever made them (any process), as
        :class:`~fsm.records.FeedEntry` items in the store's commit order.

        ``after``: resume just after this position (an entry's ``position``); ``None``
        starts at what commits from now on, or at the first transition with
        ``from_start=True``.  Reads every ``poll`` seconds while nothing is new; ends when
        ``stop`` is set or after ``timeout`` seconds (``None``: never), or when the caller
        stops iterating.  See :mod:`fsm.engine.watch`."""
        poll_s, timeout_s = watch_args(after, poll, timeout, from_start=from_start, stop=stop)
        store, kind = self.store, self.kind
        if after is None and not from_start:
            after = store.feed_head()
        else:
            store.feed(after, kind=kind, limit=1)  # a bad position is refused here, not mid-iteration
        cursor = Cursor(after)
        wakeup = getattr(store, "feed_wakeup", None)
        read = functools.partial(_feed_page, store, kind)
        return watch_sync(read, cursor, poll_s, timeout_s, stop, wakeup if callable(wakeup) else None)

    def _replay(self, entity_id: str, event: str, key: str, lease: Lease | None) -> FireResult | None:
        recorded = self.store.find_transition(entity_id, key)
        if recorded is None:
            return None
        if recorded.event != event:
            raise IdempotencyKeyReused(entity_id, key=key, recorded_event=recorded.event, event=event)
        snap = self.get(entity_id)
        # the caller's own write is the entity's last move (a commit whose answer was lost,
        # a retry that gave the lease back): it is told so, not fenced by its own move
        own = (
            lease is not None
            and recorded.owner == lease.owner
            and recorded.lease_token == lease.token
            and recorded.seq == snap.version
        )
        if lease is not None and not own:
            # a fenced holder retrying its own fire must learn it lost the work, not be
            # told that the new owner's record was its success
            self._check_holder(snap, lease)
        return FireResult(snap, recorded, replayed=True)

    def _check_holder(self, snap: Snapshot, lease: Lease) -> None:
        """Raise the fencing error if ``lease`` is no longer the entity's (see ``judge.fenced``).

        Entering a final state clears the lease: a holder that finished the entity itself
        is not fenced (the table then says the state is final); one whose entity somebody
        else finished is."""
        if snap.lease_owner == lease.owner and snap.lease_token == lease.token:
            return
        last = None
        if snap.lease_owner is None:  # moved on with nobody holding it: by what (and whom)
            history = self.store.history(snap.id)
            last = history[-1] if history else None
        # its own holder's write names the holder; an operator's override (a cancel of a
        # running job) carries the same token but no owner: that holder is fenced
        if (
            snap.state in self.table.finals
            and snap.lease_token == lease.token
            and last is not None
            and (last.actor, last.lease_token, last.owner) == ("worker", lease.token, lease.owner)
        ):
            return
        stop = fenced(snap, lease)
        if isinstance(stop, EntityMovedOn) and last is not None and last.seq == snap.version:
            stop = EntityMovedOn(
                snap.id,
                state=snap.state,
                token=lease.token,
                found_token=snap.lease_token,
                owner=lease.owner,
                cause=last.event + (f" ({last.reason})" if last.reason else ""),
            )
        if stop is not None:
            raise stop


Attempt = tuple[dict[str, Any] | None, timedelta | None]
"""What a fire adds to its write for a handler's attempt: the error and the due delay."""


def _attempt(error: object, run_after: object, kind: str) -> Attempt:
    """``fire``'s ``error`` (a JSON object) and ``run_after`` (a delay), checked."""
    copied: dict[str, Any] | None = None
    if error is not None:
        if not isinstance(error, Mapping):
            raise InvalidArgument(f"error must be a mapping (see fsm.records.error_record), not {type(error).__name__}")
        copied = json_copy(dict(error), lifecycle=kind)
    if run_after is not None and not isinstance(run_after, timedelta):
        raise InvalidArgument(f"a fire's run_after is a delay (timedelta), not {type(run_after).__name__}")
    due = check_run_after(run_after)
    assert due is None or isinstance(due, timedelta)
    return copied, due


def _feed_page(store: Store, kind: str, position: str | None) -> list[FeedEntry]:
    return store.feed(position, kind=kind, limit=PAGE)


def _columns(columns: object) -> dict[str, Any]:
    if not isinstance(columns, Mapping):
        raise InvalidArgument(f"columns must be a mapping of column name to value, not {type(columns).__name__}")
    return dict(columns)


__all__ = ["Engine"]
