"""The store protocol: the only way the framework reads and writes entities.

Every adapter (memory, SQLAlchemy on SQLite or PostgreSQL) implements :class:`Store` with
the same semantics, pinned by one contract suite (``tests/test_stores/test_store_contract.py``).  A store knows
nothing of lifecycles or reaping: it applies compare-and-set writes whose guards it
re-checks at the commit point, against its own clock.

Errors are the typed ones of :mod:`fsm.errors`; a method that raises has changed nothing.
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
class Store(Protocol):
    """Persistence of entities, their leases and their append-only history."""

    def now(self) -> datetime:
        """The store's current time (the database server's for SQL stores), aware UTC."""
        ...

    def create(self, entity: NewEntity) -> Snapshot:
        """Insert a new entity at version 0 with no lease, due at ``entity.run_after`` (a
        time, or a delay from the store's now; ``None``: now).

        Conflict: an entity with the same id exists (even soft-deleted) -> ``EntityExists``.
        """
        ...

    def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        """Insert many new entities at once, all or nothing; snapshots in the given order.

        One statement on the SQL stores' own tables (one transaction always), so a batch
        costs about one commit.  Each entity is checked as :meth:`create` checks it; an
        empty batch, or more than :data:`fsm.limits.MAX_CREATE_MANY` (10,000), ->
        ``InvalidArgument``.  Conflict: an id exists (even soft-deleted), or two entities of
        the batch share one -> ``EntityExists`` naming it, and nothing of the batch is written.
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

        ``write.run_after`` (a delay) makes the entity due that long after the store's now;
        otherwise its due time is kept.  The history row records ``write.error`` and the
        lease owner (the new owner of a lease taken, else ``expect_owner``).
        """
        ...

    def apply_chain(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord]]:
        """Apply an event's write and the microsteps it takes by itself (eventless and
        completion transitions, :mod:`fsm.chains`): the writes of one entity, each expecting
        the version the one before leaves, judged in order as :meth:`apply` judges each,
        committed together or not at all.  Returns each write's new row and history row; a
        refusal raises what :meth:`apply` would have raised for that write, and nothing is
        written.  Malformed writes -> ``InvalidArgument`` (nothing written)."""
        ...

    def create_chains(
        self, items: Sequence[tuple[NewEntity, Sequence[TransitionWrite]]]
    ) -> list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]]:
        """Create entities whose initial state takes transitions by itself (eventless and
        completion transitions, :mod:`fsm.chains`): each entity as :meth:`create` creates
        it, then its writes (the first expecting version 0, each the version the one before
        leaves) as :meth:`apply_chain` applies them, all of it committed together or not at
        all.  Returns, per item, the created row and each write's new row and history row.
        A refusal raises what :meth:`create` or :meth:`apply` would have raised, and
        nothing is written.  Malformed items -> ``InvalidArgument`` (nothing written)."""
        ...

    def apply_group(
        self, writes: Sequence[TransitionWrite], creates: Sequence[NewEntity]
    ) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
        """Apply ``writes`` (of any entities, each judged as :meth:`apply` judges it, in
        order) and then create ``creates`` (as :meth:`create` creates each), all of it
        committed together or not at all: entering a parallel state writes the entity's
        transition and its regions' rows so (:mod:`fsm.regions`).  Returns each write's new
        row and history row, and each created row.  A refusal raises what :meth:`apply` or
        :meth:`create` would have raised, and nothing is written.  Malformed arguments ->
        ``InvalidArgument`` (nothing written)."""
        ...

    def apply_many(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord] | FsmError]:
        """Apply many transitions in one transaction (one commit), each fenced on its own.

        Each write is judged exactly as :meth:`apply` judges it (its version, token and
        conditions, at the commit point), in the given order (a later write on the same
        entity sees the earlier one).  The answer has one item per write, in order: the
        new row and history row, or the error :meth:`apply` would have raised for it (a
        refusal does not stop the others, and changed nothing).  The accepted writes
        commit together.  More than :data:`fsm.limits.MAX_APPLY_MANY` (1,000) writes, or a
        malformed one -> ``InvalidArgument`` (nothing written); an empty batch -> ``[]``.
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
        ``min(now + ttl, state_entered_at + budget)``.  Logged in the same transaction as
        a :class:`~fsm.records.LeaseRenewal` with ``acquired=True`` (see :meth:`renewals`).
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
        A renewal is logged in its own transaction (see :meth:`renewals`); a refused one
        logs nothing.
        """
        ...

    def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]:
        """Renew many leases in one transaction (one commit): each as :meth:`renew_lease`
        renews it (its owner, token, expiry and budget guard, logged the same way), with
        the budget of its entity's state in ``budgets`` (a state not listed: none).

        One answer per lease, in order: the renewed row, or the error :meth:`renew_lease`
        would have raised for it (``LeaseLost``, ``UnknownEntity``); one refusal never
        stops the others.  More than :data:`fsm.limits.MAX_APPLY_MANY` leases, or a
        malformed one -> ``InvalidArgument`` (nothing renewed); none -> ``[]``.
        """
        ...

    def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        """The entity's latest lease renewals, oldest first: each successful
        :meth:`renew_lease` and :meth:`acquire_lease`, logged in that write's own
        transaction, the newest :data:`~fsm.records.RENEWALS_KEPT` kept.

        Transitions that take a lease (a claim's start) are in :meth:`history`, not here.
        The log is a reserved ledger row (:data:`~fsm.records.RENEWALS_KEY`), which
        :meth:`effects` leaves out.  Not found -> ``UnknownEntity`` (a soft-deleted entity
        still answers, as :meth:`history` does); a log that cannot be read -> ``MalformedRow``.
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

    def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]:
        """Find and move up to ``limit`` candidates in one transaction: the entities
        :meth:`candidates` would list for ``(batch.kind, batch.source, batch.require)``,
        moved as :meth:`apply_batch` moves them (``batch.ids`` is not read: pass ``()``).

        The reaper's claim: several reapers calling it at once divide the candidates
        instead of each reading all of them (PostgreSQL claims with ``FOR UPDATE SKIP
        LOCKED``: a row another transaction holds is skipped, not waited for).  Which
        candidates a call takes is the store's choice (index order, not id order), and a
        row whose content cannot be read is never taken: :meth:`candidates` reports it as
        ``MalformedRow``.  Fewer than ``limit`` moved means none was left to take at that
        moment.  Returns the moved rows with their history rows.
        """
        ...

    # -- durable work: the effects ledger, claiming, listing -----------------------------------

    def effect(self, entity_id: str, key: str) -> EffectRecord | None:
        """The recorded outcome of effect ``key`` of the entity, or ``None``."""
        ...

    def effects(self, entity_id: str) -> list[EffectRecord]:
        """Every recorded effect of the entity, by key (the keeper's progress row
        included; the lease renewal log, :meth:`renewals`, left out).  Not found ->
        ``UnknownEntity``."""
        ...

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
        """Record an effect's outcome under the caller's lease, checked in the recording
        statement: the entity's lease owner and token must still be ``owner`` and ``token``.

        Returns ``(record, True)`` when this call recorded it.  When a record exists whose
        status is not in ``replace``, it is returned as ``(existing, False)`` and nothing is
        written: the first result wins (I4).  Checked in this order: not found ->
        ``UnknownEntity``; the lease is not the caller's -> ``LeaseLost`` (a late result is
        never recorded); then the existing record.  ``result`` must be JSON.
        """
        ...

    def run(
        self, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool = True
    ) -> tuple[EffectRecord, bool]:
        """Run a side effect at most as often as needed, and record its outcome exactly once.

        The caller's lease is checked first: a caller whose lease is no longer the entity's
        gets ``LeaseLost`` whether or not the key is recorded (a fenced holder is never told
        that the new owner's recorded result is its success), and ``fn`` is not called.
        A recorded success (or a recorded failure when not ``retry_failed``) is returned as
        ``(record, False)`` and ``fn`` is not called.  Otherwise ``fn(idempotency_key)``
        runs (the key is stable across owners: ``"{entity_id}:{key}"``) and its result is
        recorded with :meth:`record_effect` under ``lease``: ``(record, True)``.  If ``fn``
        raises, the failure is recorded with its error and the exception propagates.  A
        caller whose lease is no longer the entity's when it asks gets ``LeaseLost`` and
        ``fn`` is not called; a holder whose lease was taken over while ``fn`` ran gets
        ``LeaseLost`` too, and its result is not recorded.
        """
        ...

    def claim(self, request: ClaimRequest) -> list[Snapshot]:
        """Take up to ``request.limit`` claimable entities (see
        :class:`~fsm.records.ClaimRequest`), each with a new lease token for
        ``request.owner``: entities to resume first (work already under way), then entities
        to start; within each, only entities already due (``run_after`` at or before the
        store's now), the longest due first.  A due time is set at create and by a retry;
        a requeue or a release keeps it, so such an entity keeps its place in the line.

        Concurrent claimers never take the same entity: PostgreSQL locks the candidates with
        ``FOR UPDATE SKIP LOCKED`` (a row another claimer holds is skipped, not waited for),
        SQLite takes the write lock first (``BEGIN IMMEDIATE``), the memory store its lock.
        A row that cannot be read is stepped over.  Returns the claimed entities in that order.
        """
        ...

    def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        """Live entities of ``kind`` (in ``state`` if given) ordered by id, with id >
        ``after_id`` (keyset paging), at most ``limit``.  Read-only; for dashboards and CLIs."""
        ...

    def count_states(self, kind: str) -> dict[str, int]:
        """How many live entities of ``kind`` are in each state."""
        ...

    def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int:
        """How many live entities of ``kind`` (with concurrency key ``key``, when given)
        hold a live lease in one of the ``leased`` states: the slots a limit counts."""
        ...

    def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        """The live entities whose parent is ``parent_id`` (any lifecycle), ordered by id,
        with id > ``after_id``, at most ``limit`` (SQL: the ``parent`` index)."""
        ...

    def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]:
        """Remove up to ``limit`` entities of ``kind`` whose state is one of ``states`` (the
        caller passes its lifecycle's final states) and whose ``updated_at`` is before
        ``before``, oldest first, with their history, effects and renewal log, in one
        transaction; returns their ids in that order.  Soft-deleted rows in those states
        go too.  The store cannot tell a final state from another (it knows no lifecycle):
        ``Engine.prune`` passes the final states; whatever a direct caller names, a row
        whose lease is held (live work: a final state's lease is always cleared) is never
        removed.  A row is removed only if it still matches in the removing transaction;
        rows of other kinds or states are never touched.  ``dry_run``: the ids that would
        be removed; nothing changes.  ``InvalidArgument`` for a bad argument (nothing
        removed); ``ConfigError`` on a store bound to the application's table."""
        ...

    def trim_history(self, entity_id: str, keep: int) -> int:
        """Remove all but the last ``keep`` history rows of ``entity_id`` (a log kept as an
        entity's history: the reaper's tick log) and return how many were removed; the row
        itself is unchanged.  Its history then starts after seq 1 (gap-free from there).
        ``UnknownEntity`` when there is no such row (deleted ones included: nothing removed)."""
        ...

    def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        """Committed transitions after position ``after`` (``None``: from the first one),
        oldest first, at most ``limit`` (1..10000), of ``kind`` only if given.

        The order is the store's commit order where it matters: an entry that commits
        after a reader saw a later one is never skipped (a reader resuming from any
        position it was given misses nothing committed after it).  Every history row is an
        entry (soft-deleted entities' too).  A position this store never gave, or another
        store's -> ``InvalidArgument``; a bad ``limit`` or ``kind`` -> ``InvalidArgument``.
        """
        ...

    def feed_head(self) -> str:
        """A position from which ``feed`` returns everything that commits from now on.

        Memory and SQLite: just after the last committed entry.  PostgreSQL: before the
        oldest transaction still running, so what commits from now on is never skipped; a
        few entries committed just before the call by transactions newer than that one may
        come too (at least once, never lost)."""
        ...


