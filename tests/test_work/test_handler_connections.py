"""A thread worker's handler threads share a bounded set of the store's connections.

Slots cost threads, not connections: on PostgreSQL each handler's store call through its
``job`` takes one of at most ``handler_connections`` and gives it back when it returns (an
effect's ``fn`` runs holding none; whatever else a handler did is given back when its
thread is free), an idle one kept for the next taker and one left inside a transaction
closed.  The claim loop, the completer and the keeper keep connections of their own.  On
SQLite each thread keeps its own connection, as before."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import SqlTarget, postgres_url

from fsm import Engine, JobLifecycle
from fsm.errors import ConfigError, StoreUnavailable
from fsm.work import Worker
from fsm.work.loop import DEFAULT_HANDLER_CONNECTIONS, MAX_WORKER_CONNECTIONS
from stores import MemoryStore
from stores.sql import SqlStore

WAIT = 20.0


@pytest.fixture
def pg_target() -> Iterator[SqlTarget]:
    """PostgreSQL, where handlers' connections are lent (it skips without a server, and
    fails under FSM_REQUIRE_POSTGRES=1); SQLite lends none (test_sqlite_lends_nothing)."""
    target = SqlTarget("postgres", postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    yield target
    target.close()


def _in_thread(fn: Any) -> Any:
    """``fn()`` on a new thread; its value, or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as err:
            out.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    assert out, "the thread did not finish"
    return out[0]


def test_a_connection_given_back_is_the_next_threads(pg_target: SqlTarget) -> None:
    store: Any = pg_target.store()
    eid = Engine(JobLifecycle, store).create().id
    lender = store.lend_connections(2, wait=0.1)

    def use() -> int:
        lender.join()
        try:
            store.history(eid)
            return id(store._conns.slot().conn)
        finally:
            lender.give_back()

    first = _in_thread(use)
    assert _in_thread(use) == first  # the idle connection, not a new one
    assert lender.taken == 0 and lender.idle == 1
    lender.close()
    assert lender.idle == 0
    _in_thread(use)  # given back after the close: closed, not kept
    assert lender.idle == 0 and lender.taken == 0


def test_at_most_limit_connections_are_taken_and_the_next_taker_is_refused(pg_target: SqlTarget) -> None:
    store: Any = pg_target.store()
    eid = Engine(JobLifecycle, store).create().id
    lender = store.lend_connections(2, wait=0.05)
    holding, release = threading.Barrier(3), threading.Event()

    def hold() -> None:
        lender.join()
        try:
            store.history(eid)
            holding.wait(WAIT)
            release.wait(WAIT)
        finally:
            lender.give_back()

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    holding.wait(WAIT)
    assert lender.taken == 2

    def third() -> object:
        lender.join()
        try:
            return store.history(eid)
        finally:
            lender.give_back()

    refused = _in_thread(third)
    assert isinstance(refused, StoreUnavailable)
    assert "handler_connections" in str(refused)
    release.set()
    for t in holders:
        t.join(WAIT)
    assert lender.taken == 0
    assert _in_thread(third) is not None  # a free connection again


def test_a_connection_left_inside_a_transaction_is_closed_not_lent(pg_target: SqlTarget) -> None:
    store: Any = pg_target.store()
    eid = Engine(JobLifecycle, store).create().id
    lender = store.lend_connections(1, wait=0.1)

    def leave_open() -> Any:
        lender.join()
        slot = store._conns.slot()
        slot.cursor.execute("BEGIN")
        lender.give_back()
        return slot

    left = _in_thread(leave_open)
    assert left.conn is None  # closed
    assert lender.taken == 0

    def next_one() -> Any:
        lender.join()
        try:
            store.history(eid)
            return store._conns.slot()
        finally:
            lender.give_back()

    assert _in_thread(next_one) is not left


