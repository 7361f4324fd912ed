"""Limited job lifecycles and handlers the real-process limit tests share with their child
processes.

The children import it as ``test_coordination.proc_limits`` (``tests/`` on their path); the
test imports it relatively.  Each is :class:`~fsm.JobLifecycle`'s chart under a kind of its
own, with one kind of limit, so the workers' claims count in the store what the test checks.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

from fsm import JobLifecycle, Limits, Rate
from fsm.work.worker import Handler, Job, Outcome

PER_KEY = 2
TOTAL = 3
RATE = 20
RATE_PER = timedelta(seconds=1)
SLEEP_S = 0.010
"""Each of a job's two handlers sleeps a random time up to this: the jobs overlap, and a
job holds its lease for ``0..2 * SLEEP_S`` plus the claim's and the outcomes' commits."""


class PerKey(JobLifecycle):
    """At most :data:`PER_KEY` jobs with one concurrency key hold a lease at once."""

    kind = "proc_perkey"
    limits = Limits(per_key=PER_KEY)


class Total(JobLifecycle):
    """At most :data:`TOTAL` jobs hold a lease at once."""

    kind = "proc_total"
    limits = Limits(total=TOTAL)


class Rated(JobLifecycle):
    """At most :data:`RATE` starts in any window of :data:`RATE_PER`."""

    kind = "proc_rated"
    limits = Limits(rate=Rate(RATE, per=RATE_PER))


LIFECYCLES: dict[str, type[JobLifecycle]] = {c.__name__: c for c in (PerKey, Total, Rated)}


def handlers(seed: int) -> dict[str, Handler]:
    """The handlers of a worker process: ``running`` sleeps, then ``exited`` records when it
    began (``t0``, this machine's wall clock); ``finalizing`` sleeps, then ``complete``
    records when it ended (``t1``).  Both run under the claim's one lease, so ``[t0, t1]``
    lies inside the time the store counted the job as holding a slot."""
    draw = random.Random(seed).random  # one generator per process, shared by its pool threads

    def running(job: Job) -> Outcome:
        t0 = time.time()
        time.sleep(draw() * SLEEP_S)
        return ("exited", {"t0": t0})

    def finalizing(job: Job) -> Outcome:
        time.sleep(draw() * SLEEP_S)
        return ("complete", {"t1": time.time()})

    return {"running": running, "finalizing": finalizing}
