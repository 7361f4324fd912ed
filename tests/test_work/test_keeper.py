"""The lease keeper: renews with the latest lease, stops when the lease is lost, tells the holder."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

import signals
from fsm import Engine, JobLifecycle, LeaseLost, ManualClock, Policy
from fsm.errors import ConfigError, Fenced, StoreUnavailable
from fsm.reaping import Reaper, ReaperConfig
from fsm.records import Lease
from fsm.work import AsyncLeaseKeeper, LeaseKeeper
from fsm.work.keeper import RETRY_FRACTION, KeeperCore
from stores import MemoryStore, Store


def finalizing(engine: Engine, entity_id: str = "j1") -> Lease:
    engine.create(entity_id)
    (snap,) = engine.claim()
    assert snap.lease is not None
    engine.fire(entity_id, "exited", lease=snap.lease)
    return snap.lease


def test_a_renewal_moves_the_expiry_and_the_holder_always_reads_the_latest_lease(
    jobs: Engine, clock: ManualClock
) -> None:
    lease = finalizing(jobs)
    core = KeeperCore(jobs, lease)
    clock.advance(timedelta(seconds=40))
    assert core.renew().renewed
    assert core.held.lease.expires_at == clock.now() + jobs.policy.lease_ttl
    assert core.held.lease.expires_at > lease.expires_at and core.held.renewals == 1
    assert jobs.get("j1").version == 2  # a renewal is not a transition


def test_each_renewal_of_the_keeper_is_logged_and_is_not_an_effect(jobs: Engine, clock: ManualClock) -> None:
    lease = finalizing(jobs)
    core = KeeperCore(jobs, lease)
    for _ in range(3):
        clock.advance(timedelta(seconds=40))
        assert core.renew().renewed
    logged = jobs.renewals("j1")
    assert [(r.at, r.expires_at) for r in logged] == [
        (clock.now() - timedelta(seconds=40 * i), clock.now() - timedelta(seconds=40 * i) + jobs.policy.lease_ttl)
        for i in (2, 1, 0)
    ]
    assert {(r.owner, r.token, r.acquired) for r in logged} == {(lease.owner, lease.token, False)}
    assert jobs.effects("j1") == [] and [h.event for h in jobs.history("j1")] == ["start", "exited"]


def test_a_refused_renewal_stops_the_keeper_sends_lease_lost_and_the_holder_learns_it(
    jobs: Engine, clock: ManualClock
) -> None:
    lease = finalizing(jobs)
    lost: list[Any] = []
    signals.lease_lost.connect(lambda sender, payload: lost.append(payload), weak=False)
    try:
        core = KeeperCore(jobs, lease)
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))  # the holder hung past its TTL
        jobs.fire("j1", "reclaim", actor="reaper")
        result = core.renew()
    finally:
        signals.lease_lost.receivers.clear()
    assert result.lost and not result.renewed
    assert core.held.lost and core.held.reason is not None
    with pytest.raises(Fenced):
        core.held.check()
    assert len(lost) == 1 and lost[0].token == lease.token
    assert not core.renew().renewed  # a lost keeper never renews again


def test_leaving_the_keeper_block_raises_the_fencing_error_if_the_lease_was_lost(
    jobs: Engine, clock: ManualClock
) -> None:
    lease = finalizing(jobs)
    keeper = LeaseKeeper(jobs, lease, period=timedelta(seconds=30))
    with pytest.raises(LeaseLost), keeper as held:
        clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
        jobs.fire("j1", "reclaim", actor="reaper")
        jobs.claim(owner="someone-else")
        keeper.core.renew()  # the step the thread would take
        assert held.lost


def test_the_keeper_stops_at_the_renewal_budget_and_the_reaper_can_then_act(
    store: MemoryStore, clock: ManualClock
) -> None:
    policy = Policy(
        lease_ttl=timedelta(minutes=2),
        renewal_budget={"running": timedelta(hours=6), "finalizing": timedelta(minutes=10)},
        max_attempts=3,
        max_reclaims=0,
    )
    engine = Engine(JobLifecycle, store, clock=clock, policy=policy)
    core = KeeperCore(engine, finalizing(engine))
    renewals = 0
    while core.renew().renewed:  # a live-but-hung holder renewing forever
        renewals += 1
        clock.advance(timedelta(seconds=40))
        assert renewals < 100, "the budget never stopped the keeper"
    assert core.held.lost and "budget" in (core.held.reason or "")
    clock.advance(policy.lease_ttl + timedelta(seconds=1))
    reaper = Reaper(store, {JobLifecycle: policy}, clock=clock)
    assert reaper.run_once().moved == {"job.expire": 1}
    assert engine.get("j1").state == "failed"


class FlakyStore:
    """A store whose renewals fail (the database is unreachable) while ``down``."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.down = False

    def renew_lease(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise StoreUnavailable("connection refused")
        return self._store.renew_lease(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_failing_renewals_are_retried_sooner_and_given_up_when_the_lease_would_lapse(
    store: MemoryStore, clock: ManualClock
) -> None:
    flaky = FlakyStore(store)
    engine = Engine(JobLifecycle, flaky, clock=clock)  # type: ignore[arg-type]
    core = KeeperCore(engine, finalizing(engine))
    flaky.down = True
    first = core.renew()
    assert first.retry and not first.lost
    assert core.next_delay(first) < core.next_delay(None)  # retried sooner than the period
    core.held._deadline = time.monotonic() + core.period / RETRY_FRACTION / 2  # ... until it would lapse
    assert core.renew().lost and "kept failing" in (core.held.reason or "")


def test_progress_travels_with_the_next_renewal_and_the_next_owner_reads_it(jobs: Engine, clock: ManualClock) -> None:
    core = KeeperCore(jobs, finalizing(jobs))
    core.held.progress({"gate": "coverage", "done": 2})
    assert jobs.progress("j1") is None  # not before a renewal carries it
    core.renew()
    assert jobs.progress("j1") == {"gate": "coverage", "done": 2}
    assert jobs.effects("j1") == []  # the progress row is not an effect


def test_a_period_at_or_above_the_ttl_is_refused(jobs: Engine) -> None:
    lease = finalizing(jobs)
    with pytest.raises(ConfigError):
        LeaseKeeper(jobs, lease, period=jobs.policy.lease_ttl)


SHORT = Policy(
    lease_ttl=timedelta(milliseconds=600),
    renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1)},
)


