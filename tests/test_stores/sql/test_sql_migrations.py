"""Alembic migrations of the library's tables: the same schema as ``create=True``, and an
upgrade path (``upgrade``, ``downgrade``, the ``python -m stores.migrations`` command)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from conftest import SqlTarget

from stores.sql import SqlStore, create_engine
from stores.sql.binding import TableBinding
from stores.sql.migrate import MIGRATIONS, current_revision, downgrade, drop_schema, upgrade
from stores.sql.schema import HEAD_REVISION

TABLES = ("entities", "history", "effects", "starts", "alembic_version")


def _schema(engine: sa.Engine, prefix: str, tables: tuple[str, ...] = TABLES) -> dict[str, Any]:
    """Everything inspection tells about the tables, with the prefix taken out of names."""
    inspector = sa.inspect(engine)

    def plain(name: str | None) -> str | None:
        return None if name is None else name.replace(prefix, "{p}")

    found: dict[str, Any] = {}
    for short in tables:
        table = f"{prefix}{short}"
        found[short] = {
            # by name: migrations add columns at the end in their order (PostgreSQL's feed
            # column in 0003 before 0004's), create_all in the schema's; no statement of the
            # store depends on the column order (every one names its columns)
            "columns": sorted(
                (c["name"], str(c["type"]), c["nullable"], str(c["default"]).replace(prefix, "{p}"))
                for c in inspector.get_columns(table)
            ),
            "pk": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (plain(i["name"]), tuple(i["column_names"]), bool(i["unique"]), _where(i))
                for i in inspector.get_indexes(table)
            ),
            "fks": sorted(
                (plain(f["name"]), plain(f["referred_table"]), tuple(f["constrained_columns"]), str(f["options"]))
                for f in inspector.get_foreign_keys(table)
            ),
        }
    if engine.dialect.name == "sqlite":  # the feed's high-water table and triggers (0005)
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT type, name, tbl_name, sql FROM sqlite_master"))
            found["feed_mark"] = sorted(
                tuple(plain(value) for value in row)
                for row in rows
                if row[1].startswith(prefix) and (row[0] == "trigger" or row[1] == f"{prefix}feed_mark")
            )
        assert len(found["feed_mark"]) == 3, found["feed_mark"]
    return found


def _where(index: Any) -> str | None:
    """A partial index's predicate, spelled alike on either dialect (``x IS NOT NULL``)."""
    options = index.get("dialect_options", {})
    where = options.get("postgresql_where") or options.get("sqlite_where")
    return None if where is None else " ".join(str(where).replace("(", "").replace(")", "").split())


def test_the_migrations_build_the_same_schema_as_create_true(sql_target: SqlTarget) -> None:
    sql_target.store()  # create=True: create_all + stamp
    migrated = f"m{sql_target.prefix}"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    upgrade(engine, table_prefix=migrated)  # Alembic, revision by revision
    try:
        created_schema, migrated_schema = _schema(engine, sql_target.prefix), _schema(engine, migrated)
        assert created_schema == migrated_schema
        assert created_schema["entities"]["indexes"] == [
            ("ix_{p}entities_claim", ("kind", "state", "run_after"), False, None),
            ("ix_{p}entities_lease", ("kind", "state", "lease_expires_at", "updated_at"), False, None),
            ("ix_{p}entities_parent", ("parent_id", "id"), False, "parent_id IS NOT NULL"),
            ("ix_{p}entities_priority", ("kind", "state", "priority", "run_after"), False, "priority <> 0"),
            ("ix_{p}entities_recent", ("kind", "state", "updated_at", "id"), False, None),
            (
                "ix_{p}entities_siblings",
                ("kind", "concurrency_key", "state", "created_at"),
                False,
                "concurrency_key IS NOT NULL",
            ),
            ("ix_{p}entities_timer", ("kind", "state", "timer_since"), False, "timer_since IS NOT NULL"),
        ]
        history_key = ("ux_{p}history_key", ("entity_id", "idempotency_key"), True, "idempotency_key IS NOT NULL")
        assert history_key in created_schema["history"]["indexes"]
        assert current_revision(engine, table_prefix=migrated) == HEAD_REVISION
    finally:
        drop_schema(engine, table_prefix=migrated)


