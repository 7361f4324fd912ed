"""A pytest plugin for lifecycle tests; enable it in one line of your ``conftest.py``::

    pytest_plugins = ["fsm.testing.pytest_plugin"]

It gives

- hypothesis profiles ``ci`` (the default: hypothesis's own example count, no deadline) and
  ``soak`` (many more, longer runs), chosen with ``FSM_HYPOTHESIS_PROFILE=soak``;
  :func:`examples` scales a test's own example count by the profile;
- fixtures: ``fsm_clock`` (a ManualClock), ``fsm_coverage`` (a session-wide
  :class:`~fsm.testing.TransitionCoverage` recording every ``transitioned`` signal);
- ``--fsm-coverage MODULE:Class`` (repeatable): print which transitions of those
  lifecycles the session fired and which it never did, at the end of the run.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from fsm.clock import ManualClock
from fsm.testing.coverage import TransitionCoverage

PROFILE_ENV = "FSM_HYPOTHESIS_PROFILE"
SCALE = {"ci": 1, "soak": 25}
_session_coverage: list[TransitionCoverage] = []


def profile() -> str:
    """The active profile's name (``ci`` unless ``FSM_HYPOTHESIS_PROFILE`` says otherwise)."""
    return os.environ.get(PROFILE_ENV, "ci")


def examples(ci: int) -> int:
    """``ci`` examples under the ``ci`` profile, many more under ``soak``."""
    return ci * SCALE.get(profile(), 1)


def register_profiles() -> None:
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=quiet)
    settings.register_profile(
        "soak", max_examples=1000, stateful_step_count=80, deadline=None, suppress_health_check=quiet
    )
    settings.load_profile(profile())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fsm-coverage",
        action="append",
        default=[],
        metavar="MODULE:Class",
        help="report which transitions of this lifecycle the session fired (repeatable)",
    )


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def pytest_configure(config: pytest.Config) -> None:
    register_profiles()
    refs = config.getoption("--fsm-coverage")
    if refs:
        coverage = TransitionCoverage(*(_load(r) for r in refs))
        context = coverage.recording()
        context.__enter__()

        def stop() -> None:
            context.__exit__(None, None, None)

        config.add_cleanup(stop)
        _session_coverage[:] = [coverage]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for coverage in _session_coverage:
        terminalreporter.section("fsm transition coverage")
        terminalreporter.write_line(coverage.format())


@pytest.fixture
def fsm_clock() -> ManualClock:
    """A manual clock: pass it to a store and an engine, advance it in the test."""
    return ManualClock()


@pytest.fixture
def fsm_coverage() -> Iterator[TransitionCoverage]:
    """A coverage recorder over the built-ins plus whatever you ``add``; records inside the test."""
    from fsm.lifecycles import JobLifecycle, PipelineLifecycle

    coverage = TransitionCoverage(JobLifecycle, PipelineLifecycle)
    with coverage.recording():
        yield coverage


__all__ = ["PROFILE_ENV", "examples", "profile", "register_profiles"]
