"""The store contract for retention: ``prune`` and ``trim_history``.

Run against every adapter and face (memory, SQLite, PostgreSQL; sync and async) through
``any_store``.  ``prune`` removes finished entities older than a cut-off with their
history, effects and renewal log, in batches, oldest first, and never touches another
kind, another state or a younger row; a dry run changes nothing.  ``trim_history`` keeps
the last rows of a log kept as an entity's history.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: the contract on the sync and async faces

from fsm import FsmError, InvalidArgument, ManualClock, UnknownEntity
from fsm.records import FeedEntry, LeaseChange, NewEntity, Snapshot, TransitionWrite
from stores import Store

TTL = timedelta(minutes=2)
FINALS = ("completed", "failed")


def finished(store: Store, entity_id: str, kind: str = "job", target: str = "completed") -> Snapshot:
    """queued -> running (lease) -> ``target``, with a renewal, an effect and a keyed history row."""
    store.create(NewEntity(id=entity_id, kind=kind, state="queued"))
    start = TransitionWrite(
        entity_id, "start", "queued", "running", "worker", 0, lease_change=LeaseChange.ACQUIRE, new_owner="w1",
        lease_ttl=TTL,
    )  # fmt: skip
    store.apply(start)
    store.renew_lease(entity_id, owner="w1", token=1, ttl=TTL, budget=None)
    store.record_effect(entity_id, "gate", owner="w1", token=1, status="succeeded", result={"ok": True})
    done = TransitionWrite(
        entity_id, "complete", "running", target, "worker", 1, expect_owner="w1", expect_token=1,
        lease_change=LeaseChange.CLEAR, idempotency_key=f"done-{entity_id}",
    )  # fmt: skip
    return store.apply(done)[0]


def running(store: Store, entity_id: str) -> Snapshot:
    store.create(NewEntity(id=entity_id, kind="job", state="queued"))
    return store.apply(TransitionWrite(entity_id, "start", "queued", "running", "worker", 0))[0]


def world(store: Store) -> dict[str, Any]:
    """Every entity this module makes, with its history and effects (None when gone)."""
    found: dict[str, Any] = {}
    for entity_id in ("old-1", "old-2", "old-3", "old-failed", "young", "old-running", "other-kind"):
        try:
            found[entity_id] = (store.get(entity_id), store.history(entity_id), store.effects(entity_id))
        except UnknownEntity:
            found[entity_id] = None
    return found


def populate(store: Store, clock: ManualClock) -> datetime:
    """Old finished entities, an old running one, an old one of another kind, a young one;
    returns the cut-off between old and young."""
    for entity_id in ("old-1", "old-2", "old-3"):
        finished(store, entity_id)
        clock.advance(seconds=1)
    finished(store, "old-failed", target="failed")
    running(store, "old-running")
    finished(store, "other-kind", kind="pipeline")
    clock.advance(seconds=31 * 86400)
    cut = clock.now()
    clock.advance(seconds=1)
    finished(store, "young")
    return cut


def test_prune_removes_old_finished_entities_with_everything_they_own(any_store: Store, clock: ManualClock) -> None:
    cut = populate(any_store, clock)
    removed = any_store.prune("job", FINALS, cut)
    assert removed == ["old-1", "old-2", "old-3", "old-failed"]  # oldest first
    left = world(any_store)
    assert {k for k, v in left.items() if v is None} == set(removed)
    assert left["old-running"][0].state == "running"  # not final: never touched, however old
    assert left["other-kind"][0].kind == "pipeline"  # another kind
    assert left["young"][0].state == "completed"  # younger than the cut-off
    for gone in removed:
        with pytest.raises(UnknownEntity):
            any_store.history(gone)
        with pytest.raises(UnknownEntity):
            any_store.get(gone, include_deleted=True)
        assert any_store.find_transition(gone, f"done-{gone}") is None  # its idempotency key went too
        with pytest.raises(UnknownEntity):
            any_store.effects(gone)
    # the feed of committed transitions forgets them too; what stays keeps its order
    # (PostgreSQL's feed holds back rows while an older transaction on the shared server is
    # open, see settled_feed: wait until the rows that stay are there, then check)
    fed: list[str] = []
    for _ in range(200):
        fed = [e.record.entity_id for e in any_store.feed(None, limit=10_000)]
        if {"young", "old-running"} <= set(fed):
            break
        time.sleep(0.05)
    assert not set(fed) & set(removed) and "young" in fed and "old-running" in fed
    # the id is free again: a new entity starts from nothing
    again = any_store.create(NewEntity(id="old-1", kind="job", state="queued"))
    assert again.version == 0 and any_store.history("old-1") == [] and any_store.effects("old-1") == []
    assert any_store.renewals("old-1") == []


def test_prune_works_in_batches_oldest_first(any_store: Store, clock: ManualClock) -> None:
    cut = populate(any_store, clock)
    assert any_store.prune("job", FINALS, cut, limit=3) == ["old-1", "old-2", "old-3"]
    assert any_store.prune("job", FINALS, cut, limit=3) == ["old-failed"]
    assert any_store.prune("job", FINALS, cut, limit=3) == []


def test_a_dry_run_names_the_same_entities_and_changes_nothing(any_store: Store, clock: ManualClock) -> None:
    cut = populate(any_store, clock)
    before = world(any_store)
    assert any_store.prune("job", FINALS, cut, dry_run=True) == ["old-1", "old-2", "old-3", "old-failed"]
    assert any_store.prune("job", ("failed",), cut, dry_run=True) == ["old-failed"]
    assert world(any_store) == before
    assert any_store.prune("job", ("failed",), cut) == ["old-failed"]  # then the real one removes them


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("kind NUL", {"kind": "jo\x00b"}),
    ("kind surrogate", {"kind": "job\udcff"}),
    ("kind not text", {"kind": 42}),
    ("kind too long", {"kind": "k" * 10_000}),
    ("states a string", {"states": "completed"}),
    ("states empty", {"states": ()}),
    ("states NUL", {"states": ("comp\x00leted",)}),
    ("states not text", {"states": (1, 2)}),
    ("states too many", {"states": tuple(f"s{i}" for i in range(1000))}),
    ("before naive", {"before": datetime(2030, 1, 1)}),  # the hostile value: naive
    ("before not a time", {"before": "2030-01-01"}),
    ("before NaN", {"before": math.nan}),
    ("limit zero", {"limit": 0}),
    ("limit huge", {"limit": 2**70}),
    ("limit bool", {"limit": True}),
    ("limit float", {"limit": 1.5}),
    ("dry_run not bool", {"dry_run": "yes"}),
]


def test_prune_refuses_hostile_arguments_with_a_typed_error_and_removes_nothing(
    any_store: Store, clock: ManualClock
) -> None:
    cut = populate(any_store, clock)
    before = world(any_store)
    for name, bad in HOSTILE:
        args: dict[str, Any] = {"kind": "job", "states": FINALS, "before": cut, "limit": 500, "dry_run": False, **bad}
        with pytest.raises(InvalidArgument):
            any_store.prune(args["kind"], args["states"], args["before"], limit=args["limit"], dry_run=args["dry_run"])
        assert world(any_store) == before, name


def settled_feed(store: Store, kind: str, count: int) -> list[FeedEntry]:
    """The feed of ``kind`` once it holds ``count`` entries.  PostgreSQL's feed gives a row
    only once every older transaction on the server has ended (stores/sql/feed.py): another
    session's open transaction (another test, another suite on the shared server) holds
    rows committed a moment ago back, never loses them; memory and SQLite answer at once."""
    entries: list[FeedEntry] = []
    for _ in range(200):
        entries = store.feed(None, kind=kind)
        if len(entries) >= count:
            break
        time.sleep(0.05)
    return entries


def test_trim_history_keeps_the_last_rows_of_an_entitys_log(any_store: Store, clock: ManualClock) -> None:
    any_store.create(NewEntity(id="log", kind="fsm.reaper", state="ticking"))
    for version in range(10):
        write = TransitionWrite("log", "tick", "ticking", "ticking", "reaper", version, data_patch={"n": version})
        any_store.apply(write)
        clock.advance(seconds=1)
    head = any_store.feed_head()
    assert any_store.trim_history("log", 4) == 6
    assert [h.seq for h in any_store.history("log")] == [7, 8, 9, 10]
    assert [e.record.seq for e in settled_feed(any_store, "fsm.reaper", 4)] == [7, 8, 9, 10]
    # a position given before the trim is still valid and gives no trimmed row (PostgreSQL's
    # head may repeat a few rows committed just before it: at least once, never lost)
    assert all(e.record.seq >= 7 for e in any_store.feed(head))
    assert any_store.get("log").version == 10  # the row is unchanged
    assert any_store.trim_history("log", 4) == 0
    any_store.apply(TransitionWrite("log", "tick", "ticking", "ticking", "reaper", 10))
    assert [h.seq for h in any_store.history("log")] == [7, 8, 9, 10, 11]
    assert any_store.trim_history("log", 100) == 0


TRIM_HOSTILE: list[tuple[Any, Any, type[FsmError]]] = [
    ("missing", 3, UnknownEntity),
    ("lo\x00g", 3, InvalidArgument),
    (42, 3, InvalidArgument),
    ("log", 0, InvalidArgument),
    ("log", -1, InvalidArgument),
    ("log", True, InvalidArgument),
    ("log", 2**80, InvalidArgument),
    ("log", "3", InvalidArgument),
]


def test_trim_history_refuses_hostile_arguments(any_store: Store) -> None:
    any_store.create(NewEntity(id="log", kind="fsm.reaper", state="ticking"))
    any_store.apply(TransitionWrite("log", "tick", "ticking", "ticking", "reaper", 0))
    for entity_id, keep, error in TRIM_HOSTILE:
        with pytest.raises(error):
            any_store.trim_history(entity_id, keep)
        assert [h.seq for h in any_store.history("log")] == [1]


def test_prune_cut_off_is_exclusive(any_store: Store, clock: ManualClock) -> None:
    done = finished(any_store, "edge")
    assert any_store.prune("job", FINALS, done.updated_at) == []
    assert any_store.prune("job", FINALS, done.updated_at + timedelta(microseconds=1)) == ["edge"]
