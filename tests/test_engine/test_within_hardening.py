"""Engine.within() (and AsyncEngine.within()) refuses what it cannot join, at once and typed.

- A Session or Connection on another database than the store's (another SQLite file,
  another PostgreSQL database, an in-memory SQLite) is refused with ``ConfigError`` naming
  both databases (passwords hidden), and nothing is written anywhere; the same database
  reached through another spelling of its URL is joined.
- A second within() block of a store on another connection, nested in the thread, fails
  at once with ``ConfigError`` (on SQLite also across stores on one file: one writer), not
  after the busy timeout with a driver's error; a lock held by the application's own
  transaction, a Session pending its rollback and a PostgreSQL transaction aborted by the
  application's failed statement are typed errors too, never SQLAlchemy's or the driver's.
- A within() nested on the same Session or Connection, for another engine of the store
  (two lifecycles on one store), joins the open block: one commit, one rollback, the
  signals of both after the commit, in the order they were sent.
- A rolled-back savepoint drops the signals held since it began, and only those.

The memory store has no transaction to join (within() refuses it: tests/test_engine/test_within.py),
so none of this applies to it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import postgres_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import signals
from fsm import AsyncEngine, ConfigError, Engine, FsmError, JobLifecycle, PipelineLifecycle, StoreUnavailable
from stores.sql import SqlStore
from stores.sql.migrate import drop_schema


class Db:
    """A database with a store on it (a short busy timeout: a test that waits for SQLite's
    lock fails soon on a regression) and the application's own ``orders`` table."""

    def __init__(self, dialect: str, url: str, prefix: str, tmp_path: Any) -> None:
        self.dialect, self.url, self.prefix, self.tmp_path = dialect, url, prefix, tmp_path
        self.store = SqlStore(url, table_prefix=prefix, busy_timeout=0.2)
        self.orders = f"{prefix}orders"
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {self.orders} (id VARCHAR(40) PRIMARY KEY)")
        self.cleanups: list[Any] = []

    def order_ids(self, url: str | None = None) -> list[str]:
        reader = sa.create_engine(url or self.url, poolclass=sa.pool.NullPool)
        with reader.connect() as conn:
            found = sorted(r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {self.orders}"))
        reader.dispose()
        return found

    def insert(self, conn: Session | sa.Connection, order: str) -> None:
        conn.execute(sa.text(f"INSERT INTO {self.orders} (id) VALUES (:id)"), {"id": order})

    def other(self, *, password: str | None = None) -> SqlStore:
        """A store with the same table prefix (and an ``orders`` table) on another database:
        another SQLite file, or another PostgreSQL database (dropped afterwards)."""
        if self.dialect == "sqlite":
            url = f"sqlite:///{self.tmp_path}/other.db"
        else:
            name = f"fsm_other_{uuid.uuid4().hex[:10]}"
            admin = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
            with admin.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE {name}")

            def drop() -> None:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
                admin.dispose()

            self.cleanups.append(drop)
            parts = sa.make_url(self.url).set(database=name)
            url = (parts.set(password=password) if password else parts).render_as_string(hide_password=False)
        other = SqlStore(url, table_prefix=self.prefix)
        with other.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {self.orders} (id VARCHAR(40) PRIMARY KEY)")
        self.cleanups.append(other.close)
        return other

    def async_url(self, url: str | None = None) -> str:
        url = url or self.url
        if self.dialect == "sqlite":
            return url.replace("sqlite://", "sqlite+aiosqlite://")
        return url.replace("+psycopg", "+psycopg_async")

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            cleanup()
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {self.orders}")
        if self.dialect == "postgres":
            drop_schema(self.store.engine, table_prefix=self.prefix)
        self.store.close()


def opened(dialect: str, tmp_path: Any) -> Db:
    if dialect == "sqlite":
        return Db("sqlite", f"sqlite:///{tmp_path}/app.db", "fsm_", tmp_path)
    return Db("postgres", postgres_url(), f"t{uuid.uuid4().hex[:10]}_", tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Db]:
    found = opened(request.param, tmp_path)
    yield found
    found.close()


@pytest.fixture
def sqlite_db(tmp_path: Any) -> Iterator[Db]:
    found = opened("sqlite", tmp_path)
    yield found
    found.close()


@pytest.fixture
def postgres_db(tmp_path: Any) -> Iterator[Db]:
    found = opened("postgres", tmp_path)
    yield found
    found.close()


class Received:
    """The (sender, state) of every ``transitioned`` signal received, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []
        signals.transitioned.connect(self.receive)

    def receive(self, sender: str, payload: Any) -> None:
        self.got.append((sender, payload.snapshot.state))

    def close(self) -> None:
        signals.transitioned.disconnect(self.receive)


@pytest.fixture
def received() -> Iterator[Received]:
    found = Received()
    yield found
    found.close()


def entity_ids(store: SqlStore) -> list[str]:
    return sorted(s.id for s in Engine(JobLifecycle, store).entities())


# -- 1. another database -----------------------------------------------------------------------


def test_a_session_on_another_database_is_refused_naming_both_and_nothing_is_written(
    db: Db, received: Received
) -> None:
    other = db.other(password="s3cret-pw" if db.dialect == "postgres" else None)
    jobs = Engine(JobLifecycle, db.store)
    ran = []
    with Session(other.engine) as session, session.begin():
        db.insert(session, "o-other")
        with pytest.raises(ConfigError, match="another database than the store's") as refused, jobs.within(session):
            ran.append("body")
            jobs.create()
        session.rollback()
    message = str(refused.value)
    if db.dialect == "sqlite":
        assert os.path.realpath(f"{db.tmp_path}/app.db") in message
        assert os.path.realpath(f"{db.tmp_path}/other.db") in message
    else:
        assert str(sa.make_url(db.url).database) in message and str(other.engine.url.database) in message
        assert "s3cret-pw" not in message and "***" in message
    assert ran == []  # refused on entering: the block never ran
    assert entity_ids(db.store) == [] and entity_ids(other) == []
    assert received.got == []


def test_a_connection_on_another_database_is_refused_before_it_is_begun_as_a_writer(db: Db) -> None:
    other = db.other()
    jobs = Engine(JobLifecycle, db.store)
    with other.engine.connect() as conn:
        with pytest.raises(ConfigError, match="another database"), jobs.within(conn):
            jobs.create()
        conn.rollback()
    assert entity_ids(db.store) == [] and entity_ids(other) == []
    assert Engine(JobLifecycle, db.store).create() is not None  # the store's own database is free


def test_an_in_memory_sqlite_is_not_the_stores_file(tmp_path: Any) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/app.db")
    memory = SqlStore("sqlite://")  # the store's tables, in an in-memory database of its own
    try:
        with (
            Session(memory.engine) as session,
            session.begin(),
            pytest.raises(ConfigError, match="another in-memory database"),
            Engine(JobLifecycle, store).within(session),
        ):
            pass
        assert entity_ids(store) == [] and entity_ids(memory) == []
        with Session(memory.engine) as session, session.begin(), Engine(JobLifecycle, memory).within(session):
            created = Engine(JobLifecycle, memory).create()  # its own engine: the same database
        assert entity_ids(memory) == [created.id]
    finally:
        memory.close()
        store.close()


def test_the_stores_database_through_another_spelling_of_its_url_is_joined(db: Db, received: Received) -> None:
    if db.dialect == "sqlite":  # a symlink to the file, and a path with a detour
        os.symlink(f"{db.tmp_path}/app.db", f"{db.tmp_path}/link.db")
        urls = [f"sqlite:///{db.tmp_path}/link.db", f"sqlite:///{db.tmp_path}/../{db.tmp_path.name}/app.db"]
    else:  # another host name for the same server: the servers are asked
        urls = [sa.make_url(db.url).set(host="localhost").render_as_string(hide_password=False)]
    jobs = Engine(JobLifecycle, db.store)
    for n, url in enumerate(urls):
        app = sa.create_engine(url)
        try:
            for _ in range(2):  # the second time, the engine's answer is known
                with Session(app) as session, session.begin(), jobs.within(session):
                    db.insert(session, f"o-{n}-{_}")
                    jobs.create()
        finally:
            app.dispose()
    assert len(entity_ids(db.store)) == 2 * len(urls)
    assert db.order_ids() == sorted(f"o-{n}-{i}" for n in range(len(urls)) for i in range(2))


def test_async_a_session_on_another_database_is_refused_and_nothing_is_written(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from stores.aio import AsyncSqlStore

    other = db.other()
    other_url = other.engine.url.render_as_string(hide_password=False)

    async def scenario() -> None:
        store = AsyncSqlStore(db.url, table_prefix=db.prefix, create=False)
        app = create_async_engine(db.async_url(other_url))
        jobs = AsyncEngine(JobLifecycle, store)
        try:
            async with AsyncSession(app) as session:
                await session.begin()
                with pytest.raises(ConfigError, match="another database"):
                    async with jobs.within(session):
                        await jobs.create()
                await session.rollback()
            assert await jobs.entities() == []
        finally:
            await store.close()
            await app.dispose()

    asyncio.run(scenario())
    assert entity_ids(db.store) == [] and entity_ids(other) == []


# -- 2. a second block on another connection; typed errors only ---------------------------------


def test_a_second_block_of_the_store_on_another_session_fails_at_once_and_the_first_goes_on(
    db: Db, received: Received
) -> None:
    jobs = Engine(JobLifecycle, db.store)
    job = jobs.create()
    with Session(db.store.engine) as first, first.begin():
        with jobs.within(first):
            jobs.fire(job.id, "start")
            with (
                pytest.raises(
                    ConfigError, match="another within\\(\\) block of this store is open on another connection"
                ),
                Session(db.store.engine) as second,
                jobs.within(second),
            ):
                jobs.create()
            db.insert(first, "o-1")  # the first block goes on
        assert received.got == []
    assert jobs.get(job.id).state == "running"
    assert entity_ids(db.store) == [job.id]
    assert db.order_ids() == ["o-1"]
    assert received.got == [("job", "running")]


def test_async_a_second_block_of_the_store_on_another_session_fails_at_once(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from stores.aio import AsyncSqlStore

    async def scenario() -> None:
        store = AsyncSqlStore(db.url, table_prefix=db.prefix, create=False)
        app = create_async_engine(db.async_url(), connect_args={"timeout": 0.2} if db.dialect == "sqlite" else {})
        jobs = AsyncEngine(JobLifecycle, store)
        try:
            async with AsyncSession(app) as first, AsyncSession(app) as second:
                await first.begin()
                async with jobs.within(first):
                    made = await jobs.create()
                    with pytest.raises(ConfigError, match="another within\\(\\) block of this store is open"):
                        async with jobs.within(second):
                            await jobs.create()
                await first.commit()
            assert [s.id for s in await jobs.entities()] == [made.id]
        finally:
            await store.close()
            await app.dispose()

    asyncio.run(scenario())


def test_sqlite_a_block_of_another_store_on_the_same_file_and_another_session_fails_at_once(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    first_store, second_store = SqlStore(url, busy_timeout=0.2), SqlStore(url, table_prefix="b_", busy_timeout=0.2)
    jobs, others = Engine(JobLifecycle, first_store), Engine(JobLifecycle, second_store)
    try:
        with Session(first_store.engine) as first, first.begin(), jobs.within(first):
            made = jobs.create()
            with (
                pytest.raises(ConfigError, match="SQLite allows one writer"),
                Session(second_store.engine) as second,
                others.within(second),
            ):
                others.create()
            with others.within(first):  # the same session: both stores' writes in one transaction
                also = others.create()
        assert entity_ids(first_store) == [made.id] and entity_ids(second_store) == [also.id]
    finally:
        second_store.close()
        first_store.close()


def test_sqlite_a_write_lock_held_by_the_apps_own_transaction_is_store_unavailable(sqlite_db: Db) -> None:
    db = sqlite_db
    jobs = Engine(JobLifecycle, db.store)
    with Session(db.store.engine) as holder, holder.begin():
        db.insert(holder, "o-held")  # the application's own write: SQLite's write lock, not a within() block
        with (
            pytest.raises(StoreUnavailable, match="write lock") as refused,
            Session(db.store.engine) as session,
            jobs.within(session),
        ):
            jobs.create()
    assert not isinstance(refused.value, sa.exc.SQLAlchemyError)
    assert isinstance(refused.value, FsmError)
    assert entity_ids(db.store) == []


class _Base(DeclarativeBase):
    pass


def test_a_session_pending_its_rollback_is_refused_typed(db: Db) -> None:
    class Order(_Base):
        __tablename__ = db.orders
        id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)

    try:
        jobs = Engine(JobLifecycle, db.store)
        with Session(db.store.engine) as session:
            session.begin()
            session.add(Order(id="o-1"))
            session.flush()
            session.add(Order(id="o-1"))
            with pytest.raises(sa.exc.IntegrityError):
                session.flush()  # the application's failed flush: the Session must be rolled back
            with pytest.raises(ConfigError, match="cannot be joined"), jobs.within(session):
                jobs.create()
            session.rollback()
        assert entity_ids(db.store) == []
    finally:
        _Base.metadata.clear()
        _Base.registry.dispose()


def test_postgres_a_transaction_aborted_by_the_apps_failed_statement_is_config_error(postgres_db: Db) -> None:
    db = postgres_db
    jobs = Engine(JobLifecycle, db.store)
    job = jobs.create()
    with Session(db.store.engine) as session, session.begin():
        with jobs.within(session):
            with pytest.raises(sa.exc.DataError):
                session.execute(sa.text("SELECT 1 / 0"))  # the application's own statement fails
            with pytest.raises(ConfigError, match="aborted"):
                jobs.fire(job.id, "start")
        with pytest.raises(ConfigError, match="aborted"), jobs.within(session):  # joining one: refused too
            pass
        session.rollback()
    assert jobs.get(job.id).state == "queued"


# -- 3. another engine of the same store on the same session joins the block --------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_nested_block_of_another_engine_on_the_same_session_joins_the_outer_one(
    db: Db, received: Received, outcome: str
) -> None:
    jobs, pipelines = Engine(JobLifecycle, db.store), Engine(PipelineLifecycle, db.store)
    job, pipeline = jobs.create(), pipelines.create()
    with Session(db.store.engine) as session:
        session.begin()
        db.insert(session, "o-1")
        with jobs.within(session):
            jobs.fire(job.id, "start")
            with pipelines.within(session):  # the same session: it joins
                pipelines.fire(pipeline.id, "start")
                assert jobs.get(job.id).state == "running"  # both engines' calls on the session
                with jobs.within(session.connection()):  # its connection, the same engine again: joins too
                    jobs.fire(job.id, "exited", lease=jobs.get(job.id).lease)
            assert pipelines.get(pipeline.id).state != "queued"
        assert received.got == []
        session.commit() if outcome == "commit" else session.rollback()
    if outcome == "commit":
        assert received.got == [("job", "running"), ("pipeline", "running"), ("job", "finalizing")]
        assert jobs.get(job.id).state == "finalizing" and pipelines.get(pipeline.id).state == "running"
        assert db.order_ids() == ["o-1"]
    else:
        assert received.got == []
        assert jobs.get(job.id).state == "queued" and pipelines.get(pipeline.id).state == "queued"
        assert db.order_ids() == []


def test_async_a_nested_block_of_another_engine_on_the_same_session_joins_the_outer_one(
    db: Db, received: Received
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from stores.aio import AsyncSqlStore

    async def scenario() -> None:
        store = AsyncSqlStore(db.url, table_prefix=db.prefix, create=False)
        app = create_async_engine(db.async_url())
        jobs, pipelines = AsyncEngine(JobLifecycle, store), AsyncEngine(PipelineLifecycle, store)
        try:
            job, pipeline = await jobs.create(), await pipelines.create()
            async with AsyncSession(app) as session:
                await session.begin()
                async with jobs.within(session):
                    await jobs.fire(job.id, "start")
                    async with pipelines.within(session):
                        await pipelines.fire(pipeline.id, "start")
                assert received.got == []
                await session.commit()
            assert received.got == [("job", "running"), ("pipeline", "running")]
            assert (await jobs.get(job.id)).state == "running"
            assert (await pipelines.get(pipeline.id)).state == "running"
        finally:
            await store.close()
            await app.dispose()

    asyncio.run(scenario())


# -- savepoints and the held signals -----------------------------------------------------------


def test_a_savepoint_begun_before_the_block_drops_the_blocks_signals_on_its_rollback(
    db: Db, received: Received
) -> None:
    jobs = Engine(JobLifecycle, db.store)
    job = jobs.create()
    with Session(db.store.engine) as session, session.begin():
        db.insert(session, "o-1")
        nested = session.begin_nested()
        with jobs.within(session):
            jobs.fire(job.id, "start")
        nested.rollback()
    assert jobs.get(job.id).state == "queued"
    assert received.got == []  # the transition was rolled back with the savepoint: no signal
    assert db.order_ids() == ["o-1"]


def test_an_inner_savepoints_rollback_keeps_the_signals_of_the_outer_one(db: Db, received: Received) -> None:
    jobs = Engine(JobLifecycle, db.store)
    first, second, third = jobs.create(), jobs.create(), jobs.create()
    with Session(db.store.engine) as session, session.begin(), jobs.within(session):
        jobs.fire(first.id, "start")
        outer = session.begin_nested()
        jobs.fire(second.id, "start")
        inner = session.begin_nested()
        jobs.fire(third.id, "start")
        inner.rollback()
        outer.commit()
    assert [jobs.get(e.id).state for e in (first, second, third)] == ["running", "running", "queued"]
    assert received.got == [("job", "running"), ("job", "running")]
