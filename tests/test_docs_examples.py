"""The runnable examples in docs/examples/ and the tutorial that builds one of them.

Each example runs as a user runs it: a subprocess in an empty folder (its SQLite file lands
there), the repository on ``PYTHONPATH``. Their printed output must show the behaviour
they are about. The tutorial's python blocks must be the example file, stage by stage and
whole. ``FSM_TEST_DIST=1`` also follows the tutorial in a fresh venv with the package
installed from the repository (not editable), as tests/test_distribution.py does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
TUTORIAL = ROOT / "docs" / "pages" / "tutorial.md"


def _run(script: str, cwd: Path, python: str = sys.executable, env: dict[str, str] | None = None) -> str:
    if env is None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [python, str(EXAMPLES / script)], cwd=cwd, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _assert_pipeline_story(out: str) -> None:
    assert "pipeline p-102: failed (last event expire, reason expired)" in out, out
    assert "[dashboard] pipeline p-102: running -> failed (expire by reaper, reason expired)" in out, out
    assert "pipeline p-101: completed (last event succeed" in out, out
    assert "deploy-p-101: completed at attempt 3" in out, out
    assert out.count("(retry by worker)") == 2, out
    assert "releases table: [('p-101', '4f2a9c1')]" in out, out
    assert "fsm inspect --db sqlite:///pipelines.db" in out, out


def test_pipeline_service_expires_the_zombie_and_retries_the_deploy(tmp_path: Path) -> None:
    _assert_pipeline_story(_run("pipeline_service.py", tmp_path))
    assert (tmp_path / "pipelines.db").exists()


def test_worker_retries_completes_at_the_third_attempt(tmp_path: Path) -> None:
    out = _run("worker_retries.py", tmp_path)
    assert out.count("retry: running -> queued: TimeoutError") == 2, out
    assert out.splitlines()[-1] == "job-1 completed at attempt 3", out


def test_scheduled_job_creates_a_run_per_second(tmp_path: Path) -> None:
    out = _run("scheduled_job.py", tmp_path)
    found = re.search(r"^(\d+) runs created by the schedule$", out, re.M)
    assert found is not None, out
    runs = int(found.group(1))
    assert runs >= 2, out
    assert len(re.findall(r"^heartbeat@\S+: completed$", out, re.M)) >= 2, out


def test_parent_children_gets_every_childs_result(tmp_path: Path) -> None:
    out = _run("parent_children.py", tmp_path)
    for part in ("lint", "test", "docs"):
        assert f"parent build-7 got build-7/{part}: completed, exit code 0" in out, out
    assert out.splitlines()[-1] == "build-7 completed with 3 children", out


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_the_tutorial_shows_the_example_file_stage_by_stage_and_whole() -> None:
    source = (EXAMPLES / "pipeline_service.py").read_text()
    blocks = _python_blocks(TUTORIAL.read_text())
    assert len(blocks) >= 3
    *stages, whole = blocks
    assert whole == source, "the tutorial's last python block is not docs/examples/pipeline_service.py"
    assert _lines("\n".join(stages)) == _lines(source), "the tutorial's steps, put together, are not the file"


def test_the_tutorial_names_no_internal_documents() -> None:
    text = TUTORIAL.read_text()
    for internal in ("seeds/", "DESIGN", "seed 0", "issue #"):
        assert internal not in text, internal
    assert "python3.11 -m venv .venv && . .venv/bin/activate" in text
    assert "pip install fsm-lifecycles" in text
    assert "python pipeline_service.py" in text


@pytest.mark.skipif(os.environ.get("FSM_TEST_DIST") != "1", reason="slow: FSM_TEST_DIST=1 runs it (CI does)")
def test_the_tutorial_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    project = tmp_path / "pipeline-service"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    venv = project / ".venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    python = venv / "bin" / "python"
    given = os.environ.get("FSM_DIST_DIR")
    wheels = sorted(Path(given).glob("fsm_lifecycles-*.whl")) if given else []
    target = str(wheels[-1]) if wheels else str(ROOT)  # the built wheel, or the checkout (not editable)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", target],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    (project / "pipeline_service.py").write_text(_python_blocks(TUTORIAL.read_text())[-1])
    done = subprocess.run(
        [str(python), "pipeline_service.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _assert_pipeline_story(done.stdout)
    where = subprocess.run(
        [str(python), "-c", "import fsm; print(fsm.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout
