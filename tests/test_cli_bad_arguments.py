"""Issue 18, the command line's items: every subcommand, given bad arguments, exits 2 with
one clean message on stderr and no traceback; and what a new user meets after ``fsm demo``.

``BAD_ARGUMENTS`` holds cases for every registered subcommand (a test checks that it
does, so a new subcommand must add its own).  Each runs in-process through
``fsm.cli.main``: an exception escaping it fails the test, as a traceback would.  A few
run through the real ``fsm`` console script too, where a third party (uvicorn) could
print a traceback of its own.
"""

from __future__ import annotations

import argparse
import ast
import logging
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm.cli import build_parser, main
from stores import open_store

JOB = "fsm.lifecycles:JobLifecycle"
DOWN = "postgresql+psycopg://app:s3cret@127.0.0.1:1/app"
"""A PostgreSQL URL nothing listens on: refused at once, no server needed."""
DEMO = "fsm_demo_"
DOUBLE_WRAP = re.compile(r"cannot open [^:]+: cannot|cannot open .*cannot open")


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("alembic").setLevel(logging.NOTSET)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder as after ``fsm demo``: ``fsm.db`` holds the demo's ``fsm_demo_*`` tables
    only (the demo itself takes 25 s; its tables are what matter here)."""
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///fsm.db", table_prefix=DEMO)
    close = getattr(store, "close", None)
    if close is not None:
        close()
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "a-file").write_text("")
    return tmp_path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``fsm ARGV`` in-process: (exit code, stdout, stderr); argparse's exit included."""
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