@runtime_checkable
class WorkNotices(Protocol):
    """An optional store capability: wake-ups when work becomes claimable.

    A worker subscribes to its lifecycle's kind and claims at once on a wake-up instead of
    at its next poll.  A wake-up is a hint, never a promise: a worker still polls, so a
    lost one (a dropped connection, a write from a process that cannot tell this one)
    costs latency, never work.  The memory, SQLite and PostgreSQL stores and their async
    faces have it: ``create``, ``create_many`` and ``release_lease`` wake the kind's
    subscribers after their commit (PostgreSQL: ``NOTIFY`` in the write, heard by the
    process's one ``LISTEN`` connection; SQLite and memory: this process's subscribers)."""

    def subscribe_work(self, kind: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (from any thread, without arguments) whenever work of
        ``kind`` may have become claimable; returns the function that unsubscribes
        (idempotent).  A callback that raises is logged; the others still run."""
        ...

    def notify_work(self, kind: str) -> None:
        """Wake the subscribers of ``kind`` (every process's, on PostgreSQL): for writers
        that make work claimable by other means (the reaper's requeue or reclaim)."""
        ...


@runtime_checkable
class Waits(Protocol):
    """An optional store capability: durable waits (``job.sleep``, ``job.wait_for``,
    ``Engine.send``).  The memory and SQL stores and their async faces have it."""

    def park(self, entity_id: str, *, owner: str, token: int, until: datetime) -> Snapshot:
        """Give the holder's lease back and make the entity due at ``until``, in one write
        guarded by owner and token (``LeaseLost`` otherwise).  The entity keeps its state
        and version; a claim resumes it when due (a state a claim resumes: one whose worker
        transitions need the lease)."""
        ...

    def send_message(self, entity_id: str, name: str, key: str, payload: Any) -> tuple[EffectRecord, bool]:
        """Record message ``name`` for the entity once per ``key`` (its ledger row
        ``fsm:msg:{name}:{key}``, no lease needed), then :meth:`wake` it; returns the row
        and whether this call recorded it (``False``: that key was sent before)."""
        ...

    def wake(self, entity_id: str) -> bool:
        """Make a parked entity (no owner, due later) due now and wake its lifecycle's
        workers; ``False`` when it was not parked."""
        ...


@runtime_checkable
class TimerTimes(Protocol):
    """An optional store capability: when the next timed transition falls due.

    A reaper sleeps until the earliest timer rather than a whole interval.  The memory and
    SQL stores and their async faces have it (SQL: one range of the timer index per
    ``(state, after)``, its first row)."""

    def next_timer(self, kind: str, timers: Sequence[tuple[str, timedelta]]) -> float | None:
        """Seconds until the earliest timer of ``kind`` that is not due yet: over each
        ``(state, after)`` pair, the live entities in ``state`` whose clock
        (``timer_since``) has run less than ``after``; ``None`` when there is none.  Timers
        already due are not counted (a guard may keep them from firing)."""
        ...


@runtime_checkable
class DueTimes(Protocol):
    """An optional store capability: when the next row waiting out its due time is due.

    A row requeued with a backoff (a retry) becomes claimable by the clock alone, with
    no write to send a wake-up; a drained worker sleeps no longer than this says.  The
    memory and SQL stores and their async faces have it."""

    def next_due(self, kind: str, states: Sequence[str]) -> float | None:
        """Seconds from the store's now until the earliest live row of ``kind`` in one of
        ``states`` whose ``run_after`` is still ahead becomes due; ``None`` when there is
        none.  A read: nothing changes.  Bad arguments raise ``InvalidArgument``."""
        ...


@runtime_checkable
class BriefMoves(Protocol):
    """An optional store capability: the reaper's claim without snapshots.

    A store whose *class* defines it lets the reaper move a page of candidates without
    decoding the moved rows when nobody listens to the transition signals (which carry
    full snapshots); the reaper calls :meth:`Store.move_candidates` otherwise, and on any
    store without it.
    """

    def move_candidates_brief(self, batch: BatchWrite, *, limit: int) -> list[HistoryRecord]:
        """:meth:`Store.move_candidates` exactly (the same candidates, moves, history rows
        and declared data changes, in one transaction), returning only the history rows
        of the moved entities (``seq`` is each one's new version, ``lease_token`` its new
        token)."""
        ...


def unchecked_apply(store: object) -> Callable[[TransitionWrite], tuple[Snapshot, HistoryRecord]] | None:
    """The store's ``apply_checked``, for a caller whose writes were already checked with
    :func:`fsm.limits.check_transition_write`'s rules (the engine builds its writes from
    arguments it checked with the same limits), or None.

    Only a store class whose ``apply`` is the one written beside its ``apply_checked`` (it
    checks the write, then calls ``apply_checked``) qualifies: a subclass that overrides
    ``apply``, or a wrapper around a store, gets its ``apply`` called as always."""
    cls = type(store)
    owner = next((k for k in cls.__mro__ if "apply_checked" in vars(k)), None)
    if owner is None or getattr(cls, "apply", None) is not vars(owner).get("apply"):
        return None
    checked: Callable[[TransitionWrite], tuple[Snapshot, HistoryRecord]] = store.apply_checked  # type: ignore[attr-defined]
    return checked


def unchecked_apply_many(
    store: object,
) -> Callable[[Sequence[TransitionWrite]], list[tuple[Snapshot, HistoryRecord] | FsmError]] | None:
    """The store's ``apply_many_checked`` (writes checked as :func:`unchecked_apply`'s are),
    or None; the same rule as :func:`unchecked_apply`."""
    cls = type(store)
    owner = next((k for k in cls.__mro__ if "apply_many_checked" in vars(k)), None)
    if owner is None or getattr(cls, "apply_many", None) is not vars(owner).get("apply_many"):
        return None
    checked: Callable[[Sequence[TransitionWrite]], list[tuple[Snapshot, HistoryRecord] | FsmError]] = (
        store.apply_many_checked  # type: ignore[attr-defined]
    )
    return checked


def unchecked_create_many(store: object) -> Callable[[Sequence[NewEntity]], list[Snapshot]] | None:
    """The store's ``create_many_checked``, for a caller whose batch was already checked
    with :func:`fsm.limits.check_new_entities`' rules (the engine validates every item with
    the same limits), or None; the same rule as :func:`unchecked_apply`."""
    cls = type(store)
    owner = next((k for k in cls.__mro__ if "create_many_checked" in vars(k)), None)
    if owner is None or getattr(cls, "create_many", None) is not vars(owner).get("create_many"):
        return None
    checked: Callable[[Sequence[NewEntity]], list[Snapshot]] = store.create_many_checked  # type: ignore[attr-defined]
    return checked


__all__ = ["BriefMoves", "Store", "WorkNotices", "unchecked_apply", "unchecked_apply_many", "unchecked_create_many"]
