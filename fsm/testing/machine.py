"""A hypothesis ``RuleBasedStateMachine`` for any lifecycle, with the reaper, a manual
clock, lease holders that die, pause and wake up, restarts, and the effects ledger.

::

    from fsm.testing import lifecycle_machine, sqlite_stores

    DeployMachine = lifecycle_machine(Deploy, sqlite_stores(), guard_data={"tests_green": ({"tests_passed": True},
                                                                                         {"tests_passed": False})})
    TestDeploy = DeployMachine.TestCase

What runs, step by step (hypothesis picks the order and shrinks a failure to the
shortest sequence):

- ``fire_<event>``: one rule per event, enabled only while some entity is in a state the
  event has a branch from; the actor (worker or reaper), the entity, the lease presented
  (the current holder's, a fenced holder's that ignores the news, or none) and a data
  patch (from the lifecycle's pydantic model, or ``guard_data`` hints) are drawn;
- ``fire_<region>__<event>``: the same for each event of each region of a parallel state
  (:mod:`fsm.regions`), fired on the region's own row through its engine; its holders
  renew, pause, die, run effects and are taken over like the entities' own;
- ``time_passes`` and ``lease_lapses``: the manual clock moves by a lease timing (or just
  past a lease nobody renews); on the way, live holders' keepers renew on schedule
  (``KeeperCore.renew()``, driven here instead of a thread)
  and the scheduled reaper ticks every ``reaper_interval``;
- ``second_reaper_ticks``: another reaper's tick at any moment;
- ``holder_stalls``: the seeds/002 story in one step (pause mid-step, lease lapses, maybe
  a takeover, wake up);
- ``holder_dies`` (its keeper stops renewing), ``holder_pauses`` (mid-step: a write it
  built, or an effect it started, is pending) and ``holder_wakes`` (the pending step
  lands first, then its keeper renews and learns whether it lost the lease);
- ``claim`` and ``take_expired_lease``: another worker takes the work;
- ``run_effect``: a holder in finalization runs a ledger effect;
- ``restart``: new store and engine objects over the same data; every holder dies;
- ``create_entity``: a new entity, so reaching a final state never ends the run.

After every step: I1 (checked at each reaper move), I2 (a tick leaves nothing reapable,
and ticks come every interval, so a dead holder's entity moves within TTL + interval),
I3 (no stale write or renewal wins), I4 (one recorded result per key, a replay never
re-executes, a late result is never recorded), I5, I6, every acknowledged fire is in
history, and a restore round trip; on every region's row too, and an entity joins its
parallel state's regions only once every one of them has ended.  Subclass to add
``@rule``\\ s and ``@invariant``\\ s.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fsm.clock import ManualClock
from fsm.engine import Engine
from fsm.engine.judge import choose
from fsm.engine.parallel import reserved_events
from fsm.engine.writes import write_for
from fsm.errors import Fenced, FsmError
from fsm.lifecycle import Lifecycle
from fsm.reaping import Reaper, ReaperConfig
from fsm.records import EFFECT_FAILED, EFFECT_SUCCEEDED, Actor, Lease, Snapshot, TransitionWrite
from fsm.regions import exit_event, join_event, region_row_id
from fsm.testing.checks import (
    acknowledged_problems,
    effect_problems,
    history_problems,
    restore_problems,
    succeeded,
)
from fsm.testing.stores import MemoryStores, StoreFactory
from fsm.testing.strategies import data_for, data_patches, lease_timings
from fsm.work.keeper import KeeperCore
from stores.base import Store

GuardData = Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]
"""Per user guard: a data patch that makes it true, and one that makes it false."""


class InvariantBroken(AssertionError):
    """An invariant the kit checks does not hold; the message names it (I1..I8)."""


@dataclass
class Holder:
    """A worker holding (or believing it holds) one entity's lease."""

    name: str
    core: KeeperCore
    next_renewal: datetime
    status: str = "alive"
    """alive, paused, dead (stopped renewing for good), fenced (learnt it lost the lease), done"""
    seen_state: str = ""
    pending: tuple[str, Any] | None = None
    died_at: datetime | None = None
    log: list[str] = field(default_factory=list)
    region: str | None = None
    """The region whose row it holds (:mod:`fsm.regions`), or ``None`` for an entity's own."""

    @property
    def lease(self) -> Lease:
        return self.core.held.lease

    @property
    def entity_id(self) -> str:
        return self.core.held.entity_id


