"""SQLite's blind writes number the new version and the history row from what the guard
proved (``expect_version``); a ``before`` that is not at ``expect_version`` is not used."""

from __future__ import annotations

import tempfile

from fsm.records import NewEntity, TransitionWrite
from stores.sql import SqlStore


def test_blind_write_numbers_history_from_expect_version() -> None:
    store = SqlStore(f"sqlite:///{tempfile.mkdtemp(prefix='fsm-rev-')}/fsm.db")
    s0 = store.create(NewEntity(id="e1", kind="k", state="a"))
    s1, _ = store.apply(TransitionWrite("e1", "go", "a", "b", "worker", 0, before=s0))
    # a caller handing the older snapshot it judged, with the current expect_version
    s2, rec = store.apply(TransitionWrite("e1", "go", "b", "c", "worker", 1, before=s0))
    row = store.get("e1")
    assert [h.seq for h in store.history("e1")] == list(range(1, row.version + 1))
    assert s2.version == row.version == rec.seq == 2
