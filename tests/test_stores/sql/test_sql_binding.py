"""Existing-table binding: the Pipeline lifecycle on seeds/000's ``pipeline_queue`` table.

The application's table keeps its columns and their meaning: ``status`` (Queued, Running,
Completed, Failed) follows the leaf state, ``updatedAt`` is the last update, ``del`` the
soft-delete flag, and the ``steps`` child table holds the steps.  The library only adds
columns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from conftest import SqlTarget

from fsm import ConditionFailed, ConfigError, Engine, PipelineLifecycle, TransitionNotAllowed, UnknownEntity
from fsm.reaping import Reaper
from fsm.records import BatchWrite, LeaseChange, LeaseStale, NewEntity, TransitionWrite
from stores.sql import SqlStore
from stores.sql.binding import (
    ChildRows,
    TableBinding,
    add_binding_columns,
    add_missing_columns,
    drop_binding_columns,
    missing_columns,
)
from stores.sql.schema import encode_sqlite_time

STATUS = {
    "queued": "Queued",
    "running": "Running",
    "finalizing": "Running",
    "completed": "Completed",
    "failed": "Failed",
}
STEP_STATUS = {
    "queued": "Queued",
    "running": "Running",
    "completed": "Completed",
    "failed": "Failed",
    "skipped": "Skipped",
}
APP_COLUMNS = {"id", "repo", "status", "updatedAt", "createdAt", "del"}


@dataclass
class App:
    """The application's tables, as its own migrations made them."""

    target: SqlTarget
    engine: sa.Engine
    table: str
    steps: str
    binding: TableBinding

    def run(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(sa.text(sql), params)
            return [tuple(r) for r in result] if result.returns_rows else []

    def stamp(self, when: datetime) -> Any:
        """A timestamp as the application stores it."""
        if self.target.dialect == "sqlite":
            return encode_sqlite_time(when)
        return when.astimezone(UTC).replace(tzinfo=None)  # Prisma: timestamp(3) without time zone

    def insert(
        self, pid: str, status: str, updated: datetime, *, deleted: bool = False, steps: tuple[str, ...] = ()
    ) -> None:
        """What the application's webhook handler does, knowing nothing of the library."""
        self.run(
            f'INSERT INTO {self.table} (id, repo, status, "updatedAt", del) VALUES (:id, :repo, :status, :u, :d)',
            id=pid, repo="acme/api", status=status, u=self.stamp(updated), d=deleted,
        )  # fmt: skip
        for name in steps:
            self.run(
                f'INSERT INTO {self.steps} ("pipelineId", name, status) VALUES (:p, :n, :s)', p=pid, n=name, s="Queued"
            )

    def row(self, pid: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            found = conn.execute(sa.text(f"SELECT * FROM {self.table} WHERE id = :id"), {"id": pid}).mappings().one()
            return dict(found)

    def step_statuses(self, pid: str) -> list[tuple[str, str]]:
        rows = self.run(f'SELECT name, status FROM {self.steps} WHERE "pipelineId" = :p ORDER BY id', p=pid)
        return [(str(n), str(s)) for n, s in rows]


def _create_app_tables(target: SqlTarget, engine: sa.Engine, table: str, steps: str, tag: str) -> None:
    if target.dialect == "sqlite":
        ddl = [
            f"CREATE TABLE {table} (id TEXT PRIMARY KEY, repo TEXT NOT NULL DEFAULT '', "
            "status TEXT NOT NULL DEFAULT 'Queued' CHECK (status IN ('Queued','Running','Completed','Failed')), "
            '"updatedAt" TEXT NOT NULL, "createdAt" TEXT, del BOOLEAN NOT NULL DEFAULT 0)',
            f'CREATE TABLE {steps} (id INTEGER PRIMARY KEY AUTOINCREMENT, "pipelineId" TEXT NOT NULL '
            f"REFERENCES {table}(id), name TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'Queued')",
        ]
    else:  # as Prisma creates them on PostgreSQL: enums and timestamp(3)
        ddl = [
            f"CREATE TYPE \"PipelineStatus_{tag}\" AS ENUM ('Queued', 'Running', 'Completed', 'Failed')",
            f"CREATE TYPE \"StepStatus_{tag}\" AS ENUM ('Queued', 'Running', 'Completed', 'Failed', 'Skipped')",
            f"CREATE TABLE {table} (id TEXT PRIMARY KEY, repo TEXT NOT NULL DEFAULT '', "
            f'status "PipelineStatus_{tag}" NOT NULL DEFAULT \'Queued\', "updatedAt" TIMESTAMP(3) NOT NULL, '
            '"createdAt" TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP, del BOOLEAN NOT NULL DEFAULT false)',
            f'CREATE TABLE {steps} (id SERIAL PRIMARY KEY, "pipelineId" TEXT NOT NULL REFERENCES {table}(id), '
            f"name TEXT NOT NULL, status \"StepStatus_{tag}\" NOT NULL DEFAULT 'Queued')",
        ]
    with engine.begin() as conn:
        for statement in ddl:
            conn.execute(sa.text(statement))


@pytest.fixture
def app(sql_target: SqlTarget) -> Iterator[App]:
    tag = uuid.uuid4().hex[:8]
    table, steps = f"pipeline_queue_{tag}", f"steps_{tag}"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    _create_app_tables(sql_target, engine, table, steps, tag)
    binding = TableBinding(
        table=table,
        kind="pipeline",
        columns={"id": "id", "updated_at": "updatedAt", "created_at": "createdAt", "deleted": "del"},
        status_column="status",
        status_of=STATUS,
        children=(
            ChildRows(
                key="steps",
                table=steps,
                parent_column="pipelineId",
                fields={"name": "name", "status": "status"},
                order_by="id",
                values={"status": STEP_STATUS},
            ),
        ),
    )
    yield App(sql_target, engine, table, steps, binding)
    if sql_target.dialect == "postgres":
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {steps}, {table} CASCADE"))
            conn.execute(sa.text(f'DROP TYPE IF EXISTS "PipelineStatus_{tag}", "StepStatus_{tag}"'))


def test_the_async_engine_runs_on_the_app_table_as_the_sync_one_does(app: App) -> None:
    """AsyncSqlStore takes the same binding: the status column, the child rows and the
    application's own columns follow the async engine's transitions."""
    import asyncio

    from fsm import AsyncEngine
    from stores.aio import AsyncSqlStore

    app.insert("a1", "Queued", datetime.now(UTC), steps=("build",))
    add_missing_columns(app.engine, app.binding)

    async def main() -> None:
        store = AsyncSqlStore(app.target.url, table_prefix=app.target.prefix, binding=app.binding, pool_size=2)
        engine = AsyncEngine(PipelineLifecycle, store, owner="async-worker")
        try:
            queued = await engine.get("a1")
            assert queued.data["steps"] == [{"name": "build", "status": "queued"}]
            started = await engine.fire(queued, "start")
            assert (app.row("a1")["status"], app.row("a1")["fsm_state"]) == ("Running", "running")
            finishing = await engine.fire(started, "finish")
            steps = [{"name": "build", "status": "completed"}]
            done = await engine.fire(finishing, "succeed", lease=finishing.lease, data={"steps": steps})
            assert done.snapshot == await engine.get("a1") and done.snapshot.data["steps"] == steps
            assert app.row("a1")["status"] == "Completed" and app.step_statuses("a1") == [("build", "Completed")]
            assert [r.event for r in await engine.history("a1")] == ["start", "finish", "succeed"]
            created = await engine.create("a2", data={"repo": "web", "steps": []})
            assert created.state == "queued" and app.row("a2")["status"] == "Queued"
        finally:
            await store.close()

    asyncio.run(main())


def test_the_pipeline_lifecycle_runs_on_the_app_table_and_its_columns_keep_their_meaning(app: App) -> None:
    now = datetime.now(UTC)
    app.insert("p1", "Queued", now, steps=("build", "test"))
    app.insert("zombie", "Running", now - timedelta(hours=2))  # a lost webhook (seeds/000)
    app.insert("fresh", "Running", now - timedelta(minutes=5))
    app.insert("hidden", "Running", now - timedelta(hours=2), deleted=True)
    added = add_missing_columns(app.engine, app.binding)
    assert "fsm_state" in added and not APP_COLUMNS & set(added)
    store = app.target.store(binding=app.binding)
    engine = Engine(PipelineLifecycle, store, owner="worker-1")

    # rows the application wrote read their leaf from status, their steps from the child table
    p1 = engine.get("p1")
    assert (p1.state, p1.version, p1.kind) == ("queued", 0, "pipeline")
    assert p1.data["steps"] == [{"name": "build", "status": "queued"}, {"name": "test", "status": "queued"}]

    started = engine.fire("p1", "start")
    row = app.row("p1")
    assert (row["status"], row["fsm_state"], row["del"]) == ("Running", "running", False)
    assert abs(_aware(row["updatedAt"]) - started.snapshot.updated_at) < timedelta(milliseconds=1)
    finishing = engine.fire("p1", "finish")
    assert (app.row("p1")["status"], app.row("p1")["fsm_state"]) == ("Running", "finalizing")  # both are Running
    assert finishing.lease is not None
    renewed = engine.renew_lease(finishing.lease)  # logged on the library's ledger beside the app's table
    assert [(r.owner, r.token, r.expires_at) for r in engine.renewals("p1")] == [
        ("worker-1", renewed.token, renewed.expires_at)
    ]
    assert engine.get("p1").data["steps"] == p1.data["steps"]  # the children came back with the renewal
    done_steps = [{"name": "build", "status": "completed"}, {"name": "test", "status": "completed"}]
    done = engine.fire("p1", "succeed", lease=finishing.lease, data={"steps": done_steps})
    assert done.state == "completed" and done.snapshot.data["steps"] == done_steps
    assert app.row("p1")["status"] == "Completed"
    assert app.step_statuses("p1") == [("build", "Completed"), ("test", "Completed")]
    assert [r.event for r in engine.history("p1")] == ["start", "finish", "succeed"]
    assert "steps" not in str(app.row("p1")["fsm_data"])  # the steps live in their table only

    # the reaper's query: the zombie is stale; the fresh and the soft-deleted ones are not
    stale = (LeaseStale(PipelineLifecycle.policy.stale_after),)
    assert [s.id for s in store.candidates("pipeline", "running", stale, limit=10)] == ["zombie"]
    batch = BatchWrite(("zombie", "fresh"), "pipeline", "expire", "running", "failed", "reaper", stale,
                       LeaseChange.CLEAR, reason="expired")  # fmt: skip
    assert [s.id for s, _ in store.apply_batch(batch)] == ["zombie"]
    assert (app.row("zombie")["status"], app.row("fresh")["status"]) == ("Failed", "Running")
    with pytest.raises(UnknownEntity):
        engine.get("hidden")

    # soft delete is the application's del flag; a new pipeline is a row it can read
    store.soft_delete("fresh")
    assert app.row("fresh")["del"] in (True, 1)
    engine.create("p5", data={"steps": [{"name": "lint"}]})
    assert (app.row("p5")["status"], app.row("p5")["repo"], app.row("p5")["del"]) == ("Queued", "", False)
    assert app.step_statuses("p5") == [("lint", "Queued")]
    live = app.run(f"SELECT id, status FROM {app.table} WHERE del = :d ORDER BY id", d=False)
    assert [(str(i), str(s)) for i, s in live] == [("p1", "Completed"), ("p5", "Queued"), ("zombie", "Failed")]


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_a_store_on_a_table_without_the_binding_columns_is_refused_with_the_fix(app: App) -> None:
    with pytest.raises(ConfigError) as info:
        app.target.store(binding=app.binding)
    assert "fsm_state" in str(info.value.problems) and "add_missing_columns" in str(info.value.problems)


def test_alembic_ops_add_only_additive_columns_and_drop_them_again(app: App) -> None:
    with app.engine.begin() as conn:
        add_binding_columns(Operations(MigrationContext.configure(conn)), app.binding)
    assert missing_columns(app.engine, app.binding) == []
    columns = {c["name"]: c for c in sa.inspect(app.engine).get_columns(app.table)}
    for name in set(columns) - APP_COLUMNS:
        assert columns[name]["nullable"] or columns[name]["default"] is not None, name
    app.insert("legacy", "Running", datetime.now(UTC))  # the application's own insert still works
    assert app.row("legacy")["fsm_kind"] == "pipeline"
    with app.engine.begin() as conn:
        drop_binding_columns(Operations(MigrationContext.configure(conn)), app.binding)
    assert set(c["name"] for c in sa.inspect(app.engine).get_columns(app.table)) == APP_COLUMNS


def test_a_binding_must_map_id_and_updated_at() -> None:
    with pytest.raises(ConfigError) as info:
        TableBinding(table="t", kind="pipeline", columns={"id": "id", "state": "status"})
    assert any("updated_at" in p for p in info.value.problems) and any("'state'" in p for p in info.value.problems)


def test_a_state_without_a_status_is_a_config_error(app: App) -> None:
    add_missing_columns(app.engine, app.binding)
    store = app.target.store(binding=app.binding)
    assert isinstance(store, SqlStore)
    with pytest.raises(ConfigError, match="no status for state 'limbo'"):
        store.create(NewEntity("x", "pipeline", "limbo"))


def test_the_applications_own_timestamp_spelling_is_compared_as_time(app: App) -> None:
    """SQLite keeps text: an app writing ``T...Z`` or an offset must still be judged by time."""
    now = datetime.now(UTC)
    add_missing_columns(app.engine, app.binding)
    store = app.target.store(binding=app.binding)
    if app.target.dialect == "sqlite":
        zombie = (now - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        recent = (now - timedelta(minutes=30)).astimezone(timezone(timedelta(hours=-5))).isoformat()
        for pid, stamp in (("zombie", zombie), ("recent", recent)):
            app.run(
                f'INSERT INTO {app.table} (id, status, "updatedAt", del) VALUES (:id, :s, :u, :d)',
                id=pid, s="Running", u=stamp, d=False,
            )  # fmt: skip
    else:
        app.insert("zombie", "Running", now - timedelta(hours=3))
        app.insert("recent", "Running", now - timedelta(minutes=30))
    stale = (LeaseStale(PipelineLifecycle.policy.stale_after),)
    assert [s.id for s in store.candidates("pipeline", "running", stale, limit=10)] == ["zombie"]
    engine = Engine(PipelineLifecycle, store)
    assert abs(engine.get("recent").updated_at - (now - timedelta(minutes=30))) < timedelta(milliseconds=1)
    result = Reaper(store, [PipelineLifecycle]).run_once()
    assert result.moved == {"pipeline.expire": 1}
    assert (engine.get("zombie").state, engine.get("recent").state) == ("failed", "running")


def test_a_status_the_application_changed_itself_wins_and_is_never_overwritten(app: App) -> None:
    now = datetime.now(UTC)
    app.insert("p1", "Queued", now)
    add_missing_columns(app.engine, app.binding)
    store = app.target.store(binding=app.binding)
    engine = Engine(PipelineLifecycle, store)
    engine.fire("p1", "start")
    read = engine.get("p1")
    # the application's success webhook sets the status itself, knowing nothing of the library
    app.run(f"UPDATE {app.table} SET status = 'Completed' WHERE id = 'p1'")
    assert engine.get("p1").state == "completed"
    write = TransitionWrite(
        "p1", "expire", "running", "failed", "reaper", read.version, require=(), lease_change=LeaseChange.CLEAR
    )
    with pytest.raises(ConditionFailed, match="state"):
        store.apply(write)
    with pytest.raises(TransitionNotAllowed):
        engine.fire("p1", "fail")
    assert app.row("p1")["status"] == "Completed"


def test_a_reaped_pipeline_fails_its_running_child_rows_in_the_same_write(app: App) -> None:
    """Issue 11, item 5: seeds/000's zombie pipeline fails, and so do its steps still running
    in the application's own steps table (the reaper's set-based batch)."""
    now = datetime.now(UTC)
    app.insert("zombie", "Running", now - timedelta(hours=2), steps=("build", "test"))
    app.insert("fresh", "Running", now - timedelta(minutes=5), steps=("build",))
    app.run(f"UPDATE {app.steps} SET status = 'Running'")
    app.run(f"UPDATE {app.steps} SET status = 'Completed' WHERE name = 'build' AND \"pipelineId\" = 'zombie'")
    add_missing_columns(app.engine, app.binding)
    store = app.target.store(binding=app.binding)
    result = Reaper(store, [PipelineLifecycle]).run_once()
    assert result.moved == {"pipeline.expire": 1}
    assert app.row("zombie")["status"] == "Failed"
    assert app.step_statuses("zombie") == [("build", "Completed"), ("test", "Failed")]
    assert app.step_statuses("fresh") == [("build", "Running")]  # a live pipeline keeps its running step
    assert Engine(PipelineLifecycle, store).get("zombie").data["steps"] == [
        {"name": "build", "status": "completed"},
        {"name": "test", "status": "failed"},
    ]


def test_a_create_with_steps_writes_its_child_rows_in_the_same_transaction(app: App) -> None:
    """create_chains on a bound table with child rows: the insert (with its child rows) and
    the steps in one transaction (on SQLite the child-row insert is a savepoint of it)."""
    add_missing_columns(app.engine, app.binding)
    store = app.target.store(binding=app.binding)
    steps = {"steps": [{"name": "build", "status": "queued"}]}
    new = NewEntity(id="c1", kind="pipeline", state="queued", data=steps)
    start = TransitionWrite("c1", "start", "queued", "running", "worker", 0)
    ((created, moved),) = store.create_chains([(new, [start])])
    assert (created.state, moved[-1][0].state, moved[-1][0].version) == ("queued", "running", 1)
    assert app.step_statuses("c1") == [("build", "Queued")]
    assert app.row("c1")["status"] == "Running"
    refused = TransitionWrite("c2", "start", "queued", "running", "worker", 0, require=(LeaseStale(timedelta(days=1)),))
    with pytest.raises(ConditionFailed):
        store.create_chains([(NewEntity(id="c2", kind="pipeline", state="queued", data=steps), [refused])])
    with pytest.raises(UnknownEntity):
        store.get("c2")
    assert app.step_statuses("c2") == []  # its child rows went with it