class LifecycleMachine(RuleBasedStateMachine):
    """The base of every machine :func:`lifecycle_machine` builds; see the module doc."""

    lifecycle: ClassVar[type[Lifecycle]]
    stores: ClassVar[StoreFactory] = MemoryStores()
    reaper_interval: ClassVar[timedelta | None] = None
    """Between scheduled reaper ticks (default: half the lease TTL)."""
    reaper_batch_size: ClassVar[int] = 2
    max_entities: ClassVar[int] = 3
    concurrency_keys: ClassVar[tuple[str, ...]] = ("k",)
    effect_keys: ClassVar[tuple[str, ...]] = ("gate-1", "gate-2")
    guard_data: ClassVar[GuardData] = {}
    event_data: ClassVar[Mapping[str, st.SearchStrategy[Any]]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.store: Store = self.stores.open(self.clock)
        self.interval = self.reaper_interval or self.lifecycle.policy.lease_ttl / 2
        self._connect()
        self.next_tick = self.clock.now() + self.interval
        self.entities: list[str] = []
        self.snaps: dict[str, Snapshot] = {}
        self.holders: list[Holder] = []
        self.acks: dict[str, list[tuple[int, str]]] = {}
        self.executions: Counter[tuple[str, str]] = Counter()
        self.serial = 0
        self.joins: dict[str, int] = {}
        """Per entity, the joins of its regions seen in its history so far."""
        self.region_rows: dict[str, tuple[str, str, str]] = {}
        """Every region row an entity can have: its id -> (entity, parallel state, region)."""
        self.existing_rows: set[str] = set()
        """The region rows there are (an entity entered their parallel state), as of the
        last refresh: every step that can create one refreshes."""
        self._new_entity(None, None)

    # -- wiring ----------------------------------------------------------------------------

    def _connect(self) -> None:
        lc = self.lifecycle
        config = ReaperConfig(interval=self.interval, batch_size=self.reaper_batch_size)
        self.engine = Engine(lc, self.store, clock=self.clock, owner="kit-engine")
        self.reaper = Reaper(self.store, [lc], config, clock=self.clock, owner="reaper-1")
        self.second_reaper = Reaper(self.store, [lc], config, clock=self.clock, owner="reaper-2")
        self.region_engines = {
            region: self.engine.region(region) for regions in lc.table.parallel.values() for region in regions
        }

    def teardown(self) -> None:
        self.stores.close(self.store)

    def broken(self, message: str) -> None:
        raise InvariantBroken(message)

    def _refresh(self, *ids: str) -> None:
        if not ids:
            self._find_rows()
        for entity_id in ids or (*self.entities, *self.existing_rows):
            self.snaps[entity_id] = self.store.get(entity_id)

    def _find_rows(self) -> None:
        for row_id in self.region_rows.keys() - self.existing_rows:
            try:
                self.store.get(row_id)
            except FsmError:
                continue
            self.existing_rows.add(row_id)

    def _finals_of(self, entity_id: str) -> frozenset[str]:
        """The final states of an entity's lifecycle, or of a region row's region."""
        finals: frozenset[str] = self._lifecycle_of(self._region_of_row(entity_id)).table.finals
        return finals

    def _engine_of(self, region: str | None) -> Engine:
        return self.engine if region is None else self.region_engines[region]

    def _lifecycle_of(self, region: str | None) -> type[Lifecycle]:
        lifecycle: type[Lifecycle] = self._engine_of(region).lifecycle
        return lifecycle

    def _rows(self) -> dict[str, tuple[str, str, str]]:
        """Every region row there is: its id -> (entity, parallel state, region)."""
        return {i: self.region_rows[i] for i in sorted(self.existing_rows)}

    def _region_of_row(self, row_id: str) -> str | None:
        found = self.region_rows.get(row_id)
        return None if found is None else found[2]

    def _name(self) -> str:
        self.serial += 1
        return f"holder-{self.serial}"

    def _hold(self, snap: Snapshot, region: str | None = None) -> None:
        lease = snap.lease
        assert lease is not None
        core = KeeperCore(self._engine_of(region), lease)
        next_renewal = self.clock.now() + core_period(core)
        self.holders.append(Holder(lease.owner, core, next_renewal, seen_state=snap.state, region=region))

    def _current(self, snap: Snapshot, lease: Lease | None) -> bool:
        return lease is not None and snap.lease_owner == lease.owner and snap.lease_token == lease.token

    def _holders(self, *statuses: str) -> list[Holder]:
        return [h for h in self.holders if h.status in statuses]

    # -- entities --------------------------------------------------------------------------

    def _new_entity(self, data: dict[str, Any] | None, key: str | None) -> None:
        entity_id = f"e{len(self.entities)}"
        snap = self.engine.create(entity_id, data=data, concurrency_key=key)
        self.entities.append(entity_id)
        self.snaps[entity_id] = snap
        self.acks[entity_id] = []
        for parallel, regions in self.lifecycle.table.parallel.items():
            for region in regions:
                self.region_rows[region_row_id(entity_id, region)] = (entity_id, parallel, region)
        self._refresh()  # a lifecycle that starts in a parallel state created its rows

    @precondition(lambda self: len(self.entities) < self.max_entities)
    @rule(data=st.data())
    def create_entity(self, data: st.DataObject) -> None:
        model = self.lifecycle.data_model
        payload = data.draw(data_for(model), label="data") if model is not None else None
        key = data.draw(st.sampled_from([None, *self.concurrency_keys]), label="concurrency_key")
        self._new_entity(payload, key)

    # -- firing ----------------------------------------------------------------------------

    def _sources(self, event: str) -> list[str]:
        table = self.lifecycle.table
        return [i for i in self.entities if table.branches_for(self.snaps[i].state, event)]

    def _patch(
        self, event: str, data: st.DataObject, state: str, lifecycle: type[Lifecycle] | None = None
    ) -> dict[str, Any] | None:
        if event in self.event_data:
            drawn: dict[str, Any] | None = data.draw(self.event_data[event], label="data")
            return drawn
        hints: list[dict[str, Any] | None] = []
        table = (lifecycle or self.lifecycle).table
        for branch in table.branches_for(state, event):
            # its guards, and those of the eventless steps it may take next
            for g, _ in (*branch.guards, *(x for a in table.automatic.get(branch.target, ()) for x in a.guards)):
                for name in g.names:
                    hints += [dict(p) for p in self.guard_data.get(name, ())]
        if hints:
            hint: dict[str, Any] | None = data.draw(st.sampled_from([None, *hints]), label="data")
            return hint
        return data.draw(data_patches(self.lifecycle.data_model), label="data")

    def _region_sources(self, region: str, event: str) -> list[str]:
        table = self.region_engines[region].table
        return [
            row_id
            for row_id in sorted(self.existing_rows)
            if self.region_rows[row_id][2] == region and table.branches_for(self._snap(row_id).state, event)
        ]

    def _snap(self, entity_id: str) -> Snapshot:
        """The row as of the last refresh (every step that moves one refreshes it)."""
        snap = self.snaps.get(entity_id)
        if snap is None:
            snap = self.snaps[entity_id] = self.store.get(entity_id)
        return snap

    def fire_event(self, event: str, data: st.DataObject) -> None:
        """The body of every ``fire_<event>`` rule."""
        entity_id = data.draw(st.sampled_from(self._sources(event)), label="entity")
        self._fire_on(entity_id, event, data, None)

    def fire_region_event(self, region: str, event: str, data: st.DataObject) -> None:
        """The body of every ``fire_<region>__<event>`` rule: on a region's row."""
        row_id = data.draw(st.sampled_from(self._region_sources(region, event)), label="region row")
        self._fire_on(row_id, event, data, region)

    def _fire_on(self, entity_id: str, event: str, data: st.DataObject, region: str | None) -> None:
        engine, lifecycle = self._engine_of(region), self._lifecycle_of(region)
        table = lifecycle.table
        snap = self.store.get(entity_id)
        branches = table.branches_for(snap.state, event)
        actor = data.draw(st.sampled_from(sorted({b.actor for b in branches})), label="actor")
        holder: Holder | None = None
        lease: Lease | None = None
        patch: dict[str, Any] | None = None
        if actor is Actor.WORKER:
            mine = [h for h in self._holders("alive", "fenced") if h.entity_id == entity_id]
            holder = data.draw(st.sampled_from([*mine, None]), label="holder")
            lease = None if holder is None else holder.lease
            patch = self._patch(event, data, snap.state, lifecycle)
        before = self.store.history(entity_id)
        owner = self._name()
        now = self.clock.now()
        try:
            result = engine.fire(entity_id, event, lease=lease, actor=actor, data=patch, owner=owner)
        except Fenced:
            if holder is not None:
                holder.status = "fenced"
            self._unchanged(snap, before, f"a refused {event}")
            return
        except FsmError:
            self._unchanged(snap, before, f"a refused {event}")
            return
        record = result.record
        if lease is not None and not self._current(snap, lease):
            self.broken(f"I3: {holder and holder.name} fired {event} on {entity_id} with a stale lease {lease}")
        targets = {t for b in branches if b.actor is actor for t in b.targets}  # a history target: several
        if record.source != snap.state or record.target not in targets:
            self.broken(f"table: {event} by {actor} took {record.source}->{record.target} from {snap.state}")
        self._reaper_move_checked(snap, record.actor, record.event, now, lifecycle)
        self.acks.setdefault(entity_id, []).append((record.seq, event))
        new = result.snapshot
        if new.lease_owner == owner and new.lease_token != snap.lease_token:
            self._hold(new, region)
        if holder is not None:
            holder.seen_state = new.state
        self._ended(entity_id, new.state, table.finals)
        self._refresh()  # a region's last move joins its entity; an entity's move enters or leaves regions

    def _ended(self, entity_id: str, state: str, finals: frozenset[str]) -> None:
        if state in finals:
            for h in self.holders:
                if h.entity_id == entity_id and h.status in ("alive", "paused", "fenced"):
                    h.status = "done"

    def _unchanged(self, snap: Snapshot, history: list[Any], what: str) -> None:
        after = self.store.get(snap.id)
        if after != snap or self.store.history(snap.id) != history:
            self.broken(f"I3/I10: {what} changed {snap.id}: {snap} -> {after}")

    def _reaper_move_checked(
        self, before: Snapshot, actor: str, event: str, now: datetime, lifecycle: type[Lifecycle] | None = None
    ) -> None:
        """I1: nothing leaves (or is reclaimed in) finalizing while its lease is fresh."""
        if actor != Actor.REAPER.value or before.state != (lifecycle or self.lifecycle).finalizing_state:
            return
        if before.lease_expires_at is not None and before.lease_expires_at >= now:
            self.broken(
                f"I1: the reaper fired {event} on {before.id} in {before.state} while its lease was fresh "
                f"(expires {before.lease_expires_at}, now {now})"
            )

    # -- time, keepers and the reaper ------------------------------------------------------

    @rule(data=st.data())
    def time_passes(self, data: st.DataObject) -> None:
        step = data.draw(lease_timings(self.lifecycle.policy, self.interval), label="advance")
        self._advance_to(self.clock.now() + step)

    def _advance_to(self, target: datetime) -> None:
        """Move the clock to ``target``; live keepers renew and the reaper ticks on the way."""
        while True:
            alive = self._holders("alive")
            moment = min([target, self.next_tick, *(h.next_renewal for h in alive)])
            self.clock.set(max(moment, self.clock.now()))
            now = self.clock.now()
            for h in alive:
                if h.next_renewal <= now:
                    self._renew(h)
            if self.next_tick <= now:
                self._tick(self.reaper)
                self.next_tick += self.interval
                # ticks before the first moment an entity can turn stale would find nothing
                # (renewals only push leases later): skip them, staying on the schedule
                quiet = self._earliest_stale()
                while self.next_tick <= quiet and self.next_tick < target:
                    self.next_tick += self.interval
            if now >= target:
                break

    def _earliest_stale(self) -> datetime:
        """When the first live entity can turn stale, as of now (far away if none can)."""
        stale_after = self.engine.policy.stale_after
        moments = [
            s.lease_expires_at if s.lease_expires_at is not None else s.updated_at + stale_after
            for i, s in self.snaps.items()
            if s.state not in self._finals_of(i)
        ]
        return min(moments, default=self.clock.now() + stale_after * 1000)

    def _renew(self, holder: Holder) -> None:
        snap = self.store.get(holder.entity_id)
        current = self._current(snap, holder.lease) and snap.lease_expires_at is not None
        fresh = current and snap.lease_expires_at is not None and snap.lease_expires_at >= self.clock.now()
        result = holder.core.renew()
        if result.renewed:
            if not fresh:
                self.broken(f"I3: {holder.name} renewed a lease it no longer held on {holder.entity_id}: {snap}")
            holder.next_renewal = self.clock.now() + core_period(holder.core)
        elif result.lost:
            holder.status = "fenced"
        else:
            holder.next_renewal = self.clock.now() + core_period(holder.core) / 4
        self._refresh(holder.entity_id)

    def _tick(self, reaper: Reaper) -> None:
        now = self.clock.now()
        rows = {i: r for i, (_, _, r) in self._rows().items()}
        ids: dict[str, str | None] = {**dict.fromkeys(self.entities), **rows}
        before = {i: self.store.get(i) for i in ids}
        histories = {i: len(self.store.history(i)) for i in ids}
        result = reaper.run_once()
        if result.errors or result.bad_rows:
            self.broken(f"I9: a reaper tick failed: {result.summary()}")
        for entity_id, snap in before.items():
            for record in self.store.history(entity_id)[histories[entity_id] :]:
                self._reaper_move_checked(snap, record.actor, record.event, now, self._lifecycle_of(ids[entity_id]))
        self._refresh()
        for entity_id, region in ids.items():
            snap = self.snaps[entity_id]
            engine = self._engine_of(region)
            for event in engine.table.events:
                if engine.would_fire(snap, event, Actor.REAPER) is not None:
                    self.broken(
                        f"I2: a reaper tick left {entity_id} in {snap.state} although {event} applies "
                        f"(lease expires {snap.lease_expires_at}, now {now})"
                    )

    def _unrenewed(self) -> list[Snapshot]:
        keeping = {h.entity_id for h in self._holders("alive")}
        return [
            s
            for i, s in self.snaps.items()
            if s.lease_expires_at is not None and s.id not in keeping and s.state not in self._finals_of(i)
        ]

    @precondition(lambda self: bool(self._unrenewed()))
    @rule(data=st.data())
    def lease_lapses(self, data: st.DataObject) -> None:
        """Time passes until a lease nobody renews lapses: just past it, or past the next tick."""
        snap = data.draw(st.sampled_from(self._unrenewed()), label="entity")
        assert snap.lease_expires_at is not None
        until = snap.lease_expires_at + timedelta(seconds=1)
        if data.draw(st.booleans(), label="past the next reaper tick"):
            until += self.interval
        self._advance_to(until)

    @rule()
    def second_reaper_ticks(self) -> None:
        self._tick(self.second_reaper)

    # -- holders ---------------------------------------------------------------------------

    @precondition(lambda self: bool(self._holders("alive")))
    @rule(data=st.data())
    def holder_dies(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self._holders("alive")), label="holder")
        holder.status, holder.died_at = "dead", self.clock.now()

    @precondition(lambda self: bool(self._holders("alive")))
    @rule(data=st.data())
    def holder_pauses(self, data: st.DataObject) -> None:
        """The holder stops mid-step (SIGSTOP): a write it built, or an effect it began, waits."""
        holder = data.draw(st.sampled_from(self._holders("alive")), label="holder")
        holder.status = "paused"
        snap = self.store.get(holder.entity_id)
        engine = self._engine_of(holder.region)
        table, policy = engine.table, engine.policy
        options: list[tuple[str, Any]] = []
        reserved = reserved_events(engine)  # a join or a region's exit: only the engine builds those
        for event in table.events:
            if event in reserved:
                continue
            try:
                branch = choose(table, policy, self.clock, self.store, snap, event, Actor.WORKER, holder.lease)
            except FsmError:
                continue
            if branch.source in table.parallel or branch.target in table.parallel:
                continue  # entering or leaving regions is the engine's group write, never one row's
            write = write_for(policy, holder.name, snap, branch, holder.lease, None, None, None, None, None)
            options.append(("write", write))
        if snap.state == engine.lifecycle.finalizing_state:
            # an effect it began: the ledger starts ``fn`` only for a key with no recorded
            # success (a recorded one replays), and only while the lease is the holder's
            options += [
                ("effect", key)
                for key in self.effect_keys
                if self._current(snap, holder.lease) and not succeeded(self.store.effect(holder.entity_id, key))
            ]
        if options:
            holder.pending = data.draw(st.sampled_from([*options, None]), label="pending")

    @precondition(lambda self: bool(self._holders("alive")))
    @rule(data=st.data())
    def holder_stalls(self, data: st.DataObject) -> None:
        """seeds/002 in one step: a holder stops mid-step, its lease lapses (the reaper may tick),
        another worker may take the lease, and the holder wakes up and finishes its step."""
        self.holder_pauses(data)
        holder = next(h for h in reversed(self.holders) if h.status == "paused")
        snap = self.store.get(holder.entity_id)
        if snap.lease_expires_at is not None:
            until = snap.lease_expires_at + timedelta(seconds=1)
            if data.draw(st.booleans(), label="past the next reaper tick"):
                until += self.interval
            self._advance_to(until)
        if holder.entity_id in self._takeable() and data.draw(st.booleans(), label="taken over"):
            self._take(holder.entity_id)
        self._wake(holder)

    @precondition(lambda self: bool(self._holders("paused")))
    @rule(data=st.data())
    def holder_wakes(self, data: st.DataObject) -> None:
        self._wake(data.draw(st.sampled_from(self._holders("paused")), label="holder"))

    def _wake(self, holder: Holder) -> None:
        holder.status = "alive"
        pending, holder.pending = holder.pending, None
        if pending is not None and pending[0] == "write":
            self._late_write(holder, pending[1])
        elif pending is not None:
            self._late_effect(holder, pending[1])
        if holder.status == "alive":
            self._renew(holder)

    def _late_write(self, holder: Holder, write: TransitionWrite) -> None:
        before = self.store.get(write.entity_id)
        history = self.store.history(write.entity_id)
        expected = (write.expect_version, write.expect_token, write.expect_owner)
        try:
            new, record = self.store.apply(dataclasses.replace(write))
        except FsmError:
            self._unchanged(before, history, f"{holder.name}'s refused late {write.event}")
            return
        version, token, owner = expected
        token_ok = token is None or (before.lease_token == token and before.lease_owner == owner)
        if before.version != version or not token_ok:
            self.broken(
                f"I3: {holder.name}'s late {write.event} (version {version}, token {token}) was written over "
                f"{before.id} at version {before.version}, token {before.lease_token} held by {before.lease_owner}"
            )
        self.acks.setdefault(write.entity_id, []).append((record.seq, write.event))
        self._ended(new.id, new.state, self._finals_of(new.id))
        # a region's late write lands in the store, not through its engine: as after a
        # crash, the reaper's next tick makes its entity's join (fsm.regions)
        self._refresh()

    @precondition(lambda self: bool(self._finalizers()))
    @rule(data=st.data())
    def run_effect(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self._finalizers()), label="holder")
        key = data.draw(st.sampled_from(self.effect_keys), label="key")
        self._run_effect(holder, key)

    def _finalizers(self) -> list[Holder]:
        if not self.effect_keys:
            return []
        return [
            h for h in self._holders("alive", "fenced") if h.seen_state == self._lifecycle_of(h.region).finalizing_state
        ]

    def _run_effect(self, holder: Holder, key: str) -> None:
        entity_id, lease = holder.entity_id, holder.lease
        snap = self.store.get(entity_id)
        recorded = self.store.effect(entity_id, key)
        current = self._current(snap, lease)
        calls: list[str] = []

        def effect(idempotency_key: str) -> dict[str, Any]:
            calls.append(idempotency_key)
            return {"by": lease.owner, "token": lease.token}

        try:
            self._engine_of(holder.region).run(entity_id, key, effect, lease)
        except Fenced:
            holder.status = "fenced"
            if self.store.effect(entity_id, key) != recorded:
                self.broken(f"I4: {holder.name}'s refused effect {key!r} on {entity_id} changed the ledger")
            return
        except FsmError:
            return
        self.executions[(entity_id, key)] += len(calls)
        if succeeded(recorded) and calls:
            self.broken(f"I4: effect {key!r} of {entity_id} ran again although its result was recorded")
        if not succeeded(recorded) and not current:
            self.broken(
                f"I4: {holder.name}'s late result of {key!r} on {entity_id} was recorded with token {lease.token} "
                f"while the entity's lease was token {snap.lease_token} of {snap.lease_owner}"
            )

    def _late_effect(self, holder: Holder, key: str) -> None:
        """The effect the holder began before it paused returns now: the ledger records its
        result under the holder's (maybe lost) lease, as ``run`` does once ``fn`` returns."""
        entity_id, lease = holder.entity_id, holder.lease
        assert lease is not None
        snap = self.store.get(entity_id)
        recorded = self.store.effect(entity_id, key)
        current = self._current(snap, lease)
        self.executions[(entity_id, key)] += 1
        try:
            _, wrote = self.store.record_effect(
                entity_id,
                key,
                owner=lease.owner,
                token=lease.token,
                status=EFFECT_SUCCEEDED,
                result={"by": lease.owner, "token": lease.token},
                replace=(EFFECT_FAILED,),
            )
        except Fenced:
            holder.status = "fenced"
            if self.store.effect(entity_id, key) != recorded:
                self.broken(f"I4: {holder.name}'s refused effect {key!r} on {entity_id} changed the ledger")
            return
        except FsmError:
            return
        if wrote and not current:
            self.broken(
                f"I4: {holder.name}'s late result of {key!r} on {entity_id} was recorded with token {lease.token} "
                f"while the entity's lease was token {snap.lease_token} of {snap.lease_owner}"
            )
        if wrote and succeeded(recorded):
            self.broken(f"I4: a second result of {key!r} on {entity_id} replaced the recorded one")

    # -- other workers take over -----------------------------------------------------------

    @rule()
    def claim(self) -> None:
        owner = self._name()
        try:
            claimed = self.engine.claim(1, owner=owner)
        except FsmError:
            return
        for snap in claimed:
            before = self.snaps[snap.id]
            if snap.lease_token <= before.lease_token:
                self.broken(f"I3: a claim of {snap.id} did not bump its token ({before.lease_token})")
            if snap.version != before.version:
                self.acks[snap.id].append((snap.version, self.store.history(snap.id)[-1].event))
            self._hold(snap)
            self._refresh(snap.id)

    @precondition(lambda self: bool(self.region_engines))
    @rule(data=st.data())
    def claim_region(self, data: st.DataObject) -> None:
        """A region's worker claims one of its rows."""
        region = data.draw(st.sampled_from(sorted(self.region_engines)), label="region")
        try:
            claimed = self.region_engines[region].claim(1, owner=self._name())
        except FsmError:
            return
        for snap in claimed:
            before = self.snaps.get(snap.id)
            if before is not None and snap.lease_token <= before.lease_token:
                self.broken(f"I3: a claim of {snap.id} did not bump its token ({before.lease_token})")
            if before is None or snap.version != before.version:
                self.acks.setdefault(snap.id, []).append((snap.version, self.store.history(snap.id)[-1].event))
            self._hold(snap, region)
            self._refresh(snap.id)

    def _takeable(self) -> list[str]:
        now = self.clock.now()
        return [
            i
            for i, s in self.snaps.items()
            if s.state not in self._finals_of(i)
            and (s.lease_owner is None or (s.lease is not None and not s.lease.is_fresh(now)))
        ]

    @precondition(lambda self: bool(self._takeable()))
    @rule(data=st.data())
    def take_expired_lease(self, data: st.DataObject) -> None:
        """Another worker takes a free or expired lease (no transition: token + 1 only)."""
        self._take(data.draw(st.sampled_from(self._takeable()), label="entity"))

    def _take(self, entity_id: str) -> None:
        before = self.store.get(entity_id)
        region = self._region_of_row(entity_id)
        try:
            lease = self._engine_of(region).acquire_lease(entity_id, owner=self._name())
        except FsmError:
            return
        if before.lease is not None and before.lease.is_fresh(self.clock.now()):
            self.broken(f"I3: a live lease of {entity_id} was taken over: {before.lease} -> {lease}")
        self._refresh(entity_id)
        self._hold(self.snaps[entity_id], region)

    # -- restarts --------------------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        """Every process stops: new store and engine objects over the same data."""
        ids = (*self.entities, *self._rows())
        saved = {i: (self.store.get(i), self.store.history(i), self.store.effects(i)) for i in ids}
        self.store = self.stores.reopen(self.store, self.clock)
        self._connect()
        for holder in self._holders("alive", "paused", "fenced"):
            holder.status, holder.died_at = "dead", self.clock.now()
        for entity_id, (snap, history, effects) in saved.items():
            found = (self.store.get(entity_id), self.store.history(entity_id), self.store.effects(entity_id))
            if found != (snap, history, effects):
                self.broken(f"I8: {entity_id} changed across a restart: {(snap, history, effects)} -> {found}")

    # -- after every step ------------------------------------------------------------------

    @invariant()
    def lifecycle_invariants(self) -> None:
        problems: list[str] = []
        self._find_rows()  # whatever step made them
        rows = self._rows()
        regions: dict[str, str | None] = {**dict.fromkeys(self.entities), **{i: r for i, (_, _, r) in rows.items()}}
        for entity_id, region in regions.items():
            lifecycle = self._lifecycle_of(region)
            snap = self.store.get(entity_id)
            history = self.store.history(entity_id)
            problems += history_problems(lifecycle, snap, history)
            problems += restore_problems(lifecycle, snap)
            problems += effect_problems(entity_id, self.store.effects(entity_id))
            problems += acknowledged_problems(entity_id, self.acks.get(entity_id, []), history)
        problems += self._join_problems()
        if problems:
            self.broken("; ".join(problems))

    def _join_problems(self) -> list[str]:
        """An entity joins a parallel state's regions once every one has ended: each join
        that appeared in its history since the last step finds every region's row final
        (or the entity back inside, its rows restarted)."""
        problems: list[str] = []
        table = self.lifecycle.table
        for entity_id in self.entities:
            history = self.store.history(entity_id)
            for parallel, regions in table.parallel.items():
                seen_key = f"{entity_id}:{parallel}"
                joins = sum(1 for r in history if r.event == join_event(parallel))
                if joins > self.joins.get(seen_key, 0) and self.store.get(entity_id).state != parallel:
                    for region in regions:
                        try:
                            row = self.store.get(region_row_id(entity_id, region))
                        except FsmError:  # the machine prunes nothing: entering made every row
                            problems.append(f"join: {entity_id} joined {parallel} without a row for region {region}")
                            continue
                        if row.state not in self.region_engines[region].table.finals:
                            problems.append(
                                f"join: {entity_id} joined {parallel} while its region {region} was in {row.state!r}"
                            )
                self.joins[seen_key] = joins
        return problems


