"""The command line: ``fsm demo`` (the main job) and ``fsm reaper``."""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import pytest

from fsm.cli import main

GATE_CELL = re.compile(r"([a-z-]+) (\d+)/(\d+)")


def gate_figures(out: str) -> dict[str, dict[str, tuple[int, int]]]:
    """``gates (executions/recorded results):`` lines of the report, per scenario and gate."""
    lines = out.split("gates (executions/recorded results):\n", 1)[1].splitlines()
    figures = {}
    for line in lines[:3]:
        name, _, cells = line.strip().partition(" ")
        figures[name] = {g: (int(e), int(r)) for g, e, r in GATE_CELL.findall(cells.split("(")[0])}
    return figures


def test_the_demo_tells_the_whole_story_with_real_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsm import Engine, PipelineLifecycle
    from stores.sql import SqlStore

    monkeypatch.chdir(tmp_path)
    app = SqlStore("sqlite:///fsm.db")  # an application's entity in the same database file
    pipelines = Engine(PipelineLifecycle, app)
    pipelines.create("prod-1")
    pipelines.fire("prod-1", "start")
    out_dir = tmp_path / "pictures"
    assert main(["demo", "--quick", "--out", str(out_dir)]) == 0  # the embedded default: ./fsm.db
    out = capsys.readouterr().out
    assert pipelines.get("prod-1").state == "running" and len(pipelines.history("prod-1")) == 1
    app.close()
    assert "Traceback" not in out
    # seeds/000: the zombie pipelines, as before
    assert "lost-webhook: failed (reason: expired)" in out
    assert "main-old: failed (reason: duplicate)" in out
    assert "moved pipeline.expire=1, pipeline.supersede=1" in out
    # seeds/002: each gate's executions and recorded results
    figures = gate_figures(out)
    gates = ("security", "merge-gate", "coverage", "image-freshness")
    assert figures["slow"] == dict.fromkeys(gates, (1, 1))
    killed = figures["killed"]
    assert killed["security"] == killed["merge-gate"] == (1, 1)  # replayed from the ledger, never re-run
    assert all(recorded == 1 for _, recorded in killed.values())
    in_flight = re.search(r"in flight at SIGKILL: ([a-z-, ]+)\)", out)
    assert in_flight is not None
    extra = 0 if in_flight.group(1) == "none" else len(in_flight.group(1).split(", "))
    assert sum(executed for executed, _ in killed.values()) <= 4 + extra
    paused = figures["paused"]
    assert all(recorded == 1 for _, recorded in paused.values()) and paused["merge-gate"][0] == 2
    late = re.search(r"late writes of paused: refused (\d+) \(.*\), accepted (\d+)", out)
    assert late is not None and int(late.group(1)) >= 5 and late.group(2) == "0"
    reaper = re.search(r"reaper: (\d+) ticks, moved job.reclaim=(\d+)$", out, re.M)
    assert reaper is not None and int(reaper.group(1)) > 10 and reaper.group(2) == "2"
    # fsm inspect on the demo's tables: its reaper's ticks are recorded, and no time is in the future
    from fsm.demo.pipelines import DEMO_PREFIX
    from fsm.inspect.data import Filters, InspectorData

    demo = SqlStore("sqlite:///fsm.db", table_prefix=DEMO_PREFIX, create=False)
    seen = InspectorData(demo)
    assert len(seen.reaper_ticks(limit=1000)) >= int(reaper.group(1)) + 1  # the stage's ticks and the pipelines'
    now = demo.now()
    assert all(s.updated_at <= now and s.created_at <= now for s in seen.entities(Filters(limit=500)).rows)
    demo.close()
    assert "slow: completed; history start -> exited -> complete" in out
    assert out.count("history start -> exited -> reclaim -> complete") == 2
    assert re.search(r"invariants: I1 ok, I2 ok, I3 ok, I4 ok, I5 ok, I6 ok \(\d+ checks\)", out)
    # the pictures: well-formed SVG, each job's timeline and its final state highlighted
    for name in ("slow", "killed", "paused"):
        timeline = ElementTree.parse(out_dir / f"timeline-{name}.svg").getroot()
        assert timeline.tag == "{http://www.w3.org/2000/svg}svg"
        texts = " ".join(t.text or "" for t in timeline.iter("{http://www.w3.org/2000/svg}text"))
        assert "job-" in texts and (name != "killed" or "SIGKILL" in texts)
        diagram = next(out_dir.glob(f"lifecycle-job-{name}.*"))
        if diagram.suffix == ".svg":
            ElementTree.parse(diagram)
        assert f"lifecycle-job-{name}{diagram.suffix}" in out
    assert (tmp_path / "fsm.db").exists()
    # JobData.gates is filled: each job's row holds its four gates' results, run or replayed
    demo = SqlStore("sqlite:///fsm.db", table_prefix="fsm_demo_", create=False)
    try:
        jobs = demo.entities("job")
        assert len(jobs) == 3 and {j.state for j in jobs} == {"completed"}
        for job in jobs:
            assert list(job.data["gates"]) == list(gates), job.id
            assert all(g["status"] == "passed" and g["detail"] for g in job.data["gates"].values()), job.id
    finally:
        demo.close()
    # and it says how to look closer: the demo's tables need their prefix
    assert "--prefix fsm_demo_" in out and "fsm show job-" in out


def test_the_demo_needs_a_store_its_processes_can_share(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--db", "memory://"]) == 2
    assert "shared store" in capsys.readouterr().err


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
    for kind in ("pipeline", "job"):  # one leader lease per lifecycle the reaper serves
        assert store.get(f"fsm-reaper-leader:{kind}").lease_owner is None


def test_a_bad_out_directory_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert main(["demo", "--db", f"sqlite:///{tmp_path}/fsm.db", "--out", str(blocker / "x")]) == 2
    out = capsys.readouterr()
    assert "cannot write" in out.err and "Traceback" not in out.out + out.err


def test_the_migrations_command_reports_errors_and_creates_nothing_by_accident(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from stores.sql.migrations.__main__ import main as migrations

    missing = f"{tmp_path}/missing.db"
    assert migrations(["current", f"sqlite:///{missing}"]) == 2 and not os.path.exists(missing)
    assert migrations(["upgrade", "notaurl"]) == 2  # refused input: 2, as every fsm command
    assert "Could not parse" in capsys.readouterr().err
    empty = f"{tmp_path}/empty.db"
    open(empty, "w").close()
    assert migrations(["stamp", f"sqlite:///{empty}"]) == 2
    assert "there are none here" in capsys.readouterr().err
    ok = f"sqlite:///{tmp_path}/ok.db"
    assert migrations(["upgrade", ok]) == 0 and "upgrade: done" in capsys.readouterr().out
    assert migrations(["downgrade", ok, "nope"]) == 2
    assert "python -m stores.migrations: error: cannot downgrade to 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        migrations(["upgrade", ok, "--prefix", "x y;"])


def test_python_dash_m_fsm_is_the_fsm_command() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fsm", "--version"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() and not done.stderr
