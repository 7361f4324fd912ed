"""Issue 11, item 5 (seeds/000's steps): a transition declares a data change applied in its
own write, by the engine and by the reaper's batch alike; the built-in Pipeline ``expire``
and ``supersede`` fail the steps still running, so no dashboard shows a live step in a
dead pipeline."""

from __future__ import annotations

from datetime import timedelta

from fsm import Engine, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper
from fsm.records import SetItems, apply_changes
from stores import Store

STEPS = [
    {"name": "build", "status": "completed"},
    {"name": "test", "status": "running"},
    {"name": "deploy", "status": "queued"},
]
AFTER = [
    {"name": "build", "status": "completed"},
    {"name": "test", "status": "failed"},
    {"name": "deploy", "status": "queued"},
]


def _running(store: Store, clock: ManualClock, entity_id: str, key: str | None = None) -> Engine:
    engine = Engine(PipelineLifecycle, store, clock=clock)
    engine.create(entity_id, data={"steps": STEPS}, concurrency_key=key)
    engine.fire(entity_id, "start")
    return engine


def test_set_items_changes_only_the_matching_items() -> None:
    change = SetItems("steps", "status", ("running",), "failed")
    assert apply_changes((change,), {"steps": STEPS, "other": 1}) == {"steps": AFTER, "other": 1}
    assert apply_changes((change,), {"steps": AFTER}) is None  # nothing running: nothing to write
    assert apply_changes((change,), {}) is None


def test_the_reapers_batch_expire_fails_the_running_steps_in_the_same_write(
    any_store: Store, clock: ManualClock
) -> None:
    engine = _running(any_store, clock, "zombie")
    clock.advance(timedelta(minutes=61))  # a lost webhook: idle past stale_after
    result = Reaper(any_store, [PipelineLifecycle], clock=clock).run_once()
    assert result.moved == {"pipeline.expire": 1}
    snap = engine.get("zombie")
    assert snap.state == "failed" and snap.data["steps"] == AFTER
    assert engine.history("zombie")[-1].event == "expire"


def test_supersede_fails_the_older_pipelines_running_steps(any_store: Store, clock: ManualClock) -> None:
    engine = _running(any_store, clock, "old", key="repo/main")
    clock.advance(seconds=30)
    _running(any_store, clock, "new", key="repo/main")
    result = Reaper(any_store, [PipelineLifecycle], clock=clock).run_once()
    assert result.moved == {"pipeline.supersede": 1}
    assert engine.get("old").data["steps"] == AFTER
    assert engine.get("new").data["steps"] == STEPS  # the live one keeps its running step


def test_the_engine_applies_the_declared_change_too(any_store: Store, clock: ManualClock) -> None:
    engine = _running(any_store, clock, "p1")
    clock.advance(timedelta(minutes=61))
    fired = engine.fire("p1", "expire", actor="reaper")
    assert fired.snapshot.data["steps"] == AFTER and engine.get("p1").data["steps"] == AFTER
