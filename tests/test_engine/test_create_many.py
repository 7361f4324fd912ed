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


# -- empty data validated once per model, when that is the same every time; ids in bulk -------


def test_empty_data_of_a_pure_model_is_validated_once_and_each_entity_gets_its_own_copy() -> None:
    from fsm.engine.arguments import _EMPTY_VALIDATED
    from stores import MemoryStore

    jobs = Engine(JobLifecycle, MemoryStore())
    made = jobs.create_many([{}, None, {}])
    assert all(s.data == {"exit_code": None, "gates": {}} for s in made)
    made[0].data["gates"]["x"] = {"passed": True}  # a caller mutating its snapshot changes nothing else
    assert made[1].data["gates"] == {} and jobs.get(made[1].id).data["gates"] == {}
    assert _EMPTY_VALIDATED[JobLifecycle.data_model] == {"exit_code": None, "gates": {}}
    assert jobs.create_many([{}])[0].data == {"exit_code": None, "gates": {}}


def test_a_model_that_makes_a_value_per_validation_still_runs_for_every_item() -> None:
    import itertools
    import uuid

    from pydantic import BaseModel, Field, model_validator

    from stores import MemoryStore

    counter = itertools.count()

    class Tagged(BaseModel):
        tag: str = Field(default_factory=lambda: uuid.uuid4().hex)

    class Stamped(BaseModel):
        n: int = 0

        @model_validator(mode="before")
        @classmethod
        def stamp(cls, data: object) -> object:
            assert isinstance(data, dict)
            return {**data, "n": next(counter)}

    class TaggedFlow(JobLifecycle):
        data_model = Tagged

    class StampedFlow(JobLifecycle):
        data_model = Stamped

    tagged = Engine(TaggedFlow, MemoryStore()).create_many([{}, {}, {}])
    assert len({s.data["tag"] for s in tagged}) == 3  # a fresh default each, never one shared
    stamped = Engine(StampedFlow, MemoryStore()).create_many([{}, {}, {}])
    assert [s.data["n"] for s in stamped] == [0, 1, 2]  # the validator ran for every item


def test_new_ids_are_random_version_4_uuids() -> None:
    import uuid

    from fsm.ids import new_id, new_ids

    ids = [*new_ids(500), new_id()]
    assert len(set(ids)) == len(ids)
    for i in ids:
        parsed = uuid.UUID(i)
        assert parsed.hex == i and len(i) == 32
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert new_ids(0) == []