BAD_ARGUMENTS: dict[str, list[list[str]]] = {
    "demo": [
        ["--db", "memory://"],
        ["--db", "notaurl"],
        ["--db", DOWN],
        ["--out", "a-file/pictures"],
        ["--bogus"],
    ],
    "diagram": [
        [],
        ["nope"],
        ["nope:Thing"],
        [JOB, "--format", "bogus"],
        [JOB, "--out", "x.bogus"],
        [JOB, "--last", "-1"],
        [JOB, "--id", "x"],
        [JOB, "--db", "sqlite:///fsm.db", "--id", "x"],
        [JOB, "--db", "sqlite:///missing.db", "--id", "x"],
        [JOB, "--db", DOWN, "--id", "x"],
        ["--check", "no-such-dir"],
    ],
    "prune": [
        [],  # --older-than is required
        ["--older-than", "30x"],
        ["--older-than", "0"],
        ["--older-than", "-1d"],
        ["--older-than", "\udcff"],
        ["--older-than", "9" * 400 + "w"],
        ["--older-than", "30d", "--batch-size", "0", "--prefix", DEMO],
        ["--older-than", "30d", "--batch-size", "99999999", "--prefix", DEMO],
        ["--older-than", "30d", "--list", "-1", "--prefix", DEMO],
        ["--older-than", "30d", "--lifecycle", "nope:Thing", "--prefix", DEMO],
        ["--older-than", "30d", "--db", "notaurl"],
        ["--older-than", "30d", "--db", DOWN],
        ["--older-than", "30d"],  # the default prefix fsm_: the tables are fsm_demo_*
        ["--older-than", "30d", "--prefix", "x;y"],
        ["--bogus"],
    ],
    "reaper": [
        ["--once", "--list", "-1", "--prefix", DEMO],
        ["--once", "--leader", "--interval", "1e-9", "--prefix", DEMO],
        ["--once", "--interval", "nan", "--prefix", DEMO],
        ["--once", "--interval", "abc"],
        ["--once", "--batch-size", "0", "--prefix", DEMO],
        ["--once", "--lifecycle", "nope:Thing", "--prefix", DEMO],
        ["--once", "--db", "notaurl"],
        ["--once", "--db", DOWN],
        ["--once", "--dry-run"],  # the default prefix fsm_: the tables are fsm_demo_*
        ["--once", "--prefix", "x;y"],
        ["--once", "--prefix", DEMO, "--metrics-port", "-1"],
        ["--once", "--prefix", DEMO, "--metrics-port", "abc"],
        ["--bogus"],
    ],
    "schedules": [
        [],  # an action is required
        ["bogus"],
        ["pause", "--prefix", DEMO],  # no schedule id
        ["pause", "nope", "--prefix", DEMO],
        ["add", "x", "--every", "nan", "--prefix", DEMO],
        ["add", "x", "--every", "abc", "--prefix", DEMO],
        ["add", "x", "--cron", "61 * * * *", "--prefix", DEMO],
        ["add", "x", "--every", "5", "--data", "{", "--prefix", DEMO],
        ["add", "x", "--every", "5", "--data", '{"a": "\ud800"}', "--prefix", DEMO],
        ["add", "x\u0000", "--every", "5", "--prefix", DEMO],
        ["add", "x", "--every", "5", "--timezone", "\udcff", "--prefix", DEMO],
        ["list", "--lifecycle", "nope:Thing", "--prefix", DEMO],
        ["list", "--db", "notaurl"],
        ["list", "--db", DOWN],
        ["list"],  # the default prefix fsm_: the tables are fsm_demo_*
        ["--bogus"],
    ],
    "migrate": [
        [],
        ["current"],
        ["bogus", "sqlite:///fsm.db"],
        ["current", "sqlite:///missing.db"],
        ["current", "notaurl"],
        ["current", DOWN],
        ["current", "memory://"],
        ["downgrade", "sqlite:///fsm.db"],
        ["downgrade", "sqlite:///fsm.db", "nope", "--prefix", DEMO],
        ["upgrade", "sqlite:///fsm.db", "nope"],
        ["stamp", "sqlite:///empty.db"],
        ["upgrade", "sqlite:///fsm.db", "--prefix", "x y"],
        ["partition-history", "sqlite:///fsm.db", "--prefix", DEMO],  # PostgreSQL's only
        ["partition-history", "notaurl"],
        ["partition-history", DOWN],
        ["partition-history", "sqlite:///fsm.db", "--prefix", DEMO, "--interval-days", "nan"],
        ["partition-history", "sqlite:///fsm.db", "--prefix", DEMO, "--interval-days", "0"],
    ],
    "show": [
        [],
        ["job-1"],  # the default prefix fsm_: the tables are fsm_demo_*
        ["job-1", "--prefix", DEMO],
        ["", "--prefix", DEMO],
        ["job-1", "--db", "notaurl"],
        ["job-1", "--db", DOWN],
        ["job-1", "--db", "sqlite:///missing.db"],
        ["job-1", "--prefix", "x y"],
    ],
    "check": [
        [],
        ["nope:Thing"],
        ["fsm.lifecycles:JobData"],
        ["fsm.lifecycles:JobLifecycle"],  # the default prefix fsm_: the tables are fsm_demo_*
        ["fsm.lifecycles:JobLifecycle", "--db", "notaurl"],
        ["fsm.lifecycles:JobLifecycle", "--db", DOWN],
        ["fsm.lifecycles:JobLifecycle", "--db", "sqlite:///missing.db"],
        ["fsm.lifecycles:JobLifecycle\u0000", "--prefix", DEMO],
        ["--bogus"],
    ],
    "migrate-rows": [
        [],
        ["nope:Thing", "--prefix", DEMO],
        ["fsm.lifecycles:JobLifecycle", "--db", "sqlite:///missing.db"],
        ["fsm.lifecycles:JobLifecycle", "--db", DOWN],
        ["fsm.lifecycles:JobLifecycle", "--prefix", DEMO, "--wait", "nan"],
        ["fsm.lifecycles:JobLifecycle", "--prefix", DEMO, "--wait", "inf"],
        ["fsm.lifecycles:JobLifecycle", "--prefix", DEMO, "--wait", "soon"],
        ["fsm.lifecycles:JobLifecycle", "--prefix", DEMO, "--wait", "-5"],
    ],
    "inspect": [
        [],
        ["--db", "sqlite:///missing.db"],
        ["--db", "sqlite:///fsm.db"],
        ["--db", "memory://"],
        ["--db", DOWN],
        ["--db", "sqlite:///fsm.db", "--prefix", DEMO, "--port", "-1"],
        ["--db", "sqlite:///fsm.db", "--prefix", DEMO, "--port", "99999"],
        ["--db", "sqlite:///fsm.db", "--prefix", DEMO, "--refresh", "nan"],
        ["--db", "sqlite:///fsm.db", "--prefix", DEMO, "--refresh", "0"],
        ["--db", "sqlite:///fsm.db", "--prefix", DEMO, "--lifecycle", "nope:Thing"],
    ],
}
TOP_LEVEL = [["bogus"], ["-v", "-q", "show", "x"], ["--bogus"]]


