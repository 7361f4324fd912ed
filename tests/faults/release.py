"""A parallel pipeline: a build region with a finalizer and a tests region, joined by a
completion event (the lifecycle of the parallel-region tests and fault scenario)."""

from __future__ import annotations

from statemachine import State

from fsm import Lifecycle, Policy
from fsm.lifecycle import reaper, recovery, starts, worker


class Release(Lifecycle):
    """``queued -> checks (build || tests) -> released``; ``fix`` after the join sends a
    release back to its checks (a second visit restarts both regions); ``cancel`` leaves the
    checks while they run (each running region's row rests in ``left_checks``)."""

    policy = Policy(lease_ttl=2.0, max_attempts=3, max_reclaims=3)

    queued = State(initial=True)

    class checks(State.Parallel):
        class build(State.Compound):
            compiling = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            built = State(final=True)
            broken = State(final=True)

            start = starts(compiling.to(active))
            finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
            succeed = worker(active.finalizing.to(built, cond="holds_lease"))
            expire, reclaim = recovery(
                queued=compiling, running=active.running, finalizing=active.finalizing, failed=broken
            )

        class tests(State.Compound):
            testing = State(initial=True)

            class checking(State.Compound):
                run = State(initial=True)

            passed = State(final=True)
            red = State(final=True)

            test_start = starts(testing.to(checking))
            test_pass = worker(checking.run.to(passed, cond="holds_lease"))
            test_fail = worker(checking.run.to(red, cond="holds_lease"))
            test_expire = (
                reaper(checking.run.to(testing, cond=["lease_stale", "owned", "attempts_left"]), reason="expired")
                | reaper(checking.run.to(red, cond=["lease_stale", "owned"]), reason="expired")
                | reaper(checking.run.to(red, cond=["lease_stale", "unclaimed"]), reason="unclaimed")
            )

    released = State()
    done = State(final=True)
    cancelled = State(final=True)

    begin = worker(queued.to(checks))
    cancel = worker(queued.to(cancelled) | checks.to(cancelled))
    done_state_checks = worker(checks.to(released))
    fix = worker(released.to(checks))
    publish = worker(released.to(done))


__all__ = ["Release"]
