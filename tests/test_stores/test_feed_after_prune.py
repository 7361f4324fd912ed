"""Store contract: a feed position is never given twice, even after a prune or a trim
removed the newest history rows (SQLite's rowid would be reused: migration 0005)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces
from test_feed_contract import settled

from fsm import ManualClock
from fsm.records import NewEntity, TransitionWrite
from stores import Store

FINALS = ("completed", "failed")


def _finished(store: Store, entity_id: str, kind: str) -> None:
    store.create(NewEntity(id=entity_id, kind=kind, state="queued"))
    store.apply(TransitionWrite(entity_id, "start", "queued", "running", "worker", 0))
    store.apply(TransitionWrite(entity_id, "fail", "running", "failed", "worker", 1))


def _later(clock: ManualClock) -> datetime:
    """A cut-off after everything written so far, by the store's clock or the database's."""
    return max(clock.now(), datetime.now(UTC)) + timedelta(days=1)


def test_a_reader_past_pruned_newest_rows_still_gets_the_next_transition(any_store: Store, clock: ManualClock) -> None:
    _finished(any_store, "keep", "pipeline")  # stays: another kind
    for i in range(3):
        _finished(any_store, f"old-{i}", "job")  # the newest history rows, pruned below
    passed = settled(any_store, 8)[-1].position  # a reader has read them all
    assert sorted(any_store.prune("job", FINALS, _later(clock))) == ["old-0", "old-1", "old-2"]
    any_store.create(NewEntity(id="new", kind="job", state="queued"))
    any_store.apply(TransitionWrite("new", "start", "queued", "running", "worker", 0))
    told: list[tuple[str, int]] = []
    for _ in range(200):  # PostgreSQL: another session's open transaction may hold the feed back
        told = [(e.record.entity_id, e.record.seq) for e in any_store.feed(passed)]
        if told:
            break
        time.sleep(0.05)
    assert told == [("new", 1)]


def test_a_reader_past_trimmed_rows_gets_each_later_transition_once(any_store: Store, clock: ManualClock) -> None:
    any_store.create(NewEntity(id="log", kind="job", state="queued"))
    any_store.apply(TransitionWrite("log", "start", "queued", "running", "worker", 0))
    _finished(any_store, "gone", "job")
    passed = settled(any_store, 3)[-1].position
    assert any_store.prune("job", FINALS, _later(clock)) == ["gone"]
    any_store.apply(TransitionWrite("log", "exited", "running", "finalizing", "worker", 1))
    any_store.apply(TransitionWrite("log", "fail", "finalizing", "failed", "worker", 2))
    told: list[tuple[str, int]] = []
    for _ in range(200):
        told = [(e.record.entity_id, e.record.seq) for e in any_store.feed(passed)]
        if len(told) >= 2:
            break
        time.sleep(0.05)
    assert told == [("log", 2), ("log", 3)]
