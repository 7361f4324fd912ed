"""The distribution: the built wheel installs in a fresh venv and runs (on demand and in CI).

``FSM_TEST_DIST=1`` runs it (``.ci/run`` sets it, after building the sdist and wheel into
``FSM_DIST_DIR`` and running ``twine check`` on them); without ``FSM_DIST_DIR`` the test
builds the wheel itself with ``python -m build``.  Slow (a fresh venv and the runtime
dependencies from the package index), so the default suite skips it.

The metadata checks (version single-sourced, every extra, py.typed) run in the default
suite: they read pyproject.toml and need no build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import fsm
from fsm._version import __version__

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {"postgres", "asyncio", "inspect", "test", "dev", "docs"}


def test_the_version_has_one_source_and_every_extra_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fsm._version.__version__"}
    assert fsm.__version__ == __version__
    assert set(project["project"]["optional-dependencies"]) >= EXTRAS
    assert project["project"]["license"] == "MIT" and project["project"]["classifiers"]
    assert project["project"]["license-files"] == ["LICENSE"] and "MIT License" in (ROOT / "LICENSE").read_text()
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()  # the changelog names this version


def test_fsm_version_prints_the_one_version(capsys: pytest.CaptureFixture[str]) -> None:
    from fsm.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"fsm {__version__}"


def _engine_example() -> str:
    import re

    text = (ROOT / "README.md").read_text()
    start = text.index("## A service in one file")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None
    return match.group(1)


def _wheel(tmp_path: Path) -> Path:
    given = os.environ.get("FSM_DIST_DIR")
    if given:
        wheels = sorted(Path(given).glob(f"fsm_lifecycles-{__version__}-*.whl"))
        assert wheels, f"no wheel of version {__version__} in FSM_DIST_DIR={given}"
        return wheels[-1]
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return next(out.glob("*.whl"))


@pytest.mark.skipif(os.environ.get("FSM_TEST_DIST") != "1", reason="slow: FSM_TEST_DIST=1 runs it (CI does)")
def test_the_built_wheel_installs_in_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for typed in ("fsm/py.typed", "stores/py.typed", "signals/py.typed"):
        assert typed in names, f"{typed} missing from the wheel"
    assert not [n for n in names if n.startswith("tests/")], "the tests are not part of the wheel"
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], "the MIT license text ships in the wheel"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, fsm_cli = venv / "bin" / "python", venv / "bin" / "fsm"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    run = tmp_path / "run"
    run.mkdir()

    def call(*argv: str) -> str:
        done = subprocess.run(argv, cwd=run, capture_output=True, text=True, timeout=300, env=env, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert call(str(fsm_cli), "--version") == f"fsm {__version__}"
    where = call(str(python), "-c", "import fsm, stores, signals; print(fsm.__file__)")
    assert where.startswith(str(venv)), f"fsm imported from {where}, not from the installed wheel"
    (run / "example.py").write_text(_engine_example())
    assert call(str(python), "example.py").splitlines()[-1] == "3"  # the README's service: 3 builds completed
    extras = call(
        str(python),
        "-c",
        "import importlib.metadata as m; print(m.metadata('fsm-lifecycles').get_all('Provides-Extra'))",
    )
    assert all(extra in extras for extra in EXTRAS), extras
