"""Wake-ups when work becomes claimable (``stores.base.WorkNotices``), on every store.

A subscriber of a kind is called after a ``create``, ``create_many`` or ``release_lease``
of that kind commits (PostgreSQL: through ``NOTIFY`` and the process's one ``LISTEN``
connection, so the tests wait on an event; SQLite and memory: in this process, at once).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from async_support import every_face  # noqa: F401 - any_store: the sync and async faces

from fsm import Engine, EntityExists, JobLifecycle
from fsm.records import ClaimRequest, ClaimStart, NewEntity
from fsm.work import Job, Worker
from stores import Store, WorkNotices
from stores.notices import MAX_CHANNEL, Subscribers, channel
from stores.sql.notify import Listener

WAIT = 10.0  # seconds a test waits for a wake-up that must come (never a timing claim)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)


class Woken:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    def wait(self) -> bool:
        got = self.event.wait(WAIT)
        self.event.clear()
        return got


def subscribe(store: Store, kind: str, callback: Woken) -> object:
    notices = getattr(store, "store", store)  # the async faces' facade keeps the async store
    assert isinstance(notices, WorkNotices) or hasattr(notices, "subscribe_work")
    return notices.subscribe_work(kind, callback)


def test_a_create_wakes_the_subscribers_of_its_kind(any_store: Store) -> None:
    woken = Woken()
    subscribe(any_store, "job", woken)  # returns once the channel is listened to
    any_store.create(NewEntity(id="a", kind="job", state="queued"))
    assert woken.wait()


def test_create_many_and_release_wake_the_subscribers(any_store: Store) -> None:
    woken = Woken()
    subscribe(any_store, "job", woken)
    any_store.create_many([NewEntity(id=f"m{i}", kind="job", state="queued") for i in range(3)])
    assert woken.wait()
    (snap,) = any_store.claim(
        ClaimRequest(kind="job", owner="w", limit=1, ttl=timedelta(minutes=1), starts=(START,), resumes=())
    )
    assert snap.lease is not None
    any_store.release_lease(snap.id, owner="w", token=snap.lease.token)
    assert woken.wait()


def test_in_process_notices_reach_only_the_kind_and_stop_at_unsubscribe(clock: object) -> None:
    from stores import MemoryStore

    store = MemoryStore()
    jobs, others = Woken(), Woken()
    unsubscribe = store.subscribe_work("job", jobs)
    store.subscribe_work("pipeline", others)
    store.create(NewEntity(id="a", kind="job", state="queued"))
    assert (jobs.count, others.count) == (1, 0)
    unsubscribe()
    unsubscribe()  # idempotent
    store.create(NewEntity(id="b", kind="job", state="queued"))
    assert jobs.count == 1


def test_a_refused_create_many_wakes_nobody(tmp_path: object) -> None:
    from stores.sql import SqlStore

    store = SqlStore(f"sqlite:///{tmp_path}/n.db")
    woken = Woken()
    store.subscribe_work("job", woken)
    store.create(NewEntity(id="x", kind="job", state="queued"))
    with pytest.raises(EntityExists):
        store.create_many(
            [NewEntity(id="y", kind="job", state="queued"), NewEntity(id="x", kind="job", state="queued")]
        )
    assert woken.count == 1  # the create's, not the refused batch's
    store.close()


def test_two_sqlite_stores_on_one_file_share_their_notices(tmp_path: object) -> None:
    from stores.sql import SqlStore

    url = f"sqlite:///{tmp_path}/shared.db"
    a, b = SqlStore(url), SqlStore(url)
    woken = Woken()
    a.subscribe_work("job", woken)
    b.create(NewEntity(id="x", kind="job", state="queued"))
    assert woken.count == 1
    a.close()
    b.close()


def test_a_failing_callback_does_not_stop_the_others() -> None:
    subscribers = Subscribers()
    woken = Woken()

    def broken() -> None:
        raise RuntimeError("subscriber bug")

    subscribers.add("c", broken)
    subscribers.add("c", woken)
    subscribers.call("c")
    assert woken.count == 1


def test_a_channel_name_fits_postgres_and_long_ones_stay_distinct() -> None:
    assert channel("fsm_", "job") == "fsm_job"
    long_a, long_b = channel("p" * 40, "k" * 40 + "a"), channel("p" * 40, "k" * 40 + "b")
    assert len(long_a.encode()) <= MAX_CHANNEL and len(long_b.encode()) <= MAX_CHANNEL
    assert long_a != long_b


@pytest.mark.postgres
def test_the_listener_reconnects_and_wakes_every_subscriber_once(sql_target: object) -> None:
    target = sql_target
    if target.dialect != "postgres":  # type: ignore[attr-defined]
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    import psycopg

    conninfo = target.url.replace("postgresql+psycopg://", "postgresql://")  # type: ignore[attr-defined]
    listener = Listener(lambda: psycopg.connect(conninfo, autocommit=True))
    woken, reconnected = Woken(), threading.Event()
    listener.on_reconnect = reconnected.set
    name = f"t{uuid.uuid4().hex[:8]}"
    listener.subscribe(name, woken)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for _ in range(40):  # until the listener listens (it LISTENs on its thread)
                conn.execute("SELECT pg_notify(%s, '')", (name,))
                if woken.event.wait(0.25):
                    break
            assert woken.wait()
            listener.drop_connection()
            assert reconnected.wait(WAIT)
            assert woken.wait()  # told once after the reconnect: a notice may have been lost
            conn.execute("SELECT pg_notify(%s, '')", (name,))
            assert woken.wait()  # and it listens again
            assert listener.reconnects == 1
    finally:
        listener.close()


def test_a_worker_that_never_polls_still_picks_up_a_create(sql_target: object) -> None:
    """poll_interval of a day: only a wake-up (NOTIFY on PostgreSQL, the in-process notice
    on SQLite) can start the handler."""
    target = sql_target
    store = target.store()  # type: ignore[attr-defined]
    jobs = Engine(JobLifecycle, store)
    started: dict[str, threading.Event] = {"early": threading.Event(), "late": threading.Event()}

    def running(job: Job) -> str:
        started[job.id].set()
        return "exited"

    worker = Worker(jobs, {"running": running, "finalizing": lambda job: "complete"}, poll_interval=timedelta(days=1))
    jobs.create("early")
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert started["early"].wait(WAIT)  # the first claim took it: the worker now waits a day
        jobs.create("late")
        assert started["late"].wait(WAIT), "the worker was not woken by the create"
    finally:
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
