"""Store contract: the feed of committed transitions (``feed``, ``feed_head``), on every
adapter and both faces, and its order under concurrent commits on PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from async_support import every_face

from fsm import Engine, InvalidArgument, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper
from fsm.records import FeedEntry
from stores import Store

__all__ = ["every_face"]


def _transitions(store: Store, clock: ManualClock) -> list[tuple[str, int, str]]:
    jobs = Engine(JobLifecycle, store, clock=clock)
    pipelines = Engine(PipelineLifecycle, store, clock=clock)
    done = []
    for i in range(3):
        jobs.create(f"j{i}")
        pipelines.create(f"p{i}")
    for snap in jobs.claim(3):
        done.append((snap.id, snap.version, "start"))
    for i in (2, 0):
        result = pipelines.fire(f"p{i}", "start")
        done.append((f"p{i}", result.record.seq, "start"))
    lease = jobs.get("j1").lease
    assert lease is not None
    result = jobs.fire("j1", "exited", lease=lease)
    done.append(("j1", result.record.seq, "exited"))
    return done


def settled(store: Store, count: int) -> list[FeedEntry]:
    """The whole feed once it holds ``count`` entries (PostgreSQL: another session's open
    transaction may hold it back a moment; it never loses one)."""
    entries: list[FeedEntry] = []
    for _ in range(200):
        entries = store.feed()
        if len(entries) >= count:
            break
        time.sleep(0.05)
    return entries


def test_the_feed_tells_every_committed_transition_once_in_commit_order(any_store: Store, clock: ManualClock) -> None:
    committed = _transitions(any_store, clock)
    entries = settled(any_store, len(committed))
    assert [(e.record.entity_id, e.record.seq, e.record.event) for e in entries][-3:] == committed[-3:]
    assert sorted((e.record.entity_id, e.record.seq, e.record.event) for e in entries) == sorted(committed)
    assert {e.kind for e in entries if e.record.entity_id.startswith("j")} == {"job"}
    assert len({e.position for e in entries}) == len(entries)
    # resuming from each position gives exactly the rest
    for i, entry in enumerate(entries):
        assert any_store.feed(entry.position) == entries[i + 1 :]
    # paged
    first, second = any_store.feed(limit=2), any_store.feed(entries[1].position, limit=2)
    assert first + second == entries[:4]
    # one kind only
    jobs = any_store.feed(kind="job")
    assert jobs == [e for e in entries if e.kind == "job"]
    assert any_store.feed(kind="nothing") == []


def test_from_the_head_the_feed_tells_what_commits_from_now_on(any_store: Store, clock: ManualClock) -> None:
    before = set(_transitions(any_store, clock))
    settled(any_store, len(before))
    head = any_store.feed_head()
    engine = Engine(PipelineLifecycle, any_store, clock=clock)
    engine.fire("p1", "start")
    told: list[tuple[str, int, str]] = []
    for _ in range(200):  # PostgreSQL: another session's open transaction may hold the feed back a moment
        told = [(e.record.entity_id, e.record.seq, e.record.event) for e in any_store.feed(head)]
        if ("p1", 1, "start") in told:
            break
        time.sleep(0.05)
    assert told[-1] == ("p1", 1, "start")
    if not any_store.feed_head().startswith("p"):
        assert told == [("p1", 1, "start")]
    else:  # PostgreSQL may repeat a few that committed just before the head was read, never others
        assert set(told[:-1]) <= before


def test_a_reaper_move_is_in_the_feed(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("j1")
    engine.claim()
    head = any_store.feed_head()
    clock.advance(timedelta(minutes=3))
    assert Reaper(any_store, [JobLifecycle], clock=clock).run_once().total_moved == 1
    moves: list[tuple[str, str, str]] = []
    for _ in range(200):
        # PostgreSQL's head may repeat the claim's start (committed just before it was read)
        entries = any_store.feed(head, kind="job")
        moves = [(e.record.entity_id, e.record.event, e.record.actor) for e in entries if e.record.actor == "reaper"]
        if moves:
            break
        time.sleep(0.05)
    assert moves == [("j1", "expire", "reaper")]
    assert {e.record.event for e in entries} <= {"start", "expire"}


def test_positions_are_printable_ascii_whatever_the_entity_id(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(PipelineLifecycle, any_store, clock=clock)
    odd = ["line\nbreak", "\u00e9t\u00e9 \u2713", "dots.and%25percent", "x" * 255]
    for entity_id in odd:
        engine.create(entity_id)
        engine.fire(entity_id, "start")
    entries = settled(any_store, len(odd))
    assert [e.record.entity_id for e in entries] == odd
    for i, entry in enumerate(entries):
        assert entry.position.isascii() and entry.position.isprintable(), entry.position
        assert any_store.feed(entry.position) == entries[i + 1 :]


@pytest.mark.parametrize(
    "position",
    [
        5,
        b"s1",
        "",
        "x1",
        "m-1",
        "s-1",
        "m1\x00",
        "s\ud800",
        "p1.2",
        "pa.b.c",
        "m" + "9" * 40,
        "p" * 3000,
        "p1.2.\u00e9",
        "p1.2.%ff",
    ],
)
def test_a_position_this_store_never_gave_is_refused_with_a_typed_error(any_store: Store, position: object) -> None:
    with pytest.raises(InvalidArgument):
        any_store.feed(position)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, -1, 10_001, 1.5, True, "5", None])
def test_a_bad_limit_or_kind_is_refused(any_store: Store, limit: object) -> None:
    with pytest.raises(InvalidArgument):
        any_store.feed(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        any_store.feed(kind="bad\x00kind")
