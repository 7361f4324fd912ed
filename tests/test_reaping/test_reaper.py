"""The reaper (DESIGN section 6): the seeds' scenarios, the kill switch, dry runs, bad rows.

Every scenario runs against each store through ``any_store`` (memory, and the SQL stores
once registered), with a ManualClock driving time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import signals
from fsm import (
    ConfigError,
    Engine,
    GuardContext,
    JobLifecycle,
    LeaseChange,
    Lifecycle,
    MalformedRow,
    ManualClock,
    PipelineLifecycle,
    State,
    guard,
    reaper,
    worker,
)
from fsm.policy import Policy
from fsm.reaping import Reaper, ReaperConfig, ReapPolicy
from fsm.records import Lease
from stores import MemoryStore, Store

INTERVAL = timedelta(minutes=5)


@pytest.fixture
def transitioned() -> Iterator[list[Any]]:
    got: list[Any] = []

    def hook(sender: str, payload: Any) -> None:
        got.append(payload)

    signals.transitioned.connect(hook)
    yield got
    signals.transitioned.disconnect(hook)


def reaper_for(store: Store, clock: ManualClock, **config: Any) -> Reaper:
    return Reaper(store, [PipelineLifecycle, JobLifecycle], ReaperConfig(**config), clock=clock)


def pipeline(store: Store, clock: ManualClock, entity_id: str, key: str | None = None) -> Engine:
    engine = Engine(PipelineLifecycle, store, clock=clock)
    engine.create(entity_id, concurrency_key=key, data={"steps": [{"name": "build", "status": "running"}]})
    engine.fire(entity_id, "start")
    return engine


def finalizing_job(store: Store, clock: ManualClock, entity_id: str = "j1") -> tuple[Engine, Lease]:
    engine = Engine(JobLifecycle, store, clock=clock, owner="finalizer-1")
    engine.create(entity_id)
    lease = engine.fire(entity_id, "start").lease
    assert lease is not None
    engine.fire(entity_id, "exited", lease=lease, data={"exit_code": 0})
    return engine, lease


# -- seeds/000: zombie pipelines ------------------------------------------------------------


def test_AC1_a_running_pipeline_past_stale_after_fails_with_one_signal_carrying_its_steps(
    any_store: Store, clock: ManualClock, transitioned: list[Any]
) -> None:
    engine = pipeline(any_store, clock, "p1")
    transitioned.clear()
    clock.advance(timedelta(minutes=61))
    result = reaper_for(any_store, clock).run_once()
    assert result.moved == {"pipeline.expire": 1}
    snap = engine.get("p1")
    assert snap.state == "failed" and engine.history("p1")[-1].reason == "expired"
    assert len(transitioned) == 1
    payload = transitioned[0]
    assert payload.snapshot.id == "p1" and payload.snapshot.state == "failed"
    # the payload carries the committed row: its running step failed with it (issue 11, item 5)
    assert payload.snapshot.data["steps"] == [{"name": "build", "status": "failed"}]


def test_AC2_a_fresh_running_pipeline_stays_running(any_store: Store, clock: ManualClock) -> None:
    engine = pipeline(any_store, clock, "p1")
    clock.advance(timedelta(minutes=59))
    assert reaper_for(any_store, clock).run_once().total_moved == 0
    assert engine.get("p1").state == "running"


def test_AC3_of_two_running_pipelines_the_older_fails_as_duplicate_and_the_newer_stays(
    any_store: Store, clock: ManualClock
) -> None:
    engine = pipeline(any_store, clock, "a", key="repo/main")
    clock.advance(seconds=30)
    pipeline(any_store, clock, "b", key="repo/main")
    result = reaper_for(any_store, clock).run_once()
    assert result.moved == {"pipeline.supersede": 1}
    assert engine.get("a").state == "failed" and engine.history("a")[-1].reason == "duplicate"
    assert engine.get("b").state == "running"


def test_AC4_of_three_running_pipelines_the_two_older_fail_and_the_newest_stays(
    any_store: Store, clock: ManualClock
) -> None:
    engine = pipeline(any_store, clock, "a", key="repo/main")
    for name in ("b", "c"):
        clock.advance(seconds=30)
        pipeline(any_store, clock, name, key="repo/main")
    pipeline(any_store, clock, "other", key="repo/feature")
    reaper_for(any_store, clock).run_once()
    assert [engine.get(i).state for i in ("a", "b", "c", "other")] == ["failed", "failed", "running", "running"]


class BrokenStore:
    """A store whose reads fail, as a database going away would."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.broken = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def candidates(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            raise ConnectionError("database is restarting")
        return self.inner.candidates(*args, **kwargs)

    def move_candidates(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            raise ConnectionError("database is restarting")
        return self.inner.move_candidates(*args, **kwargs)


def test_AC5_a_failing_store_is_logged_and_the_reaper_keeps_running(
    any_store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline(any_store, clock, "p1")
    clock.advance(timedelta(hours=2))
    broken = BrokenStore(any_store)
    reaper = Reaper(broken, [PipelineLifecycle], clock=clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="fsm.reaper"):
        first = reaper.run_once()  # must not raise
    assert first.errors == 1 and first.total_moved == 0
    failed_tick = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed_tick) == 1 and failed_tick[0].exc_info is not None
    broken.broken = False
    assert reaper.run_once().moved == {"pipeline.expire": 1}


# -- seeds/002: a slow but live finalizer ----------------------------------------------------


def test_a_finalizer_renewing_far_past_a_fixed_grace_is_never_expired_nor_reclaimed(
    any_store: Store, clock: ManualClock
) -> None:
    engine, lease = finalizing_job(any_store, clock)
    reaper = reaper_for(any_store, clock)
    ttl = engine.policy.lease_ttl
    for _ in range(40):  # 40 minutes of gates: far beyond the incident's 300 s grace
        clock.advance(ttl / 2)
        lease = engine.renew_lease(lease)
        assert reaper.run_once().total_moved == 0
    assert engine.get("j1").state == "finalizing" and engine.get("j1").lease_token == lease.token
    assert [r.event for r in engine.history("j1")] == ["start", "exited"]


def test_I2_a_finalizer_that_stops_renewing_is_reclaimed_within_ttl_plus_interval(
    any_store: Store, clock: ManualClock
) -> None:
    engine, lease = finalizing_job(any_store, clock)
    reaper = reaper_for(any_store, clock)
    died_at = clock.now()  # the holder dies right after its last write
    step = timedelta(seconds=30)
    while engine.get("j1").lease_token == lease.token:
        clock.advance(step)
        if (clock.now() - died_at) % INTERVAL < step:  # a tick every interval
            reaper.run_once()
        assert clock.now() - died_at <= engine.policy.lease_ttl + INTERVAL, "not reclaimed in time"
    snap = engine.get("j1")
    # fenced (token + 1) and left free for a claim: the reaper never becomes the owner
    assert snap.state == "finalizing" and snap.lease_token == lease.token + 1 and snap.lease_owner is None


class RaceStore:
    """Runs ``between`` after the reaper's read and before its write."""

    def __init__(self, inner: Store, between: Any) -> None:
        self.inner = inner
        self.between = between

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def apply_batch(self, batch: Any) -> Any:
        if self.between is not None:
            self.between()
            self.between = None
        return self.inner.apply_batch(batch)

    def move_candidates(self, batch: Any, *, limit: int) -> Any:
        # a claim reads and writes in one statement: nothing can land in between, so the
        # race is staged on the keyset path that reads first and writes later
        return []


def test_a_renewal_wins_over_a_reaper_whose_own_clock_ran_ahead(any_store: Store, clock: ManualClock) -> None:
    """A skewed reaper clock changes nothing: the engine judges time guards with the store's
    clock (issue 11, item 3), and the store re-checks them with it at commit anyway."""
    engine, lease = finalizing_job(any_store, clock)
    ahead = ManualClock(clock.now())
    ahead.advance(engine.policy.lease_ttl + timedelta(minutes=1))  # a skewed reaper host
    reaper_engine = Engine(JobLifecycle, any_store, clock=ahead)
    assert reaper_engine.get("j1").lease_is_stale(ahead.now(), engine.policy.stale_after)
    clock.advance(seconds=30)
    engine.renew_lease(lease)  # the holder is alive by the store's clock
    before = any_store.get("j1"), any_store.history("j1")
    from fsm import ConditionFailed, GuardRejected

    with pytest.raises((GuardRejected, ConditionFailed), match="lease_stale"):
        reaper_engine.fire("j1", "reclaim", actor="reaper")
    assert (any_store.get("j1"), any_store.history("j1")) == before


def test_a_renewal_landing_after_the_read_makes_the_reaper_write_a_lost_race(
    any_store: Store, clock: ManualClock
) -> None:
    engine, lease = finalizing_job(any_store, clock)
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))  # stale when the reaper reads
    state = {"lease": lease}

    def a_new_holder_takes_over() -> None:
        # the only way a stale lease becomes fresh again is a takeover (renew never revives)
        state["lease"] = engine.acquire_lease("j1", owner="finalizer-2")

    reaper = Reaper(RaceStore(any_store, a_new_holder_takes_over), [JobLifecycle], clock=clock)  # type: ignore[arg-type]
    result = reaper.run_once()
    assert result.total_moved == 0 and result.lost_races == 1
    snap = engine.get("j1")
    assert snap.lease_owner == "finalizer-2" and [r.event for r in engine.history("j1")] == ["start", "exited"]


