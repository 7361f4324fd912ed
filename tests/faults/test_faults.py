"""The fault suite with real processes (see :mod:`tests.faults.run`), on SQLite and on a
private PostgreSQL server that it stops and restarts; a fraction of the jobs park on the
way (``job.sleep``, ``job.wait_for`` a message the runner sends), across the kills too.

The short version runs in the default suite; ``FSM_FAULTS=long pytest tests/faults -s -n 0``
runs the long one (thousands of jobs), as does ``python -m tests.faults.run --long``.
``FSM_FAULTS=off`` skips it.  The printed summary is the point: figures are printed,
and the only time asserted is the death-to-claim bound with its documented allowance.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from .run import Config, run

MODE_ENV = "FSM_FAULTS"
SUMMARY_PROPERTY = "fault suite summary"


def _config(store: str) -> Config:
    mode = os.environ.get(MODE_ENV, "short")
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    if mode not in {"short", "long"}:
        pytest.fail(f"{MODE_ENV} must be short, long or off, not {mode!r}")
    return Config.long(store) if mode == "long" else Config.short(store)


def _private_server_or_skip() -> None:
    """The fault suite's PostgreSQL is its own server; without initdb/pg_ctl it skips,
    unless ``FSM_REQUIRE_POSTGRES=1`` (CI) makes that a failure."""
    from .postgres import PrivateServer, ServerUnavailable

    try:
        PrivateServer().destroy()
    except ServerUnavailable as err:
        reason = f"the fault suite's private PostgreSQL server cannot start: {err}"
        if os.environ.get("FSM_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason} (FSM_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_workers_and_reapers_survive_kills_pauses_and_a_server_restart(
    store: str, record_property: Callable[[str, object], None]
) -> None:
    config = _config(store)
    if store == "postgres":
        _private_server_or_skip()
    summary = run(config, out=sys.stdout if os.environ.get(MODE_ENV) == "long" else None)
    record_property(SUMMARY_PROPERTY, summary.text())  # printed at the end of the run, from any worker (conftest.py)
    assert not summary.problems, summary.text()
    assert sum(n for s, n in summary.states.items() if s in {"completed", "failed"}) == config.jobs
    assert summary.kills + summary.stops > 0, "the chaos loop did nothing"
    assert summary.parks > 0 and summary.replays == summary.parks, "no job parked, or one never resumed"
    assert summary.limited_holds > 0 and 0 < summary.most_held <= config.per_key, "the per-key limit went unchecked"
    if store == "postgres":
        assert summary.server_restart_s is not None
