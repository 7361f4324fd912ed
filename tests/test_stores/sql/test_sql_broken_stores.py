"""Issue 11, item 1: broken stores get typed errors, and nothing stops the reaper.

- a corrupt SQLite file (garbage header, garbage page, truncated) -> ``StoreCorrupt``
  naming the file, from ``open_store``, ``get`` and ``fire``; no CLI prints a traceback;
- a row whose text is not UTF-8 -> ``MalformedRow``, counted and stepped over by the reaper;
- ``Engine.create`` on a bound table with a ``NOT NULL`` column of its own -> ``ConstraintViolated``,
  and ``columns=`` fills it;
- a bound store and the default store sharing ``{prefix}history`` -> ``ConfigError``;
- ``add_missing_columns`` (or a store) on a missing table -> ``ConfigError``.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import SqlTarget

from fsm import (
    ConfigError,
    ConstraintViolated,
    Engine,
    FsmError,
    InvalidArgument,
    MalformedRow,
    ManualClock,
    PipelineLifecycle,
    StoreCorrupt,
    UnknownEntity,
)
from fsm.cli import main
from fsm.reaping import Reaper
from stores import open_store
from stores.sql import SqlStore
from stores.sql.binding import TableBinding, add_missing_columns

PAGE = 4096


def _healthy(path: Path) -> None:
    store = open_store(f"sqlite:///{path}")
    engine = Engine(PipelineLifecycle, store)
    for i in range(200):
        engine.create(f"p{i:03}", data={"padding": "x" * 300})
    store.close()  # type: ignore[attr-defined]
    for suffix in ("-wal", "-shm"):
        assert not Path(f"{path}{suffix}").exists() or Path(f"{path}{suffix}").stat().st_size >= 0


def _garbage_header(raw: bytearray) -> bytes:
    raw[0:100] = b"\xab" * 100
    return bytes(raw)


def _garbage_page(raw: bytearray) -> bytes:
    noise = random.Random(11)
    for page in range(4, len(raw) // PAGE, 3):  # pages holding entity rows, not the schema's
        raw[page * PAGE : (page + 1) * PAGE] = noise.randbytes(PAGE)
    return bytes(raw)


def _truncated(raw: bytearray) -> bytes:
    return bytes(raw[: len(raw) // 3])


@pytest.fixture(params=[_garbage_header, _garbage_page, _truncated], ids=["header", "page", "truncated"])
def corrupt_db(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    healthy = tmp_path / "healthy.db"
    _healthy(healthy)
    damage: Callable[[bytearray], bytes] = request.param
    broken = tmp_path / "broken.db"
    broken.write_bytes(damage(bytearray(healthy.read_bytes())))
    return broken


def test_a_corrupt_sqlite_file_is_a_typed_error_naming_it(corrupt_db: Path) -> None:
    url = f"sqlite:///{corrupt_db}"
    with pytest.raises(StoreCorrupt) as caught:
        store = open_store(url)
        engine = Engine(PipelineLifecycle, store)
        for i in range(200):  # every row: the damage is somewhere among them
            engine.get(f"p{i:03}")
            engine.fire(f"p{i:03}", "start")
    assert str(corrupt_db) in str(caught.value) and caught.value.path == str(corrupt_db)


@pytest.mark.parametrize("command", [["reaper", "--once"], ["demo"], ["diagram", "fsm.lifecycles:JobLifecycle"]])
def test_no_cli_prints_a_traceback_for_a_corrupt_store(
    corrupt_db: Path, command: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    args = [*command, "--db", f"sqlite:///{corrupt_db}"]
    if command[0] == "diagram":
        args += ["--id", "p001"]
    if command[0] == "demo":  # the demo runs worker processes: its short form, its pictures out of the checkout
        args += ["--quick", "--out", str(corrupt_db.parent / "demo")]
    with caplog.at_level(logging.DEBUG):
        code = main(args)
    out = capsys.readouterr()
    text = out.out + out.err + caplog.text
    assert "Traceback" not in text
    if code != 0:  # a command may never read a damaged page (the demo keeps to tables of its own)
        assert str(corrupt_db) in text
    if corrupt_db.read_bytes()[:16] != b"SQLite format 3\x00":  # no header: nothing can be read at all
        assert code != 0


def test_a_row_whose_text_is_not_utf8_is_malformed_and_the_reaper_steps_over_it(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "fsm.db"
    store = SqlStore(f"sqlite:///{path}", clock=clock)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(5):
        engine.create(f"p{i}", data={"n": i})
        engine.fire(f"p{i}", "start")
    raw = sqlite3.connect(path)
    raw.execute("UPDATE fsm_entities SET data = CAST(x'7b226e223a22ff227d' AS TEXT) WHERE id = 'p2'")
    raw.commit()
    raw.close()
    with pytest.raises(MalformedRow) as caught:
        store.get("p2")
    assert caught.value.entity_id == "p2"
    with pytest.raises(MalformedRow):
        engine.fire("p2", "finish")
    clock.advance(timedelta(hours=2))
    reaper = Reaper(store, [PipelineLifecycle], {"batch_size": 2}, clock=clock)
    result = reaper.run_once()
    assert result.bad_rows == 1 and result.errors == 0 and result.moved == {"pipeline.expire": 4}
    assert reaper.run_once().errors == 0  # and every later tick runs too (I9)
    store.close()


# -- bound tables -------------------------------------------------------------------------


@pytest.fixture
def app_table(sql_target: SqlTarget) -> Iterator[tuple[SqlTarget, sa.Engine, str]]:
    table = f"jobs_{uuid.uuid4().hex[:8]}"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE {table} (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "updatedAt" TEXT)'))
    yield sql_target, engine, table
    if sql_target.dialect == "postgres":
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))


def _binding(table: str) -> TableBinding:
    return TableBinding(table=table, kind="pipeline", columns={"id": "id", "updated_at": "updatedAt"})


def test_create_on_a_bound_table_with_a_not_null_column_of_its_own(
    app_table: tuple[SqlTarget, sa.Engine, str],
) -> None:
    target, engine, table = app_table
    if target.dialect == "postgres":  # a text updatedAt is the application's own business; keep it simple
        with engine.begin() as conn:
            conn.execute(sa.text(f'ALTER TABLE {table} ALTER COLUMN "updatedAt" TYPE TIMESTAMPTZ USING NULL'))
    binding = _binding(table)
    add_missing_columns(engine, binding)
    store = target.store(binding=binding, table_prefix=f"b{uuid.uuid4().hex[:8]}_")
    pipelines = Engine(PipelineLifecycle, store)
    with pytest.raises(ConstraintViolated, match="owner"):
        pipelines.create("j1")
    with pytest.raises(UnknownEntity):
        pipelines.get("j1")  # nothing written
    with pytest.raises(InvalidArgument, match="no application column 'nope'"):
        pipelines.create("j1", columns={"owner": "ops", "nope": 1})
    snap = pipelines.create("j1", columns={"owner": "ops"})
    assert pipelines.fire(snap.id, "start").state == "running"
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT owner FROM {table} WHERE id = 'j1'")).scalar() == "ops"
    with pytest.raises(InvalidArgument, match="no application columns"):
        Engine(PipelineLifecycle, target.store(table_prefix=f"o{uuid.uuid4().hex[:8]}_")).create(
            "x", columns={"owner": "ops"}
        )


def test_a_bound_store_and_the_default_store_cannot_share_a_history_table(
    app_table: tuple[SqlTarget, sa.Engine, str],
) -> None:
    target, engine, table = app_table
    binding = _binding(table)
    add_missing_columns(engine, binding)
    prefix = f"s{uuid.uuid4().hex[:8]}_"
    target.store(table_prefix=prefix)  # the default store's tables, history included
    target.prefix = prefix  # dropped with the target
    with pytest.raises(ConfigError, match=f"{prefix}history") as caught:
        target.store(binding=binding, table_prefix=prefix)
    assert any("prefix of its own" in p for p in caught.value.problems)
    target.store(binding=binding, table_prefix=f"b{uuid.uuid4().hex[:8]}_")  # its own prefix: fine


def test_a_binding_to_a_missing_table_is_a_config_error(sql_target: SqlTarget) -> None:
    binding = _binding("no_such_table")
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with pytest.raises(ConfigError, match="'no_such_table' does not exist"):
        add_missing_columns(engine, binding)
    with pytest.raises(ConfigError, match="'no_such_table' does not exist"):
        sql_target.store(binding=binding)


def test_store_constructors_refuse_bad_options_with_config_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    bad: list[dict[str, object]] = [
        {"url_or_engine": 42},
        {"url_or_engine": "nonsense://"},
        {"url_or_engine": "sqlite:///a\x00b"},
        {"table_prefix": 7},
        {"table_prefix": "x" * 40},
        {"busy_timeout": float("nan")},
        {"busy_timeout": "5"},
        {"busy_timeout": 1e300},
        {"sqlite_synchronous": 1},
        {"sqlite_synchronous": "SOMETIMES"},
        {"schema": 3},
        {"schema": "a; DROP TABLE x"},
        {"clock": object()},
        {"clock": "now"},
        {"create": "yes"},
        {"binding": {"table": "t"}},
    ]
    for options in bad:
        kwargs = {"url_or_engine": url, **options}
        with pytest.raises(ConfigError):
            SqlStore(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        open_store(42)  # type: ignore[arg-type]
    from stores import MemoryStore

    with pytest.raises(ConfigError):
        MemoryStore(clock="now")  # type: ignore[arg-type]
    assert not os.path.exists(f"{tmp_path}/x.db")  # nothing was created
    assert issubclass(StoreCorrupt, FsmError)