def test_a_completion_between_the_reapers_read_and_write_is_not_overwritten(
    any_store: Store, clock: ManualClock
) -> None:
    engine, lease = finalizing_job(any_store, clock)
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))

    def complete() -> None:
        engine.fire("j1", "complete", lease=lease)

    reaper = Reaper(RaceStore(any_store, complete), [JobLifecycle], clock=clock)  # type: ignore[arg-type]
    result = reaper.run_once()
    assert result.lost_races == 1 and result.total_moved == 0
    assert engine.get("j1").state == "completed"
    assert [r.event for r in engine.history("j1")] == ["start", "exited", "complete"]


def test_a_row_with_a_null_lease_waits_for_a_worker_and_is_reaped_only_at_the_backstop(
    any_store: Store, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    lease = engine.fire("j1", "start").lease
    assert lease is not None
    engine.release_lease(lease)  # running with no lease at all: a stopping worker gave it back
    reaper = reaper_for(any_store, clock)
    clock.advance(engine.policy.stale_after + timedelta(seconds=1))
    assert reaper.run_once().total_moved == 0  # waiting for a worker is not dying
    clock.advance(engine.policy.max_wait - engine.policy.stale_after - timedelta(seconds=2))
    assert reaper.run_once().total_moved == 0
    clock.advance(seconds=2)  # a NULL lease never leaves a row unreapable: the backstop fails it
    assert reaper.run_once().moved == {"job.expire": 1}
    snap = engine.get("j1")
    assert snap.state == "failed" and engine.history("j1")[-1].reason == "unclaimed"


def test_job_expire_requeues_while_attempts_remain_then_fails(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    reaper = reaper_for(any_store, clock)
    for _ in range(engine.policy.max_attempts - 1):
        engine.fire("j1", "start")
        clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
        reaper.run_once()
        assert engine.get("j1").state == "queued"
    engine.fire("j1", "start")
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
    reaper.run_once()
    assert engine.get("j1").state == "failed"


def test_a_finalizer_is_expired_only_once_its_reclaims_are_spent(any_store: Store, clock: ManualClock) -> None:
    engine, _ = finalizing_job(any_store, clock)
    reaper = reaper_for(any_store, clock)
    for n in range(1, engine.policy.max_reclaims + 1):
        clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
        assert reaper.run_once().moved == {"job.reclaim": 1}
        assert engine.get("j1").reclaims == n
        clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
        assert reaper.run_once().total_moved == 0  # nobody claimed it: waiting, not a death
        engine.claim(owner=f"rescuer-{n}")  # a new holder takes it, and dies in its turn
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
    assert reaper.run_once().moved == {"job.expire": 1}
    assert engine.get("j1").state == "failed"


# -- switches, dry runs, bad rows, receivers ---------------------------------------------------


class CountingStore:
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.inner, name)


def test_the_kill_switch_reads_and_writes_nothing(any_store: Store, clock: ManualClock) -> None:
    pipeline(any_store, clock, "p1")
    clock.advance(timedelta(hours=2))
    spy = CountingStore(any_store)
    reaper = Reaper(spy, [PipelineLifecycle], ReaperConfig(enabled=False), clock=clock)  # type: ignore[arg-type]
    spy.calls.clear()
    result = reaper.run_once()
    assert spy.calls == [] and not result.enabled and result.total_moved == 0
    assert any_store.get("p1").state == "running"


def test_a_dry_run_lists_what_a_tick_would_move_and_moves_nothing(any_store: Store, clock: ManualClock) -> None:
    pipeline(any_store, clock, "p1")
    pipeline(any_store, clock, "p2")
    clock.advance(timedelta(hours=2))
    before = [any_store.history(i) for i in ("p1", "p2")]
    result = reaper_for(any_store, clock).run_once(dry_run=True)
    assert sorted(result.would_move) == [("pipeline", "p1", "expire", "failed"), ("pipeline", "p2", "expire", "failed")]
    assert result.total_moved == 0 and [any_store.history(i) for i in ("p1", "p2")] == before


def test_keyset_pages_move_every_stale_row_in_one_tick(any_store: Store, clock: ManualClock) -> None:
    for i in range(7):
        pipeline(any_store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))
    assert reaper_for(any_store, clock, batch_size=2).run_once().moved == {"pipeline.expire": 7}


