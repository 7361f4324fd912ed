"""Threads racing on the memory store: one winner per compare-and-set, history gap-free (I3, I6)."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

from fsm import Engine, FsmError, JobLifecycle, ManualClock
from stores import MemoryStore


def test_threads_racing_to_start_the_same_jobs_get_exactly_one_winner_each() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    ids = [f"j{i}" for i in range(200)]
    setup = Engine(JobLifecycle, store, clock=clock)
    for i in ids:
        setup.create(i)
    wins: Counter[str] = Counter()
    losses: Counter[str] = Counter()
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        engine = Engine(JobLifecycle, store, clock=clock, owner=f"w{n}")
        barrier.wait()
        for i in ids:
            try:
                engine.fire(i, "start")
                wins[i] += 1
            except FsmError as err:
                losses[type(err).__name__] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(wins[i] == 1 for i in ids)
    assert sum(losses.values()) == 7 * len(ids)
    assert set(losses) <= {"StaleVersion", "TransitionNotAllowed"}
    for i in ids:
        snap = store.get(i)
        assert snap.version == 1 and [r.seq for r in store.history(i)] == [1]
        assert snap.lease_token == 1


def test_renewals_racing_a_reclaim_never_leave_two_live_holders() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w")
    lease = engine.fire(engine.create("j").id, "start").lease
    assert lease is not None
    engine.fire("j", "exited", lease=lease)
    clock.advance(engine.policy.lease_ttl + timedelta(seconds=1))
    outcomes: list[str] = []

    def renew() -> None:
        try:
            engine.renew_lease(lease)
            outcomes.append("renewed")
        except FsmError:
            outcomes.append("lost")

    def reclaim() -> None:
        try:
            Engine(JobLifecycle, store, clock=clock, owner="r").fire("j", "reclaim", actor="reaper")
            outcomes.append("reclaimed")
        except FsmError:
            outcomes.append("refused")

    threads = [threading.Thread(target=renew), threading.Thread(target=reclaim)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the lease was expired: renewal must not revive it, so the reclaim wins
    assert sorted(outcomes) == ["lost", "reclaimed"]
    # the reaper fences the dead holder (token + 1) and leaves the lease free for a claim
    assert store.get("j").lease_owner is None and store.get("j").lease_token == 2
