"""On a shared in-memory SQLite store every public method is wrapped in the connection's
lock: the reaper's brief claim must be too (its BEGIN IMMEDIATE .. COMMIT runs on the one
shared connection)."""

from __future__ import annotations

import threading
from datetime import timedelta

from fsm import Engine, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from fsm.records import BatchWrite, LeaseChange, LeaseStale
from stores.sql import SqlStore


def test_the_reaper_takes_the_shared_connections_lock() -> None:
    clock = ManualClock()
    store = SqlStore("sqlite://", clock=clock)
    assert store._conns.lock is not None
    engine = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(3):
        engine.fire(engine.create(f"p{i}").id, "start")
    clock.advance(timedelta(hours=2))
    reaper = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=10), clock=clock)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread is inside a store call on the shared connection
        with store._conns.lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    done = threading.Event()
    brief = reaper._brief  # what run_once calls for each rule: brief(write, limit=...)
    assert brief is not None
    claim = BatchWrite(
        (),
        "pipeline",
        "expire",
        "running",
        "failed",
        "reaper",
        (LeaseStale(timedelta(minutes=60)),),
        LeaseChange.CLEAR,
        reason="expired",
    )
    threading.Thread(target=lambda: (brief(claim, limit=10), done.set()), daemon=True).start()
    ran_without_lock = done.wait(1.0)
    release.set()
    t.join()
    assert not ran_without_lock, "the reaper's tick used the shared connection while another thread held its lock"
