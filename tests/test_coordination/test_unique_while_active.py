"""Unique while active: ``create(..., concurrency_key=K, unique=True)`` creates nothing while
a live entity of the lifecycle with key K is not final (seed 000's duplicate pipelines,
refused at the door).  On every store and face; concurrent creates on the SQL stores."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import ActiveDuplicate, Engine, EntityExists, InvalidArgument, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.records import NewEntity
from stores import Store


def test_a_second_active_entity_with_the_key_is_refused_until_the_first_is_final(
    any_store: Store, clock: ManualClock
) -> None:
    pipelines = Engine(PipelineLifecycle, any_store, clock=clock)
    first = pipelines.create("p1", concurrency_key="repo-a/main", unique=True)
    with pytest.raises(ActiveDuplicate) as refused:
        pipelines.create("p2", concurrency_key="repo-a/main", unique=True)
    assert refused.value.existing == "p1" and isinstance(refused.value, EntityExists)
    assert "p1" in str(refused.value) and "repo-a/main" in str(refused.value)
    assert pipelines.create("p3", concurrency_key="repo-a/main", unique=True, if_active="return") == first
    with pytest.raises(EntityExists):
        pipelines.get("p2") if False else pipelines.create("p1", concurrency_key="other", unique=True)
    other = pipelines.create("p4", concurrency_key="repo-b/main", unique=True)  # another key
    assert other.id == "p4"
    pipelines.fire("p1", "cancel")  # final: the key is free again
    assert pipelines.create("p5", concurrency_key="repo-a/main", unique=True).id == "p5"
    assert pipelines.create("p6", concurrency_key="repo-a/main").id == "p6"  # without unique: not checked
    assert sorted(s.id for s in any_store.entities("pipeline")) == ["p1", "p4", "p5", "p6"]


def test_another_lifecycle_with_the_same_key_does_not_count(any_store: Store, clock: ManualClock) -> None:
    Engine(JobLifecycle, any_store, clock=clock).create("j1", concurrency_key="k", unique=True)
    assert Engine(PipelineLifecycle, any_store, clock=clock).create("p1", concurrency_key="k", unique=True).id == "p1"


def test_a_batch_is_all_or_nothing(any_store: Store, clock: ManualClock) -> None:
    Engine(JobLifecycle, any_store, clock=clock).create("j0", concurrency_key="busy", unique=True)
    finals = tuple(sorted(JobLifecycle.table.finals))
    batch = [
        NewEntity("j1", "job", "queued", concurrency_key="free", unique_finals=finals),
        NewEntity("j2", "job", "queued", concurrency_key="busy", unique_finals=finals),
    ]
    with pytest.raises(ActiveDuplicate):
        any_store.create_many(batch)
    twice = [
        NewEntity("j3", "job", "queued", concurrency_key="same", unique_finals=finals),
        NewEntity("j4", "job", "queued", concurrency_key="same", unique_finals=finals),
    ]
    with pytest.raises(ActiveDuplicate):
        any_store.create_many(twice)
    assert [s.id for s in any_store.entities("job")] == ["j0"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"unique": True},  # no key
        {"unique": "yes", "concurrency_key": "k"},
        {"unique": True, "concurrency_key": "k", "if_active": "ignore"},
        {"unique": True, "concurrency_key": "k\x00"},
        {"unique": True, "concurrency_key": "\ud800"},
    ],
)
def test_hostile_unique_creates_are_refused_and_create_nothing(
    any_store: Store, clock: ManualClock, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument):
        Engine(JobLifecycle, any_store, clock=clock).create("j1", **kwargs)
    assert any_store.entities("job") == []


@pytest.mark.parametrize("finals", [(), ("x\x00",), ["completed"], ("a",) * 65])
def test_a_store_refuses_a_malformed_uniqueness(any_store: Store, finals: Any) -> None:
    with pytest.raises(InvalidArgument):
        any_store.create(NewEntity("j1", "job", "queued", concurrency_key="k", unique_finals=finals))
    with pytest.raises(InvalidArgument):  # a uniqueness without a key
        any_store.create(NewEntity("j1", "job", "queued", unique_finals=("completed",)))
    assert any_store.entities("job") == []


def test_concurrent_unique_creates_land_exactly_one(sql_target: SqlTarget) -> None:
    """Eight threads, each with its own store (its own connection), create the same key
    at once, twenty rounds: exactly one entity per round is created."""
    stores = [sql_target.store() for _ in range(8)]
    try:
        for round_ in range(20):
            barrier = threading.Barrier(len(stores))
            outcomes: list[str] = []

            def create(
                store: Store,
                n: int,
                round_: int = round_,
                barrier: threading.Barrier = barrier,
                outcomes: list[str] = outcomes,
            ) -> None:
                engine = Engine(PipelineLifecycle, store)
                barrier.wait()
                try:
                    engine.create(f"r{round_}-{n}", concurrency_key=f"key-{round_}", unique=True)
                    outcomes.append("created")
                except ActiveDuplicate:
                    outcomes.append("refused")

            threads = [threading.Thread(target=create, args=(s, n)) for n, s in enumerate(stores)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(outcomes) == ["created"] + ["refused"] * 7, (round_, outcomes)
    finally:
        for s in stores:
            close = getattr(s, "close", None)
            if close is not None:
                close()


def test_the_async_engine_creates_unique_while_active() -> None:
    import asyncio

    from fsm import AsyncEngine
    from stores.aio import AsyncMemoryStore

    async def scenario() -> None:
        pipelines = AsyncEngine(PipelineLifecycle, AsyncMemoryStore())
        first = await pipelines.create("p1", concurrency_key="k", unique=True)
        with pytest.raises(ActiveDuplicate):
            await pipelines.create("p2", concurrency_key="k", unique=True)
        assert await pipelines.create("p3", concurrency_key="k", unique=True, if_active="return") == first

    asyncio.run(scenario())