def test_threads_outside_the_group_keep_their_own_connection(pg_target: SqlTarget) -> None:
    store: Any = pg_target.store()
    eid = Engine(JobLifecycle, store).create().id
    lender = store.lend_connections(1, wait=0.1)
    store.history(eid)
    mine = store._conns.slot()
    lender.give_back()  # this thread never joined: nothing is taken from it
    assert store._conns.slot() is mine and mine.conn is not None
    assert lender.taken == 0


@pytest.mark.parametrize("bad", [0, -1, 1001, True, "4", 2.5, math.nan, None])
def test_lend_connections_refuses_a_bad_limit(bad: object, tmp_path: Any) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/l.db")
    try:
        with pytest.raises(ConfigError, match="limit"):
            store.lend_connections(bad)  # type: ignore[arg-type]
        assert store.lend_connections(2) is None  # a good limit is taken (SQLite lends none)
    finally:
        store.close()


@pytest.mark.parametrize("bad", [-1, 3601, True, "4", math.nan, math.inf, None])
def test_lend_connections_refuses_a_bad_wait(bad: object, tmp_path: Any) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/w.db")
    try:
        with pytest.raises(ConfigError, match="wait"):
            store.lend_connections(2, wait=bad)  # type: ignore[arg-type]
    finally:
        store.close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///{tmp}/f.db"])
def test_sqlite_lends_nothing(url: str, tmp_path: Any) -> None:
    """In memory one connection is shared already; a file's connections cost no server
    anything and may be bound to their thread: each thread keeps its own."""
    store = SqlStore(url.format(tmp=tmp_path))
    try:
        assert store.lend_connections(4) is None
        worker = Worker(Engine(JobLifecycle, store), {"running": lambda job: "exited"})
        assert worker.lender is None
    finally:
        store.close()


@pytest.mark.parametrize("bad", [0, 1001, True, "16", 1.5, math.nan, None])
def test_worker_refuses_bad_handler_connections(bad: object) -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    with pytest.raises(ConfigError, match="handler_connections"):
        Worker(engine, {"running": lambda job: "exited"}, handler_connections=bad)  # type: ignore[arg-type]


def test_a_memory_store_worker_has_no_lender() -> None:
    worker = Worker(Engine(JobLifecycle, MemoryStore()), {"running": lambda job: "exited"})
    assert worker.lender is None


def test_writing_handlers_share_at_most_handler_connections(pg_target: SqlTarget) -> None:
    """Eight handlers at once, each recording an effect (``job.run``: a write on its
    thread): they use no more than two connections between them, every job completes, and
    every connection is given back when the worker is done."""
    store: Any = pg_target.store()
    engine = Engine(JobLifecycle, store)
    jobs = 24
    made = [engine.create().id for _ in range(jobs)]
    seen: dict[int, Any] = {}
    most = [0]
    lock = threading.Lock()
    worker: Worker

    def running(job: Any) -> str:
        job.run("effect", lambda key: key)  # recorded once: a write on this thread
        with lock:
            slot = store._conns.slot()
            seen[id(slot)] = slot
            assert worker.lender is not None
            most[0] = max(most[0], worker.lender.taken)
        return "exited"

    worker = Worker(
        engine,
        {"running": running, "finalizing": lambda job: "complete"},
        concurrency=8,
        handler_connections=2,
        poll_interval=timedelta(milliseconds=20),
    )
    assert worker.lender is not None and worker.lender.limit == 2
    _drain(engine, worker, jobs)
    assert [engine.get(i).state for i in made] == ["completed"] * jobs
    assert worker.stats.claimed == jobs
    assert len(seen) <= 2
    assert 1 <= most[0] <= 2
    assert worker.lender.taken == 0
    assert worker.lender.idle == 0  # the stopped worker closed what it kept
    assert all(slot.conn is None for slot in seen.values())


def test_the_default_bound_is_independent_of_concurrency(pg_target: SqlTarget) -> None:
    store: Any = pg_target.store()
    worker = Worker(Engine(JobLifecycle, store), {"running": lambda job: "exited"}, concurrency=64)
    assert worker.lender is not None and worker.lender.limit == DEFAULT_HANDLER_CONNECTIONS


