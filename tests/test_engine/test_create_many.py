"""``Engine.create_many`` (and ``AsyncEngine.create_many``): many jobs in one write, each
validated first, all or nothing."""

from __future__ import annotations

import asyncio

import pytest

from fsm import AsyncEngine, Engine, EntityExists, InvalidArgument, InvalidData, JobLifecycle, UnknownEntity
from fsm.limits import MAX_CREATE_MANY
from stores import Store
from stores.aio import AsyncMemoryStore


def test_create_many_makes_one_queued_entity_per_item_in_order(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    made = jobs.create_many([{"exit_code": i} for i in range(4)])
    assert len({s.id for s in made}) == 4
    assert [s.data["exit_code"] for s in made] == [0, 1, 2, 3]
    assert all(s.state == "queued" and s.kind == "job" and s.version == 0 for s in made)
    assert [jobs.get(s.id).data["exit_code"] for s in made] == [0, 1, 2, 3]
    assert sorted(s.id for s in jobs.claim(10)) == sorted(s.id for s in made)


def test_create_many_takes_ids_and_concurrency_keys_item_by_item(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    made = jobs.create_many([None, {}], ids=["a", "b"], concurrency_keys=["k", None])
    assert [(s.id, s.concurrency_key) for s in made] == [("a", "k"), ("b", None)]


def test_one_invalid_item_creates_nothing(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    with pytest.raises(InvalidData):
        jobs.create_many([{}, {"exit_code": "not a number"}], ids=["ok", "bad"])
    with pytest.raises(UnknownEntity):
        jobs.get("ok")


def test_an_existing_id_creates_nothing(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    jobs.create("taken")
    with pytest.raises(EntityExists):
        jobs.create_many([{}, {}], ids=["new", "taken"])
    with pytest.raises(UnknownEntity):
        jobs.get("new")


@pytest.mark.parametrize(
    "call",
    [
        lambda jobs: jobs.create_many([]),
        lambda jobs: jobs.create_many({}),
        lambda jobs: jobs.create_many([{}] * (MAX_CREATE_MANY + 1)),
        lambda jobs: jobs.create_many([{}, {}], ids=["only-one"]),
        lambda jobs: jobs.create_many([{}], concurrency_keys="k"),
    ],
)
def test_a_malformed_batch_is_refused_with_invalid_argument(any_store: Store, call: object) -> None:
    jobs = Engine(JobLifecycle, any_store)
    with pytest.raises(InvalidArgument):
        call(jobs)  # type: ignore[operator]
    assert jobs.counts()["queued"] == 0


def test_the_async_engine_creates_many_too() -> None:
    async def main() -> list[str]:
        jobs = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        made = await jobs.create_many([{}, {"exit_code": 3}], ids=["x", "y"])
        return [s.id for s in made] + [str((await jobs.get("y")).data["exit_code"])]

    assert asyncio.run(main()) == ["x", "y", "3"]
