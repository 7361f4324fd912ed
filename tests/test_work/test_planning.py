"""A worker's threads plan the store's statements as a long-running worker's, from the
first run: on PostgreSQL each thread's own connection prepares at once and plans
generically; nothing else changes (other threads, a joined caller's connection, SQLite)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from conftest import SqlTarget

from fsm import Engine, JobLifecycle
from fsm.work import Worker
from fsm.work.planning import plan_for_work
from stores import MemoryStore

WAIT = 10.0


def _mode(store: Any) -> str:
    return str(store._conns.slot().conn.execute("SHOW plan_cache_mode").fetchone()[0])


def test_plan_for_work_sets_up_this_threads_connection_only(sql_target: SqlTarget) -> None:
    store: Any = sql_target.store()
    if sql_target.dialect != "postgres":
        store.plan_for_work()  # nothing to do on SQLite, and no error
        return
    other: list[str] = []
    thread = threading.Thread(target=lambda: other.append(_mode(store)))
    assert _mode(store) == "auto"
    store.plan_for_work()
    store.plan_for_work()  # once per connection
    assert _mode(store) == "force_generic_plan"
    assert store._conns.slot().conn.prepare_threshold == 0
    thread.start()
    thread.join(WAIT)
    assert other == ["auto"]  # another thread's connection is its own
    jobs = Engine(JobLifecycle, store)
    made = jobs.create()
    (claimed,) = jobs.claim(1)  # the work path runs as before
    assert claimed.id == made.id and claimed.state == "running"


def test_plan_for_work_leaves_a_joined_callers_connection_alone(sql_target: SqlTarget) -> None:
    if sql_target.dialect != "postgres":
        return
    import sqlalchemy as sa

    store: Any = sql_target.store()
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.connect() as conn, store.joined(conn):
        store.plan_for_work()
        assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "auto"
    assert _mode(store) == "auto"


def test_each_thread_of_a_worker_plans_for_work() -> None:
    class Recording(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.threads: set[str] = set()

        def plan_for_work(self) -> None:
            self.threads.add(threading.current_thread().name)

    store = Recording()
    jobs = Engine(JobLifecycle, store)
    jobs.create_many([{}, {}])
    done = threading.Semaphore(0)

    def finalizing(job: Any) -> str:
        done.release()
        return "complete"

    worker = Worker(
        jobs, {"running": lambda job: "exited", "finalizing": finalizing}, poll_interval=timedelta(milliseconds=20)
    )
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False}, name="the-loop", daemon=True)
    runner.start()
    try:
        assert done.acquire(timeout=WAIT) and done.acquire(timeout=WAIT)
    finally:
        worker.stop(grace=timedelta(seconds=5))
        runner.join(WAIT)
    assert "the-loop" in store.threads
    assert any(name.startswith("fsm-completer") for name in store.threads)
    assert any(name.startswith("fsm-keepers") for name in store.threads)


def test_a_store_without_it_or_one_that_fails_is_left_to_work_as_before() -> None:
    from fsm.errors import StoreUnavailable

    plan_for_work(object())  # no such method: nothing happens

    class Down:
        def plan_for_work(self) -> None:
            raise StoreUnavailable("down")

    plan_for_work(Down())  # an optimisation: the work goes on