def test_soft_deleted_rows_are_never_touched(any_store: Store, clock: ManualClock) -> None:
    pipeline(any_store, clock, "p1")
    any_store.soft_delete("p1")
    clock.advance(timedelta(hours=2))
    assert reaper_for(any_store, clock).run_once().total_moved == 0
    assert any_store.get("p1", include_deleted=True).state == "running"


class ClaimSpy(MemoryStore):
    """A store whose class offers the brief claim, recording which claim the reaper calls."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.claims: list[str] = []
        self.briefing = False

    def move_candidates(self, batch: Any, *, limit: int) -> Any:
        if not self.briefing:  # the memory store's brief claim is its full one, unpacked
            self.claims.append("full")
        return super().move_candidates(batch, limit=limit)

    def move_candidates_brief(self, batch: Any, *, limit: int) -> Any:
        self.claims.append("brief")
        self.briefing = True
        try:
            return super().move_candidates_brief(batch, limit=limit)
        finally:
            self.briefing = False


def test_with_nobody_listening_claimed_pages_move_brief_with_one_info_line_per_entity(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = ClaimSpy(clock)
    for i in range(5):
        pipeline(store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))
    with caplog.at_level(logging.INFO, logger="fsm.reaper"):
        result = reaper_for(store, clock, batch_size=2).run_once()
    assert result.moved == {"pipeline.expire": 5}
    assert "brief" in store.claims and "full" not in store.claims
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    lines = sorted(line for line in infos if "-> failed" in line)
    expected = []
    for i in range(5):
        record = store.history(f"p{i}")[-1]
        assert store.get(f"p{i}").data["steps"] == [{"name": "build", "status": "failed"}]  # the declared change
        tail = f"[reason=expired, version={record.seq}, token={record.lease_token}]"
        expected.append(f"pipeline p{i}: running -> failed (expire) {tail}")
    assert lines == sorted(expected)


def test_with_a_receiver_claimed_pages_move_with_snapshots_and_one_signal_per_entity(
    clock: ManualClock, transitioned: list[Any]
) -> None:
    store = ClaimSpy(clock)
    for i in range(5):
        pipeline(store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))
    assert reaper_for(store, clock, batch_size=2).run_once().moved == {"pipeline.expire": 5}
    assert "full" in store.claims and "brief" not in store.claims
    expired = [p for p in transitioned if p.snapshot.state == "failed"]  # not the workers' starts
    assert sorted(p.snapshot.id for p in expired) == [f"p{i}" for i in range(5)]
    assert all(p.snapshot.data["steps"] == [{"name": "build", "status": "failed"}] for p in expired)


class OneBadRowStore:
    """Raises MalformedRow for one entity, wherever the reaper meets it."""

    def __init__(self, inner: Store, bad: str) -> None:
        self.inner = inner
        self.bad = bad

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def candidates(self, kind: str, state: str, require: Any, *, limit: int, after_id: str | None = None) -> Any:
        rows = self.inner.candidates(kind, state, require, limit=limit, after_id=after_id)
        if any(r.id == self.bad for r in rows):
            raise MalformedRow(self.bad, reason="broken JSON in data")
        return rows

    def move_candidates(self, batch: Any, *, limit: int) -> Any:
        # as a store does: an unreadable row is never claimed, the others are
        rows = self.inner.candidates(batch.kind, batch.source, batch.require, limit=1_000_000)
        ids = tuple(r.id for r in rows if r.id != self.bad)[:limit]
        return self.inner.apply_batch(dataclasses.replace(batch, ids=ids))


def test_a_bad_row_among_good_ones_is_logged_and_skipped(
    any_store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(5):
        pipeline(any_store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))
    reaper = Reaper(OneBadRowStore(any_store, "p2"), [PipelineLifecycle], clock=clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="fsm.reaper"):
        result = reaper.run_once()
    assert result.bad_rows == 1 and result.moved == {"pipeline.expire": 4}
    assert any_store.get("p2").state == "running"
    assert any("p2" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    moved_lines = [r for r in caplog.records if r.levelno == logging.INFO and "-> failed" in r.getMessage()]
    assert len(moved_lines) == 4  # one INFO line per entity moved


def test_a_receiver_that_raises_does_not_stop_the_tick(any_store: Store, clock: ManualClock) -> None:
    for i in range(3):
        pipeline(any_store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))

    def broken(sender: str, payload: Any) -> None:
        raise RuntimeError("dashboard socket closed")

    signals.expired.connect(broken)
    try:
        result = reaper_for(any_store, clock).run_once()
    finally:
        signals.expired.disconnect(broken)
    assert result.moved == {"pipeline.expire": 3} and result.errors == 0


# -- config and schedule -------------------------------------------------------------------------


def test_a_config_whose_max_active_does_not_exceed_budget_plus_ttl_is_refused_naming_the_numbers() -> None:
    policy = Policy(
        lease_ttl=timedelta(minutes=2), renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1)}
    )
    bad = ReapPolicy(lifecycle=JobLifecycle, policy=policy, max_active=timedelta(minutes=61))
    with pytest.raises(ConfigError) as info:
        Reaper(MemoryStoreFactory(), {JobLifecycle: bad})
    message = str(info.value)
    assert "max_active=1:01:00" in message and "1:00:00" in message and "0:02:00" in message
    # finalizing can be re-entered by each of the 2 reclaims, each with a fresh budget
    reclaimed = ReapPolicy(lifecycle=JobLifecycle, policy=policy, max_active=timedelta(hours=2))
    with pytest.raises(ConfigError, match=r"\(1:00:00 \+ 0:02:00\) x \(1 \+ 2 reclaims\) \+ 0:05:00 = 3:11:00"):
        Reaper(MemoryStoreFactory(), {JobLifecycle: reclaimed})
    ok = ReapPolicy(lifecycle=JobLifecycle, policy=policy, max_active=timedelta(hours=3, minutes=12))
    Reaper(MemoryStoreFactory(), {JobLifecycle: ok})


def test_a_state_entered_with_a_kept_lease_needs_a_budget_too() -> None:
    from fsm.reaping.config import leased_states, watched_states

    assert leased_states(JobLifecycle) == {"running", "finalizing"}
    assert leased_states(PipelineLifecycle) == {"finalizing"}
    # a running pipeline has no lease of its own, but acquire_lease can give it one, and
    # the reaper watches running: with max_active set, it needs a budget too
    assert watched_states(PipelineLifecycle) == {"running", "finalizing"}
    policy = Policy(renewal_budget={"finalizing": timedelta(hours=1)}, default_renewal_budget=None)
    with pytest.raises(ConfigError, match="'running' has no renewal budget"):
        Reaper(
            MemoryStoreFactory(),
            {PipelineLifecycle: ReapPolicy(lifecycle=PipelineLifecycle, policy=policy, max_active=timedelta(hours=3))},
        )


def test_a_max_active_with_an_unbudgeted_leased_state_is_refused() -> None:
    policy = Policy(renewal_budget={"finalizing": timedelta(hours=1)}, default_renewal_budget=None)
    with pytest.raises(ConfigError, match="'running' has no renewal budget"):
        Reaper(
            MemoryStoreFactory(),
            {JobLifecycle: ReapPolicy(lifecycle=JobLifecycle, policy=policy, max_active=timedelta(hours=3))},
        )


@pytest.mark.parametrize("config", [{"interval": timedelta(0)}, {"batch_size": 0}, {"colour": "red"}])
def test_an_invalid_config_is_a_config_error(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Reaper(MemoryStoreFactory(), [PipelineLifecycle], config)


def test_the_reaper_needs_lifecycles() -> None:
    with pytest.raises(ConfigError, match="at least one lifecycle"):
        Reaper(MemoryStoreFactory(), [])
    with pytest.raises(ConfigError, match="not a Lifecycle"):
        Reaper(MemoryStoreFactory(), [object])  # type: ignore[list-item]


def MemoryStoreFactory() -> Store:
    from stores import MemoryStore

    return MemoryStore()


def test_start_and_stop_run_ticks_on_a_thread_and_tolerate_doubles(clock: ManualClock) -> None:
    reaper = Reaper(MemoryStoreFactory(), [PipelineLifecycle], {"interval": timedelta(milliseconds=5)}, clock=clock)
    ticked = threading.Event()

    def on_tick(sender: str, payload: Any) -> None:
        if reaper.ticks >= 2:
            ticked.set()

    signals.reaper_tick.connect(on_tick)
    try:
        reaper.start()
        reaper.start()  # a second start is a no-op
        assert ticked.wait(timeout=10), "the scheduled reaper never ticked twice"
        reaper.stop()
        reaper.stop()  # a second stop too
    finally:
        signals.reaper_tick.disconnect(on_tick)
    assert not reaper.running
    after = reaper.ticks
    ticked.clear()
    assert not ticked.wait(timeout=0.05) and reaper.ticks == after


def test_stop_is_prompt_even_with_a_long_interval(clock: ManualClock) -> None:
    reaper = Reaper(MemoryStoreFactory(), [PipelineLifecycle], {"interval": timedelta(hours=1)}, clock=clock)
    reaper.start()
    reaper.stop(timeout=5)
    assert not reaper.running


# -- one leader at a time ------------------------------------------------------------------------


def test_with_leader_on_only_one_of_two_reapers_ticks_until_the_leader_dies(
    any_store: Store, clock: ManualClock
) -> None:
    config = ReaperConfig(leader=True, interval=INTERVAL)
    first = Reaper(any_store, [PipelineLifecycle], config, clock=clock, owner="reaper-a")
    second = Reaper(any_store, [PipelineLifecycle], config, clock=clock, owner="reaper-b")
    pipeline(any_store, clock, "p1")
    clock.advance(timedelta(hours=2))
    assert first.run_once().leading
    standby = second.run_once()
    assert not standby.leading and standby.total_moved == 0 and "standby" in standby.summary()
    pipeline(any_store, clock, "p2")
    clock.advance(timedelta(hours=2))
    assert first.run_once().moved == {"pipeline.expire": 1}  # the leader renews and keeps working
    clock.advance(config.effective_leader_ttl + timedelta(seconds=1))  # reaper-a died: its lease runs out
    taken = second.run_once()
    assert taken.leading
    assert not first.run_once().leading  # back from the dead, it finds a new leader
    assert any_store.get("fsm-reaper-leader:pipeline").lease_owner == "reaper-b"


def test_a_stopped_leader_resigns_so_a_standby_leads_at_its_next_tick(any_store: Store, clock: ManualClock) -> None:
    config = ReaperConfig(leader=True, interval=timedelta(hours=1))
    first = Reaper(any_store, [PipelineLifecycle], config, clock=clock, owner="reaper-a")
    second = Reaper(any_store, [PipelineLifecycle], config, clock=clock, owner="reaper-b")
    assert first.run_once().leading and not second.run_once().leading
    first.stop()
    assert second.run_once().leading


def test_a_leader_ttl_not_longer_than_the_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match="leader_ttl"):
        Reaper(
            MemoryStoreFactory(), [PipelineLifecycle], {"leader": True, "leader_ttl": INTERVAL, "interval": INTERVAL}
        )


# -- rules a store cannot check: row by row through the engine ------------------------------------


class Pinnable(Lifecycle):
    """A reaper transition with a Python-only guard: the reaper cannot run it set-based."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing), lease=LeaseChange.ACQUIRE)
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire = reaper(active.running.to(failed, cond=["lease_stale", "not_pinned"]), reason="expired")

    @guard
    def not_pinned(ctx: GuardContext) -> bool:
        "an operator did not pin the entity for inspection"
        return not ctx.data.get("pinned", False)


