"""``fsm diagram``: export, entity overlay, ``--check`` and ``--write``, Graphviz missing."""

from __future__ import annotations

import hashlib
import importlib
import shutil
import sqlite3
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from statemachine import State
from test_diagram_formats import needs_dot, parse_dot, parse_mermaid

import stores
from fsm import Engine, JobLifecycle, Lifecycle, ManualClock, StoreUnavailable, worker
from fsm.cli import main
from fsm.diagram import GraphvizNotFound, extract, read_header, render, write_dir
from fsm.diagram.export import WriteRefused
from stores import MemoryStore

REPO_DIAGRAMS = Path(__file__).resolve().parents[2] / "diagrams"
JOB = "fsm.lifecycles:JobLifecycle"
PIPELINE = "fsm.lifecycles:PipelineLifecycle"


@pytest.fixture
def diagrams(tmp_path: Path) -> Path:
    """A copy of the committed diagrams/ directory (its diagram files; not screenshots/)."""
    return Path(shutil.copytree(REPO_DIAGRAMS, tmp_path / "diagrams", ignore=shutil.ignore_patterns("screenshots")))


@pytest.fixture
def no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which there is no ``dot``."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("FSM_GRAPHVIZ_DOT", raising=False)


# -- export --------------------------------------------------------------------------------


def test_export_prints_mermaid_on_stdout_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", JOB]) == 0
    doc = parse_mermaid(capsys.readouterr().out)
    assert set(doc.states) == set(JobLifecycle.states_map)


def test_export_writes_the_format_the_out_suffix_names(tmp_path: Path) -> None:
    out = tmp_path / "job.dot"
    assert main(["diagram", JOB, "--out", str(out)]) == 0
    assert parse_dot(out.read_text()).name == "JobLifecycle"
    explicit = tmp_path / "job.txt"
    assert main(["diagram", JOB, "--format", "mermaid", "--out", str(explicit)]) == 0
    assert explicit.read_text().startswith("stateDiagram-v2\n")


@needs_dot
def test_export_renders_svg_and_png_through_graphviz(tmp_path: Path) -> None:
    assert main(["diagram", PIPELINE, "--out", str(tmp_path / "p.svg")]) == 0
    assert main(["diagram", PIPELINE, "--format", "png", "--out", str(tmp_path / "p.png")]) == 0
    svg_header = read_header((tmp_path / "p.svg").read_bytes())
    png_header = read_header((tmp_path / "p.png").read_bytes())
    assert svg_header is not None and svg_header.format == "svg"
    assert png_header is not None and png_header.format == "png"