def core_period(core: KeeperCore) -> timedelta:
    return timedelta(seconds=core.period)


def _rule_name(event: str, taken: Mapping[str, Any]) -> str:
    """``fire_<event>`` as an identifier (a dotted event's dots become underscores), unique."""
    base = "fire_" + re.sub(r"\W", "_", event)
    name, n = base, 1
    while name in taken or hasattr(LifecycleMachine, name):  # never a method of the machine's
        n += 1
        name = f"{base}_{n}"
    return name


def _region_rule(region: str, event: str, name: str) -> Any:
    def fire(self: LifecycleMachine, data: st.DataObject) -> None:
        self.fire_region_event(region, event, data)

    fire.__name__ = name
    fire.__doc__ = f"Fire {event!r} on a row of region {region!r} whose state has a branch for it."
    return precondition(lambda self: bool(self._region_sources(region, event)))(rule(data=st.data())(fire))


def _fire_rule(event: str, name: str) -> Any:
    def fire(self: LifecycleMachine, data: st.DataObject) -> None:
        self.fire_event(event, data)

    fire.__name__ = name
    fire.__doc__ = f"Fire {event!r} on an entity whose state has a branch for it."
    return precondition(lambda self: bool(self._sources(event)))(rule(data=st.data())(fire))


def lifecycle_machine(
    lifecycle: type[Lifecycle],
    stores: StoreFactory | None = None,
    *,
    guard_data: GuardData | None = None,
    event_data: Mapping[str, st.SearchStrategy[Any]] | None = None,
    reaper_interval: timedelta | None = None,
    effect_keys: tuple[str, ...] | None = None,
    max_entities: int | None = None,
    name: str | None = None,
) -> type[LifecycleMachine]:
    """A :class:`LifecycleMachine` subclass for ``lifecycle`` on ``stores`` (default: memory).

    ``guard_data`` maps each of your ``@guard`` names to two data patches, one making it
    true and one false, so the machine (and :func:`fsm.testing.paths.replay`) can steer
    it; ``event_data`` gives a strategy of data patches per event instead.  Use the
    returned class's ``TestCase`` as a pytest test, or subclass it to add rules and
    invariants.
    """
    namespace: dict[str, Any] = {
        "lifecycle": lifecycle,
        "stores": stores or MemoryStores(),
        "__doc__": f"Property test of {lifecycle.__name__}: every event, the clock, the reaper, crashes.",
    }
    if guard_data is not None:
        namespace["guard_data"] = dict(guard_data)
    if event_data is not None:
        namespace["event_data"] = dict(event_data)
    if reaper_interval is not None:
        namespace["reaper_interval"] = reaper_interval
    if effect_keys is not None:
        namespace["effect_keys"] = tuple(effect_keys)
    if max_entities is not None:
        namespace["max_entities"] = max_entities
    for event in lifecycle.table.events:
        if event == "*" or event.endswith((".", ".*")):
            continue  # a descriptor matching sent events, not one a caller sends
        rule_name = _rule_name(event, namespace)
        namespace[rule_name] = _fire_rule(event, rule_name)
    for parallel, found in lifecycle.regions.items():
        for region, region_lifecycle in found.items():
            for event in region_lifecycle.table.events:
                if event == exit_event(parallel) or event == "*" or event.endswith((".", ".*")):
                    continue  # the engine takes a region's exit with its entity's event
                rule_name = _rule_name(f"{region}__{event}", namespace)
                namespace[rule_name] = _region_rule(region, event, rule_name)
    cls_name = name or f"{lifecycle.__name__}Machine"
    machine: type[LifecycleMachine] = type(cls_name, (LifecycleMachine,), namespace)
    return machine


__all__ = ["GuardData", "Holder", "InvariantBroken", "LifecycleMachine", "lifecycle_machine"]
