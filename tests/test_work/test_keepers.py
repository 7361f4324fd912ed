"""One keeper for every lease a worker holds: one round renews them all in one
transaction, and each holder hears only its own answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

import signals
from fsm import ConfigError, Engine, JobLifecycle, LeaseLost, ManualClock, Policy
from fsm.errors import InvalidArgument, StoreUnavailable
from fsm.records import Lease
from fsm.work import LeaseKeepers
from fsm.work.keeper import RETRY_FRACTION
from stores import MemoryStore

WAIT = 10.0


def claimed(jobs: Engine, n: int) -> list[Lease]:
    jobs.create_many([{} for _ in range(n)])
    leases = [s.lease for s in jobs.claim(n)]
    assert all(lease is not None for lease in leases)
    return leases  # type: ignore[return-value]


class Counting(MemoryStore):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.calls: list[int] = []
        self.down = False

    def renew_leases(self, leases: Sequence[Lease], **kw: Any) -> Any:
        if self.down:
            raise StoreUnavailable("the store is down")
        self.calls.append(len(leases))
        return super().renew_leases(leases, **kw)


def test_one_round_renews_every_kept_lease_in_one_call(clock: ManualClock) -> None:
    store = Counting(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    helds = [keepers.keep(lease) for lease in claimed(jobs, 3)]
    clock.advance(timedelta(seconds=40))
    results = keepers.run_once(all_of_them=True)
    assert store.calls == [3] and keepers.rounds == 1
    assert all(r.renewed for r in results.values())
    assert all(h.lease.expires_at == clock.now() + jobs.policy.lease_ttl and h.renewals == 1 for h in helds)
    keepers.stop()


def test_a_taken_over_lease_is_told_to_its_holder_only(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    mine, theirs = (keepers.keep(lease) for lease in claimed(jobs, 2))
    store.release_lease(theirs.entity_id, owner="w1", token=theirs.lease.token)  # somebody let it go
    lost: list[Any] = []
    with signals.lease_lost.connected_to(lambda sender, **kw: lost.append(kw)):
        results = keepers.run_once(all_of_them=True)
    assert results[mine.entity_id].renewed and not mine.lost
    assert results[theirs.entity_id].lost and theirs.lost
    with pytest.raises(LeaseLost):
        theirs.check()
    assert len(lost) == 1 and len(keepers) == 1  # the lost one is no longer kept
    keepers.stop()


def test_a_store_outage_is_retried_until_the_lease_would_lapse(clock: ManualClock) -> None:
    store = Counting(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    (held,) = (keepers.keep(lease) for lease in claimed(jobs, 1))
    store.down = True
    first = keepers.run_once(all_of_them=True)[held.entity_id]
    assert first.retry and not held.lost
    held._deadline = time.monotonic() + keepers.period / RETRY_FRACTION / 2  # lapses before the next retry
    last = keepers.run_once(all_of_them=True)[held.entity_id]
    assert last.lost and held.lost
    keepers.stop()


def test_a_holder_that_finished_its_entity_is_not_told_it_lost(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    (lease,) = claimed(jobs, 1)
    held = keepers.keep(lease)
    done = jobs.fire(lease.entity_id, "exited", lease=lease)
    jobs.fire(done, "complete", lease=lease)  # final: the lease is cleared
    result = keepers.run_once(all_of_them=True)[lease.entity_id]
    assert result.reason == "finished by its holder" and not held.lost
    keepers.stop()


def test_the_thread_renews_when_a_lease_is_due(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs, period=timedelta(milliseconds=20))
    renewed = threading.Event()
    (lease,) = claimed(jobs, 1)
    with signals.lease_renewed.connected_to(lambda sender, **kw: renewed.set()):
        held = keepers.keep(lease)
        assert renewed.wait(WAIT)
    assert held.renewals >= 1
    keepers.release(held)
    keepers.release(held)  # idempotent
    keepers.stop()
    keepers.stop()


def test_a_period_not_below_the_ttl_is_refused(store: MemoryStore) -> None:
    jobs = Engine(JobLifecycle, store)
    with pytest.raises(ConfigError):
        LeaseKeepers(jobs, period=jobs.policy.lease_ttl)


def test_a_lease_lost_but_not_yet_released_does_not_make_the_keeper_spin(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs, period=timedelta(milliseconds=5))
    rounds: list[int] = []
    real = keepers.run_once

    def counted(**kw: Any) -> Any:
        rounds.append(1)
        return real(**kw)

    keepers.run_once = counted  # type: ignore[method-assign]
    (lease,) = claimed(jobs, 1)
    held = keepers.keep(lease)
    held._lost = True  # its holder learnt it lost the lease and has not released it yet
    threading.Event().wait(0.3)  # sixty periods: a loop counting the lost lease's due time spins
    keepers.stop()
    assert len(rounds) <= 2


def test_a_lease_kept_after_the_keeper_went_idle_is_renewed_in_time(clock: ManualClock) -> None:
    """Keeping a lease never wakes the keeper's thread (no thread switch between a claim and
    its handler): an idle keeper looks again within a period, which is before the new
    lease is due."""
    store = Counting(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    period = timedelta(milliseconds=100)
    keepers = LeaseKeepers(jobs, period=period)
    first, second = claimed(jobs, 2)
    held = keepers.keep(first)
    keepers.release(held)  # the thread now waits with nothing to renew
    threading.Event().wait(0.25)
    renewed = threading.Event()
    with signals.lease_renewed.connected_to(lambda sender, **kw: renewed.set()):
        later = keepers.keep(second)
        # the bound that matters: renewed before the lease would lapse
        assert renewed.wait(min(WAIT, jobs.policy.lease_ttl.total_seconds()))
    keepers.stop()
    assert later.renewals >= 1 and store.calls and store.calls[0] == 1


class Stuck(MemoryStore):
    """A store whose renewals hang (a connection to a server that went away) until let go."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = threading.Event()
        self.go = threading.Event()

    def renew_leases(self, leases: Sequence[Lease], **kw: Any) -> Any:
        self.stuck.set()
        self.go.wait(WAIT)
        return super().renew_leases(leases, **kw)


