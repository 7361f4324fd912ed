"""Issue 11, item 6: the CLI and the diagrams, tried as a new user would."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.cli import main
from fsm.diagram import extract, to_dot, to_mermaid
from fsm.errors import ConfigError
from stores import open_store


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("alembic").setLevel(logging.NOTSET)


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'fsm.db'}"


def test_reaper_refuses_a_missing_file_or_a_wrong_prefix_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _db(tmp_path)
    assert main(["reaper", "--db", url, "--once"]) == 2
    out, err = capsys.readouterr()
    assert "no database file" in err and "nothing was created" in err and out == ""
    assert "only reads" not in err  # the reaper writes: it opens a store without creating one
    assert not (tmp_path / "fsm.db").exists()
    assert main(["migrate", "upgrade", url]) == 0
    assert main(["reaper", "--db", url, "--prefix", "wrong_", "--once"]) == 2
    err = capsys.readouterr().err
    assert "no fsm-lifecycles tables with prefix 'wrong_'" in err and "create=True" not in err


def test_errors_go_to_stderr_on_every_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["reaper", "--db", _db(tmp_path), "--once"],
        ["reaper", "--db", "memory://", "--lifecycle", "no.such:Thing", "--once"],
        ["demo", "--db", "nosuchdriver://x"],
        ["show", "x", "--db", _db(tmp_path)],
        ["diagram", "no.such:Thing"],
        ["migrate", "current", _db(tmp_path)],
    ):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code != 0, argv
        assert err.strip() and "error" in err, argv
        assert "error" not in out.lower(), (argv, out)


def test_version_and_verbose_after_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("fsm ")
    assert main(["reaper", "-v", "--db", "memory://", "--once"]) == 0
    assert main(["reaper", "--db", "memory://", "--once", "-q"]) == 0


def test_migrate_and_show_an_entity_with_its_lease_history_and_effects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _db(tmp_path)
    assert main(["migrate", "upgrade", url]) == 0
    assert main(["migrate", "current", url]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] != "(none)"
    store = open_store(url, create=False)
    jobs = Engine(JobLifecycle, store)
    jobs.create("job-42")
    lease = jobs.fire("job-42", "start").lease
    assert lease is not None
    jobs.run("job-42", "security", lambda key: {"status": "passed"}, lease=lease)
    store.close()  # type: ignore[attr-defined]
    assert main(["show", "job-42", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "job job-42: running (version 1, definition 1)" in out
    assert f"lease: held by {lease.owner}, token 1" in out
    assert "v1 " in out and "start: queued -> running by worker" in out
    assert "security: succeeded" in out
    assert main(["show", "job-42", "--db", url, "--json"]) == 0
    assert '"effects"' in capsys.readouterr().out


def test_quiet_a_summary_line_per_tick_and_a_capped_dry_run_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _db(tmp_path)
    clock = ManualClock()
    store = open_store(url, clock=clock)
    pipelines = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(30):
        pipelines.create(f"p{i}")
        pipelines.fire(f"p{i}", "start")
    store.close()  # type: ignore[attr-defined]
    # the rows were written "two hours ago" by the store's own clock: move them back
    import sqlite3

    conn = sqlite3.connect(tmp_path / "fsm.db")
    conn.execute("UPDATE fsm_entities SET updated_at = '2000-01-01 00:00:00.000000'")
    conn.commit()
    conn.close()
    assert main(["reaper", "--db", url, "--once", "--dry-run", "--list", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("would ")]) == 5
    assert "... and 25 more (--list N shows more)" in out
    assert any(line.startswith("tick 1 at ") and "would move 30" in line for line in out)
    caplog_root = logging.getLogger()
    assert main(["-q", "reaper", "--db", url, "--once"]) == 0
    assert caplog_root.level == logging.WARNING
    assert any(
        line.startswith("tick 1 at ") and "pipeline.expire=30" in line for line in capsys.readouterr().out.splitlines()
    )


def test_diagram_refuses_an_unknown_out_suffix_and_a_missing_check_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gif = tmp_path / "x.gif"
    assert main(["diagram", "fsm.lifecycles:JobLifecycle", "--out", str(gif)]) == 2
    assert not gif.exists() and "cannot tell a format" in capsys.readouterr().err
    assert main(["diagram", "--check", str(tmp_path / "nosuchdir")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_a_revision_mismatch_hint_never_tells_a_reader_to_pass_create_true(tmp_path: Path) -> None:
    (tmp_path / "fsm.db").touch()  # a database without the library's tables
    with pytest.raises(ConfigError) as refused:
        open_store(_db(tmp_path), create=False)
    assert "create=True" not in str(refused.value) and "fsm migrate upgrade" in str(refused.value)


def test_mermaid_self_loop_label_is_short_and_guard_meanings_are_in_the_rendered_legend() -> None:
    text = to_mermaid(extract(JobLifecycle))
    assert "finalizing --> finalizing : reclaim (reaper), see note" in text
    note = text[text.index("note left of queued") : text.index("end note")]
    assert "finalizing loop: reclaim [lease_stale, owned, reclaims_left] (reaper)" in note
    assert "lease_stale: the lease expired" in note and "reclaims_left: reclaims #lt; max_reclaims" in note
    assert "%% guard" not in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_svg_keeps_the_spaces_next_to_bold_text() -> None:
    from fsm.diagram import render

    dot = to_dot(extract(JobLifecycle))
    assert "<b>start</b>&#160;(worker)" in dot and "fired by the&#160;<b>worker</b>" in dot
    svg = render(extract(JobLifecycle), "svg").decode()
    assert ">\u00a0(worker)</text>" in svg and ">solid: fired by the\u00a0</text>" in svg


def test_show_prints_each_failed_attempts_error_and_the_owner_beside_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import timedelta

    from fsm.policy import RetryPolicy
    from fsm.work import Worker

    url = _db(tmp_path)
    clock = ManualClock()
    store = open_store(url, clock=clock)
    retry = RetryPolicy(initial_interval=timedelta(seconds=1), jitter=0.0)
    jobs = Engine(JobLifecycle, store, clock=clock, policy=JobLifecycle.policy.replace(default_retry=retry))
    jobs.create("job-7")
    calls: list[int] = []

    def flaky(job: object) -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise ConnectionError(f"refused {len(calls)}")
        return "exited"

    worker = Worker(jobs, {"running": flaky}, poll_interval=timedelta(milliseconds=10))
    while jobs.get("job-7").state != "finalizing":
        worker.run_once()
        while worker.running:
            time.sleep(0.01)
        clock.advance(seconds=5)
    worker.stop()
    store.close()  # type: ignore[attr-defined]
    assert main(["show", "job-7", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "error (attempt 1): ConnectionError: refused 1" in out
    assert "error (attempt 2): ConnectionError: refused 2" in out
    assert f"owner {jobs.owner}" in out
    assert main(["show", "job-7", "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["error"]["message"] for h in doc["history"] if h["error"]] == ["refused 1", "refused 2"]
