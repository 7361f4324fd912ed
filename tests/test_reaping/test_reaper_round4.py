"""The reaper a worker embeds, as an operator sees it: one leader per lifecycle, its ticks
in the tick log (what ``fsm inspect`` shows), and its idle ticks kept out of the INFO log."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from fsm.reaping.ticklog import TICKS_ID
from fsm.work import Worker
from stores import MemoryStore, Store

WAIT = 30.0


def _until(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        threading.Event().wait(0.01)
    raise AssertionError(what)


def test_idle_ticks_log_at_debug_and_a_tick_that_moves_logs_at_info(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    reaper = Reaper(store, [PipelineLifecycle], ReaperConfig(interval=timedelta(milliseconds=10)), clock=clock)
    caplog.set_level(logging.DEBUG, logger="fsm.reaper")
    reaper.start()
    try:
        _until(lambda: reaper.ticks >= 3, "the reaper never ticked")
        ticks = [r for r in caplog.records if r.name == "fsm.reaper" and r.getMessage().startswith("reaper tick:")]
        assert ticks and {r.levelno for r in ticks} == {logging.DEBUG}  # "moved nothing" is not news
        pipelines = Engine(PipelineLifecycle, store, clock=clock)
        pipelines.create("p1")
        pipelines.fire("p1", "start")
        clock.advance(PipelineLifecycle.policy.stale_after + timedelta(seconds=1))  # type: ignore[operator]
        _until(lambda: pipelines.get("p1").state == "failed", "the zombie was never expired")
        _until(
            lambda: any(
                r.levelno == logging.INFO and r.getMessage().startswith("reaper tick: moved pipeline.expire=1")
                for r in caplog.records
            ),
            "the tick that moved a pipeline was not logged at INFO",
        )
    finally:
        reaper.stop()


def test_a_workers_embedded_reaper_records_the_ticks_it_leads(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    worker = Worker(
        engine,
        {"running": lambda job: "exited", "finalizing": lambda job: "complete"},
        poll_interval=timedelta(milliseconds=10),
        reap=ReaperConfig(interval=timedelta(milliseconds=20)),
    )
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    runner.start()
    try:
        _until(lambda: _ticks(any_store) >= 2, "the embedded reaper's ticks never reached the tick log")
    finally:
        worker.stop()
        runner.join(WAIT)
    rows = [h for h in any_store.history(TICKS_ID) if h.event == "tick"]
    assert {h.data["owner"] for h in rows} == {engine.owner}  # type: ignore[index]
    assert all(h.data["leading"] for h in rows)  # type: ignore[index]


def _ticks(store: Store) -> int:
    try:
        return sum(1 for h in store.history(TICKS_ID) if h.event == "tick")
    except Exception:
        return 0