SHORT = Policy(
    lease_ttl=timedelta(milliseconds=300),
    renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1)},
)


def test_a_holder_whose_renewal_hangs_is_told_by_its_own_clock_when_the_lease_lapses() -> None:
    store = Stuck()
    jobs = Engine(JobLifecycle, store, policy=SHORT, owner="w1")
    keepers = LeaseKeepers(jobs, period=timedelta(milliseconds=50))
    asked_at = time.monotonic()
    (lease,) = claimed(jobs, 1)
    held = keepers.keep(lease, asked_at=asked_at)
    assert held.deadline == pytest.approx(asked_at + 0.3) and not held.lost
    assert store.stuck.wait(WAIT)  # the keeper's renewal is on its way, and hangs
    assert held.wait_lost(WAIT)  # woken at the deadline, though no verdict came
    assert time.monotonic() >= held.deadline
    with pytest.raises(LeaseLost, match="no renewal was confirmed"):
        held.check()
    store.go.set()  # the renewal lands at last (the store's lease was still live): too late
    keepers.stop()
    assert held.lost and held.renewals <= 1


def test_a_lease_lapsed_by_the_clock_stays_lost_when_a_renewal_lands_after(clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, MemoryStore(clock=clock), clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    (lease,) = claimed(jobs, 1)
    held = keepers.keep(lease, asked_at=time.monotonic() - 3600)  # asked for an hour ago
    assert held.lost and "no renewal was confirmed" in (held.reason or "")
    held._renewed(lease, time.monotonic() + 60)
    assert held.lost
    keepers.stop()


def test_wait_lost_returns_false_after_its_timeout_while_the_lease_lasts(clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, MemoryStore(clock=clock), clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    (lease,) = claimed(jobs, 1)
    held = keepers.keep(lease)
    assert held.wait_lost(0.01) is False and not held.lost
    keepers.stop()


@pytest.mark.parametrize("bad", ["now", float("nan"), float("inf"), True, None.__class__])
def test_keep_refuses_an_asked_at_that_is_no_clock_reading(clock: ManualClock, bad: object) -> None:
    jobs = Engine(JobLifecycle, MemoryStore(clock=clock), clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    (lease,) = claimed(jobs, 1)
    with pytest.raises(InvalidArgument, match="asked_at"):
        keepers.keep(lease, asked_at=bad)  # type: ignore[arg-type]
    assert len(keepers) == 0
    keepers.stop()


def test_keep_many_keeps_a_claims_leases_together_or_none_of_them(clock: ManualClock) -> None:
    """A claim's leases are kept in one call, each with its own HeldLease whose deadline
    counts from the claim; one that is not a Lease, or an asked_at that is no clock
    reading, is refused before any is kept."""
    store = Counting(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    keepers = LeaseKeepers(jobs)
    leases = claimed(jobs, 3)
    asked_at = time.monotonic()
    with pytest.raises(InvalidArgument, match="Lease"):
        keepers.keep_many([*leases, "not a lease"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="asked_at"):
        keepers.keep_many(leases, asked_at=float("nan"))
    for not_a_list in (None, "lease", leases[0], 42):  # a lease alone is a tuple of its fields: refused
        with pytest.raises(InvalidArgument):
            keepers.keep_many(not_a_list)  # type: ignore[arg-type]
    assert len(keepers) == 0
    helds = keepers.keep_many(leases, asked_at=asked_at)
    assert [h.lease for h in helds] == leases and len(keepers) == 3
    assert all(h.deadline == asked_at + jobs.policy.lease_ttl.total_seconds() for h in helds)
    clock.advance(timedelta(seconds=40))
    assert all(r.renewed for r in keepers.run_once(all_of_them=True).values())
    assert store.calls == [3]
    keepers.stop()
