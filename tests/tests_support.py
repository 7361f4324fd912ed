"""Small lifecycles shared by tests."""

from __future__ import annotations

from statemachine import State

from fsm import Lifecycle, reaper, worker


class Untyped(Lifecycle):
    """A lifecycle with no data model."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")
