"""Firing from the snapshot the caller holds: no read first; a stale one is read once and judged again."""

from __future__ import annotations

from typing import Any

import pytest

from fsm import Engine, JobLifecycle, LeaseLost, ManualClock, PipelineLifecycle, TransitionNotAllowed
from stores import Store


class CountingStore:
    """Counts the reads of the row a fire would make."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.gets = 0
        self.applies = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self.gets += 1
        return self.inner.get(*args, **kwargs)

    def apply(self, write: Any) -> Any:
        self.applies += 1
        return self.inner.apply(write)


def test_a_held_fire_result_fires_without_reading_the_row(any_store: Store, clock: ManualClock) -> None:
    store = CountingStore(any_store)
    engine = Engine(PipelineLifecycle, store, clock=clock)  # type: ignore[arg-type]
    created = engine.create("p1", data={"n": 1})
    store.gets = 0
    started = engine.fire(created, "start")
    finishing = engine.fire(started, "finish")
    done = engine.fire(finishing.snapshot, "succeed", lease=finishing.lease)
    assert (store.gets, store.applies) == (0, 3)
    assert done.state == "completed" and done.snapshot == any_store.get("p1") and done.snapshot.data["n"] == 1
    assert [r.event for r in any_store.history("p1")] == ["start", "finish", "succeed"]


def test_a_stale_snapshot_is_read_once_and_the_event_judged_again(any_store: Store, clock: ManualClock) -> None:
    store = CountingStore(any_store)
    engine = Engine(PipelineLifecycle, store, clock=clock)  # type: ignore[arg-type]
    created = engine.create("p1")
    engine.fire("p1", "start", data={"by": "other"})  # somebody else moved it on
    store.gets = store.applies = 0
    with pytest.raises(TransitionNotAllowed):  # judged again on the row as it is: running
        engine.fire(created, "start")
    assert (store.gets, store.applies) == (1, 1)
    store.gets = store.applies = 0
    # refused on the stale snapshot (queued has no finish): judged again on the row read
    finishing = engine.fire(created, "finish")
    assert finishing.state == "finalizing" and (store.gets, store.applies) == (1, 1)


def test_a_refusal_other_than_a_stale_version_is_not_retried(any_store: Store, clock: ManualClock) -> None:
    store = CountingStore(any_store)
    engine = Engine(JobLifecycle, store, clock=clock)  # type: ignore[arg-type]
    engine.create("j1")
    started = engine.fire("j1", "start")
    assert started.lease is not None
    engine.release_lease(started.lease)
    Engine(JobLifecycle, any_store, clock=clock, owner="other").acquire_lease("j1")  # token + 1, same version
    store.gets = store.applies = 0
    with pytest.raises(LeaseLost):  # the held snapshot still shows our lease: the store refuses
        engine.fire(started, "exited", lease=started.lease)
    assert store.applies == 1  # one write, refused, not tried again