def _cases() -> list[list[str]]:
    return [[command, *args] for command, cases in BAD_ARGUMENTS.items() for args in cases] + TOP_LEVEL


def test_the_table_covers_every_subcommand() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(BAD_ARGUMENTS)


@pytest.mark.parametrize("argv", _cases(), ids=" ".join)
def test_bad_arguments_exit_2_with_one_clean_error_and_no_traceback(
    argv: list[str], folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err + out
    assert "error:" in err, err  # "fsm show: error: ..." or argparse's "fsm show: error: ..."
    assert "error" not in out.lower()
    assert not DOUBLE_WRAP.search(err), err  # "cannot open URL: cannot open the store at URL"
    for leak in ("OperationalError", "(psycopg", "sqlalchemy.exc", "s3cret"):
        assert leak not in err, (leak, err)


def test_a_port_in_use_is_refused_before_the_server_starts(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, _, err = run(["inspect", "--db", "sqlite:///fsm.db", "--prefix", DEMO, "--port", port], capsys)
    assert code == 2 and "cannot listen on 127.0.0.1:" in err and "Traceback" not in err


# -- the items of issue 18, one by one ---------------------------------------------------------


def test_the_reaper_refuses_an_interval_under_a_microsecond_with_the_leader(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["reaper", "--once", "--leader", "--interval", "1e-9", "--prefix", DEMO], capsys)
    assert code == 2 and err.startswith("fsm reaper: error: ") and "interval" in err and "microsecond" in err
    code, out, _ = run(["reaper", "--once", "--leader", "--interval", "1e-6", "--prefix", DEMO], capsys)
    assert code == 0 and "moved nothing" in out


def test_list_takes_no_negative_count(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["reaper", "--once", "--dry-run", "--list", "-1", "--prefix", DEMO], capsys)
    assert code == 2 and "--list" in err and "0 or more" in err
    assert run(["reaper", "--once", "--dry-run", "--list", "0", "--prefix", DEMO], capsys)[0] == 0


def test_migrate_errors_are_prefixed_exit_2_and_leak_no_driver_class(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["current", DOWN], ["current", "sqlite:///missing.db"], ["upgrade", "sqlite:///fsm.db", "nope"]):
        code, _, err = run(["migrate", *argv], capsys)
        assert code == 2 and err.startswith("fsm migrate: error: "), err
        assert "psycopg.OperationalError" not in err and not err.startswith("error:")
    code, out, _ = run(["migrate", "current", "sqlite:///fsm.db", "--prefix", DEMO], capsys)
    assert code == 0 and out.strip() not in ("", "(none)")


def test_migrate_help_lists_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["migrate", "--help"], capsys)
    assert code == 0
    for command in ("upgrade", "current", "stamp", "downgrade"):
        assert re.search(rf"^  {command} +\w", out, re.M), (command, out)
    assert "fsm migrate upgrade sqlite:///fsm.db" in out  # an example, with the real prog name


def test_a_store_that_cannot_be_opened_is_named_once(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["reaper", "--once", "--db", DOWN],
        ["show", "x", "--db", DOWN],
        ["diagram", JOB, "--db", DOWN, "--id", "x"],
        ["inspect", "--db", DOWN],
        ["migrate", "current", DOWN],
    ):
        code, _, err = run(argv, capsys)
        assert code == 2 and err.count("127.0.0.1:1/app") == 1, (argv, err)
        assert "Connection refused" in err and not DOUBLE_WRAP.search(err)


def test_the_reaper_is_not_said_to_only_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for prefix in ("fsm_", "wrong_"):
        code, _, err = run(["reaper", "--once", "--db", f"sqlite:///{tmp_path}/x.db", "--prefix", prefix], capsys)
        assert code == 2 and "only reads" not in err and "reads a store" not in err


def test_after_the_demo_a_wrong_prefix_names_the_prefixes_there_and_the_flag(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["show", "job-1"],
        ["reaper", "--once", "--dry-run"],
        ["diagram", JOB, "--db", "sqlite:///fsm.db", "--id", "job-1"],
        ["inspect", "--db", "sqlite:///fsm.db"],
    ):
        code, _, err = run(argv, capsys)
        assert code == 2, argv
        assert "prefix 'fsm_'" in err and "'fsm_demo_'" in err and "--prefix fsm_demo_" in err, err
    open_store("sqlite:///fsm.db", table_prefix="app_").close()  # type: ignore[attr-defined]
    _, _, err = run(["show", "job-1"], capsys)
    assert "'app_', 'fsm_demo_'" in err
    # a database without any: nothing to select, say how to create them
    code, _, err = run(["show", "job-1", "--db", "sqlite:///empty.db"], capsys)
    assert code == 2 and "nor under any other prefix" in err and "fsm migrate upgrade" in err


ETL = """
from fsm import LeaseChange, Lifecycle, State, reaper, worker


class EtlRun(Lifecycle):
    kind = "etl"
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    loaded = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active), lease=LeaseChange.ACQUIRE)
    extracted = worker(active.running.to(active.finalizing, cond="holds_lease"))
    load = worker(active.finalizing.to(loaded, cond="holds_lease"))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")
"""


@pytest.mark.parametrize("command", ["reaper", "diagram", "inspect"])
def test_every_command_loads_a_lifecycle_from_the_folder_it_runs_in(
    command: str, folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "etl.py").write_text(ETL)
    # as the console script runs: its own folder first on sys.path, not the current one
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(folder))])
    monkeypatch.delitem(sys.modules, "etl", raising=False)
    if command == "reaper":
        code, out, err = run(["reaper", "--once", "--prefix", DEMO, "--lifecycle", "etl:EtlRun"], capsys)
        assert code == 0 and "for etl (live)" in out, err
    elif command == "diagram":
        code, out, err = run(["diagram", "etl:EtlRun"], capsys)
        assert code == 0 and "ref=etl:EtlRun" in out, err
    else:
        from fsm.inspect.cli import build

        parser = build_parser()
        args = parser.parse_args(["inspect", "--db", "sqlite:///fsm.db", "--prefix", DEMO, "--lifecycle", "etl:EtlRun"])
        app = build(args)  # the app, not the server: its lifecycles are what was loaded
        assert app is not None and sys.modules["etl"].__file__ == str(folder / "etl.py")
    monkeypatch.delitem(sys.modules, "etl", raising=False)


