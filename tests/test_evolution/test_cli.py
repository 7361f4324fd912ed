"""``fsm check`` and ``fsm migrate-rows`` as a deploy script runs them: exit codes, reports,
and one-line errors for what cannot be opened or parsed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsm import Engine
from fsm.cli import main
from stores.sql import SqlStore

from .builds import BuildV1

V2 = "test_evolution.builds:BuildV2"
UNDECLARED = "test_evolution.builds:BuildV2Undeclared"


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'builds.db'}"
    store = SqlStore(url)
    v1 = Engine(BuildV1, store, owner="w1")
    for i in range(3):
        v1.create(f"b-{i}", data={"target": "arm"})
    for claimed in v1.claim(2):
        store.release_lease(claimed.id, owner="w1", token=claimed.lease_token)
    store.close()
    return url


def test_check_fails_on_a_definition_that_would_strand_entities(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", UNDECLARED, "--db", db]) == 1
    out = capsys.readouterr().out
    assert "2 in state 'building', which this definition lacks and no migration moves: stranded" in out
    assert "FAILED" in out


def test_check_passes_once_the_migration_is_declared_and_migrate_rows_moves_them(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", V2, "--db", db]) == 0
    assert "2 in 'building' to move to 'compiling'" in capsys.readouterr().out
    assert main(["migrate-rows", V2, "--db", db, "--dry-run"]) == 0
    assert "would move 2 from 'building' to 'compiling'" in capsys.readouterr().out
    assert main(["migrate-rows", V2, "--db", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["moved"] == [{"from": "building", "to": "compiling", "count": 2}] and doc["done"]
    assert main(["check", V2, "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["pending"] == [] and report["states"] == {"compiling": 2, "queued": 1}


def test_migrate_rows_exits_1_while_a_worker_holds_an_entity_it_must_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'held.db'}"
    store = SqlStore(url)
    v1 = Engine(BuildV1, store, owner="w1")
    v1.create("b-held")
    v1.claim(1)  # held, its lease fresh
    store.close()
    assert main(["migrate-rows", V2, "--db", url]) == 1
    assert "1 held by a worker, left to it: run again once released (b-held)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "nosuchmodule:Build"], "cannot be imported"),
        (["check", "fsm.lifecycles:JobData"], "is not a Lifecycle"),
        (["check", V2, "--db", "sqlite:///{tmp}/absent.db"], "error:"),
        (["check", V2, "--db", "nosuchdriver://x"], "error:"),
        (["migrate-rows", V2, "--wait", "nan"], "--wait takes 0 to 86400 seconds"),
        (["migrate-rows", V2, "--wait", "-1"], "--wait takes 0 to 86400 seconds"),
    ],
)
def test_what_cannot_be_opened_is_one_line_on_stderr_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--db" not in argv:
        argv += ["--db", f"sqlite:///{tmp_path / 'absent.db'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "absent.db").exists()  # nothing created
