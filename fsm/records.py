r"""The data model: what a store keeps and what an engine asks it to write.

This module imports nothing of the framework's, so ``stores`` and ``signals`` can build on
it without pulling in lifecycles or the engine.  Stored records (snapshots, leases,
history rows) are ``NamedTuple``\ s: immutable like a frozen dataclass but built ten times
faster, which matters on a hot path that builds two of them per transition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple


class Actor(StrEnum):
    """Who may fire a transition: the worker that owns the entity, or the reaper."""

    WORKER = "worker"
    REAPER = "reaper"


class LeaseChange(StrEnum):
    """What a transition does to the entity's lease."""

    KEEP = "keep"
    """Leave owner, token and expiry as they are."""
    ACQUIRE = "acquire"
    """A new owner takes the lease: token + 1, expiry = store now + lease TTL."""
    CLEAR = "clear"
    """Drop owner and expiry (the token stays, so the next acquire still increments it)."""


class TimerMode(StrEnum):
    """What a state-changing write does to the entity's timer clock (``timer_since``).

    A lifecycle with timed transitions (``reaper(..., after=...)``) has at most one *timed
    state* on each leaf's path; ``timer_since`` is when the entity entered it.  Each branch
    knows at compile time whether it enters that state (``ARM``: now), stays inside it
    (``KEEP``: a move between the children of a timed compound state does not restart its
    timers) or leaves every timed state (``CLEAR``).  Lifecycles without timers always keep
    (the column stays NULL and no statement writes it)."""

    KEEP = "keep"
    ARM = "arm"
    CLEAR = "clear"


class Lease(NamedTuple):
    """A lease held on an entity: the holder's proof, checked by every write it makes.

    ``token`` is a fencing token: every takeover increments it, so a write carrying an old
    token is refused even if the old holder still believes it owns the entity.
    """

    entity_id: str
    owner: str
    token: int
    expires_at: datetime

    def is_fresh(self, now: datetime) -> bool:
        return self.expires_at >= now


class Snapshot(NamedTuple):
    """One entity as stored: its leaf state, version, lease and data.

    ``state`` is the *leaf* state id (``running``, ``finalizing``...); the lifecycle rebuilds
    the full configuration (``active`` + ``finalizing``) from it.
    """

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
    deleted: bool = False
    concurrency_key: str | None = None
    attempt: int = 0
    reclaims: int = 0
    data: dict[str, Any] = {}
    run_after: datetime | None = None
    """When the entity is due: a claim takes it no earlier, and takes due entities in this
    order.  Set at create (now, or ``run_after=``) and by a retry (now + its backoff); a
    requeue or a release keeps it, so the entity keeps its place in the line."""
    timer_since: datetime | None = None
    """When the entity entered its timed state (the state whose ``after=`` transitions
    count), or ``None`` when it is in none: a timer of ``after`` is due at
    ``timer_since + after``."""
    priority: int = 0
    """Claims take higher priorities first, then the longest due (set at create, never
    changed: see :data:`fsm.records.MIN_PRIORITY`)."""
    parent_id: str | None = None
    """The entity that started this one as its child (``job.start_child``), or ``None``."""
    definition: int | None = None
    """The version of the lifecycle definition the row was created or last migrated under
    (the shape of its state and data); ``None`` for rows written before versions were
    recorded.  A claim of definition ``n`` takes only rows at ``n`` or below (or ``None``);
    claims and transitions leave it as it is."""
    memory: dict[str, str] | None = None
    """History memory (:mod:`fsm.history`): for each compound state with a history state
    that the entity has left, the leaf it was in when it left; ``None`` when it has left
    none.  Entering the compound's history state restores from it."""

    @property
    def lease(self) -> Lease | None:
        """The current lease, or ``None`` when nobody holds one."""
        if self.lease_owner is None or self.lease_expires_at is None:
            return None
        return Lease(self.id, self.lease_owner, self.lease_token, self.lease_expires_at)

    def lease_is_stale(self, now: datetime, stale_after: timedelta) -> bool:
        """The reaper's predicate: the lease expired, or there is none and the entity has
        not been updated for ``stale_after`` (a NULL lease never makes a row unreapable)
        nor been due for that long (a parked entity is not idle before it is due)."""
        if self.lease_expires_at is not None:
            return self.lease_expires_at < now
        return self.idle_before(now - stale_after)

    def idle_before(self, cut: datetime) -> bool:
        """Last moved before ``cut``, and not due since then: an entity parked by a durable
        sleep or wait (due later, no owner) is neither dead nor waiting for a worker."""
        return self.updated_at < cut and (self.run_after is None or self.run_after < cut)

    @property
    def budget_since(self) -> datetime:
        """When the renewal budget of the entity's state counts from: entering the state,
        or, once parked in it, the due time it wakes at."""
        due = self.run_after
        return due if due is not None and due > self.state_entered_at else self.state_entered_at


