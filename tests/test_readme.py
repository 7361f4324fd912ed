"""Every Python block of the README runs as written, or is named here with why it cannot.

The runnable examples run twice (a second run must work too, on the files the first left).
A block that needs what only the reader has (a PostgreSQL host, the application's own
table) is listed in :data:`CANNOT_RUN` with the reason; a block that is neither run nor
listed fails :func:`test_every_python_block_is_run_or_named_why_not`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    """(the block's first line, its text) of every ```python block, in order."""
    text = README.read_text()
    return [(m.group(1).splitlines()[0], m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def python_block_after(marker: str) -> str:
    text = README.read_text()
    start = text.index(marker)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block after {marker!r}"
    return match.group(1)


def block_starting(first: str) -> str:
    [found] = [text for line, text in python_blocks() if line.startswith(first)]
    return found


RUNS = {
    "from fsm import Engine, Fenced, JobLifecycle": "test_the_readme_example_runs_as_written_and_again",
    "import time": "test_the_readme_example_runs_as_written_and_again",
    "import asyncio": "test_the_async_example_runs",
    "# lifecycles.py": "test_the_testing_kit_blocks_run_under_pytest (the lifecycles module); "
    "tests/test_work/test_recovery_processes.py (its workers SIGKILLed)",
    'pytest_plugins = ["fsm.testing.pytest_plugin"]': "test_the_testing_kit_blocks_run_under_pytest (conftest.py)",
    "import pytest": "test_the_testing_kit_blocks_run_under_pytest (the test module)",
    "import signals": "test_the_signals_block_forwards_a_transition",
    "from datetime import timedelta": "test_the_reaper_block_runs",
    "import threading": "test_the_readme_watch_example_runs_as_written (tests/test_engine/test_watch.py)",
    "import urllib.request": "test_the_readme_observability_example_runs_as_written (tests/test_observe)",
}
CANNOT_RUN = {
    "from fsm import Engine, JobLifecycle": "connects to a placeholder PostgreSQL host (app@db-host)",
    "from fsm import Engine, PipelineLifecycle": "binds the reader's own pipeline_queue table on a placeholder host",
}


def run_script(path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python path`` in ``cwd``, or ``python *args`` when args are given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), *sys.path])}
    return subprocess.run(
        [sys.executable, *args] if args else [sys.executable, str(path)],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_every_python_block_is_run_or_named_why_not() -> None:
    for first, _ in python_blocks():
        runs = [key for key in RUNS if first.startswith(key)]
        cannot = [key for key in CANNOT_RUN if first == key]
        assert runs or cannot, f"README block {first!r} is neither run by a test nor named in CANNOT_RUN"


@pytest.mark.parametrize("marker", ["## Using the engine", "A complete finalizer app"])
def test_the_readme_example_runs_as_written_and_again(marker: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_block_after(marker))
    for run in (1, 2):
        done = run_script(script, tmp_path)
        assert done.returncode == 0, done.stderr
        last = done.stdout.splitlines()[-1]
        if marker == "## Using the engine":
            assert last == "completed"
            continue
        # the counts: every job of every run completed
        assert f"'completed': {3 * run}, 'failed': 0" in last and "'queued': 0" in last


def test_the_async_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block_starting("import asyncio"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "completed ['start', 'exited', 'complete']"


def test_the_testing_kit_blocks_run_under_pytest(tmp_path: Path) -> None:
    (tmp_path / "lifecycles.py").write_text(block_starting("# lifecycles.py"))
    (tmp_path / "conftest.py").write_text(block_starting("pytest_plugins"))
    (tmp_path / "test_deploy.py").write_text(block_starting("import pytest"))
    done = run_script(tmp_path / "test_deploy.py", tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    assert passed >= 4 and "failed" not in summary, summary  # every path, and the stateful test


def test_the_signals_block_forwards_a_transition(tmp_path: Path) -> None:
    """The block's ``websocket`` is the application's; a stand-in records what it is given."""
    prelude = (
        "class _Socket:\n    sent = []\n\n"
        "    def broadcast(self, *args):\n        self.sent.append(args)\n\n\n"
        "websocket = _Socket()\n"
    )
    fire = (
        "\nfrom fsm import Engine, PipelineLifecycle\nfrom stores import MemoryStore\n\n"
        "pipelines = Engine(PipelineLifecycle, MemoryStore())\n"
        "pipelines.fire(pipelines.create().id, 'start')\n"
        "[(topic, body)] = websocket.sent\n"
        "print(topic, 'running' in body)\n"
    )
    script = tmp_path / "example.py"
    script.write_text(prelude + block_starting("import signals") + fire)
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "pipeline.updated True"


def test_the_reaper_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block_starting("from datetime import timedelta"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("moved ")