def test_upgrading_a_current_database_changes_nothing_and_create_false_accepts_it(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    before = _schema(engine, sql_target.prefix)
    upgrade(engine, table_prefix=sql_target.prefix)
    assert _schema(engine, sql_target.prefix) == before
    from fsm.records import NewEntity

    store.create(NewEntity("e1", "job", "queued"))
    assert sql_target.store(create=False).get("e1").state == "queued"


def test_downgrade_to_base_drops_the_tables_and_create_true_builds_them_again(sql_target: SqlTarget) -> None:
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    upgrade(engine, table_prefix=sql_target.prefix)
    downgrade(engine, "base", table_prefix=sql_target.prefix)
    names = set(sa.inspect(engine).get_table_names())
    assert not {f"{sql_target.prefix}{t}" for t in TABLES[:3]} & names
    assert current_revision(engine, table_prefix=sql_target.prefix) is None
    sql_target.store()  # an emptied version table: create=True upgrades through Alembic
    assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION


def test_a_database_at_0001_upgrades_to_the_head_keeping_rows_and_their_place_in_line(
    sql_target: SqlTarget,
) -> None:
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    reference = f"r{sql_target.prefix}"
    upgrade(engine, table_prefix=sql_target.prefix, revision="0001")
    try:
        indexes = {i["name"] for i in sa.inspect(engine).get_indexes(f"{sql_target.prefix}entities")}
        assert f"ix_{sql_target.prefix}entities_idle" in indexes
        from fsm.records import NewEntity

        # an old store (revision 0001) wrote rows; the new code upgrades on open and reads them
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {sql_target.prefix}entities (id, kind, state, version, state_entered_at, "
                    "created_at, updated_at, data) VALUES ('old', 'job', 'queued', 0, :t, :t, :t, '{}')"
                ),
                {"t": "2026-01-01 00:00:00.000000+00:00" if sql_target.dialect == "sqlite" else "2026-01-01Z"},
            )
        store = sql_target.store()  # create=True: Alembic upgrades 0001 -> head
        assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION == "0012"
        old = store.get("old")
        assert old.state == "queued"
        assert old.run_after == old.created_at  # due since it was created: it keeps its place
        assert f"ix_{sql_target.prefix}entities_idle" not in {
            i["name"] for i in sa.inspect(engine).get_indexes(f"{sql_target.prefix}entities")
        }
        store.create(NewEntity("new", "job", "queued", concurrency_key="k"))
        SqlStore(engine, table_prefix=reference).close()  # create_all at head, for comparison
        upgraded, created = _schema(engine, sql_target.prefix), _schema(engine, reference)
        assert upgraded == created
        downgrade(engine, "0001", table_prefix=sql_target.prefix)
        assert current_revision(engine, table_prefix=sql_target.prefix) == "0001"
    finally:
        drop_schema(engine, table_prefix=reference)


def test_the_head_revision_constant_is_the_newest_migration() -> None:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION


def test_the_migration_command_upgrades_and_reports_the_revision(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"

    def cli(*args: str, check: bool = True) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "stores.migrations", *args], capture_output=True, text=True, check=check
        )
        return run.stdout.strip() + run.stderr.strip()

    assert "no database file" in cli("current", url, check=False)  # and none is created
    assert cli("upgrade", url).startswith("upgrade: done")
    assert cli("current", url) == HEAD_REVISION
    store = SqlStore(url, create=False)
    store.close()


def test_a_bound_store_migrates_history_and_effects_referencing_the_app_table(tmp_path: object) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/app.db")
    with engine.begin() as conn:
        conn.execute(sa.text('CREATE TABLE jobs (job_id TEXT PRIMARY KEY, "updatedAt" TEXT NOT NULL)'))
    binding = TableBinding(table="jobs", kind="job", columns={"id": "job_id", "updated_at": "updatedAt"})
    upgrade(engine, binding=binding)
    try:
        names = set(sa.inspect(engine).get_table_names())
        assert {"fsm_history", "fsm_effects", "fsm_alembic_version"} <= names and "fsm_entities" not in names
        (fk,) = sa.inspect(engine).get_foreign_keys("fsm_history")
        assert (fk["referred_table"], fk["referred_columns"]) == ("jobs", ["job_id"])
    finally:
        engine.dispose()