def test_the_command_lines_load_lifecycles_through_one_loader() -> None:
    """``load_lifecycle_here`` (the current folder on sys.path) in every CLI module; a bare
    ``load_lifecycle`` call there would bring back a command that cannot find ``etl.py``."""
    root = Path(__file__).resolve().parents[1]
    for module in ("fsm/reaping/cli.py", "fsm/diagram/cli.py", "fsm/inspect/cli.py", "fsm/commands.py", "fsm/cli.py"):
        tree = ast.parse((root / module).read_text())
        calls = [
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "load_lifecycle"
        ]
        assert not calls, f"{module} calls load_lifecycle; use load_lifecycle_here"


def test_an_unexpected_error_is_one_line_and_its_traceback_only_with_v(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsm.commands

    def broken(args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(fsm.commands, "run_show", broken)
    code, _, err = run(["show", "x"], capsys)
    assert code == 1
    assert err.strip() == "fsm show: unexpected error: RuntimeError: a bug (run with -v for the traceback)"
    code, _, err = run(["show", "x", "-v"], capsys)
    assert code == 1 and "Traceback" in err and "RuntimeError: a bug" in err


def test_the_console_script_prints_no_traceback(folder: Path) -> None:
    """Through the real ``fsm`` script (its own process): uvicorn or a warning could print one."""
    script = Path(sys.executable).with_name("fsm")
    if not script.exists():
        pytest.skip("no fsm console script next to this interpreter")
    for argv in (
        ["reaper", "--once", "--leader", "--interval", "1e-9", "--prefix", DEMO],
        ["inspect", "--db", "sqlite:///fsm.db", "--prefix", DEMO, "--port", "99999"],
        ["migrate", "current", DOWN],
    ):
        done = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr)