class HistoryRecord(NamedTuple):
    """One committed transition; ``seq`` equals the entity's version after it (I6)."""

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
    data: dict[str, Any] | None = None
    owner: str | None = None
    """The lease owner the transition was made by or for (``lease_token``'s owner): the
    holder firing it, or the worker a claim started it for; ``None`` for the reaper."""
    error: dict[str, Any] | None = None
    """The handler error this transition records (a retry, or a failure once the attempts
    are spent): ``{"type", "message", "traceback", "attempt"}``, see :func:`error_record`."""


class FeedEntry(NamedTuple):
    """One committed transition as the feed (``Store.feed``, ``Engine.watch``) tells it.

    ``position`` is an opaque cursor: hand it back as ``after`` to resume just after this
    entry (an SSE bridge sends it as the event's ``id``; the browser returns it as
    ``Last-Event-ID``).  Positions are ordered per store; compare them only through the store."""

    position: str
    kind: str
    record: HistoryRecord


class EffectRecord(NamedTuple):
    """The recorded outcome of one side effect, at most one per ``(entity_id, key)`` (I4).

    ``status`` is ``"succeeded"`` (``result`` is the JSON result) or ``"failed"``
    (``result`` is ``{"error": {"type": ..., "message": ...}}``).  ``lease_token`` is the
    token of the holder that recorded it; ``attempts`` counts the recorded executions (a
    failed effect retried by a later owner records again).
    """

    entity_id: str
    key: str
    status: str
    lease_token: int | None
    attempts: int
    result: Any
    recorded_at: datetime | None


EFFECT_SUCCEEDED = "succeeded"
EFFECT_FAILED = "failed"
EFFECT_PROGRESS = "progress"
RESERVED_KEY_PREFIX = "fsm:"
"""Ledger keys starting with this are the framework's own rows, never a user's effect."""
STEP_KEY_PREFIX = "fsm:step:"
"""Ledger rows of a handler's durable steps (a sleep's wake time, a wait's outcome): the
framework records them under the holder's lease, as any effect."""
PARKED_KEY = "fsm:step:parked"
"""The ledger row a park writes under the holder's lease (its token): an entity is parked
while this row's token is the entity's (a claim that resumes it takes token + 1); only a
parked entity is woken by a message."""
MESSAGE_KEY_PREFIX = "fsm:msg:"
"""Ledger rows of messages sent to an entity (``fsm:msg:{name}:{idempotency key}``), status
:data:`EFFECT_MESSAGE`: written without a lease, one per key."""
EFFECT_MESSAGE = "message"
PROGRESS_KEY = "fsm:progress"
"""The ledger row that carries a keeper's progress details (its status is ``progress``);
user effect keys may not start with ``fsm:``."""
EFFECT_RENEWALS = "renewals"
RENEWALS_KEY = "fsm:renewals"
"""The ledger row that logs an entity's recent lease renewals (its status is ``renewals``,
its ``result`` the JSON list of :class:`LeaseRenewal` entries, oldest first, its
``attempts`` how many were ever recorded).  Written by the store in the renewal's own
transaction; not an effect: ``effects()`` leaves it out and ``renewals()`` reads it."""
RENEWALS_KEPT = 50
"""How many renewals the log keeps per entity: the newest, so a job that renews for days
keeps one bounded row (about 6 KB of JSON) however long it runs."""


