"""A parked entity woken and claimed again while its previous run still winds down on its
handler thread (a loaded machine deschedules that thread between the park and the
worker's bookkeeping) is two runs of one entity at once in the worker's books: each must
give back its own slot, or the worker loses one for good (``running`` never returns to 0,
``stop`` forgets the earlier run)."""

from __future__ import annotations

import threading
from datetime import timedelta

from fsm import Engine, JobLifecycle, ManualClock
from fsm.work import Job, Worker
from fsm.work.waits import Parked
from stores import MemoryStore

WAIT = 10.0


def test_a_run_claimed_again_before_the_last_one_ended_leaks_no_slot() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    claimed_again = threading.Event()
    tokens: list[int] = []

    def running(job: Job) -> str:
        tokens.append(job.snapshot.lease_token)
        if len(tokens) == 1:
            try:
                job.wait_for("go")
            except Parked:
                store.wake(job.id)  # a child ended right after the park: the parent is due
                assert claimed_again.wait(WAIT)  # this thread unwinds late
                raise
        return "exited"

    engine.create("p")
    handlers = {"running": running, "finalizing": lambda job: "complete"}
    with Worker(engine, handlers, poll_interval=timedelta(milliseconds=10), grace=timedelta(seconds=5)) as worker:
        assert worker.run_once() == 1
        for _ in range(500):  # the loop claims the woken entity while its first run winds down
            if worker.run_once():
                break
            threading.Event().wait(0.01)
        assert worker.running == 2  # two runs of one entity, each with its slot
        claimed_again.set()
        for _ in range(1000):
            if engine.get("p").state == "completed" and worker.running == 0:
                break
            threading.Event().wait(0.01)
        assert engine.get("p").state == "completed" and len(tokens) == 2
        assert worker.running == 0, f"a slot leaked: running={worker.running}"
