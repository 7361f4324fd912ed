"""Several reapers at once on one database (issue 4): every stale row moves exactly once.

Each reaper has its own store object (its own connections), as reapers on several machines
would; on PostgreSQL they claim rows with FOR UPDATE SKIP LOCKED, on SQLite they take turns
at the write lock.  Whatever the interleaving, the rows' histories must show one move each.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from conftest import SqlTarget

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig, ReapResult

STALE = 120
REAPERS = 4


def test_concurrent_reapers_move_each_stale_row_exactly_once(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    setup = sql_target.store(clock=clock)
    pipelines = Engine(PipelineLifecycle, setup, clock=clock)
    jobs = Engine(JobLifecycle, setup, clock=clock)
    for i in range(STALE // 2):
        pipelines.create(f"p{i:03d}")
        pipelines.fire(f"p{i:03d}", "start")
        lease = jobs.fire(jobs.create(f"j{i:03d}").id, "start").lease
        assert lease is not None
        jobs.fire(f"j{i:03d}", "exited", lease=lease)
    clock.advance(timedelta(hours=2))
    results: list[ReapResult] = []
    barrier = threading.Barrier(REAPERS)

    def reap() -> None:
        reaper = Reaper(sql_target.store(clock=clock), [PipelineLifecycle, JobLifecycle], ReaperConfig(batch_size=7))
        barrier.wait()
        results.append(reaper.run_once())

    threads = [threading.Thread(target=reap) for _ in range(REAPERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.errors == 0 and r.bad_rows == 0 for r in results), [r.summary() for r in results]
    moved = sum(r.total_moved for r in results)
    assert moved == STALE, [r.summary() for r in results]
    for i in range(STALE // 2):
        p_history = pipelines.history(f"p{i:03d}")
        assert [r.event for r in p_history] == ["start", "expire"]
        j_history = jobs.history(f"j{i:03d}")
        assert [r.event for r in j_history] == ["start", "exited", "reclaim"]  # reclaimed once, not twice
        assert [r.seq for r in j_history] == [1, 2, 3]
        assert jobs.get(f"j{i:03d}").lease_token == 2


def test_a_real_malformed_row_is_counted_logged_and_stepped_over(sql_target: SqlTarget) -> None:
    from stores.sql import create_engine

    clock = ManualClock()
    store = sql_target.store(clock=clock)
    pipelines = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(6):
        pipelines.fire(pipelines.create(f"p{i}").id, "start")
    broken = "'{broken'" if sql_target.dialect == "sqlite" else "'[1, 2]'"  # jsonb only holds valid JSON
    engine = create_engine(sql_target.url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {sql_target.prefix}entities SET data = {broken} WHERE id IN ('p0', 'p3')")
    finally:
        engine.dispose()
    clock.advance(timedelta(hours=2))
    result = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=2), clock=clock).run_once()
    assert result.bad_rows == 2 and result.errors == 0
    assert result.moved == {"pipeline.expire": 4}
    assert [pipelines.get(f"p{i}").state for i in (1, 2, 4, 5)] == ["failed"] * 4