def test_on_its_thread_the_keeper_keeps_a_slow_holder_alive_past_many_ttls() -> None:
    store = MemoryStore()  # the real clock
    engine = Engine(JobLifecycle, store, policy=SHORT)
    lease = finalizing(engine)
    reaper = Reaper(store, {JobLifecycle: SHORT}, ReaperConfig(interval=timedelta(seconds=1)))
    with LeaseKeeper(engine, lease) as held:
        deadline = time.monotonic() + 4 * SHORT.lease_ttl.total_seconds()
        while time.monotonic() < deadline:  # the slow gate: four TTLs of work
            assert not reaper.run_once().moved, "the reaper touched a live holder"
            time.sleep(0.05)
        engine.fire("j1", "complete", lease=held.check())
    assert held.renewals >= 4
    assert engine.get("j1").state == "completed"


def test_the_asyncio_keeper_renews_without_blocking_the_loop() -> None:
    store = MemoryStore()
    engine = Engine(JobLifecycle, store, policy=SHORT)
    lease = finalizing(engine)

    async def main() -> int:
        ticks = 0
        async with AsyncLeaseKeeper(engine, lease) as held:
            for _ in range(60):  # the loop stays free: 60 short awaits over ~3 TTLs
                await asyncio.sleep(0.03)
                ticks += 1
            engine.fire("j1", "complete", lease=held.check())
        assert held.renewals >= 3
        return ticks

    assert asyncio.run(main()) == 60
    assert engine.get("j1").state == "completed"


def test_keep_refuses_what_is_not_a_lease(jobs: Engine) -> None:
    from fsm import InvalidArgument

    with pytest.raises(InvalidArgument):
        LeaseKeeper(jobs, "not a lease")  # type: ignore[arg-type]


def test_a_renewal_racing_the_holders_own_completion_is_not_a_loss(jobs: Engine) -> None:
    lease = finalizing(jobs)
    core = KeeperCore(jobs, lease)
    jobs.fire("j1", "complete", lease=lease)  # the final state clears the lease; a renewal was due
    result = core.renew()
    assert result.lost and result.reason == "finished by its holder"  # the keeper stops...
    assert not core.held.lost and core.held.error is None  # ...and the holder is not told it lost


def test_a_renewal_after_somebody_else_finished_the_entity_is_a_loss(jobs: Engine) -> None:
    lease = finalizing(jobs)
    core = KeeperCore(jobs, lease)
    jobs.release_lease(lease)
    (other,) = jobs.claim(owner="w2")
    assert other.lease is not None
    jobs.fire("j1", "complete", lease=other.lease)
    assert core.renew().lost and core.held.lost
