"""Issue 11, item 3: every staleness judgement follows the store's clock.

A reaper rule with a Python-only guard runs row by row through the engine.  The engine
used to judge ``lease_stale`` with the application's clock; with that clock behind the
store's, a finalizer dead by the store's clock was refused, and stayed in ``finalizing``
for as long as the clocks disagreed (I2 broken).
"""

from __future__ import annotations

from datetime import timedelta

from statemachine import State

from fsm import Engine, GuardContext, Lifecycle, ManualClock, guard, reaper, worker
from fsm.reaping import Reaper
from fsm.records import LeaseChange
from stores import Store


class Gated(Lifecycle):
    """A finalizer the reaper expires once its lease is stale, unless an operator holds it."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing), lease=LeaseChange.ACQUIRE)
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire = reaper(active.finalizing.to(failed, cond=["lease_stale", "not_held"]), reason="expired")

    @guard
    def not_held(ctx: GuardContext) -> bool:
        "an operator did not hold the entity for inspection"
        return not ctx.data.get("held", False)


def test_I2_a_reaper_whose_clock_is_behind_the_store_still_reaps_a_dead_finalizer(
    any_store: Store, clock: ManualClock
) -> None:
    """``clock`` is the store's; the application's clock stays ten minutes behind it."""
    app_clock = ManualClock(clock.now())
    worker_engine = Engine(Gated, any_store, clock=app_clock, owner="finalizer-1")
    worker_engine.create("g1")
    worker_engine.fire("g1", "start")
    assert worker_engine.fire("g1", "finish").lease is not None  # the finalizer takes its lease, then dies
    clock.advance(timedelta(minutes=10))  # the lease (2 min) is long dead by the store's clock
    reaper_ = Reaper(any_store, [Gated], clock=app_clock)
    (rule,) = reaper_.rules
    assert not rule.set_based  # the Python guard sends it row by row through the engine
    assert [e for _, e, _, _ in reaper_.run_once(dry_run=True).would_move] == ["g1"]
    result = reaper_.run_once()
    assert result.moved == {"gated.expire": 1} and result.refused == 0
    assert any_store.get("g1").state == "failed"


def test_I1_a_reaper_whose_clock_is_ahead_of_the_store_never_reaps_a_fresh_finalizer(
    any_store: Store, clock: ManualClock
) -> None:
    app_clock = ManualClock(clock.now() + timedelta(hours=1))
    worker_engine = Engine(Gated, any_store, clock=clock, owner="finalizer-1")
    worker_engine.create("g1")
    worker_engine.fire("g1", "start")
    worker_engine.fire("g1", "finish")
    result = Reaper(any_store, [Gated], clock=app_clock).run_once()
    assert result.total_moved == 0 and any_store.get("g1").state == "finalizing"