class LeaseRenewal(NamedTuple):
    """One successful lease renewal (or a lease taken outside a transition, ``acquired``),
    as the store logged it in the same transaction: when (store clock), the expiry it set,
    and whose lease it was.  A refused renewal logs nothing."""

    at: datetime
    expires_at: datetime
    owner: str
    token: int
    acquired: bool = False


MIN_PRIORITY = -100
"""The lowest claim priority (a create's ``priority=``)."""
MAX_PRIORITY = 100
"""The highest claim priority; the default is 0, and a claim takes higher first."""
MAX_DEFINITION = 2**31 - 1
"""The largest lifecycle definition version a store records (a 32-bit integer column);
the smallest is 1."""


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """What a claim may take, counted in the store across every claimer (see
    :class:`fsm.Limits`, which a lifecycle or a worker declares).

    ``per_key``: at most this many entities with one ``concurrency_key`` hold a live lease
    at once; ``total``: at most this many of the lifecycle; ``rate`` and ``key_rate``: at
    most ``count`` starts per ``period`` (sliding), of the lifecycle and per key.  A slot is
    a live lease (``lease_expires_at >= now``, as a holder's write sees it) in one of ``leased`` (the states a lease is
    held in): a parked entity holds none, and a dead worker's slot frees with its lease."""

    leased: tuple[str, ...]
    per_key: int | None = None
    total: int | None = None
    rate: tuple[int, timedelta] | None = None
    key_rate: tuple[int, timedelta] | None = None

    @property
    def keyed(self) -> bool:
        """Whether anything is counted per key."""
        return self.per_key is not None or self.key_rate is not None


@dataclass(frozen=True, slots=True)
class ClaimStart:
    """How a claim starts an entity waiting in ``source``: the unguarded worker transition
    that takes the lease (``queued -> running`` for a job)."""

    source: str
    target: str
    event: str
    bump_attempt: bool = False
    timer: TimerMode = TimerMode.KEEP
    """What the start does to the timer clock (:class:`TimerMode`)."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What ``Store.claim`` needs: take up to ``limit`` of the oldest claimable entities of
    ``kind`` for ``owner``.

    Claimable: a live entity in a ``starts`` source state (it is started: one transition,
    history row, token + 1), or in a ``resumes`` state with no lease owner (a reclaimed
    finalizer: its lease is taken, token + 1, no transition).  Leases expire at
    ``now + ttl``, capped by the state's renewal ``budgets``.
    """

    kind: str
    owner: str
    limit: int
    ttl: timedelta
    starts: tuple[ClaimStart, ...] = ()
    resumes: tuple[str, ...] = ()
    budgets: tuple[tuple[str, timedelta], ...] = ()
    limits: ClaimLimits | None = None
    """Concurrency and rate limits the claim keeps (``None``: none)."""
    starve_after: timedelta | None = None
    """Priorities' answer to starvation: per state, the claim first takes one entity due
    for at least this long, whatever its priority (``None``: strictly by priority)."""
    definition: int | None = None
    """The claimer's lifecycle definition version: the claim takes only rows whose
    :attr:`Snapshot.definition` is ``None`` or at most this, so a worker never takes a row
    a newer definition created or migrated (the rows keep their own version).  ``None``:
    no such filter."""

    def budget_for(self, state: str) -> timedelta | None:
        return dict(self.budgets).get(state)

    def start_write(self, start: ClaimStart, entity_id: str, version: int) -> TransitionWrite:
        """The compare-and-set write that starts a claimed entity for :attr:`owner`: the
        same for every store, which only picks the rows and applies it."""
        return TransitionWrite(
            entity_id,
            start.event,
            start.source,
            start.target,
            "worker",
            version,
            lease_change=LeaseChange.ACQUIRE,
            new_owner=self.owner,
            lease_ttl=self.ttl,
            bump_attempt=start.bump_attempt,
            timer=start.timer,
        )


