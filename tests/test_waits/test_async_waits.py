"""The asyncio face's durable waits: ``await job.sleep`` and ``await job.wait_for`` park the
entity, ``await engine.send`` wakes it; real time, short waits, nothing timed."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from fsm import AsyncEngine, JobLifecycle
from fsm.aio import AsyncJob, AsyncWorker
from stores.aio import AsyncMemoryStore

PATIENT = 30.0


async def until(predicate: Any, what: str) -> None:
    for _ in range(int(PATIENT / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_an_async_handler_sleeps_and_waits_without_holding_its_slot() -> None:
    async def scenario() -> None:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await jobs.create("waiter")
        await jobs.create("other")
        seen: list[Any] = []

        async def running(job: AsyncJob) -> str:
            if job.id == "waiter":
                await job.sleep(timedelta(milliseconds=200))
                seen.append(await job.wait_for("go"))
            else:
                seen.append("other")
            return "exited"

        worker = AsyncWorker(jobs, {"running": running}, concurrency=1, poll_interval=timedelta(milliseconds=20))
        task = asyncio.create_task(worker.run())
        await until(lambda: "other" in seen, "the other job ran while the waiter slept")
        await until(lambda: worker.stats.parked == 2, "slept, then waited for go")
        assert await jobs.send("waiter", "go", {"ok": True}, idempotency_key="go-1") is True
        await until(lambda: {"ok": True} in seen, "the message woke the waiter")
        await until(lambda: worker.running == 0, "the handlers finished")
        await worker.stop()
        await task
        assert (await jobs.get("waiter")).state == "finalizing"
        assert seen == ["other", {"ok": True}]

    asyncio.run(scenario())