def test_tables_without_a_version_are_not_silently_adopted(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/fsm.db"
    SqlStore(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE fsm_alembic_version"))
    engine.dispose()
    with pytest.raises(Exception, match="without a migration version"):
        SqlStore(url)


def test_fsm_migrate_upgrades_a_sqlite_database_at_0004_keeping_its_rows_and_positions(tmp_path: object) -> None:
    from datetime import UTC, datetime, timedelta

    from fsm.records import NewEntity, TransitionWrite

    url = f"sqlite:///{tmp_path}/old.db"
    upgrade(url, revision="0004")  # a database an older release made, with rows in it
    engine = create_engine(url)
    with engine.begin() as conn:
        for name in ("a", "b"):
            conn.execute(
                sa.text(
                    "INSERT INTO fsm_entities (id, kind, state, version, state_entered_at, created_at, updated_at, "
                    "run_after, data) VALUES (:id, 'job', 'failed', 1, :t, :t, :t, :t, '{}')"
                ),
                {"id": name, "t": "2026-01-01 00:00:00.000000+00:00"},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO fsm_history (entity_id, seq, event, source, target, actor, at) "
                    "VALUES (:id, 1, 'fail', 'queued', 'failed', 'worker', '2026-01-01 00:00:00.000000+00:00')"
                ),
                {"id": name},
            )
    engine.dispose()
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from fsm.cli import main; sys.exit(main())", "migrate", "upgrade", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    store = SqlStore(url, create=False)
    try:
        assert current_revision(url) == HEAD_REVISION == "0012"
        fed = store.feed()
        assert [(e.record.entity_id, e.position) for e in fed] == [("a", "s1"), ("b", "s2")]  # kept
        # the fix holds on the upgraded database: prune the newest, a reader past it misses nothing
        assert store.prune("job", ["failed"], datetime.now(UTC) + timedelta(days=1)) == ["a", "b"]
        store.create(NewEntity(id="c", kind="job", state="queued"))
        store.apply(TransitionWrite("c", "start", "queued", "running", "worker", 0))
        assert [(e.record.entity_id, e.position) for e in store.feed(fed[-1].position)] == [("c", "s3")]
    finally:
        store.close()


def test_a_0005_store_upgrades_to_0006_gaining_the_recent_index_and_downgrades_back(sql_target: SqlTarget) -> None:
    from fsm.records import NewEntity

    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    table, recent = f"{sql_target.prefix}entities", f"ix_{sql_target.prefix}entities_recent"

    def indexes() -> dict[str, tuple[str, ...]]:
        return {str(i["name"]): tuple(i["column_names"]) for i in sa.inspect(engine).get_indexes(table)}

    upgrade(engine, table_prefix=sql_target.prefix, revision="0005")
    assert recent not in indexes() and f"ix_{sql_target.prefix}entities_idle" not in indexes()
    with engine.begin() as conn:  # a row an 0005 release wrote
        conn.execute(
            sa.text(
                f"INSERT INTO {table} (id, kind, state, version, state_entered_at, created_at, updated_at, "
                "run_after, data) VALUES ('old', 'job', 'queued', 0, :t, :t, :t, :t, '{}')"
            ),
            {"t": "2026-01-01 00:00:00.000000+00:00" if sql_target.dialect == "sqlite" else "2026-01-01Z"},
        )
    sqlite = sql_target.dialect == "sqlite"
    if sqlite:  # statistics of the 0005 indexes only
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    store = sql_target.store()  # create=True: Alembic upgrades 0005 -> 0006
    assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION == "0012"
    assert indexes()[recent] == ("kind", "state", "updated_at", "id")
    if sqlite:  # the new index is described as the others are, or the planner would misjudge it
        with engine.connect() as conn:
            described = {r[0] for r in conn.exec_driver_sql("SELECT idx FROM sqlite_stat1 WHERE tbl = ?", (table,))}
        assert {recent, f"ix_{sql_target.prefix}entities_lease"} <= described
    store.create(NewEntity("new", "job", "queued"))
    assert {store.get("old").state, store.get("new").state} == {"queued"}
    downgrade(engine, "0005", table_prefix=sql_target.prefix)
    assert current_revision(engine, table_prefix=sql_target.prefix) == "0005"
    assert recent not in indexes() and {f"ix_{sql_target.prefix}entities_{n}" for n in ("lease", "claim")} <= set(
        indexes()
    )
    upgrade(engine, table_prefix=sql_target.prefix)
    assert indexes()[recent] == ("kind", "state", "updated_at", "id")


def test_a_bound_table_without_the_recent_index_gets_it_from_add_missing_columns(tmp_path: object) -> None:
    from stores.sql.binding import add_missing_columns

    engine = create_engine(f"sqlite:///{tmp_path}/app.db")
    with engine.begin() as conn:
        conn.execute(sa.text('CREATE TABLE jobs (job_id TEXT PRIMARY KEY, "updatedAt" TEXT NOT NULL)'))
    binding = TableBinding(table="jobs", kind="job", columns={"id": "job_id", "updated_at": "updatedAt"})
    try:
        add_missing_columns(engine, binding)
        with engine.begin() as conn:  # as an application bound before revision 0006 has it
            conn.execute(sa.text("DROP INDEX ix_fsm_jobs_recent"))
        upgrade(engine, binding=binding)  # the library's migrations leave the application table alone
        assert "ix_fsm_jobs_recent" not in {i["name"] for i in sa.inspect(engine).get_indexes("jobs")}
        assert add_missing_columns(engine, binding) == []  # no column is missing, an index is
        found = {str(i["name"]): tuple(i["column_names"]) for i in sa.inspect(engine).get_indexes("jobs")}
        assert found["ix_fsm_jobs_recent"] == ("fsm_kind", "fsm_state", "updatedAt", "job_id")
        assert {"ix_fsm_jobs_lease", "ix_fsm_jobs_claim", "ix_fsm_jobs_siblings"} <= set(found)
    finally:
        engine.dispose()


def test_0007_drops_the_history_foreign_key_on_postgresql_only_and_downgrades_back(sql_target: SqlTarget) -> None:
    from datetime import UTC, datetime, timedelta

    from fsm.records import NewEntity, TransitionWrite

    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    history = f"{sql_target.prefix}history"

    def keys() -> list[str]:
        return [str(f["referred_table"]) for f in sa.inspect(engine).get_foreign_keys(history)]

    upgrade(engine, table_prefix=sql_target.prefix, revision="0006")
    assert keys() == [f"{sql_target.prefix}entities"]
    store = sql_target.store()  # create=True: 0006 -> head
    assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION == "0012"
    postgres = sql_target.dialect == "postgres"
    assert keys() == ([] if postgres else [f"{sql_target.prefix}entities"])
    store.create(NewEntity("a", "job", "queued"))
    store.apply(TransitionWrite("a", "start", "queued", "running", "worker", 0))
    assert [h.event for h in store.history("a")] == ["start"]
    # prune removes an entity's history itself: nothing is left behind without the cascade
    store.apply(TransitionWrite("a", "fail", "running", "failed", "worker", 1))
    assert store.prune("job", ["failed"], datetime.now(UTC) + timedelta(days=1)) == ["a"]
    with engine.connect() as conn:
        left = conn.execute(sa.text(f"SELECT count(*) FROM {history} WHERE entity_id = 'a'")).scalar()
    assert left == 0
    store.close()
    downgrade(engine, "0006", table_prefix=sql_target.prefix)
    assert keys() == [f"{sql_target.prefix}entities"]


def test_a_fresh_store_has_the_history_foreign_key_on_sqlite_only(sql_target: SqlTarget) -> None:
    sql_target.store()
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    found = sa.inspect(engine).get_foreign_keys(f"{sql_target.prefix}history")
    if sql_target.dialect == "postgres":
        assert found == []
    else:
        assert [f["options"].get("ondelete") for f in found] == ["CASCADE"]


def test_a_0009_store_upgrades_to_0010_its_rows_without_a_definition_and_downgrades_back(
    sql_target: SqlTarget,
) -> None:
    from fsm.records import NewEntity, TransitionWrite

    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    table = f"{sql_target.prefix}entities"

    def columns() -> dict[str, tuple[str, bool]]:
        return {str(c["name"]): (str(c["type"]), bool(c["nullable"])) for c in sa.inspect(engine).get_columns(table)}

    upgrade(engine, table_prefix=sql_target.prefix, revision="0009")
    assert "definition" not in columns()
    with engine.begin() as conn:  # a row an 0009 release wrote
        conn.execute(
            sa.text(
                f"INSERT INTO {table} (id, kind, state, version, state_entered_at, created_at, updated_at, "
                "run_after, data) VALUES ('old', 'job', 'queued', 0, :t, :t, :t, :t, '{}')"
            ),
            {"t": "2026-01-01 00:00:00.000000+00:00" if sql_target.dialect == "sqlite" else "2026-01-01Z"},
        )
    store = sql_target.store()  # create=True: Alembic upgrades 0009 -> 0010
    assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION == "0012"
    assert columns()["definition"] == ("INTEGER", True)
    assert store.get("old").definition is None  # written before versions were recorded
    assert store.create(NewEntity("new", "job", "queued", definition=3)).definition == 3
    moved, _ = store.apply(TransitionWrite("old", "start", "queued", "running", "worker", 0, definition=2))
    assert moved.definition == store.get("old").definition == 2
    store.close()
    downgrade(engine, "0009", table_prefix=sql_target.prefix)
    assert current_revision(engine, table_prefix=sql_target.prefix) == "0009"
    assert "definition" not in columns()
    with engine.connect() as conn:  # the rows stay, without their definitions
        kept = conn.execute(sa.text(f"SELECT id, state, version FROM {table} ORDER BY id")).all()
    assert [tuple(r) for r in kept] == [("new", "queued", 0), ("old", "running", 1)]
    upgrade(engine, table_prefix=sql_target.prefix)
    again = sql_target.store(create=False)
    assert (again.get("old").definition, again.get("new").definition) == (None, None)


def test_a_table_bound_before_0010_is_refused_until_the_definition_column_is_added(tmp_path: object) -> None:
    from fsm.errors import ConfigError
    from fsm.records import NewEntity
    from stores.sql.binding import add_missing_columns

    url = f"sqlite:///{tmp_path}/app.db"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text('CREATE TABLE jobs (job_id TEXT PRIMARY KEY, "updatedAt" TEXT NOT NULL)'))
    binding = TableBinding(table="jobs", kind="job", columns={"id": "job_id", "updated_at": "updatedAt"})
    try:
        add_missing_columns(engine, binding)
        with engine.begin() as conn:  # as an application bound before revision 0010 has it
            conn.execute(sa.text("ALTER TABLE jobs DROP COLUMN fsm_definition"))
        with pytest.raises(ConfigError, match="lacks the binding's columns") as refused:
            SqlStore(url, binding=binding)
        assert "missing: fsm_definition" in refused.value.problems
        assert add_missing_columns(engine, binding) == ["fsm_definition"]
        store = SqlStore(url, binding=binding)
        try:
            assert store.create(NewEntity("j1", "job", "queued", definition=4)).definition == 4
            assert store.get("j1").definition == 4
        finally:
            store.close()
    finally:
        engine.dispose()


