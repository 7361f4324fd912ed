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
from tests_support import guide_block_after, guide_text

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    """(the block's first line, its text) of every ```python block, in order."""
    text = README.read_text()
    return [(m.group(1).splitlines()[0], m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def python_block_after(marker: str) -> str:
    return guide_block_after(marker)


def block_starting(first: str) -> str:
    """The one block of the README or the site whose first line starts with ``first``."""
    blocks = re.findall(r"```python\n(.*?)```", guide_text(), re.S)
    [found] = {text for text in blocks if text.splitlines()[0].startswith(first)}
    return found


RUNS = {
    "# service.py": "test_the_service_block_runs",
    "# zombie.py": "test_the_zombie_block_runs",
    "from fsm import Engine, Fenced, JobLifecycle": "test_the_readme_example_runs_as_written_and_again",
    "import functools": "test_the_readme_example_runs_as_written_and_again",
    "import asyncio": "test_the_async_example_runs",
    "# lifecycles.py": "test_the_testing_kit_blocks_run_under_pytest (the lifecycles module); "
    "tests/test_work/test_recovery_processes.py (its workers SIGKILLed)",
    'pytest_plugins = ["fsm.testing.pytest_plugin"]': "test_the_testing_kit_blocks_run_under_pytest (conftest.py)",
    "import pytest": "test_the_testing_kit_blocks_run_under_pytest (the test module)",
    "import signals": "test_the_signals_block_forwards_a_transition",
    "from datetime import timedelta": "test_the_reaper_block_runs",
    "import sqlalchemy as sa": "test_the_webhook_recipe_commits_both_rows_or_neither",
    "import threading": "test_the_readme_watch_example_runs_as_written (tests/test_engine/test_watch.py)",
    "import urllib.request": "test_the_readme_observability_example_runs_as_written (tests/test_observe)",
    "# approvals.py": "test_the_timer_block_runs",
    "# approvals_service.py": "test_the_durable_wait_block_runs",
    "# schedules.py": "test_the_schedules_block_runs",
    "# later.py": "test_the_delayed_fire_block_runs",
    "# unique.py": "test_the_unique_block_runs",
    "# limits.py": "test_the_limits_block_runs",
    "# queues.py": "test_the_queues_block_runs",
    "# children.py": "test_the_children_block_runs",
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


@pytest.mark.parametrize("marker", ["# Use the engine", "A complete finalizer app"])
def test_the_readme_example_runs_as_written_and_again(marker: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_block_after(marker))
    for run in (1, 2):
        done = run_script(script, tmp_path)
        assert done.returncode == 0, done.stderr
        last = done.stdout.splitlines()[-1]
        if marker == "# Use the engine":
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


QUICK_KIT_EXAMPLES = 25
"""The stateful block's examples in the default suite (of the ``ci`` profile's 100: the
block alone was the suite's largest CPU cost); ``FSM_HYPOTHESIS_PROFILE=soak`` runs it with
the ``ci`` profile exactly as a reader gets it."""

QUICK_KIT_PLUGIN = f"""
import pytest
from hypothesis import settings


@pytest.hookimpl(trylast=True)  # after fsm.testing.pytest_plugin loaded the ci profile
def pytest_configure(config):
    settings.register_profile("readme-quick", settings.get_profile("ci"), max_examples={QUICK_KIT_EXAMPLES})
    settings.load_profile("readme-quick")
"""


def test_the_testing_kit_blocks_run_under_pytest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsm.testing.pytest_plugin import PROFILE_ENV, profile

    (tmp_path / "lifecycles.py").write_text(block_starting("# lifecycles.py"))
    (tmp_path / "conftest.py").write_text(block_starting("pytest_plugins"))
    (tmp_path / "test_deploy.py").write_text(block_starting("import pytest"))
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if profile() == "soak":
        monkeypatch.delenv(PROFILE_ENV)  # the blocks as written: the ci profile, hypothesis's own example count
    else:
        (tmp_path / "readme_quick.py").write_text(QUICK_KIT_PLUGIN)
        args += ["-p", "readme_quick"]
    done = run_script(tmp_path / "test_deploy.py", tmp_path, *args)
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


def test_the_webhook_recipe_commits_both_rows_or_neither(tmp_path: Path) -> None:
    """Seed 000's webhook served by uvicorn: the app's row and the pipeline's success commit
    together; a refused transition leaves no row of the app's either."""
    import json
    import socket
    import sqlite3
    import time
    import urllib.error
    import urllib.request

    (tmp_path / "app.py").write_text(block_starting("import sqlalchemy as sa"))
    setup = (
        "from fsm import Engine, PipelineLifecycle\nfrom stores import SqlStore\n"
        "pipelines = Engine(PipelineLifecycle, SqlStore('sqlite:///app.db'))\n"
        "pipelines.create('p-1'); pipelines.fire('p-1', 'start'); pipelines.create('p-queued')\n"
    )
    (tmp_path / "setup.py").write_text(setup)
    assert run_script(tmp_path / "setup.py", tmp_path).returncode == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def post(pipeline_id: str) -> tuple[int, object]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/webhooks/pipelines/{pipeline_id}/succeeded",
            data=json.dumps({"sha": "abc123"}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, None

    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                time.sleep(0.05)
        assert post("p-1") == (200, {"state": "completed"})
        assert post("p-1") == (200, {"state": "completed"})  # redelivered: done already, nothing written twice
        assert post("p-queued")[0] == 500  # `finish` is refused from queued: the app's insert rolls back too
    finally:
        server.terminate()
        server.wait(10)
    db = sqlite3.connect(tmp_path / "app.db")
    assert db.execute("SELECT pipeline_id, sha FROM deploys").fetchall() == [("p-1", "abc123")]
    states = dict(db.execute("SELECT id, state FROM fsm_entities").fetchall())
    assert states == {"p-1": "completed", "p-queued": "queued"}
    events = [r[0] for r in db.execute("SELECT event FROM fsm_history WHERE entity_id = 'p-1' ORDER BY seq")]
    assert events == ["start", "finish", "succeed"]
    db.close()


def test_the_timer_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "approvals.py"
    script.write_text(block_starting("# approvals.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    summary, history = done.stdout.splitlines()[-2:]
    assert summary.startswith("moved approval.timeout=1")
    assert history == "[('timeout', 'timed out')]"


def test_the_durable_wait_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "approvals_service.py"
    script.write_text(block_starting("# approvals_service.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "asked for an approval deploy-42:request"
    assert lines[-2:] == ["approved by alice", "completed"]


def test_the_schedules_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "schedules.py"
    script.write_text(block_starting("# schedules.py"))
    for run in (1, 2):  # adding the same schedules again changes nothing
        done = run_script(script, tmp_path)
        assert done.returncode == 0, (run, done.stderr)
        assert done.stdout.splitlines()[-1] == "['heartbeat', 'nightly-report']"


def test_the_delayed_fire_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "later.py"
    script.write_text(block_starting("# later.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    summary, states = done.stdout.splitlines()[-2:]
    assert "delayed job.dropped=1, job.fired=1" in summary
    assert states.startswith("fired / TransitionNotAllowed:")


def test_the_unique_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "unique.py"
    script.write_text(block_starting("# unique.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: active run-1", "run-1", "run-4"]


def test_the_limits_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "limits.py"
    script.write_text(block_starting("# limits.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['hotfix', 'acme-0', 'acme-1', 'other-0']", "[]"]


def test_the_queues_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "queues.py"
    script.write_text(block_starting("# queues.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["completed completed"]


def test_the_children_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "children.py"
    script.write_text(block_starting("# children.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[('build-7/lint', 'completed', 12), ('build-7/test', 'completed', 12), ('build-7/docs', 'completed', 12)]",
        "completed",
    ]


def test_the_install_section_names_every_extra() -> None:
    import tomllib

    project = tomllib.loads((README.parent / "pyproject.toml").read_text())
    text = README.read_text()
    install = text[text.index("## Install") : text.index("\n## ", text.index("## Install") + 1)]
    missing = [e for e in project["project"]["optional-dependencies"] if f"`{e}`" not in install.split("Extras:")[1]]
    assert not missing, f"extras the Install section does not explain: {missing}"


def test_the_readme_is_short_and_starts_with_a_worker() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    first = python_blocks()[0][1]
    assert "Worker(" in first and text.index("```python") < len("\n".join(text.splitlines()[:100]))


def test_the_service_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "service.py"
    script.write_text(block_starting("# service.py"))
    for _ in (1, 2):  # a second run works too, on the store the first left
        done = run_script(script, tmp_path)
        assert done.returncode == 0, done.stderr
        out = done.stdout  # the handlers' threads print at once: counted in the whole text
        assert out.count("notified once:") == 3 and out.count("complete -> completed") == 3  # three new builds
        assert out.splitlines()[-1] == "3"


def test_the_zombie_block_runs(tmp_path: Path) -> None:
    script = tmp_path / "zombie.py"
    script.write_text(block_starting("# zombie.py"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["failed expired"]


def test_the_readme_names_no_internal_documents() -> None:
    text = README.read_text()
    assert not re.search(r"seeds/0|\bissue \d|DESIGN section", text, re.I), "the README names an internal document"
