"""An in-process store with the semantics of the SQL stores.

Thread-safe: one lock serialises every write, and each guard is re-checked under that lock
(the commit point) against the injected clock, exactly where a SQL store re-checks it in
the ``WHERE`` clause.  Nothing survives the process: use it for tests and embedding.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from fsm.clock import Clock, SystemClock, read_clock
from fsm.errors import (
    ActiveDuplicate,
    ConditionFailed,
    ConfigError,
    EntityExists,
    FsmError,
    IdempotencyKeyReused,
    InvalidArgument,
    LeaseLost,
    StaleVersion,
    UnknownEntity,
)
from fsm.id_write import IdWrite, check_id_write
from fsm.limits import (
    check_batch_write,
    check_chain,
    check_children_args,
    check_claim_request,
    check_create_chains,
    check_effect_args,
    check_group,
    check_id,
    check_int,
    check_lease_args,
    check_listing,
    check_message_args,
    check_new_entities,
    check_new_entity,
    check_page,
    check_park_args,
    check_renewals,
    check_slots_args,
    check_store_ttl,
    check_timers,
    check_transition_write,
    check_transition_writes,
)
from fsm.records import (
    EFFECT_MESSAGE,
    EFFECT_RENEWALS,
    PARKED_KEY,
    RENEWALS_KEY,
    BatchWrite,
    ClaimLimits,
    ClaimRequest,
    ClaimStart,
    Condition,
    EffectRecord,
    FeedEntry,
    HeldBy,
    HistoryRecord,
    Lease,
    LeaseChange,
    LeaseRenewal,
    NewEntity,
    NewerSibling,
    Snapshot,
    TimerMode,
    TransitionWrite,
    apply_changes,
    condition_holds,
)
from stores.feed import counter, feed_args
from stores.gate import ALL, ClaimGate
from stores.ledger import (
    LedgerRun,
    appended_log,
    check_effect_key,
    json_result,
    message_key,
    message_result,
    renewal_entry,
    renewals_of,
)
from stores.notices import LocalNotices, channel
from stores.retention import MemoryRetention

_tuple_new = tuple.__new__
"""Builds a NamedTuple from a tuple of its fields without its generated ``__new__``."""


class MemoryStore(LedgerRun, MemoryRetention):
    """A :class:`stores.Store` kept in dictionaries, guarded by one lock."""

    def __init__(self, clock: Clock | None = None) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigError(f"clock must be a Clock (with a now() method), not {clock!r}")
        self.clock: Clock = clock or SystemClock()
        # re-entrant: a claim starts entities through apply and acquire_lease under it
        self._lock = threading.RLock()
        self._notices = LocalNotices()
        self._effects: dict[str, dict[str, EffectRecord]] = {}
        self._rows: dict[str, Snapshot] = {}
        self._history: dict[str, list[HistoryRecord]] = {}
        self._keys: dict[tuple[str, str], HistoryRecord] = {}
        self._feed: list[tuple[str, HistoryRecord]] = []  # every history row in commit order
        self._by_concurrency_key: dict[tuple[str, str], list[str]] = {}
        self._starts: dict[tuple[str, str], deque[datetime]] = {}  # (kind, key): the starts a rate limit counts

    def now(self) -> datetime:
        """The clock's time, checked (:func:`fsm.clock.read_clock`): a clock returning
        ``None`` or a naive datetime is a ``ConfigError`` before anything is written."""
        clock = self.clock
        if clock.__class__ is SystemClock:  # the wall clock itself: aware UTC, two calls fewer per write
            return datetime.now(UTC)
        return read_clock(clock)

    # -- reads ---------------------------------------------------------------------------

    def _live(self, entity_id: str) -> Snapshot:
        row = self._rows.get(entity_id)
        if row is None or row.deleted:
            raise UnknownEntity(entity_id)
        return row

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:
        row = self._rows.get(check_id("entity id", entity_id))
        if row is None or (row.deleted and not include_deleted):
            raise UnknownEntity(entity_id)
        return row

    def history(self, entity_id: str) -> list[HistoryRecord]:
        if check_id("entity id", entity_id) not in self._rows:
            raise UnknownEntity(entity_id)
        with self._lock:
            return list(self._history[entity_id])

    def find_transition(self, entity_id: str, idempotency_key: str) -> HistoryRecord | None:
        return self._keys.get((check_id("entity id", entity_id), check_id("idempotency_key", idempotency_key)))

    def has_newer_sibling(self, entity_id: str) -> bool:
        check_id("entity id", entity_id)
        with self._lock:
            return self._newer_sibling(self._live(entity_id))

    def _newer_sibling(self, row: Snapshot) -> bool:
        if row.concurrency_key is None:
            return False
        for other_id in self._by_concurrency_key.get((row.kind, row.concurrency_key), ()):
            other = self._rows[other_id]
            if (
                other_id != row.id
                and not other.deleted
                and other.state == row.state
                and (other.created_at, other.id) > (row.created_at, row.id)
            ):
                return True
        return False

    # -- writes --------------------------------------------------------------------------

    def create(self, entity: NewEntity) -> Snapshot:
        made = self._insert(entity)
        self._notices.notify(channel("", entity.kind))
        return made

    def _insert(self, entity: NewEntity, *, checked: bool = False) -> Snapshot:
        if not checked:
            check_new_entity(entity)
        if entity.columns:
            raise InvalidArgument("the memory store has no application table: it takes no columns")
        with self._lock:
            if entity.id in self._rows:
                raise EntityExists(entity.id)
            if entity.unique_finals is not None:
                active = self._active_duplicate(entity)
                if active is not None:
                    raise ActiveDuplicate(entity.id, key=str(entity.concurrency_key), existing=active)
            now = self.now()
            row = Snapshot(
                id=entity.id,
                kind=entity.kind,
                state=entity.state,
                version=0,
                lease_owner=None,
                lease_token=0,
                lease_expires_at=None,
                state_entered_at=now,
                created_at=now,
                updated_at=now,
                concurrency_key=entity.concurrency_key,
                data=copy.deepcopy(entity.data),
                run_after=due_time(entity.run_after, now),
                timer_since=now if entity.arm_timer else None,
                priority=entity.priority,
                parent_id=entity.parent_id,
                definition=entity.definition,
            )
            self._rows[entity.id] = row
            self._history[entity.id] = []
            if entity.concurrency_key is not None:
                self._by_concurrency_key.setdefault((entity.kind, entity.concurrency_key), []).append(entity.id)
            return row

    def _active_duplicate(self, entity: NewEntity) -> str | None:
        """The id of a live entity of ``entity``'s kind and key in a state that is not final."""
        finals = set(entity.unique_finals or ())
        for other_id in self._by_concurrency_key.get((entity.kind, str(entity.concurrency_key)), []):
            other = self._rows.get(other_id)
            if other is not None and not other.deleted and other.state not in finals:
                return other_id
        return None

    def create_many(self, entities: Sequence[NewEntity]) -> list[Snapshot]:
        """See :meth:`stores.Store.create_many`: every id checked under the lock first,
        so a conflict writes nothing."""
        return self.create_many_checked(check_new_entities(entities))

    def create_many_checked(self, batch: Sequence[NewEntity]) -> list[Snapshot]:
        """:meth:`create_many` of a batch already checked (see ``stores.base.unchecked_create_many``)."""
        if any(e.columns for e in batch):
            raise InvalidArgument("the memory store has no application table: it takes no columns")
        with self._lock:
            keys: dict[tuple[str, str], str] = {}
            for entity in batch:
                if entity.id in self._rows:
                    raise EntityExists(entity.id)
                if entity.unique_finals is not None:  # all or nothing: judged before any insert
                    key = (entity.kind, str(entity.concurrency_key))
                    active = keys.get(key) or self._active_duplicate(entity)
                    if active is not None:
                        raise ActiveDuplicate(entity.id, key=key[1], existing=active)
                    keys[key] = entity.id
            made = [self._insert(entity, checked=True) for entity in batch]
        for kind in {e.kind for e in batch}:
            self._notices.notify(channel("", kind))
        return made

    # -- wake-ups (stores.base.WorkNotices) ----------------------------------------------------

    def subscribe_work(self, kind: str, callback: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`stores.base.WorkNotices.subscribe_work`: this store's own subscribers."""
        return self._notices.subscribe(channel("", check_id("kind", kind)), callback)

    def notify_work(self, kind: str) -> None:
        """See :meth:`stores.base.WorkNotices.notify_work`."""
        self._notices.notify(channel("", check_id("kind", kind)))

    def next_due(self, kind: str, states: Sequence[str]) -> float | None:
        """See :meth:`stores.base.DueTimes.next_due`."""
        check_id("kind", kind)
        if not isinstance(states, list | tuple) or not 1 <= len(states) <= 32:
            raise InvalidArgument(f"states must be a list of 1 to 32 state names, not {states!r}")
        wanted = {check_id("state", state) for state in states}
        with self._lock:
            now = self.now()
            first = min(
                (
                    r.run_after
                    for r in self._rows.values()
                    if r.kind == kind
                    and not r.deleted
                    and r.state in wanted
                    and r.run_after is not None
                    and r.run_after > now
                ),
                default=None,
            )
        return None if first is None else (first - now).total_seconds()

    def next_timer(self, kind: str, timers: Sequence[tuple[str, timedelta]]) -> float | None:
        """See :meth:`stores.base.TimerTimes.next_timer`."""
        pairs = check_timers(kind, timers)
        with self._lock:
            now = self.now()
            first = min(
                (
                    r.timer_since + after
                    for state, after in pairs
                    for r in self._rows.values()
                    if r.kind == kind
                    and not r.deleted
                    and r.state == state
                    and r.timer_since is not None
                    and r.timer_since + after > now
                ),
                default=None,
            )
        return None if first is None else (first - now).total_seconds()

    def apply(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        check_transition_write(write)
        return self.apply_checked(write)

    def apply_checked(self, write: TransitionWrite) -> tuple[Snapshot, HistoryRecord]:
        """:meth:`apply` for a write already checked by ``fsm.limits.check_transition_write``'s
        rules: the engine builds its writes from arguments it checked with the same limits,
        so on the in-memory hot path the store does not check them a second time."""
        entity_id = write.entity_id
        with self._lock:
            row = self._rows.get(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            key = write.idempotency_key
            if key is not None:
                recorded = self._keys.get((entity_id, key))
                if recorded is not None:
                    raise IdempotencyKeyReused(entity_id, key=key, recorded_event=recorded.event, event=write.event)
            if row.version != write.expect_version:
                raise StaleVersion(entity_id, expected=write.expect_version, found=row.version)
            if write.expect_token is not None and (
                row.lease_token != write.expect_token or row.lease_owner != write.expect_owner
            ):
                raise LeaseLost(
                    entity_id, expected_token=write.expect_token, found_token=row.lease_token, owner=write.expect_owner
                )
            now = self.now()
            for condition in write.require:
                if not self._holds(condition, row, now):
                    raise ConditionFailed(entity_id, condition=condition.name)
            return self._move(row, write, now, write.data, write.data_patch, key)

    judges_by_id = True
    """The store judges a fire by id itself (:mod:`fsm.id_write`)."""

    def apply_by_id(self, write: IdWrite) -> tuple[Snapshot, HistoryRecord] | None:
        """The transition ``write`` on the row as it is, judged under the lock as the SQL
        stores judge it in their statement (:meth:`IdWrite.target_for`): the new snapshot and
        history row, or ``None`` if the row does not qualify (nothing written)."""
        return self.apply_by_id_checked(check_id_write(write))

    def apply_by_id_checked(self, write: IdWrite) -> tuple[Snapshot, HistoryRecord] | None:
        """:meth:`apply_by_id` of a write built from checked arguments (the engine's)."""
        with self._lock:
            row = self._rows.get(write.entity_id)
            target = None if row is None else write.target_for(row)
            if row is None or target is None:
                return None
            # the row and history row :meth:`_move` writes, without what a fire by id never
            # carries (data, patch, key, timer, definition, memory, restart).  Every in-memory
            # fire by id runs this, so it is inline and builds its tuples directly (a
            # NamedTuple's ``__new__`` is one more Python call each)
            clock = self.clock
            now = datetime.now(UTC) if clock.__class__ is SystemClock else read_clock(clock)
            entity_id = row.id
            owner, token, expires = row.lease_owner, row.lease_token, row.lease_expires_at
            change = write.lease_change
            if change is LeaseChange.ACQUIRE:
                owner, token = write.new_owner, token + 1
                ttl = write.lease_ttl
                expires = now + ttl if ttl is not None else None
            elif change is LeaseChange.CLEAR:
                owner, expires = None, None
            if write.bump_attempt:
                attempt, reclaims = row.attempt + 1, 0
            else:
                attempt, reclaims = row.attempt, row.reclaims + 1 if write.bump_reclaims else row.reclaims
            due = write.run_after
            if due is None:  # a due time ahead becomes now (stores.sql.dialect's due_now)
                due_at = row.run_after
                if due_at is not None and due_at > now:
                    due_at = now
            else:
                due_at = now + due
            version = row.version + 1
            new = _tuple_new(Snapshot, (
                entity_id, row.kind, target, version, owner, token, expires, now, row.created_at, now,
                False, row.concurrency_key, attempt, reclaims, row.data, due_at, row.timer_since,
                row.priority, row.parent_id, row.definition, row.memory,
            ))  # fmt: skip
            error = write.error
            if change is LeaseChange.ACQUIRE:
                history_owner = write.new_owner
            else:
                history_owner = write.expect_owner if write.holds else None
            record = _tuple_new(HistoryRecord, (
                entity_id, version, write.event, row.state, target, write.actor, token, write.reason, None,
                now, None, history_owner, None if error is None else copy.deepcopy(error),
            ))  # fmt: skip
            self._rows[entity_id] = new
            self._history[entity_id].append(record)
            self._feed.append((row.kind, record))
            return new, record

    def apply_many(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord] | FsmError]:
        """See :meth:`stores.Store.apply_many`: every write under the lock, in order."""
        return self.apply_many_checked(check_transition_writes(writes))

    def apply_many_checked(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord] | FsmError]:
        """:meth:`apply_many` of writes already checked (see ``stores.base.unchecked_apply``)."""
        results: list[tuple[Snapshot, HistoryRecord] | FsmError] = []
        with self._lock:
            for write in writes:
                try:
                    results.append(self.apply_checked(write))
                except FsmError as err:
                    results.append(err)
        return results

    def create_chains(
        self, items: Sequence[tuple[NewEntity, Sequence[TransitionWrite]]]
    ) -> list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]]:
        """See :meth:`stores.Store.create_chains`: under the lock, each entity created and its
        writes applied in order; a refusal removes every entity the call created (its row,
        history and feed entries)."""
        checked = check_create_chains(items)
        if any(e.columns for e, _ in checked):
            raise InvalidArgument("the memory store has no application table: it takes no columns")
        done: list[tuple[Snapshot, list[tuple[Snapshot, HistoryRecord]]]] = []
        with self._lock:
            feed = len(self._feed)
            made: list[NewEntity] = []
            try:
                for entity, writes in checked:
                    created = self.create(entity)
                    made.append(entity)
                    done.append((created, [self.apply_checked(w) for w in writes]))
            except BaseException:
                for entity, writes in checked[: len(made)]:
                    for write in writes:  # the entity is new: every key of its writes is the call's
                        if write.idempotency_key is not None:
                            self._keys.pop((entity.id, write.idempotency_key), None)
                for entity in made:
                    self._rows.pop(entity.id, None)
                    self._history.pop(entity.id, None)
                    if entity.concurrency_key is not None:
                        self._by_concurrency_key[(entity.kind, entity.concurrency_key)].remove(entity.id)
                del self._feed[feed:]
                raise
        return done

    def apply_group(
        self, writes: Sequence[TransitionWrite], creates: Sequence[NewEntity]
    ) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
        """See :meth:`stores.Store.apply_group`: under the lock, the writes in order, then the
        creates; a refusal restores every written row (its history, keys and the feed) and
        removes every created one."""
        checked, made = check_group(writes, creates)
        if any(e.columns for e in made):
            raise InvalidArgument("the memory store has no application table: it takes no columns")
        with self._lock:
            touched = {w.entity_id for w in checked}
            rows = {i: self._rows.get(i) for i in touched}
            history = {i: len(self._history.get(i, ())) for i in touched}
            keys = [(w.entity_id, w.idempotency_key) for w in checked if w.idempotency_key is not None]
            kept = {k: self._keys[k] for k in keys if k in self._keys}
            feed = len(self._feed)
            done: list[tuple[Snapshot, HistoryRecord]] = []
            created: list[Snapshot] = []
            try:
                for write in checked:
                    done.append(self.apply_checked(write))
                for entity in made:
                    created.append(self.create(entity))
            except BaseException:
                for entity in made[: len(created)]:
                    self._rows.pop(entity.id, None)
                    self._history.pop(entity.id, None)
                    if entity.concurrency_key is not None:
                        self._by_concurrency_key[(entity.kind, entity.concurrency_key)].remove(entity.id)
                for entity_id, row in rows.items():
                    if row is not None:
                        self._rows[entity_id] = row
                        del self._history[entity_id][history[entity_id] :]
                for k in keys:
                    if k in kept:
                        self._keys[k] = kept[k]
                    else:
                        self._keys.pop(k, None)
                del self._feed[feed:]
                raise
            return done, created

    def apply_chain(self, writes: Sequence[TransitionWrite]) -> list[tuple[Snapshot, HistoryRecord]]:
        """See :meth:`stores.Store.apply_chain`: every write under the lock, in order; a refusal
        undoes the ones before it (the row, its history, the feed and the idempotency key)."""
        checked = check_chain(writes)
        entity_id = checked[0].entity_id
        with self._lock:
            row = self._rows.get(entity_id)
            history = len(self._history.get(entity_id, ()))
            feed = len(self._feed)
            keys = [(entity_id, w.idempotency_key) for w in checked if w.idempotency_key is not None]
            kept = {k: self._keys[k] for k in keys if k in self._keys}
            done: list[tuple[Snapshot, HistoryRecord]] = []
            try:
                for write in checked:
                    done.append(self.apply_checked(write))
            except BaseException:
                if done and row is not None:
                    self._rows[entity_id] = row
                    del self._history[entity_id][history:]
                    del self._feed[feed:]
                    for k in keys:
                        if k in kept:
                            self._keys[k] = kept[k]
                        else:
                            self._keys.pop(k, None)
                raise
            return done

    def _holds(self, condition: Condition, row: Snapshot, now: datetime) -> bool:
        sibling = self._newer_sibling(row) if isinstance(condition, NewerSibling) else None
        other = self._rows.get(condition.entity_id) if isinstance(condition, HeldBy) else None
        return condition_holds(condition, row, now, sibling, other)

    def _move(
        self,
        row: Snapshot,
        write: TransitionWrite | BatchWrite | IdWrite,
        now: datetime,
        data: dict[str, Any] | None,
        patch: dict[str, Any] | None,
        key: str | None,
        target: str | None = None,
    ) -> tuple[Snapshot, HistoryRecord]:
        """Write the moved row and its history row (the caller holds the lock); ``target``:
        an :class:`IdWrite`'s, chosen by the row's state."""
        entity_id = row.id
        if target is None:
            target = write.target  # type: ignore[union-attr]
        owner, token, expires = row.lease_owner, row.lease_token, row.lease_expires_at
        change = write.lease_change
        if change is LeaseChange.ACQUIRE:
            owner, token = write.new_owner, token + 1
            expires = now + write.lease_ttl if write.lease_ttl is not None else None
        elif change is LeaseChange.CLEAR:
            owner, expires = None, None
        attempt = row.attempt + 1 if write.bump_attempt else row.attempt
        reclaims = 0 if write.bump_attempt else row.reclaims + (1 if write.bump_reclaims else 0)
        if write.restart:  # a region's row entering its parallel state again
            attempt = reclaims = 0
        version = row.version + 1
        # positional construction: the hot path of every in-memory transition.  A BatchWrite
        # and an IdWrite answer what they never set (None, KEEP) from class attributes
        due, error, timer = write.run_after, write.error, write.timer
        definition, memory = write.definition, write.memory
        since = row.timer_since if timer is TimerMode.KEEP else now if timer is TimerMode.ARM else None
        if due is None:  # a due time ahead becomes now (stores.sql.dialect's due_now)
            due_at = row.run_after
            if due_at is not None and due_at > now:
                due_at = now
        else:
            due_at = now + due
        new = Snapshot(
            entity_id, row.kind, target, version, owner, token, expires, now, row.created_at, now,
            False, row.concurrency_key, attempt, reclaims, row.data if data is None else data,
            due_at, since, row.priority, row.parent_id,
            row.definition if definition is None else definition,
            row.memory if memory is None else dict(memory),
        )  # fmt: skip
        record = HistoryRecord(
            entity_id, version, write.event, row.state, target, write.actor, token,
            write.reason, key, now, patch, None if isinstance(write, BatchWrite) else write.history_owner(),
            None if error is None else copy.deepcopy(error),
        )  # fmt: skip
        self._rows[entity_id] = new
        self._history[entity_id].append(record)
        self._feed.append((row.kind, record))
        if key is not None:
            self._keys[(entity_id, key)] = record
        return new, record

    # -- the reaper's set-based reads and writes ---------------------------------------------

    def candidates(
        self, kind: str, state: str, require: tuple[Condition, ...], *, limit: int, after_id: str | None = None
    ) -> list[Snapshot]:
        check_page(kind, state, limit, after_id)
        with self._lock:
            now = self.now()
            found = sorted(
                (
                    row
                    for row in self._rows.values()
                    if row.kind == kind
                    and row.state == state
                    and not row.deleted
                    and (after_id is None or row.id > after_id)
                    and all(self._holds(c, row, now) for c in require)
                ),
                key=lambda r: r.id,
            )
            return found[:limit]

    def apply_batch(self, batch: BatchWrite) -> list[tuple[Snapshot, HistoryRecord]]:
        check_batch_write(batch)
        moved: list[tuple[Snapshot, HistoryRecord]] = []
        with self._lock:
            now = self.now()
            for entity_id in batch.ids:
                row = self._rows.get(entity_id)
                if (
                    row is None
                    or row.deleted
                    or row.kind != batch.kind
                    or row.state != batch.source
                    or not all(self._holds(c, row, now) for c in batch.require)
                ):
                    continue  # a lost race: somebody moved, renewed or deleted it first
                data = apply_changes(batch.changes, row.data) if batch.changes else None
                moved.append(self._move(row, batch, now, data, None, None))
        return moved

    def move_candidates(self, batch: BatchWrite, *, limit: int) -> list[tuple[Snapshot, HistoryRecord]]:
        check_batch_write(batch)
        check_int("limit", limit, low=1, high=1_000_000)
        moved: list[tuple[Snapshot, HistoryRecord]] = []
        with self._lock:
            now = self.now()
            for row in list(self._rows.values()):
                if len(moved) >= limit:
                    break
                if (
                    row.kind == batch.kind
                    and row.state == batch.source
                    and not row.deleted
                    and all(self._holds(c, row, now) for c in batch.require)
                ):
                    data = apply_changes(batch.changes, row.data) if batch.changes else None
                    moved.append(self._move(row, batch, now, data, None, None))
        return moved

    def move_candidates_brief(self, batch: BatchWrite, *, limit: int) -> list[HistoryRecord]:
        """See :meth:`stores.base.BriefMoves.move_candidates_brief` (the snapshots are at
        hand here: this is :meth:`move_candidates` without them)."""
        return [record for _, record in self.move_candidates(batch, limit=limit)]

    @staticmethod
    def _capped_expiry(row: Snapshot, now: datetime, ttl: timedelta, budget: timedelta | None) -> datetime | None:
        """``min(now + ttl, state_entered_at + budget)``, or ``None`` when the budget is spent."""
        expires = now + ttl
        if budget is not None:
            deadline = row.budget_since + budget
            if now >= deadline:
                return None
            expires = min(expires, deadline)
        return expires

    def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        check_lease_args(entity_id, owner, ttl=check_store_ttl(ttl), budget=budget)
        check_int("expect_version", expect_version)
        with self._lock:
            row = self._live(entity_id)
            if row.version != expect_version:
                raise StaleVersion(entity_id, expected=expect_version, found=row.version)
            now = self.now()
            if row.lease_owner is not None and row.lease_expires_at is not None and row.lease_expires_at >= now:
                raise LeaseLost(
                    entity_id,
                    expected_token=None,
                    found_token=row.lease_token,
                    owner=owner,
                    detail=f"held by {row.lease_owner} until {row.lease_expires_at.isoformat()}",
                )
            expires = self._capped_expiry(row, now, ttl, budget)
            if expires is None:
                raise LeaseLost(
                    entity_id,
                    expected_token=None,
                    found_token=row.lease_token,
                    owner=owner,
                    detail=f"renewal budget of state {row.state!r} is spent",
                )
            new = _with_lease(row, owner, row.lease_token + 1, expires)
            self._rows[entity_id] = new
            self._log_renewal(new, now, acquired=True)
            return new

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        check_lease_args(entity_id, owner, token=check_int("token", token), ttl=check_store_ttl(ttl), budget=budget)
        with self._lock:
            row = self._live(entity_id)
            now = self.now()
            if row.lease_owner != owner or row.lease_token != token:
                raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)
            if row.lease_expires_at is None or row.lease_expires_at < now:
                raise LeaseLost(
                    entity_id,
                    expected_token=token,
                    found_token=row.lease_token,
                    owner=owner,
                    detail="the lease expired before the renewal",
                )
            expires = self._capped_expiry(row, now, ttl, budget)
            if expires is None:
                raise LeaseLost(
                    entity_id,
                    expected_token=token,
                    found_token=row.lease_token,
                    owner=owner,
                    detail=f"renewal budget of state {row.state!r} is spent",
                )
            new = _with_lease(row, owner, token, max(expires, row.lease_expires_at))
            self._rows[entity_id] = new
            self._log_renewal(new, now, acquired=False)
            return new

    def _log_renewal(self, snap: Snapshot, now: datetime, *, acquired: bool) -> None:
        """Append to the entity's renewal log (the caller holds the lock: the same commit)."""
        effects = self._effects.setdefault(snap.id, {})
        old = effects.get(RENEWALS_KEY)
        log = appended_log(None if old is None else old.result, renewal_entry(snap, now, acquired=acquired))
        attempts = 1 if old is None else old.attempts + 1
        token = snap.lease_token
        effects[RENEWALS_KEY] = EffectRecord(snap.id, RENEWALS_KEY, EFFECT_RENEWALS, token, attempts, log, now)

    def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        if check_id("entity id", entity_id) not in self._rows:
            raise UnknownEntity(entity_id)
        with self._lock:
            return renewals_of(entity_id, self._effects.get(entity_id, {}).get(RENEWALS_KEY))

    def renew_leases(
        self, leases: Sequence[Lease], *, ttl: timedelta, budgets: tuple[tuple[str, timedelta], ...] = ()
    ) -> list[Snapshot | FsmError]:
        """See :meth:`stores.Store.renew_leases`: each renewal under the lock, in order."""
        batch = check_renewals(leases, ttl, budgets)
        budget_of = dict(budgets)
        results: list[Snapshot | FsmError] = []
        with self._lock:
            for lease in batch:
                row = self._rows.get(lease.entity_id)
                try:
                    budget = None if row is None else budget_of.get(row.state)
                    results.append(
                        self.renew_lease(lease.entity_id, owner=lease.owner, token=lease.token, ttl=ttl, budget=budget)
                    )
                except FsmError as err:
                    results.append(err)
        return results

    def park(self, entity_id: str, *, owner: str, token: int, until: datetime) -> Snapshot:
        """See :meth:`stores.base.Waits.park`."""
        when = check_park_args(entity_id, owner, token, until)
        with self._lock:
            row = self._live(entity_id)
            if row.lease_owner != owner or row.lease_token != token:
                raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)
            new = _with_lease(row, None, token, None)._replace(run_after=when)
            self._rows[entity_id] = new
        self._notices.notify(channel("", new.kind))  # idle workers learn the new due time
        return new

    def send_message(self, entity_id: str, name: str, key: str, payload: Any) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.base.Waits.send_message`."""
        check_message_args(entity_id, name, key)
        stored = json_result(payload, "a message payload")
        ledger_key = message_key(name, key)
        with self._lock:
            row = self._live(entity_id)
            effects = self._effects.setdefault(entity_id, {})
            existing = effects.get(ledger_key)
            if existing is not None:
                return existing, False
            record = EffectRecord(
                entity_id, ledger_key, EFFECT_MESSAGE, row.lease_token, 1, message_result(name, key, stored), self.now()
            )
            effects[ledger_key] = record
        self.wake(entity_id)
        return record, True

    def wake(self, entity_id: str) -> bool:
        """See :meth:`stores.base.Waits.wake`."""
        check_id("entity id", entity_id)
        with self._lock:
            row = self._rows.get(entity_id)
            if row is None or row.deleted:
                return False
            now = self.now()
            if row.lease_owner is not None or row.run_after is None or row.run_after <= now:
                return False
            mark = self._effects.get(entity_id, {}).get(PARKED_KEY)
            if mark is None or mark.lease_token != row.lease_token:
                return False  # due later, but not parked (a create due later, a retry's backoff)
            self._rows[entity_id] = row._replace(run_after=now)
        self._notices.notify(channel("", row.kind))
        return True

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        check_lease_args(entity_id, owner, token=token)
        with self._lock:
            row = self._live(entity_id)
            if row.lease_owner != owner or row.lease_token != token:
                raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)
            new = _with_lease(row, None, token, None)
            self._rows[entity_id] = new
        self._notices.notify(channel("", new.kind))  # another worker may take it now
        return new

    def soft_delete(self, entity_id: str) -> Snapshot:
        check_id("entity id", entity_id)
        with self._lock:
            row = self._live(entity_id)
            new = row._replace(deleted=True, updated_at=self.now())
            self._rows[entity_id] = new
            return new

    # -- durable work: the effects ledger, claiming, listing ----------------------------------

    def effect(self, entity_id: str, key: str) -> EffectRecord | None:
        return self._effects.get(check_id("entity id", entity_id), {}).get(check_id("effect key", key))

    def effects(self, entity_id: str) -> list[EffectRecord]:
        if check_id("entity id", entity_id) not in self._rows:
            raise UnknownEntity(entity_id)
        with self._lock:
            return [r for k, r in sorted(self._effects.get(entity_id, {}).items()) if k != RENEWALS_KEY]

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
        check_effect_args(entity_id, key, owner, token, status)
        check_effect_key(key, steps=True)
        stored = json_result(result, "an effect result")
        with self._lock:
            row = self._live(entity_id)
            if row.lease_owner != owner or row.lease_token != token:
                raise LeaseLost(
                    entity_id,
                    expected_token=token,
                    found_token=row.lease_token,
                    owner=owner,
                    detail=f"the result of effect {key!r} was not recorded",
                )
            effects = self._effects.setdefault(entity_id, {})
            existing = effects.get(key)
            if existing is not None and existing.status not in replace:
                return existing, False
            attempts = 1 if existing is None else existing.attempts + 1
            record = EffectRecord(entity_id, key, status, token, attempts, stored, self.now())
            effects[key] = record
            return record, True

    def claim(self, request: ClaimRequest) -> list[Snapshot]:
        check_claim_request(request)
        starts = {s.source: s for s in request.starts}
        resumes = set(request.resumes)
        claimed: list[Snapshot] = []
        with self._lock:
            now = self.now()
            defn = request.definition
            due = [
                r
                for r in self._rows.values()
                if r.kind == request.kind
                and not r.deleted
                and (r.run_after is None or r.run_after <= now)
                and (r.state in starts or (r.state in resumes and r.lease_owner is None))
                and (defn is None or r.definition is None or r.definition <= defn)  # none a newer definition wrote
            ]
            gate = None if request.limits is None else self._gate(request.kind, request.limits, now)
            full = set(gate.full_keys()) if gate is not None else set()
            cut = None if request.starve_after is None else now - request.starve_after
            waiting: list[Snapshot] = []
            # the SQL stores' order: each state in the claim's order (resumes first: work
            # already under way), its starved row first, then the highest priority, then the
            # longest due; a full key's rows are stepped over before the starved row is chosen
            for state in [*request.resumes, *(s.source for s in request.starts if s.source not in resumes)]:
                rows = [
                    r for r in due if r.state == state and (r.concurrency_key is None or r.concurrency_key not in full)
                ]
                rows.sort(key=lambda r: (-r.priority, r.run_after or r.created_at, r.id))
                waiting += _starved_first(rows, cut) if cut is not None else rows
            for row in waiting:
                if len(claimed) >= request.limit:
                    break
                start = starts.get(row.state)
                if gate is not None and not gate.admit(row.concurrency_key, start is not None):
                    continue
                try:
                    if start is not None:
                        claimed.append(self._start(row, start, request))
                        if gate is not None:
                            self._started(request.kind, row.concurrency_key, gate.limits, now)
                    else:
                        budget = request.budget_for(row.state)
                        taken = self.acquire_lease(
                            row.id, owner=request.owner, ttl=request.ttl, budget=budget, expect_version=row.version
                        )
                        claimed.append(taken)
                except LeaseLost:
                    continue  # its budget is spent: the reaper will fail it
        return claimed

    def _gate(self, kind: str, limits: ClaimLimits, now: datetime) -> ClaimGate:
        """The counts a limited claim is judged by: live leases in the leased states, and
        the starts inside each rate window (older ones are forgotten here)."""
        held: dict[str, int] = {}
        held_all = 0
        leased = set(limits.leased)
        for r in self._rows.values():
            if (
                r.kind == kind
                and not r.deleted
                and r.state in leased
                and r.lease_expires_at is not None
                and r.lease_expires_at >= now
            ):
                held_all += 1
                if r.concurrency_key is not None:
                    held[r.concurrency_key] = held.get(r.concurrency_key, 0) + 1
        started: dict[str, int] = {}
        started_all = 0
        for (k, key), times in self._starts.items():
            if k != kind:
                continue
            period = limits.rate[1] if key == ALL and limits.rate else limits.key_rate[1] if limits.key_rate else None
            if period is None:
                continue
            while times and times[0] <= now - period:
                times.popleft()
            if key == ALL:
                started_all = len(times)
            else:
                started[key] = len(times)
        return ClaimGate(limits, held, held_all, started, started_all)

    def _started(self, kind: str, key: str | None, limits: ClaimLimits, now: datetime) -> None:
        """A start the claim's rates count: of the lifecycle, and of its key (the SQL
        stores' ``starts`` rows; nothing when no rate counts it)."""
        if limits.rate is not None:
            self._starts.setdefault((kind, ALL), deque()).append(now)
        if key is not None and limits.key_rate is not None:
            self._starts.setdefault((kind, key), deque()).append(now)

    def _start(self, row: Snapshot, start: ClaimStart, request: ClaimRequest) -> Snapshot:
        return self.apply(request.start_write(start, row.id, row.version))[0]

    def entities(
        self, kind: str, *, state: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Snapshot]:
        check_listing(kind, state, limit, after_id)
        with self._lock:
            found = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.kind == kind
                    and not r.deleted
                    and (state is None or r.state == state)
                    and (after_id is None or r.id > after_id)
                ),
                key=lambda r: r.id,
            )
        return found[:limit]

    def slots(self, kind: str, leased: Sequence[str], key: str | None = None) -> int:
        check_slots_args(kind, leased, key)
        with self._lock:
            gate = self._gate(kind, ClaimLimits(leased=tuple(leased)), self.now())
        return gate.held_all if key is None else gate.held.get(key, 0)

    def children(self, parent_id: str, *, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        check_children_args(parent_id, limit, after_id)
        with self._lock:
            found = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.parent_id == parent_id and not r.deleted and (after_id is None or r.id > after_id)
                ),
                key=lambda r: r.id,
            )
        return found[:limit]

    def feed(self, after: str | None = None, *, kind: str | None = None, limit: int = 500) -> list[FeedEntry]:
        """See :meth:`stores.Store.feed`: positions ``m<n>``, the n-th history row written."""
        start = counter(feed_args(after, kind, limit, "m"), "m")
        found: list[FeedEntry] = []
        with self._lock:
            for index in range(start, len(self._feed)):
                entry_kind, record = self._feed[index]
                if entry_kind and (kind is None or entry_kind == kind):  # "": pruned (stores.retention)
                    found.append(FeedEntry(f"m{index + 1}", entry_kind, record))
                    if len(found) >= limit:
                        break
        return found

    def feed_head(self) -> str:
        """See :meth:`stores.Store.feed_head`."""
        with self._lock:
            return f"m{len(self._feed)}"

    def count_states(self, kind: str) -> dict[str, int]:
        check_id("kind", kind)
        counts: dict[str, int] = {}
        with self._lock:
            for r in self._rows.values():
                if r.kind == kind and not r.deleted:
                    counts[r.state] = counts.get(r.state, 0) + 1
        return counts


def due_time(run_after: datetime | timedelta | None, now: datetime) -> datetime:
    """A new entity's due time: the time given, now plus the delay given, or now."""
    if run_after is None:
        return now
    return now + run_after if isinstance(run_after, timedelta) else run_after


def _with_lease(row: Snapshot, owner: str | None, token: int, expires: datetime | None) -> Snapshot:
    return row._replace(lease_owner=owner, lease_token=token, lease_expires_at=expires)


__all__ = ["MemoryStore"]


def _starved_first(rows: list[Snapshot], cut: datetime) -> list[Snapshot]:
    """One state's rows in the claim's order with the row due the longest first when it has
    been due since ``cut`` or earlier (priorities' starvation rule)."""
    if not rows:
        return rows
    oldest = min(rows, key=lambda r: (r.run_after or r.created_at, r.id))
    if (oldest.run_after or oldest.created_at) > cut:
        return rows
    return [oldest, *(r for r in rows if r is not oldest)]
