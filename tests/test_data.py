"""Typed entity data: validated on create and on fire; invalid data is refused, nothing written."""

from __future__ import annotations

import pytest
from conftest import frozen

from fsm import Engine, InvalidData, PipelineData


def test_create_validates_and_normalises_pipeline_steps(pipelines: Engine) -> None:
    snap = pipelines.create("p1", data={"steps": [{"name": "build"}, {"name": "test", "status": "running"}]})
    assert snap.data["steps"] == [{"name": "build", "status": "queued"}, {"name": "test", "status": "running"}]
    assert PipelineData.model_validate(snap.data).steps[1].status == "running"


def test_create_with_invalid_data_is_refused_and_creates_nothing(pipelines: Engine) -> None:
    from fsm import UnknownEntity

    with pytest.raises(InvalidData) as info:
        pipelines.create("p1", data={"steps": [{"name": "build", "status": "exploded"}]})
    assert info.value.entity_id is None and info.value.errors[0]["loc"][:3] == ("steps", 0, "status")
    with pytest.raises(UnknownEntity):
        pipelines.get("p1")


def test_fire_with_invalid_data_is_refused_and_changes_nothing(jobs: Engine) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    before = frozen(jobs, "j1")
    with pytest.raises(InvalidData, match="exit_code"):
        jobs.fire("j1", "exited", lease=lease, data={"exit_code": "zero"})
    assert frozen(jobs, "j1") == before


def test_fire_merges_the_patch_into_the_data(jobs: Engine) -> None:
    jobs.create("j1", data={"exit_code": None})
    lease = jobs.fire("j1", "start").lease
    jobs.fire("j1", "exited", lease=lease, data={"exit_code": 0})
    result = jobs.fire("j1", "complete", lease=lease, data={"gates": {"merge-gate": {"status": "passed"}}})
    assert result.snapshot.data == {"exit_code": 0, "gates": {"merge-gate": {"status": "passed", "detail": None}}}


def test_a_lifecycle_without_a_data_model_stores_any_json(store: object) -> None:
    from tests_support import Untyped

    engine = Engine(Untyped, store)  # type: ignore[arg-type]
    assert engine.create("u1", data={"anything": [1, 2]}).data == {"anything": [1, 2]}
