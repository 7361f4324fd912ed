"""``fsm schedules``: every action, its output, and a one-line error for each bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsm.cli import main


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    assert main(["migrate", "upgrade", url]) == 0
    return url


def test_add_list_pause_resume_delete(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedules", "add", "nightly", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin", "--db", db]) == 0
    assert (
        main(["schedules", "add", "hb", "--every", "30", "--data", '{"n": 1}', "--overlap", "allow", "--db", db]) == 0
    )
    capsys.readouterr()
    assert main(["schedules", "list", "--db", db]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("hb: every 30s, overlap allow, catch-up latest; next ")
    assert listed[1].startswith("nightly: cron '30 2 * * *' Europe/Berlin, overlap skip") and "T01:30:00Z" in listed[1]
    assert main(["schedules", "pause", "hb", "--db", db]) == 0
    assert "paused" in capsys.readouterr().out
    assert main(["schedules", "list", "--json", "--db", db]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["id"] == "hb" and rows[0]["paused"] and rows[0]["data"] == {"n": 1}
    assert main(["schedules", "resume", "hb", "--db", db]) == 0
    assert main(["schedules", "delete", "hb", "--db", db]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--db", db]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == ["nightly"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add", "x", "--every", "nan"], "every must be between"),
        (["add", "x", "--cron", "* *"], "five fields"),
        (["add", "x", "--cron", "* * * * *", "--every", "5"], "exactly one of cron"),
        (["add", "x", "--every", "5", "--data", "{bad"], "--data is not JSON"),
        (["add", "x", "--every", "5", "--data", "[1]"], "data must be a JSON object"),
        (["add", "x", "--every", "5", "--timezone", "Mars/Base"], "unknown time zone"),
        (["add", "x@y", "--every", "5"], "without '@'"),
        (["add", "x\x00", "--every", "5"], "schedule id"),
        (["pause", "nope"], "no schedule 'nope' of job"),
        (["pause"], "pause needs a schedule id"),
        (["list", "--lifecycle", "nowhere:Nope"], "nowhere"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    db: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["schedules", *argv, "--db", db]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_missing_store_is_refused_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedules", "list", "--db", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "nothing was created" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()
