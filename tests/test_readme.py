"""The README's runnable examples run as written (twice: a second run must work too)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block_after(marker: str) -> str:
    text = README.read_text()
    start = text.index(marker)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block after {marker!r}"
    return match.group(1)


@pytest.mark.parametrize("marker", ["## Using the engine", "A complete finalizer app"])
def test_the_readme_example_runs_as_written_and_again(marker: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_block_after(marker))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(script)],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        last = done.stdout.splitlines()[-1]
        if marker == "## Using the engine":
            assert last == "completed"
            continue
        # the counts: every job of every run completed
        assert f"'completed': {3 * run}, 'failed': 0" in last and "'queued': 0" in last
