"""The command line: ``fsm demo`` (the main job) and ``fsm reaper``."""

from __future__ import annotations

import pytest

from fsm.cli import main


def test_demo_replays_both_seeds_on_a_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--db", "memory://"]) == 0
    out = capsys.readouterr().out
    assert "lost-webhook: failed (reason: expired)" in out
    assert "main-old: failed (reason: duplicate)" in out and "main-new: running" in out
    assert "never expired nor reclaimed" in out
    assert "late write is refused" in out
    assert "start -> exited -> reclaim -> complete" in out


def test_reaper_once_prints_a_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reaper", "--db", "memory://", "--once"]) == 0
    out = capsys.readouterr().out
    assert "tick 1 at " in out and ": moved nothing" in out


def test_reaper_dry_run_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reaper", "--db", "memory://", "--once", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(dry run)" in out and "dry run, would move 0" in out


def test_reaper_refuses_a_bad_lifecycle_and_a_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reaper", "--db", "memory://", "--once", "--lifecycle", "fsm.lifecycles:Nope"]) == 2
    assert "cannot load" in capsys.readouterr().err
    assert main(["reaper", "--db", "memory://", "--once", "--interval", "0"]) == 2
    assert "interval" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_bad_urls_and_unreachable_databases_are_clean_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--db", "notaurl"]) == 2
    assert "cannot open notaurl" in capsys.readouterr().err
    assert main(["reaper", "--db", "postgresql+psycopg://app:s3cret@127.0.0.1:1/x", "--once"]) == 2
    out = capsys.readouterr().err
    assert "s3cret" not in out and "***" in out


def test_the_leader_lease_is_resigned_when_a_once_run_ends(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/fsm.db"
    assert main(["migrate", "upgrade", url]) == 0  # the reaper only reads: tables come from a deploy step
    for _ in range(3):  # run from cron: every run leads, none waits for the previous lease to expire
        assert main(["reaper", "--db", url, "--once", "--leader"]) == 0
    from stores import open_store

    store = open_store(url)
    assert store.get("fsm-reaper-leader").lease_owner is None


def test_the_demo_never_touches_an_applications_entities_in_the_same_database(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsm import Engine, PipelineLifecycle
    from stores.sql import SqlStore

    url = f"sqlite:///{tmp_path}/fsm.db"
    app = SqlStore(url)
    pipelines = Engine(PipelineLifecycle, app)
    pipelines.create("prod-1")
    pipelines.fire("prod-1", "start")
    assert main(["demo", "--db", url]) == 0
    assert "moved pipeline.expire=1, pipeline.supersede=1" in capsys.readouterr().out
    assert pipelines.get("prod-1").state == "running" and len(pipelines.history("prod-1")) == 1
    app.close()


def test_the_migrations_command_reports_errors_and_creates_nothing_by_accident(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from stores.sql.migrations.__main__ import main as migrations

    missing = f"{tmp_path}/missing.db"
    assert migrations(["current", f"sqlite:///{missing}"]) == 1 and not os.path.exists(missing)
    assert migrations(["upgrade", "notaurl"]) == 1
    assert "Could not parse" in capsys.readouterr().err
    empty = f"{tmp_path}/empty.db"
    open(empty, "w").close()
    assert migrations(["stamp", f"sqlite:///{empty}"]) == 1
    assert "there are none here" in capsys.readouterr().err
    ok = f"sqlite:///{tmp_path}/ok.db"
    assert migrations(["upgrade", ok]) == 0 and "upgrade: done" in capsys.readouterr().out
    assert migrations(["downgrade", ok, "nope"]) == 1
    with pytest.raises(SystemExit):
        migrations(["upgrade", ok, "--prefix", "x y;"])