@dataclass(frozen=True, slots=True)
class NewEntity:
    """What ``Store.create`` needs; the store stamps times and version 0."""

    id: str
    kind: str
    state: str
    concurrency_key: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, Any] | None = None
    """Values of a bound application table's own columns (a ``NOT NULL`` column of its
    own); only a store bound to such a table takes them."""
    run_after: datetime | timedelta | None = None
    """When the entity becomes due: an aware time, a delay from the store's now, or
    ``None`` (due at once)."""
    arm_timer: bool = False
    """The initial state is timed: ``timer_since`` starts at the creation time."""
    unique_finals: tuple[str, ...] | None = None
    """Unique while active: create nothing while a live entity of this kind with the same
    ``concurrency_key`` is in a state other than these (the lifecycle's final states);
    ``None``: no such check."""
    priority: int = 0
    """Claims take higher priorities first (:data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`)."""
    parent_id: str | None = None
    """The entity that started this one as its child."""
    definition: int | None = None
    """The lifecycle definition version the entity is created under (stored as is; ``None``:
    not recorded)."""


# -- data changes a transition declares ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetItems:
    """A data change a transition declares, applied in the transition's own write (by the
    engine and by the reaper's batch alike): every item of the list ``data[key]`` whose
    ``field`` is one of ``when`` gets ``field = value``.

    ``SetItems("steps", "status", when=("running",), value="failed")`` fails a pipeline's
    running steps as the pipeline fails.  On a table bound with
    :class:`~stores.sql.ChildRows` under ``key``, the store updates the child rows.
    """

    key: str
    field: str
    when: tuple[Any, ...]
    value: Any

    def apply(self, data: dict[str, Any]) -> list[Any] | None:
        """The changed list, or ``None`` when no item matches (nothing to write)."""
        items = data.get(self.key)
        if not isinstance(items, list):
            return None
        out: list[Any] = []
        hit = False
        for item in items:
            if isinstance(item, dict) and item.get(self.field) in self.when:
                out.append({**item, self.field: self.value})
                hit = True
            else:
                out.append(item)
        return out if hit else None


DataChange = SetItems


def apply_changes(changes: tuple[DataChange, ...], data: dict[str, Any]) -> dict[str, Any] | None:
    """``data`` with every change applied, or ``None`` when none of them changes anything."""
    new: dict[str, Any] | None = None
    for change in changes:
        items = change.apply(data if new is None else new)
        if items is not None:
            new = {**(data if new is None else new), change.key: items}
    return new


# -- conditions a store re-checks at the commit point -------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseStale:
    """Holds when the lease expired (``lease_expires_at < now``), or when there is no lease
    and the entity was last updated before ``now - stale_after``."""

    stale_after: timedelta
    name: str = "lease_stale"


@dataclass(frozen=True, slots=True)
class NewerSibling:
    """Holds when another live entity of the same kind and concurrency key, in the same
    state, was created after this one (ties broken by id)."""

    name: str = "superseded"


@dataclass(frozen=True, slots=True)
class CounterBelow:
    """Holds when the row's ``counter`` (``attempt`` or ``reclaims``) is below ``limit``."""

    counter: str
    limit: int
    name: str = "counter_below"


@dataclass(frozen=True, slots=True)
class CounterAtLeast:
    """Holds when the row's ``counter`` (``attempt`` or ``reclaims``) is at least ``limit``."""

    counter: str
    limit: int
    name: str = "counter_at_least"


@dataclass(frozen=True, slots=True)
class NoLiveLease:
    """Holds when nobody holds a live lease on the row: no owner (a reclaimed or released
    entity), or a lease that expired.  A parallel state's exit or restart requires it of a
    region's row in ``finalizing`` (:mod:`fsm.regions`): a live finalizer is never cut off."""

    name: str = "no_live_lease"


@dataclass(frozen=True, slots=True)
class Owned:
    """Holds when the row has a lease owner (``held``) or has none (``not held``).

    A reaper rule that counts a *death* requires ``Owned(True)``: a reclaimed or released
    entity nobody has claimed yet has no owner, and waiting for a worker is not dying."""

    held: bool
    name: str = "owned"


@dataclass(frozen=True, slots=True)
class Unclaimed:
    """Holds when the row has no lease owner and was last moved (``updated_at``) before
    ``now - max_wait``: the backstop of an entity waiting, unowned, for a worker."""

    max_wait: timedelta
    name: str = "unclaimed"


@dataclass(frozen=True, slots=True)
class TimerDue:
    """Holds when the entity has been in its timed state for ``after``: ``timer_since`` is
    set and at most ``now - after`` (a timed transition's store-side re-check)."""

    after: timedelta
    name: str = "timer_due"