def test_bad_usage_and_unknown_lifecycle_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram"]) == 2
    assert "name exactly one lifecycle" in capsys.readouterr().err
    assert main(["diagram", "fsm.lifecycles:Nope"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    assert main(["diagram", JOB, "--db", "memory://"]) == 2
    assert "--db and --id go together" in capsys.readouterr().err
    assert main(["diagram", JOB, "--check", "diagrams"]) == 2
    assert "--check PATH... takes no lifecycle" in capsys.readouterr().err


# -- entity overlay ------------------------------------------------------------------------


def test_db_and_id_highlight_the_entity_and_list_its_transitions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("job-42")
    lease = engine.fire("job-42", "start").lease
    engine.fire("job-42", "exited", lease=lease)
    opened: list[tuple[str, dict[str, Any]]] = []

    def open_store(url: str, **options: Any) -> MemoryStore:
        opened.append((url, options))
        return store

    monkeypatch.setattr(stores, "open_store", open_store)
    assert main(["diagram", JOB, "--db", "memory://shared", "--id", "job-42", "--last", "1"]) == 0
    assert opened == [("memory://shared", {"table_prefix": "fsm_", "create": False})]  # read, never created
    doc = parse_mermaid(capsys.readouterr().out)
    assert doc.classes["current"] == {"finalizing"}
    (note,) = [lines for state, lines in doc.notes if state == "finalizing"]
    assert note[:2] == ["entity job-42: finalizing (version 2)", "last 1 of 2 transitions"]
    assert note[2].startswith("v2 exited: running")

    assert main(["diagram", JOB, "--db", "memory://shared", "--id", "job-42", "--format", "dot"]) == 0
    dot = parse_dot(capsys.readouterr().out)
    assert "filled" in dot.nodes["finalizing"]["style"] and "__history" in dot.nodes

    opened.clear()
    assert main(["diagram", JOB, "--db", "memory://shared", "--prefix", "app_", "--id", "job-42"]) == 0
    assert opened == [("memory://shared", {"table_prefix": "app_", "create": False})]


def test_unknown_entity_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", JOB, "--db", "memory://", "--id", "ghost"]) == 2
    assert "no entity with id 'ghost'" in capsys.readouterr().err


def test_db_overlay_from_a_sqlite_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    store = stores.open_store(url)
    engine = Engine(JobLifecycle, store)
    engine.create("s1")
    engine.fire("s1", "start")
    close = getattr(store, "close", None)
    if callable(close):
        close()
    assert main(["diagram", JOB, "--db", url, "--id", "s1"]) == 0
    assert parse_mermaid(capsys.readouterr().out).classes["current"] == {"running"}


def _sqlite_store_with(url: str, entity: str, *, prefix: str = "fsm_") -> None:
    store = stores.open_store(url, table_prefix=prefix)
    engine = Engine(JobLifecycle, store)
    engine.create(entity)
    engine.fire(entity, "start")
    getattr(store, "close", lambda: None)()


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_db_is_only_read_a_missing_sqlite_file_is_an_error_not_a_new_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    typo = tmp_path / "fsm-typo.db"
    assert main(["diagram", JOB, "--db", f"sqlite:///{typo}", "--id", "j1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fsm diagram: error: ") and "Traceback" not in err
    assert "fsm-typo.db" in err and "check the URL" in err
    assert not typo.exists()


def test_db_without_the_tables_is_an_error_and_gets_no_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    assert main(["diagram", JOB, "--db", f"sqlite:///{other}", "--id", "j1"]) == 2
    assert "fsm diagram: error: " in capsys.readouterr().err
    assert _tables(other) == {"notes"}  # nothing created


def test_db_with_another_table_prefix_needs_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    path = tmp_path / "app.db"
    url = f"sqlite:///{path}"
    _sqlite_store_with(url, "j1", prefix="app_")
    tables, digest = _tables(path), hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["diagram", JOB, "--db", url, "--id", "j1"]) == 2
    assert "--prefix" in capsys.readouterr().err
    assert main(["diagram", JOB, "--db", url, "--prefix", "app_", "--id", "j1"]) == 0
    assert parse_mermaid(capsys.readouterr().out).classes["current"] == {"running"}
    assert _tables(path) == tables  # no fsm_ tables created by the first, mistaken, call
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # the database was only read
    assert main(["diagram", JOB, "--prefix", "app_"]) == 2
    assert "--prefix goes with --db" in capsys.readouterr().err


def test_db_that_is_no_database_or_unreachable_is_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not a database\n" * 50)
    assert main(["diagram", JOB, "--db", f"sqlite:///{text}", "--id", "j1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fsm diagram: error: the store at {text} is corrupt or not a database")
    assert text.read_text() == "these are notes, not a database\n" * 50

    def unavailable(url: str, **options: Any) -> MemoryStore:
        raise StoreUnavailable("cannot open the store at 'postgresql+psycopg://db/x': connection refused")

    monkeypatch.setattr(stores, "open_store", unavailable)
    assert main(["diagram", JOB, "--db", "postgresql+psycopg://db/x", "--id", "j1"]) == 2
    assert "fsm diagram: error: cannot open the store" in capsys.readouterr().err


@needs_dot
def test_svg_of_an_entity_whose_id_holds_dashes_is_valid_xml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The provenance header is an XML comment, in which '--' is not allowed."""
    pytest.importorskip("stores.sql", reason="the SQL store (stores/sql.py) is not in this tree yet")
    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    _sqlite_store_with(url, "deploy--prod-")
    out = tmp_path / "checked"
    out.mkdir()
    svg = out / "dd.svg"
    assert main(["diagram", JOB, "--db", url, "--id", "deploy--prod-", "--out", str(svg)]) == 0
    ET.parse(svg)  # well-formed
    header = read_header(svg.read_bytes())
    assert header is not None and header.entity == "deploy--prod-"
    capsys.readouterr()
    assert main(["diagram", "--check", str(out)]) == 1
    assert "an export of stored entity 'deploy--prod-'" in capsys.readouterr().out


# -- MODULE:Class from the current directory ------------------------------------------------


def test_a_module_in_the_current_directory_is_found_as_with_python_m(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ``fsm`` console script has its own folder on sys.path, not the current one."""
    module = "fsm_diagram_cwd_flow"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            from statemachine import State
            from fsm import Lifecycle, worker

            class Flow(Lifecycle):
                queued = State(initial=True)

                class active(State.Compound):
                    running = State(initial=True)
                    finalizing = State()

                done = State(final=True)
                start = worker(queued.to(active))
                finish = worker(active.running.to(active.finalizing))
                succeed = worker(active.finalizing.to(done, cond="holds_lease"))
            """
        )
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["diagram", f"{module}:Flow"]) == 0
        assert set(parse_mermaid(capsys.readouterr().out).states) == {
            "queued",
            "active",
            "running",
            "finalizing",
            "done",
        }
    finally:
        sys.modules.pop(module, None)


def test_a_module_that_cannot_be_found_gets_a_hint_about_pythonpath(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "fsm_diagram_no_such_module:Flow"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'fsm_diagram_no_such_module'" in err and "PYTHONPATH" in err


# -- --check -------------------------------------------------------------------------------


def test_check_passes_on_the_committed_diagrams(diagrams: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "--check", str(diagrams)]) == 0
    out = capsys.readouterr().out
    assert "6 fresh, 0 stale, 0 broken" in out
    assert {p.name for p in diagrams.iterdir()} >= {
        f"{k}.{x}" for k in ("job", "pipeline") for x in ("mmd", "dot", "svg")
    }


def test_check_fails_naming_a_stale_mermaid_file_and_shows_the_diff(
    diagrams: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = diagrams / "job.mmd"
    stale.write_text(stale.read_text().replace("reclaims+1", "reclaims+2"))
    assert main(["diagram", "--check", str(diagrams)]) == 1
    out = capsys.readouterr().out
    assert f"stale  {stale}: differs from {JOB}" in out
    diff = [line for line in out.splitlines() if line.startswith(("-    ", "+    "))]
    assert [line[0] for line in diff] == ["-", "+"]
    assert "finalizing loop: reclaim" in diff[0] and diff[0].endswith("reclaims+2")
    assert diff[1].endswith("reclaims+1")
    assert f"fresh  {diagrams / 'pipeline.mmd'}" in out
    assert f"regenerate: fsm diagram {JOB} --format mermaid --out {stale}" in out


def test_check_fails_naming_an_image_rendered_from_other_dot_text(
    diagrams: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svg = diagrams / "pipeline.svg"
    data = svg.read_bytes()
    header = read_header(data)
    assert header is not None and header.dot_sha256 is not None
    svg.write_bytes(data.replace(header.dot_sha256.encode(), b"0" * 64))
    assert main(["diagram", "--check", str(diagrams)]) == 1
    out = capsys.readouterr().out
    assert f"stale  {svg}: rendered from DOT sha256 000000000000, {PIPELINE} gives" in out
    assert "5 fresh, 1 stale, 0 broken" in out


def test_check_fails_when_the_lifecycle_changed_after_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = "fsm_diagram_check_flow"
    source = textwrap.dedent(
        """
        from statemachine import State
        from fsm import Lifecycle, reaper, worker

        class Flow(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            failed = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))
            expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")
        """
    )
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    out = tmp_path / "out"
    write_dir(out, [f"{module}:Flow"], formats=("mermaid", "dot"))
    assert main(["diagram", "--check", str(out)]) == 0
    capsys.readouterr()

    # the lifecycle gains a branch; its exported diagrams are now stale
    (tmp_path / f"{module}.py").write_text(source + "    abort = worker(active.running.to(failed))\n")
    sys.modules.pop(module, None)
    importlib.invalidate_caches()
    assert main(["diagram", "--check", str(out)]) == 1
    report = capsys.readouterr().out
    assert f"stale  {out / 'flow.dot'}" in report and f"stale  {out / 'flow.mmd'}" in report
    assert "abort (worker)" in report
    sys.modules.pop(module, None)


def test_check_flags_files_it_cannot_trace_back_and_entity_exports(
    diagrams: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (diagrams / "notes.md").write_text("not a diagram: ignored\n")
    (diagrams / "hand-drawn.dot").write_text("digraph x { a -> b }\n")
    (diagrams / "ghost.mmd").write_text("stateDiagram-v2\n    %% fsm-diagram ref=gone.module:Ghost format=mermaid\n")
    store = MemoryStore(ManualClock())
    Engine(JobLifecycle, store).create("j1")
    (diagrams / "j1.mmd").write_bytes(render(extract(JobLifecycle, store=store, entity_id="j1"), "mermaid"))
    assert main(["diagram", "--check", str(diagrams)]) == 1
    out = capsys.readouterr().out
    assert f"error  {diagrams / 'hand-drawn.dot'}: no fsm-diagram header" in out
    assert f"error  {diagrams / 'ghost.mmd'}: cannot load lifecycle 'gone.module:Ghost'" in out
    assert f"error  {diagrams / 'j1.mmd'}: an export of stored entity 'j1'" in out
    assert "notes.md" not in out
    assert "6 fresh, 0 stale, 3 broken" in out


def test_check_of_a_missing_or_empty_directory_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "--check", str(tmp_path / "nope")]) == 2  # bad input, as the README says
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["diagram", "--check", str(tmp_path)]) == 1
    assert "holds no diagram file" in capsys.readouterr().err


def test_check_reads_the_exported_mermaid_blocks_of_a_markdown_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = (REPO_DIAGRAMS / "job.mmd").read_text()
    readme = tmp_path / "README.md"
    other = "```mermaid\nflowchart LR\n    a --> b\n```\n"  # no fsm-diagram header: not ours
    readme.write_text(f"# Job\n\n```mermaid\n{job}```\n\n{other}")
    assert main(["diagram", "--check", str(readme)]) == 0
    assert f"fresh  {readme}:4" in capsys.readouterr().out

    readme.write_text(f"# Job\n\n```mermaid\n{job.replace('(worker)', '(owner)', 1)}```\n")
    assert main(["diagram", "--check", str(REPO_DIAGRAMS), str(readme)]) == 1
    out = capsys.readouterr().out
    assert f"stale  {readme}:4: Mermaid block differs from {JOB} exported now" in out
    assert "6 fresh, 1 stale, 0 broken" in out

    readme.write_text("# nothing exported here\n" + other)
    assert main(["diagram", "--check", str(readme)]) == 1
    assert "holds no exported Mermaid block" in capsys.readouterr().err


def test_check_needs_no_graphviz(diagrams: Path, no_graphviz: None) -> None:
    assert main(["diagram", "--check", str(diagrams)]) == 0


# -- --write -------------------------------------------------------------------------------


def test_write_leaves_fresh_files_alone_without_running_graphviz(
    diagrams: Path, no_graphviz: None, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in diagrams.iterdir()}
    assert main(["diagram", "--write", str(diagrams)]) == 0
    assert capsys.readouterr().out.count("fresh  ") == 6
    assert {p.name: p.read_bytes() for p in diagrams.iterdir()} == before


@needs_dot
def test_write_exports_the_builtins_and_refreshes_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagram", "--write", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "job.dot",
        "job.mmd",
        "job.svg",
        "pipeline.dot",
        "pipeline.mmd",
        "pipeline.svg",
    ]
    (out / "job.mmd").write_text("stale\n")
    capsys.readouterr()
    assert main(["diagram", "--write", str(out)]) == 0
    assert capsys.readouterr().out.splitlines().count(f"wrote  {out / 'job.mmd'}") == 1
    assert main(["diagram", "--check", str(out)]) == 0


class Job(Lifecycle):
    """A user's lifecycle whose kind defaults to ``job``, like the built-in JobLifecycle."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))


class Sneaky(Job):
    kind = "../escaped"


class Nested(Job):
    kind = "sub/dir"


class Shouting(Job):
    kind = "JOB"  # job.mmd and JOB.mmd are one file on macOS and Windows


USER_JOB = f"{__name__}:Job"


def test_write_refuses_two_lifecycles_writing_the_same_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagram", "--write", str(out), JOB, USER_JOB]) == 2
    err = capsys.readouterr().err
    assert f"{JOB} and {USER_JOB} would both be written to {out / 'job.mmd'}" in err
    assert not out.exists()
    assert main(["diagram", "--write", str(out), JOB, f"{__name__}:Shouting"]) == 2
    assert "would both be written" in capsys.readouterr().err
    assert not out.exists()
    # the same lifecycle twice (under two names) is no clash
    written = write_dir(out, [JOB, "fsm:JobLifecycle"], formats=("mermaid", "dot"))
    assert [(w.path.name, w.status) for w in written] == [("job.mmd", "wrote"), ("job.dot", "wrote")]


def test_write_refuses_to_replace_another_lifecycles_export(diagrams: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: p.read_bytes() for p in diagrams.iterdir()}
    assert main(["diagram", "--write", str(diagrams), USER_JOB]) == 2
    err = capsys.readouterr().err
    assert f"{diagrams / 'job.mmd'} holds the export of {JOB}, not of {USER_JOB}" in err
    assert {p.name: p.read_bytes() for p in diagrams.iterdir()} == before
    with pytest.raises(WriteRefused):
        write_dir(diagrams, [USER_JOB], formats=("mermaid",))
    written = write_dir(diagrams, [USER_JOB], formats=("mermaid",), force=True)
    assert [(w.path.name, w.status) for w in written] == [("job.mmd", "wrote")]
    header = read_header((diagrams / "job.mmd").read_bytes())
    assert header is not None and header.ref == USER_JOB


@pytest.mark.parametrize("cls", ["Sneaky", "Nested"])
def test_write_refuses_a_kind_that_is_not_a_plain_file_name(
    cls: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    out.mkdir()
    assert main(["diagram", "--write", str(out), JOB, f"{__name__}:{cls}"]) == 2
    assert "which cannot name a file" in capsys.readouterr().err
    assert list(out.iterdir()) == [] and not (tmp_path / "escaped.mmd").exists()
    assert not (out / "sub").exists()


def test_write_without_graphviz_writes_the_text_and_names_every_image_it_skipped(
    tmp_path: Path, no_graphviz: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagram", "--write", str(out)]) == 2
    captured = capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["job.dot", "job.mmd", "pipeline.dot", "pipeline.mmd"]
    lines = captured.out.splitlines()
    assert f"skipped  {out / 'job.svg'}" in lines and f"skipped  {out / 'pipeline.svg'}" in lines
    assert f"wrote  {out / 'job.mmd'}" in lines
    assert f"not written (drawing them needs Graphviz): {out / 'pipeline.svg'}, {out / 'job.svg'}" in captured.err
    assert "apt-get install graphviz" in captured.err
    statuses = {w.path.name: w.status for w in write_dir(out, formats=("mermaid", "svg"))}
    assert statuses == {"job.mmd": "fresh", "pipeline.mmd": "fresh", "job.svg": "skipped", "pipeline.svg": "skipped"}


def test_check_ignores_crlf_line_endings(diagrams: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Windows checkout (core.autocrlf) has CRLF in the text files: not stale."""
    for path in [*diagrams.glob("*.mmd"), *diagrams.glob("*.dot")]:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    readme = diagrams.parent / "README.md"
    job = (diagrams / "job.mmd").read_bytes()
    readme.write_bytes(b"# Job\r\n\r\n```mermaid\r\n" + job + b"```\r\n")
    assert b"\r\n" in job and b"\n" not in job.replace(b"\r\n", b"")
    assert main(["diagram", "--check", str(diagrams), str(readme)]) == 0
    assert "7 fresh, 0 stale, 0 broken" in capsys.readouterr().out
    stale = diagrams / "job.dot"
    stale.write_bytes(stale.read_bytes().replace(b"reclaim", b"reclaimed"))
    assert main(["diagram", "--check", str(diagrams)]) == 1
    assert f"stale  {stale}" in capsys.readouterr().out


# -- Graphviz missing ----------------------------------------------------------------------


def test_missing_graphviz_gives_a_clear_error_saying_how_to_install_it(
    no_graphviz: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(GraphvizNotFound, match=r"apt-get install graphviz.*brew install graphviz"):
        render(extract(JobLifecycle), "svg")
    assert main(["diagram", JOB, "--format", "svg"]) == 2
    err = capsys.readouterr().err
    assert "Graphviz's `dot` program was not found" in err
    assert "apt-get install graphviz" in err and "brew install graphviz" in err
    # the text formats never need it
    assert main(["diagram", JOB, "--format", "dot"]) == 0


def test_graphviz_path_from_the_environment_must_exist(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FSM_GRAPHVIZ_DOT", "/nonexistent/dot")
    assert main(["diagram", JOB, "--format", "png"]) == 2
    assert "FSM_GRAPHVIZ_DOT='/nonexistent/dot' is not an executable" in capsys.readouterr().err


def test_a_format_contradicting_the_out_suffix_is_refused(tmp_path: Path) -> None:
    from fsm.cli import main

    assert main(["diagram", "fsm.lifecycles:JobLifecycle", "--format", "png", "--out", str(tmp_path / "x.svg")]) == 2
    assert not (tmp_path / "x.svg").exists()
