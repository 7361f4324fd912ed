"""A durable wait that meets a store outage and is called again by the handler (as a
handler's retry of a store call does) is the same step, not the next one: the replay
after a resume numbers its waits as the first run did."""

from __future__ import annotations

from typing import Any

from fsm import Engine, JobLifecycle, ManualClock
from fsm.errors import StoreUnavailable
from fsm.work import Job, Worker
from stores import MemoryStore


def test_a_wait_retried_after_an_outage_keeps_its_step_number(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock)
    jobs.create("j")
    jobs.send("j", "go", {"n": 1}, idempotency_key="k1")
    real = store.effects
    calls = {"n": 0}

    def flaky(entity_id: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:  # the wait's first read of the messages meets an outage
            raise StoreUnavailable("down for a moment")
        return real(entity_id)

    got: list[Any] = []

    def running(job: Job) -> str:
        for _ in range(3):  # the handler's own retry of a store call
            try:
                got.append(job.wait_for("go"))
                break
            except StoreUnavailable:
                continue
        return "exited"

    store.effects = flaky  # type: ignore[method-assign]
    with Worker(jobs, {"running": running, "finalizing": lambda job: "complete"}) as worker:
        for _ in range(200):
            worker.run_once()
            if jobs.get("j").state == "completed":
                break
            clock.advance(seconds=1)
    assert jobs.get("j").state == "completed" and got == [{"n": 1}]
    steps = sorted(e.key for e in real("j") if e.key.startswith("fsm:step:running:wait:"))
    assert steps == ["fsm:step:running:wait:1", "fsm:step:running:wait:1:until"], steps
