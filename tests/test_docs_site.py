"""The documentation site builds offline and clean, and its examples run.

The site (``docs/``) is built into a temporary folder, strictly, as CI builds it; the test
then reads every built file for what must not be there: a CDN (the site works offline),
the project's internal references (seed documents, issue numbers, design sections) and a
Sphinx role left raw by the API reference.  Every ```python block of ``docs/pages/`` (the
tutorial aside: its own tests run it) runs here as a script, or is named in
:data:`CANNOT_RUN` with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "pages"
SKIPPED_PAGES = {"tutorial.md"}  # its own tests run its blocks (docs/examples/)

CANNOT_RUN = {
    (
        "how-to/storage.md",
        "from fsm import Engine, JobLifecycle",
    ): "connects to a placeholder PostgreSQL host (app@db-host)",
    ("how-to/existing-table.md", "from fsm import Engine, PipelineLifecycle"): (
        "binds the reader's own pipeline_queue table on a placeholder PostgreSQL host"
    ),
    ("how-to/change-a-lifecycle.md", "from fsm import check_store"): (
        "checks the reader's own lifecycle module against a copy of their production rows"
    ),
}
TOGETHER = {"how-to/testing.md"}
"""Pages whose blocks are one project (a module, its conftest and its tests), run together
under pytest by tests/test_readme.py's ``test_the_testing_kit_blocks_run_under_pytest``
(once: a nested pytest run with hypothesis is the suite's slowest test)."""

QUICK_KIT_PLUGIN = """
import pytest
from hypothesis import settings


@pytest.hookimpl(trylast=True)  # after fsm.testing.pytest_plugin loaded the ci profile
def pytest_configure(config):
    settings.register_profile("docs-quick", settings.get_profile("ci"), max_examples=10)
    settings.load_profile("docs-quick")
"""

SIGNALS_PRELUDE = """
class _Socket:
    sent = []

    def broadcast(self, *args):
        self.sent.append(args)


websocket = _Socket()
"""
SIGNALS_FIRE = """
from fsm import Engine, PipelineLifecycle
from stores import MemoryStore

pipelines = Engine(PipelineLifecycle, MemoryStore())
pipelines.fire(pipelines.create().id, "start")
[(topic, body)] = websocket.sent
print(topic, "running" in body)
"""
PRELUDE = {"how-to/signals.md": SIGNALS_PRELUDE}
"""What a block takes from the reader's application (a stand-in), put before it."""
EPILOGUE = {"how-to/signals.md": SIGNALS_FIRE}
"""What shows a block did its work, put after it."""


def blocks() -> list[tuple[str, str, str]]:
    """(page, first line, text) of every ```python block of the pages."""
    found = []
    for path in sorted(PAGES.rglob("*.md")):
        page = path.relative_to(PAGES).as_posix()
        if page in SKIPPED_PAGES:
            continue
        for m in re.finditer(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            found.append((page, m.group(1).splitlines()[0], m.group(1)))
    return found


def runnable() -> list[tuple[str, str, str]]:
    return [b for b in blocks() if (b[0], b[1]) not in CANNOT_RUN and b[0] not in TOGETHER]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), *sys.path])}
    return subprocess.run(
        [sys.executable, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_every_python_block_is_run_or_named_why_not() -> None:
    found = blocks()
    assert found, "no python block found under docs/pages"
    keys = {(page, first) for page, first, _ in found}
    for page, first in CANNOT_RUN:
        assert (page, first) in keys, f"CANNOT_RUN names a block that is gone: {page}: {first!r}"
    for page in TOGETHER:
        assert any(p == page for p, _, _ in found), f"TOGETHER names a page without blocks: {page}"


@pytest.mark.parametrize(("page", "first", "text"), runnable(), ids=lambda v: v if "\n" not in v else "")
def test_the_block_runs(page: str, first: str, text: str, tmp_path: Path) -> None:
    name = re.match(r"# (\w+\.py)$", first)
    script = tmp_path / (name.group(1) if name else "example.py")
    script.write_text(PRELUDE.get(page, "") + text + EPILOGUE.get(page, ""))
    done = run([str(script)], tmp_path)
    assert done.returncode == 0, f"{page}: {first!r}\n{done.stderr}"
    if page == "how-to/signals.md":
        assert done.stdout.splitlines()[-1] == "pipeline.updated True"
    for line in re.findall(r"^print\(.*#\s*(\w+)$", text, re.M):  # a print ending in "# completed"
        assert line in done.stdout, f"{page}: {first!r} printed {done.stdout!r}, not {line!r}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mkdocs = shutil.which("mkdocs")
    if mkdocs is None:
        if os.environ.get("FSM_REQUIRE_DOCS"):
            pytest.fail("FSM_REQUIRE_DOCS is set but mkdocs is not installed (pip install '.[test]')")
        pytest.skip("mkdocs is not installed (pip install '.[test]' or '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [mkdocs, "build", "--strict", "-f", str(ROOT / "docs" / "mkdocs.yml"), "-d", str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def built_text(site: Path) -> dict[str, str]:
    return {
        path.relative_to(site).as_posix(): path.read_text(encoding="utf-8", errors="replace")
        for path in site.rglob("*")
        if path.is_file() and path.suffix in {".html", ".js", ".map", ".css", ".json", ".xml", ".svg", ".txt"}
    }


def test_the_site_needs_no_cdn(site: Path) -> None:
    for name, text in built_text(site).items():
        for cdn in ("unpkg", "jsdelivr", "cdnjs", "fonts.googleapis", "fonts.gstatic"):
            assert cdn not in text, f"{name} names {cdn}"


def page_text(html: str) -> str:
    """What a reader sees of a page: no tags, no scripts."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", "", html)


def test_no_internal_references_or_raw_roles(site: Path) -> None:
    pages = {name: page_text(text) for name, text in built_text(site).items() if name.endswith(".html")}
    assert "reference/work/index.html" in pages
    for name, text in pages.items():
        for pattern in (r"seeds/0", r"\bissues? #?\d+", r"DESIGN section", r":(meth|class|func):`?"):
            found = re.search(pattern, text, re.I if pattern != r":(meth|class|func):`?" else 0)
            assert found is None, f"{name}: {text[max(found.start() - 60, 0) : found.end() + 60]!r}"


def test_the_reference_links_its_cross_references(site: Path) -> None:
    html = (site / "reference" / "work" / "index.html").read_text(encoding="utf-8")
    assert 'href="#fsm.work.Job.sleep"' in html  # a :meth:`sleep` of Job.wait_for's docstring, as a link


def test_the_cli_reference_shows_every_commands_own_help(site: Path) -> None:
    import argparse

    from fsm.cli import build_parser

    (commands,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = page_text((site / "reference" / "cli" / "index.html").read_text(encoding="utf-8"))
    assert "fsm-help:" not in text
    for name in commands.choices:
        assert f"usage: fsm {name} [-h]" in text, f"the CLI reference lacks fsm {name} --help"