def test_a_rule_with_a_python_guard_runs_row_by_row_through_the_engine(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(Pinnable, any_store, clock=clock)
    for i, pinned in enumerate([False, True, False]):
        engine.create(f"x{i}", data={"pinned": pinned})
        engine.fire(f"x{i}", "start")
    reaper = Reaper(any_store, [Pinnable], clock=clock)
    (rule,) = reaper.rules
    assert not rule.set_based
    clock.advance(timedelta(hours=2))
    preview = reaper.run_once(dry_run=True)  # the dry run judges the Python guard too
    assert sorted(entity for _, entity, _, _ in preview.would_move) == ["x0", "x2"]
    result = reaper.run_once()
    assert result.moved == {"pinnable.expire": 2} and result.refused == 1 and result.lost_races == 0
    assert [engine.get(f"x{i}").state for i in range(3)] == ["failed", "running", "failed"]


class DownStore:
    """Reads work, writes find the database gone."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def apply_batch(self, batch: Any) -> Any:
        from fsm import StoreUnavailable

        raise StoreUnavailable("connection refused")

    def move_candidates(self, batch: Any, *, limit: int) -> Any:
        return self.apply_batch(batch)


def test_a_database_outage_mid_tick_is_a_tick_error_not_lost_races(
    any_store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(3):
        pipeline(any_store, clock, f"p{i}")
    clock.advance(timedelta(hours=2))
    reaper = Reaper(DownStore(any_store), [PipelineLifecycle], clock=clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="fsm.reaper"):
        result = reaper.run_once()
    assert result.errors == 1 and result.lost_races == 0 and result.total_moved == 0
    assert "reaper tick failed" in caplog.text


def test_a_start_racing_a_stop_never_leaves_two_loops(clock: ManualClock) -> None:
    reaper = Reaper(MemoryStoreFactory(), [PipelineLifecycle], {"interval": timedelta(milliseconds=2)}, clock=clock)
    for _ in range(20):
        reaper.start()
        stopper = threading.Thread(target=reaper.stop)
        stopper.start()
        reaper.start()
        stopper.join()
        reaper.stop(timeout=5)
    alive = [t for t in threading.enumerate() if t.name == "fsm-reaper"]
    assert alive == [] and not reaper.running


def test_a_dry_run_lists_a_row_two_rules_would_move_once_and_takes_no_leadership(
    any_store: Store, clock: ManualClock
) -> None:
    pipeline(any_store, clock, "old", key="main")
    clock.advance(seconds=1)
    pipeline(any_store, clock, "new", key="main")
    clock.advance(timedelta(hours=2))  # old is both stale and superseded
    reaper = Reaper(any_store, [PipelineLifecycle], ReaperConfig(leader=True), clock=clock)
    result = reaper.run_once(dry_run=True)
    assert sorted(result.would_move) == [
        ("pipeline", "new", "expire", "failed"),
        ("pipeline", "old", "expire", "failed"),
    ]
    from fsm import UnknownEntity

    with pytest.raises(UnknownEntity):
        any_store.get("fsm-reaper-leader:pipeline")  # a dry run writes nothing, not even the leader row


def test_a_reap_policy_for_another_lifecycle_is_refused() -> None:
    wrong = ReapPolicy(lifecycle=JobLifecycle, policy=JobLifecycle.policy)
    with pytest.raises(ConfigError, match="ReapPolicy of JobLifecycle"):
        Reaper(MemoryStoreFactory(), {PipelineLifecycle: wrong})


def test_a_row_whose_data_cannot_be_written_back_is_a_bad_row_not_a_lost_race(
    tmp_path: Any, clock: ManualClock
) -> None:
    """SQLite reads 1e400 as a float (inf in Python), which JSON cannot hold: the declared
    change (fail the running steps) cannot be written for that row. The reaper moves the
    others and counts it as a bad row on every tick, not as a race it lost."""
    import sqlite3

    from stores.sql import SqlStore

    path = tmp_path / "fsm.db"
    store = SqlStore(f"sqlite:///{path}", clock=clock)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    steps = {"steps": [{"name": "build", "status": "running"}]}
    for i in range(3):
        engine.fire(engine.create(f"p{i}", data=steps), "start")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE fsm_entities SET data = ? WHERE id = 'p1'",
            ('{"steps": [{"name": "build", "status": "running"}], "size": 1e400}',),
        )
    clock.advance(timedelta(hours=2))
    reaper = Reaper(store, [PipelineLifecycle], clock=clock)
    first = reaper.run_once()
    assert first.moved == {"pipeline.expire": 2} and first.bad_rows == 1 and first.lost_races == 0
    again = reaper.run_once()
    assert again.bad_rows == 1 and again.lost_races == 0 and sum(again.moved.values()) == 0
    assert store.get("p0").data["steps"] == [{"name": "build", "status": "failed"}]
    store.close()