def _drain(engine: Engine, worker: Worker, jobs: int) -> None:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    pause = threading.Event()
    for _ in range(int(WAIT / 0.02)):
        if worker.stats.finished + worker.stats.failed >= jobs:
            break
        pause.wait(0.02)
    worker.stop()
    thread.join(WAIT)


def test_an_effect_runs_holding_no_connection(pg_target: SqlTarget) -> None:
    """One handler connection, two handlers whose effects must run at the same time (each
    waits for the other inside its ``fn``): the first effect holds no connection, so the
    second job's ledger reads get one and both effects run and are recorded.  Had a
    handler kept its connection through its effect, the second would wait for it while
    the first waits for the second."""
    store: Any = pg_target.store()
    engine = Engine(JobLifecycle, store)
    made = [engine.create().id for _ in range(2)]
    both = threading.Barrier(2, timeout=WAIT / 2)

    def effect(key: str) -> str:
        both.wait()
        return key

    def running(job: Any) -> str:
        job.run("call", effect)
        job.progress({"after": "call"})  # a write after the effect: a connection again
        return "exited"

    worker = Worker(
        engine,
        {"running": running, "finalizing": lambda job: "complete"},
        concurrency=2,
        handler_connections=1,
        poll_interval=timedelta(milliseconds=20),
    )
    _drain(engine, worker, 2)
    assert worker.stats.failed == 0
    assert [engine.get(i).state for i in made] == ["completed", "completed"]
    assert all(store.effect(i, "call") is not None for i in made)
    assert worker.lender is not None and worker.lender.taken == 0


_CHILD = """
import sys, threading, time
from fsm import Engine, JobLifecycle
from fsm.work import Worker
from stores.sql import SqlStore

url, prefix, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = SqlStore(url, table_prefix=prefix, create=False)
engine = Engine(JobLifecycle, store)

def running(job):
    job.run("call", lambda key: time.sleep(0.05) or key)  # a slow external call
    job.progress({"called": True})
    return "exited"

worker = Worker(engine, {"running": running, "finalizing": lambda job: "complete"}, reap=True)  # the defaults

def stop_when_done():
    while worker.stats.finished < jobs:
        time.sleep(0.01)
    worker.stop()

threading.Thread(target=stop_when_done, daemon=True).start()
worker.run(install_signals=False)
store.close()
"""


def test_a_default_worker_process_holds_at_most_ten_connections(pg_target: SqlTarget) -> None:
    """A real worker process with the shipped defaults (32 slots, 5 handler connections)
    and its embedded reaper, 64 jobs whose handlers each record a slow effect and then
    their progress: PostgreSQL never sees more than 10 of its connections (the 5 handlers'
    plus the claim loop's, the completer's, the keeper's, the listener's and the
    reaper's), and every job completes.  Four such processes leave 60 of PostgreSQL's
    default 100 to the application; with 16 handler connections they held 84."""
    import subprocess
    import sys

    import psycopg

    store: Any = pg_target.store()
    engine = Engine(JobLifecycle, store)
    jobs = 64
    made = [engine.create().id for _ in range(jobs)]
    tag = f"fsm-lend-{uuid.uuid4().hex[:8]}"
    url = f"{pg_target.url}?application_name={tag}"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, url, pg_target.prefix, str(jobs)])
    peak = 0
    plain = pg_target.url.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(plain, autocommit=True) as watch:
            while child.poll() is None:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
                ).fetchone()
                peak = max(peak, int(row[0]) if row else 0)
                time.sleep(0.005)
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert [engine.get(i).state for i in made] == ["completed"] * jobs
    assert DEFAULT_HANDLER_CONNECTIONS + 5 == MAX_WORKER_CONNECTIONS == 10  # the README's figure
    assert 1 <= peak <= MAX_WORKER_CONNECTIONS