@dataclass(frozen=True, slots=True)
class HeldBy:
    """Holds when *another* entity, ``entity_id``, is leased to ``owner`` with ``token`` and
    the lease has not expired: a write made on behalf of that lease (a delayed fire's
    delivery) is fenced by it, in the same statement."""

    entity_id: str
    owner: str
    token: int
    name: str = "held_by"


Condition = (
    LeaseStale | NewerSibling | CounterBelow | CounterAtLeast | Owned | Unclaimed | TimerDue | HeldBy | NoLiveLease
)
COUNTERS = ("attempt", "reclaims")


@dataclass(slots=True)
class TransitionWrite:
    """One compare-and-set transition, as the engine hands it to a store.

    The store applies it atomically or not at all: it checks ``expect_version`` (not the
    state: running -> queued -> running must not let an old writer through), the holder's
    ``expect_owner``/``expect_token`` when set, and every condition in ``require`` against
    its own clock, then writes the new row and the history row in one commit.
    """

    entity_id: str
    event: str
    source: str
    target: str
    actor: str
    expect_version: int
    expect_owner: str | None = None
    expect_token: int | None = None
    require: tuple[Condition, ...] = ()
    lease_change: LeaseChange = LeaseChange.KEEP
    new_owner: str | None = None
    lease_ttl: timedelta | None = None
    bump_attempt: bool = False
    bump_reclaims: bool = False
    data: dict[str, Any] | None = None
    """The full new data, or ``None`` to keep the stored data."""
    data_patch: dict[str, Any] | None = None
    """What the caller changed, recorded in the history row."""
    reason: str | None = None
    idempotency_key: str | None = None
    before: Snapshot | None = None
    """The snapshot the write was judged on (at ``expect_version``), or ``None``.  A store
    may build the snapshot it returns from it and the columns the write changes instead of
    reading every column back: the version compare-and-set proves the others unchanged."""
    run_after: timedelta | None = None
    """Make the entity due this long after the store's now (a retry's backoff); ``None``
    keeps its due time."""
    error: dict[str, Any] | None = None
    """The handler error recorded in the history row (:attr:`HistoryRecord.error`)."""
    timer: TimerMode = TimerMode.KEEP
    """What the write does to the timer clock (:class:`TimerMode`)."""
    definition: int | None = None
    """The lifecycle definition version the write records on the row (a lifecycle
    migration's, or a claim's start); ``None`` keeps the row's."""
    memory: dict[str, str] | None = None
    """The entity's new history memory (:attr:`Snapshot.memory`), whole, when the
    transition leaves a compound state with a history state; ``None`` keeps the row's."""
    restart: bool = False
    """The row starts over: ``attempt`` and ``reclaims`` back to 0 (a region's row, when its
    parallel state is entered again: :mod:`fsm.regions`)."""

    def history_owner(self) -> str | None:
        """Whose lease the history row records: the new owner of a lease taken, else the holder."""
        return self.new_owner if self.lease_change is LeaseChange.ACQUIRE else self.expect_owner


@dataclass(slots=True)
class BatchWrite:
    """One transition applied to many entities at once (the reaper's set-based move).

    There is no expected version: the store re-checks, per row and inside the statement,
    that the row is live, of ``kind``, in ``source``, and meets every ``require``
    condition; rows that no longer qualify are left alone (lost races).  Each moved row
    gets version + 1 and its history row in the same commit.
    """

    ids: tuple[str, ...]
    kind: str
    event: str
    source: str
    target: str
    actor: str
    require: tuple[Condition, ...] = ()
    lease_change: LeaseChange = LeaseChange.KEEP
    new_owner: str | None = None
    lease_ttl: timedelta | None = None
    bump_attempt: bool = False
    bump_reclaims: bool = False
    reason: str | None = None
    changes: tuple[DataChange, ...] = ()
    """Data changes applied to each moved row in the same commit (see :class:`SetItems`)."""
    timer: TimerMode = TimerMode.KEEP
    """What the move does to the timer clock (:class:`TimerMode`)."""
    # what a set-based move never sets, read as a TransitionWrite's are (the memory store's
    # one code path for both): it keeps every due time, records no error, keeps the row's
    # definition version and history memory
    run_after: ClassVar[None] = None
    error: ClassVar[None] = None
    definition: ClassVar[None] = None
    memory: ClassVar[None] = None
    restart: ClassVar[bool] = False


