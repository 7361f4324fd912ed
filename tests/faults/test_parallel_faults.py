"""The parallel-region fault scenario (see :mod:`tests.faults.parallel`) with real worker and
reaper processes, on SQLite and on a private PostgreSQL server: a worker per region, holders
SIGKILLed and SIGSTOPped (a ``run`` holder and a ``finalizing`` holder each killed on
purpose), the reaper ending regions and racing the join.

``FSM_FAULTS=long`` runs 400 pipelines per store; ``FSM_FAULTS=off`` skips it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from .parallel import run
from .test_faults import MODE_ENV, SUMMARY_PROPERTY, _private_server_or_skip


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_regions_survive_kills_and_pauses_and_join_exactly_once(
    store: str, record_property: Callable[[str, object], None]
) -> None:
    mode = os.environ.get(MODE_ENV, "short")
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    if store == "postgres":
        _private_server_or_skip()
    summary = run(store, pipelines=400 if mode == "long" else 40, seed=11, timeout=600 if mode == "long" else 150)
    if mode == "long":
        print(summary.text(), file=sys.stdout)
    record_property(SUMMARY_PROPERTY, summary.text())
    assert not summary.problems, summary.text()
    assert summary.planned >= 2, "the planned deaths found no holder to kill (a run holder, then a finalizer)"
    assert summary.reaped_regions > 0, "no region was ended by the reaper: the join never raced it"
    assert summary.reclaimed_finalizers > 0 and summary.replays > 0, "no finalizer was reclaimed and resumed"
    assert summary.checked_moves > 0, "no reaper move was checked against its holder's death"
