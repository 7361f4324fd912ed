"""The caller's transaction (Engine.within / AsyncEngine.within) on SQLite and PostgreSQL.

The application's own insert and the library's writes commit together and roll back
together; signals go out after the caller's commit and never after a rollback; an error
inside the block leaves neither write; compare-and-set and fencing refuse exactly as
they do outside; a call after the caller's transaction ended is refused.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import postgres_url
from sqlalchemy.orm import Session

import signals
from fsm import AsyncEngine, ConfigError, Engine, Fenced, JobLifecycle
from stores import MemoryStore
from stores.sql import SqlStore
from stores.sql.migrate import drop_schema


class Target:
    """A database, a store on it and the application's own ``orders`` table beside it."""

    def __init__(self, dialect: str, url: str, prefix: str) -> None:
        self.dialect, self.url, self.prefix = dialect, url, prefix
        self.store = SqlStore(url, table_prefix=prefix)
        self.orders = f"{prefix}orders"
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {self.orders} (id VARCHAR(40) PRIMARY KEY)")

    def order_ids(self) -> list[str]:
        """The committed orders, read by another connection (a plain engine: on SQLite the
        store's engine would begin every transaction as a writer)."""
        reader = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        with reader.connect() as conn:
            found = sorted(r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {self.orders}"))
        reader.dispose()
        return found

    def insert(self, conn: Session | sa.Connection, order: str) -> None:
        conn.execute(sa.text(f"INSERT INTO {self.orders} (id) VALUES (:id)"), {"id": order})

    def async_url(self) -> str:
        if self.dialect == "sqlite":
            return self.url.replace("sqlite://", "sqlite+aiosqlite://")
        return self.url.replace("+psycopg", "+psycopg_async")

    def close(self) -> None:
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {self.orders}")
        if self.dialect == "postgres":
            drop_schema(self.store.engine, table_prefix=self.prefix)
        self.store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Target]:
    if request.param == "sqlite":
        found = Target("sqlite", f"sqlite:///{tmp_path}/app.db", "fsm_")
    else:
        found = Target("postgres", postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    yield found
    found.close()


class Received:
    """The states of the ``transitioned`` signals received, in order."""

    def __init__(self) -> None:
        self.states: list[str] = []
        signals.transitioned.connect(self.receive, sender="job")

    def receive(self, sender: str, payload: Any) -> None:
        self.states.append(payload.snapshot.state)

    def close(self) -> None:
        signals.transitioned.disconnect(self.receive, sender="job")


@pytest.fixture
def received() -> Iterator[Received]:
    found = Received()
    yield found
    found.close()


# -- the sync face -------------------------------------------------------------------------


def test_the_apps_insert_and_a_transition_commit_together_and_signals_follow_the_commit(
    target: Target, received: Received
) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    with Session(target.store.engine) as session, session.begin():
        target.insert(session, "o-1")
        with jobs.within(session):
            started = jobs.fire(job.id, "start")
            assert jobs.get(job.id).state == "running"  # the block reads its own write
        assert received.states == []  # not yet committed: nothing sent
        assert Engine(JobLifecycle, target.store).get(job.id).state == "queued"  # others see the old row
        assert target.order_ids() == []
    assert received.states == ["running"]
    assert jobs.get(job.id).state == "running" and jobs.get(job.id).lease_token == started.snapshot.lease_token
    assert [h.event for h in jobs.history(job.id)] == ["start"]
    assert target.order_ids() == ["o-1"]


def test_a_rollback_undoes_both_writes_and_sends_no_signal(target: Target, received: Received) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    with Session(target.store.engine) as session:
        session.begin()
        target.insert(session, "o-1")
        with jobs.within(session):
            jobs.fire(job.id, "start")
            created = jobs.create()
        session.rollback()
    assert received.states == []
    assert jobs.get(job.id).state == "queued" and jobs.history(job.id) == []
    assert created.id not in {s.id for s in jobs.entities()}
    assert target.order_ids() == []


def test_an_error_inside_the_block_leaves_neither_write(target: Target, received: Received) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    with pytest.raises(RuntimeError, match="the app failed"), Session(target.store.engine) as session, session.begin():
        target.insert(session, "o-1")
        with jobs.within(session):
            jobs.fire(job.id, "start")
            raise RuntimeError("the app failed")
    assert received.states == []
    assert jobs.get(job.id).state == "queued" and jobs.history(job.id) == []
    assert target.order_ids() == []


def test_a_connection_works_as_a_session_does(target: Target, received: Received) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    with target.store.engine.connect() as conn:
        with jobs.within(conn):  # not begun yet: within begins it, the caller commits
            target.insert(conn, "o-1")
            [claimed] = jobs.claim()  # the claim, a renewal and an effect, all in the caller's transaction
            assert claimed.lease is not None
            held = jobs.renew_lease(claimed.lease)
            assert jobs.run(job.id, "gate", lambda key: {"ran": True}, held) == {"ran": True}
            jobs.fire(job.id, "exited", lease=held)
        assert received.states == []
        assert Engine(JobLifecycle, target.store).get(job.id).state == "queued"
        conn.commit()
    assert received.states == ["finalizing"]
    assert jobs.get(job.id).state == "finalizing"
    assert [h.event for h in jobs.history(job.id)] == ["start", "exited"]
    assert [e.key for e in jobs.effects(job.id)] == ["gate"]
    assert target.order_ids() == ["o-1"]


def test_a_rolled_back_savepoint_drops_its_writes_and_its_signals(target: Target, received: Received) -> None:
    jobs = Engine(JobLifecycle, target.store)
    first, second = jobs.create(), jobs.create()
    with Session(target.store.engine) as session, session.begin(), jobs.within(session):
        jobs.fire(first.id, "start")
        nested = session.begin_nested()
        jobs.fire(second.id, "start")
        nested.rollback()
    assert received.states == ["running"]
    assert jobs.get(first.id).state == "running" and jobs.get(second.id).state == "queued"


def test_fencing_refuses_inside_the_block_and_the_callers_transaction_goes_on(
    target: Target, received: Received
) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    started = jobs.fire(job.id, "start")
    stale = started.lease
    assert stale is not None
    jobs.release_lease(stale)
    retaken = jobs.acquire_lease(job.id)
    with Session(target.store.engine) as session, session.begin(), jobs.within(session):
        with pytest.raises(Fenced):
            jobs.fire(job.id, "exited", lease=stale)  # the old token: refused, nothing written
        target.insert(session, "o-1")  # the caller's transaction is still usable (PostgreSQL too)
        jobs.fire(job.id, "exited", lease=retaken)
    assert jobs.get(job.id).state == "finalizing"
    assert target.order_ids() == ["o-1"]
    assert received.states[-1] == "finalizing"


def test_a_call_after_the_callers_commit_inside_the_block_is_refused(target: Target) -> None:
    jobs = Engine(JobLifecycle, target.store)
    job = jobs.create()
    with Session(target.store.engine) as session, jobs.within(session):
        jobs.fire(job.id, "start")
        session.commit()
        with pytest.raises(ConfigError, match="has ended"):
            jobs.create()
    assert jobs.get(job.id).state == "running"
    assert len(jobs.entities()) == 1


def test_within_refuses_what_it_cannot_join(target: Target) -> None:
    jobs = Engine(JobLifecycle, target.store)
    with pytest.raises(ConfigError, match="no SQL transaction"), Engine(JobLifecycle, MemoryStore()).within(None):
        pass
    for wrong in (None, "sqlite:///x.db", 42, object()):
        with pytest.raises(ConfigError, match="Connection or Session"), jobs.within(wrong):
            pass
    with (
        target.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
        pytest.raises(ConfigError, match="autocommit"),
        jobs.within(conn),
    ):
        pass
    other = sa.create_engine("sqlite://")
    with other.connect() as conn:
        if target.dialect == "postgres":
            with pytest.raises(ConfigError, match="runs on postgresql"), jobs.within(conn):
                pass
    other.dispose()


def test_outside_the_block_the_store_commits_on_its_own_again(target: Target, received: Received) -> None:
    jobs = Engine(JobLifecycle, target.store)
    with Session(target.store.engine) as session, session.begin(), jobs.within(session):
        inside = jobs.create()
    outside = jobs.create()
    assert {inside.id, outside.id} <= {s.id for s in jobs.entities()}


# -- the async face ------------------------------------------------------------------------


@pytest.mark.parametrize("face", ["session", "connection"])
def test_async_commit_together_rollback_together_error_leaves_neither(
    target: Target, received: Received, face: str
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from stores.aio import AsyncSqlStore

    async def scenario() -> None:
        store = AsyncSqlStore(target.url, table_prefix=target.prefix, create=False)
        app = create_async_engine(target.async_url())
        jobs = AsyncEngine(JobLifecycle, store)
        try:
            job = await jobs.create()
            insert = sa.text(f"INSERT INTO {target.orders} (id) VALUES (:id)")

            async def attempt(order: str, *, commit: bool, fail: bool = False) -> None:
                if face == "session":
                    async with AsyncSession(app) as session:
                        await session.begin()
                        await session.execute(insert, {"id": order})
                        async with jobs.within(session):
                            await jobs.fire(job.id, "start")
                            if fail:
                                raise RuntimeError("the app failed")
                        assert received.states == []
                        await (session.commit() if commit else session.rollback())
                else:
                    async with app.connect() as conn:
                        async with jobs.within(conn):
                            await conn.execute(insert, {"id": order})
                            await jobs.fire(job.id, "start")
                            if fail:
                                raise RuntimeError("the app failed")
                        assert received.states == []
                        await (conn.commit() if commit else conn.rollback())

            await attempt("o-rolled-back", commit=False)
            assert received.states == [] and (await jobs.get(job.id)).state == "queued"
            with pytest.raises(RuntimeError, match="the app failed"):
                await attempt("o-failed", commit=True, fail=True)
            assert received.states == [] and (await jobs.get(job.id)).state == "queued"
            await attempt("o-1", commit=True)
            assert received.states == ["running"]
            assert (await jobs.get(job.id)).state == "running"
            assert [h.event for h in await jobs.history(job.id)] == ["start"]
        finally:
            await store.close()
            await app.dispose()

    asyncio.run(scenario())
    assert target.order_ids() == ["o-1"]


def test_async_within_refuses_a_memory_store_and_a_wrong_argument(target: Target) -> None:
    from stores.aio import AsyncMemoryStore, AsyncSqlStore

    async def scenario() -> None:
        with pytest.raises(ConfigError, match="no SQL transaction"):
            async with AsyncEngine(JobLifecycle, AsyncMemoryStore()).within(None):
                pass
        store = AsyncSqlStore(target.url, table_prefix=target.prefix, create=False)
        try:
            with pytest.raises(ConfigError, match="AsyncConnection or AsyncSession"):
                async with AsyncEngine(JobLifecycle, store).within(Session()):
                    pass
        finally:
            await store.close()

    asyncio.run(scenario())
