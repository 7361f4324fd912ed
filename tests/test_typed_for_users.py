"""Typed for users: ``mypy --strict`` on the README's examples and on a user's lifecycle module.

A user runs plain ``mypy --strict`` on their own code (no pydantic plugin, the library
checked as an installed package: ``--follow-imports=silent``).  Every README Python block
is checked as a module of its own (the ``Deploy`` block as ``lifecycles.py``, which the
testing-kit block imports), and :data:`USER_MODULE` is what a user writes beyond them: a
lifecycle with self-transitions and a compound state's transitions, its policy, a reaper
config, typed handler functions around the engine, the async engine, the caller's
transaction and retention.  The test fails on any error mypy reports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests_support import guide_text

ROOT = Path(__file__).resolve().parents[1]

USER_MODULE = """
from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from fsm import (
    AsyncEngine,
    Engine,
    Fenced,
    GuardContext,
    Lease,
    LeaseChange,
    Lifecycle,
    Policy,
    PruneResult,
    ReaperConfig,
    Snapshot,
    State,
    guard,
    itself,
    operator_override,
    reaper,
    worker,
)
from stores import MemoryStore, SqlStore


class Build(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active), lease=LeaseChange.ACQUIRE)
    beat = worker(itself(active.running, cond="holds_lease"))
    promote = worker(active.running.to(active.finalizing, cond=["holds_lease", "green"]))
    finish = worker(active.finalizing.to(done, cond="holds_lease")) | worker(active.running.to(failed))
    abort = operator_override(active.to(failed))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")
    retry = reaper(itself(active.finalizing, cond="lease_stale"), lease=LeaseChange.ACQUIRE, counts_reclaim=True)

    policy = Policy(lease_ttl=timedelta(minutes=2), renewal_budget={"finalizing": timedelta(hours=1)})

    @guard
    def green(ctx: GuardContext) -> bool:
        "every test passed"
        return bool(ctx.data.get("green"))


REAPING = ReaperConfig(interval=timedelta(seconds=30))


def run_one(builds: Engine, build_id: str) -> Snapshot:
    started = builds.fire(build_id, "start")
    lease: Lease | None = started.lease
    if lease is None:
        raise RuntimeError("start takes the lease")
    lease = builds.renew_lease(lease)
    builds.fire(build_id, "promote", lease=lease, data={"green": True})
    result: dict[str, str] = builds.run(build_id, "deploy", lambda key: {"key": key}, lease)
    assert result["key"]
    try:
        return builds.fire(build_id, "finish", lease=lease).snapshot
    except Fenced:
        return builds.get(build_id)


def in_the_apps_transaction(store: SqlStore, builds: Engine, build_id: str) -> None:
    with Session(store.engine) as session, session.begin(), builds.within(session):
        builds.fire(build_id, "start")


def retention(builds: Engine) -> int:
    pruned: PruneResult = builds.prune(timedelta(days=30), dry_run=True)
    return len(pruned.removed)


async def async_one(builds: AsyncEngine) -> str:
    build = await builds.create(data={"green": False})
    done = await builds.fire(build.id, "start")
    return done.snapshot.state


def main() -> None:
    builds = Engine(Build, MemoryStore())
    print(run_one(builds, builds.create().id).state, retention(builds))
"""


def readme_modules() -> dict[str, str]:
    """Every Python block of the README and the site as a module: name -> source."""
    text = guide_text()
    named = {
        "# lifecycles.py": "lifecycles",
        "# builds.py": "builds",
        "import pytest": "test_deploy",
        'pytest_plugins = ["fsm.testing.pytest_plugin"]': "conftest",
    }
    found: dict[str, str] = {}
    for i, match in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
        source = match.group(1)
        first = source.splitlines()[0]
        name = next((n for k, n in named.items() if first.startswith(k)), f"readme_block_{i:02d}")
        if first == "import signals":  # the block's `websocket` is the application's own object
            source = "from typing import Any\n\nwebsocket: Any  # the application's\n" + source
        found[name] = source
    return found


def test_mypy_strict_is_clean_on_the_readme_examples_and_a_user_lifecycle_module(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    modules = {**readme_modules(), "user_lifecycles": USER_MODULE}
    assert {"lifecycles", "test_deploy", "conftest"} <= set(modules)
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",  # the library as an installed package: its own errors are not the user's
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            *sorted(f"{name}.py" for name in modules),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().startswith(f"Success: no issues found in {len(modules)} source files"), done.stdout