def condition_holds(
    condition: Condition,
    row: Snapshot,
    now: datetime,
    newer_sibling: bool | None = None,
    other: Snapshot | None = None,
) -> bool:
    """Evaluate a condition on a row in Python (the memory store's commit point).

    ``newer_sibling`` is needed only for :class:`NewerSibling`, ``other`` (the row it
    names, ``None`` when there is none) only for :class:`HeldBy`.
    """
    if isinstance(condition, HeldBy):
        return (
            other is not None
            and not other.deleted
            and other.lease_owner == condition.owner
            and other.lease_token == condition.token
            and other.lease_expires_at is not None
            and other.lease_expires_at >= now
        )
    if isinstance(condition, LeaseStale):
        return row.lease_is_stale(now, condition.stale_after)
    if isinstance(condition, NewerSibling):
        return bool(newer_sibling)
    if isinstance(condition, CounterBelow):
        return int(getattr(row, condition.counter)) < condition.limit
    if isinstance(condition, Owned):
        return (row.lease_owner is not None) is condition.held
    if isinstance(condition, NoLiveLease):
        expires = row.lease_expires_at
        return row.lease_owner is None or (expires is not None and expires < now)
    if isinstance(condition, Unclaimed):
        return row.lease_owner is None and row.idle_before(now - condition.max_wait)
    if isinstance(condition, TimerDue):
        return row.timer_since is not None and row.timer_since <= now - condition.after
    return int(getattr(row, condition.counter)) >= condition.limit


MAX_TRACEBACK = 4000
"""Characters of a handler error's traceback kept in history (its end: the raising frames)."""
MAX_ERROR_MESSAGE = 2000


def error_record(err: BaseException, *, attempt: int, traceback_text: str | None = None) -> dict[str, Any]:
    """How a handler error is kept in history: its type, message (first
    :data:`MAX_ERROR_MESSAGE` characters) and the last :data:`MAX_TRACEBACK` characters of
    its traceback, and the attempt it ended (JSON, bounded whatever the error)."""
    import traceback

    text = traceback_text
    if text is None:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        message = str(err)
    except Exception:  # an error whose __str__ raises still gets recorded
        message = f"<{type(err).__qualname__}: unprintable>"
    return {
        "type": _storable(type(err).__qualname__),
        "message": _storable(message[:MAX_ERROR_MESSAGE]),
        "traceback": _storable(text[-MAX_TRACEBACK:]),
        "attempt": attempt,
    }


def _storable(text: str) -> str:
    """``text`` as every store keeps it: no NUL, no lone surrogate."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


__all__ = [
    "COUNTERS",
    "EFFECT_FAILED",
    "EFFECT_MESSAGE",
    "EFFECT_PROGRESS",
    "EFFECT_RENEWALS",
    "EFFECT_SUCCEEDED",
    "MAX_DEFINITION",
    "MAX_ERROR_MESSAGE",
    "MAX_PRIORITY",
    "MAX_TRACEBACK",
    "MESSAGE_KEY_PREFIX",
    "MIN_PRIORITY",
    "PARKED_KEY",
    "PROGRESS_KEY",
    "RENEWALS_KEPT",
    "RENEWALS_KEY",
    "RESERVED_KEY_PREFIX",
    "STEP_KEY_PREFIX",
    "Actor",
    "BatchWrite",
    "ClaimLimits",
    "ClaimRequest",
    "ClaimStart",
    "Condition",
    "CounterAtLeast",
    "CounterBelow",
    "DataChange",
    "EffectRecord",
    "FeedEntry",
    "HeldBy",
    "HistoryRecord",
    "Lease",
    "LeaseChange",
    "LeaseRenewal",
    "LeaseStale",
    "NewEntity",
    "NewerSibling",
    "NoLiveLease",
    "Owned",
    "SetItems",
    "Snapshot",
    "TimerDue",
    "TimerMode",
    "TransitionWrite",
    "Unclaimed",
    "apply_changes",
    "condition_holds",
    "error_record",
]