def test_a_0011_store_upgrades_to_0012_its_rows_without_a_memory_and_downgrades_back(
    sql_target: SqlTarget,
) -> None:
    from fsm.records import TransitionWrite

    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    table = f"{sql_target.prefix}entities"

    def columns() -> set[str]:
        return {str(c["name"]) for c in sa.inspect(engine).get_columns(table)}

    upgrade(engine, table_prefix=sql_target.prefix, revision="0011")
    assert "memory" not in columns()
    with engine.begin() as conn:  # a row an 0011 release wrote
        conn.execute(
            sa.text(
                f"INSERT INTO {table} (id, kind, state, version, state_entered_at, created_at, updated_at, "
                "run_after, data) VALUES ('old', 'job', 'paused', 0, :t, :t, :t, :t, '{}')"
            ),
            {"t": "2026-01-01 00:00:00.000000+00:00" if sql_target.dialect == "sqlite" else "2026-01-01Z"},
        )
    store = sql_target.store()  # create=True: Alembic upgrades 0011 -> 0012
    assert current_revision(engine, table_prefix=sql_target.prefix) == HEAD_REVISION == "0012"
    assert "memory" in columns()
    assert store.get("old").memory is None  # it left no compound with a history state
    moved, _ = store.apply(TransitionWrite("old", "pause", "paused", "queued", "worker", 0, memory={"active": "b"}))
    assert moved.memory == store.get("old").memory == {"active": "b"}
    store.close()
    downgrade(engine, "0011", table_prefix=sql_target.prefix)
    assert current_revision(engine, table_prefix=sql_target.prefix) == "0011"
    assert "memory" not in columns()
    with engine.connect() as conn:  # the row stays, without its memory
        kept = conn.execute(sa.text(f"SELECT id, state, version FROM {table}")).all()
    assert [tuple(r) for r in kept] == [("old", "queued", 1)]
