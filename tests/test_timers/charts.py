"""Timed lifecycles the timer tests share."""

from __future__ import annotations

from datetime import timedelta

from statemachine import State

from fsm import Lifecycle, reaper, starts, worker
from fsm.records import LeaseChange


class Approval(Lifecycle):
    """A request waits a day for approval, then times out; once approved, the whole active
    phase (running and finalizing together) has a 90-minute deadline."""

    kind = "approval"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    cancel = worker(waiting.to(failed), reason="cancelled")
    timeout = reaper(waiting.to(failed), after=timedelta(hours=24), reason="timed out")
    deadline = reaper(active.to(failed, cond="lease_stale"), after=timedelta(minutes=90), reason="deadline")


class Reminder(Lifecycle):
    """An expiry after an hour on the initial state, and a finalizer reaped only when dead."""

    kind = "reminder"
    open = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    closed = State(final=True)
    expired = State(final=True)

    start = worker(open.to(active), lease=LeaseChange.ACQUIRE)
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    close = worker(active.finalizing.to(closed, cond="holds_lease"))
    expire = reaper(open.to(expired), after=timedelta(hours=1), reason="expired")
    reap = reaper(active.finalizing.to(expired, cond="lease_stale"), reason="dead")


class Quick(Lifecycle):
    """A request that times out after 300 ms (real-time tests)."""

    kind = "quick"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    timeout = reaper(waiting.to(failed), after=timedelta(milliseconds=300), reason="timed out")


class Nested(Lifecycle):
    """A timer on a compound state with a nested compound inside, internal and external
    self-transitions, and a transition from the timed state into its own child."""

    kind = "nested"
    idle = State(initial=True)

    class active(State.Compound):
        class running(State.Compound):
            fetch = State(initial=True)
            build = State()

        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(idle.to(active))
    step = worker(active.running.fetch.to(active.running.build))
    again = worker(active.running.to.itself(internal=True))  # type: ignore[no-untyped-call]
    restart = worker(active.running.to.itself())  # type: ignore[no-untyped-call]
    reset = worker(active.to(active.running.build, cond="holds_lease"))  # external: leaves and re-enters ``active``
    finish = worker(active.running.build.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    deadline = reaper(active.to(failed, cond="lease_stale"), after=timedelta(minutes=30))
