"""A timed lifecycle the real-process timer tests share with their child processes.

The children import it as ``test_timers.proc_lifecycles`` (``tests/`` on their path); the
test imports it relatively.  Both are the same chart of the same kind, so they read and
write the same rows.
"""

from __future__ import annotations

from datetime import timedelta

from statemachine import State

from fsm import Lifecycle, reaper, starts, worker

AFTER = timedelta(seconds=2)
"""The timer: short enough for a real-time test, long enough that a child process started
right after a create is running before the timer is due."""


class Timed(Lifecycle):
    """A request that times out after :data:`AFTER` in ``waiting``, unless a worker
    cancels it or a claim starts it first."""

    kind = "proc_timed"
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
    timeout = reaper(waiting.to(failed), after=AFTER, reason="timed out")
