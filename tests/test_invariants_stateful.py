"""Invariants under random interleavings (hypothesis stateful testing).

Workers fire random events with the lease they hold (or an old one), renew, or die; time
advances; the reaper ticks.  After every step: I1 (nothing left finalizing while its lease
was fresh), I3 (a stale lease never wins), I5 (final states absorb, one entering row),
I6 (history gap-free).  Runs on the memory store and on a SQLite file.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fsm import Engine, FsmError, JobLifecycle, ManualClock
from fsm.reaping import Reaper, ReaperConfig
from fsm.records import Lease
from stores import MemoryStore, Store

IDS = ["j0", "j1"]  # few entities: the workers and the reaper meet on them often
WORKER_EVENTS = ["start", "exited", "complete", "fail"]
FINALS = JobLifecycle.table.finals


class JobsUnderTheReaper(RuleBasedStateMachine):
    store_kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.store: Store = self._store()
        self.engine = Engine(JobLifecycle, self.store, clock=self.clock, owner="worker")
        self.reaper = Reaper(self.store, [JobLifecycle], ReaperConfig(batch_size=2), clock=self.clock)
        self.leases: dict[str, Lease] = {}
        self.old_leases: dict[str, list[Lease]] = {i: [] for i in IDS}
        for entity_id in IDS:
            self.engine.create(entity_id)

    def _store(self) -> Store:
        if self.store_kind == "memory":
            return MemoryStore(self.clock)
        from stores.sql import SqlStore

        self._dir = tempfile.TemporaryDirectory()
        return SqlStore(f"sqlite:///{self._dir.name}/fsm.db", clock=self.clock)

    def teardown(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    @rule(entity_id=st.sampled_from(IDS), event=st.sampled_from(WORKER_EVENTS))
    def worker_fires(self, entity_id: str, event: str) -> None:
        lease = self.leases.get(entity_id)
        try:
            result = self.engine.fire(entity_id, event, lease=lease)
        except FsmError:
            return
        if result.lease is not None and result.lease.owner == "worker":
            if lease is not None and lease.token != result.lease.token:
                self.old_leases[entity_id].append(lease)
            self.leases[entity_id] = result.lease
        if result.state in FINALS:
            self.leases.pop(entity_id, None)

    @rule(entity_id=st.sampled_from(IDS), event=st.sampled_from(["exited", "complete", "fail"]))
    def a_fenced_off_worker_tries(self, entity_id: str, event: str) -> None:
        """I3: a lease that was taken over never wins a write."""
        current = self.store.get(entity_id)
        for old in self.old_leases[entity_id]:
            if old.token == current.lease_token and old.owner == current.lease_owner:
                continue
            before = self.store.history(entity_id)
            try:
                self.engine.fire(entity_id, event, lease=old)
            except FsmError:
                pass
            else:
                raise AssertionError(f"a stale lease {old} won {event} on {current}")
            assert self.store.history(entity_id) == before

    @rule(entity_id=st.sampled_from(IDS))
    def worker_renews(self, entity_id: str) -> None:
        lease = self.leases.get(entity_id)
        if lease is None:
            return
        try:
            self.leases[entity_id] = self.engine.renew_lease(lease)
        except FsmError:
            self.old_leases[entity_id].append(self.leases.pop(entity_id))

    @rule(entity_id=st.sampled_from(IDS))
    def worker_dies(self, entity_id: str) -> None:
        lease = self.leases.pop(entity_id, None)
        if lease is not None:
            self.old_leases[entity_id].append(lease)

    # steps around the lease TTL (120 s) and its edges, so ticks meet leases about to expire
    @rule(seconds=st.sampled_from([1, 20, 45, 59, 60, 61, 119, 120, 121, 400]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(timedelta(seconds=seconds))

    @rule()
    def reaper_ticks(self) -> None:
        now = self.clock.now()
        fresh = {
            s.id: s.version
            for s in (self.store.get(i) for i in IDS)
            if s.state == "finalizing" and s.lease_expires_at is not None and s.lease_expires_at >= now
        }
        result = self.reaper.run_once()
        assert result.errors == 0 and result.bad_rows == 0, result.summary()
        for entity_id, version in fresh.items():  # I1
            assert self.store.get(entity_id).version == version, f"{entity_id} moved from finalizing while fresh"

    @invariant()
    def history_is_gap_free_and_finals_absorb(self) -> None:
        for entity_id in IDS:
            snap = self.store.get(entity_id)
            history = self.store.history(entity_id)
            assert [r.seq for r in history] == list(range(1, snap.version + 1))  # I6
            entering_final = [i for i, r in enumerate(history) if r.target in FINALS]
            assert len(entering_final) <= 1  # I5
            if entering_final:
                assert entering_final[0] == len(history) - 1 and snap.state in FINALS


class JobsUnderTheReaperOnSqlite(JobsUnderTheReaper):
    store_kind = "sqlite"


TestMemory = JobsUnderTheReaper.TestCase
TestMemory.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestSqlite = JobsUnderTheReaperOnSqlite.TestCase
TestSqlite.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
