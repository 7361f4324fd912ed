"""``check_store`` and ``migrate_rows`` on every store: a rename, an inserted state, a new
data field, run as a deploy runs them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm import Engine, InvalidArgument, MalformedRow, ManualClock, Renamed, check_store, migrate_rows
from fsm.evolution.migrate import MIGRATE_EVENT, MIGRATION_ACTOR
from stores.base import Store

from .builds import BuildData, BuildV1, BuildV2, BuildV2Undeclared


def _started(engine: Engine, entity_id: str) -> None:
    """``entity_id`` claimed by ``engine``'s owner: in ``building``, holding a lease."""
    engine.create(entity_id, data={"target": "arm"})
    [claimed] = engine.claim(1)
    assert claimed.id == entity_id


def _in_building_unheld(engine: Engine, entity_id: str) -> None:
    """``entity_id`` in ``building`` with its lease released: work a v1 worker gave back."""
    _started(engine, entity_id)
    snap = engine.store.get(entity_id)
    engine.store.release_lease(entity_id, owner=snap.lease_owner or "", token=snap.lease_token)


def test_the_undeclared_rename_fails_the_check_and_names_the_stranded_entities(
    any_store: Store, clock: ManualClock
) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    _in_building_unheld(v1, "b-1")
    v1.create("q-1")
    report = check_store(BuildV2Undeclared, any_store)
    assert not report.ok
    assert report.entities == 2
    assert report.states == {"queued": 1, "building": 1}
    [finding] = report.problems.values()
    assert finding.count == 1 and finding.examples == ["b-1"]
    assert "'building'" in finding.what and "stranded" in finding.what
    assert "FAILED" in report.render()


def test_the_declared_migration_passes_the_check_and_lists_what_it_will_move(
    any_store: Store, clock: ManualClock
) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    _in_building_unheld(v1, "b-1")
    v1.create("q-1")
    report = check_store(BuildV2, any_store)
    assert report.ok, report.render()
    assert {k: f.count for k, f in report.pending.items()} == {"move:building": 1, "data": 2}
    assert check_store(BuildV1, any_store).ok  # the old definition reads them all too


def test_data_the_new_model_refuses_fails_the_check(any_store: Store, clock: ManualClock) -> None:
    """Version 2 without its data migration: ``label`` is required and old rows have none."""

    class NoLabel(BuildV2):  # a subclass may change its migrations, not its states
        migrations = (Renamed("building", "compiling"),)

    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    v1.create("q-1")
    report = check_store(NoLabel, any_store)
    assert not report.ok
    [finding] = report.problems.values()
    assert "label" in finding.what and finding.examples == ["q-1"]


def test_the_migration_moves_unheld_entities_with_a_history_row_and_leaves_held_ones(
    any_store: Store, clock: ManualClock
) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    for entity_id in ("b-free", "b-held"):
        v1.create(entity_id, data={"target": "arm"})
    assert {s.id for s in v1.claim(2)} == {"b-free", "b-held"}
    free = any_store.get("b-free")
    any_store.release_lease("b-free", owner="w1", token=free.lease_token)  # work a v1 worker gave back
    v1.create("q-1", data={"target": "riscv"})
    before = {i: any_store.get(i) for i in ("q-1", "b-free", "b-held")}

    dry = migrate_rows(BuildV2, any_store, dry_run=True)
    assert dry.moved == {("building", "compiling"): 1} and dry.rewritten == 2
    assert dry.waiting == {"b-held": "building"}
    assert {i: any_store.get(i) for i in before} == before  # a dry run writes nothing

    report = migrate_rows(BuildV2, any_store)
    assert report.moved == {("building", "compiling"): 1}
    assert report.rewritten == 2 and report.waiting == {"b-held": "building"} and not report.done
    moved = any_store.get("b-free")
    assert (moved.state, moved.version, moved.definition) == ("compiling", before["b-free"].version + 1, 2)
    assert moved.data["label"] == "build for arm"
    last = any_store.history("b-free")[-1]
    assert (last.event, last.actor, last.source, last.target, last.seq) == (
        MIGRATE_EVENT,
        MIGRATION_ACTOR,
        "building",
        "compiling",
        moved.version,
    )
    assert last.reason is not None and "'building' renamed 'compiling'" in last.reason and "label" in last.reason
    queued = any_store.get("q-1")
    assert (queued.state, queued.definition, queued.data["label"]) == ("queued", 2, "build for riscv")
    assert any_store.get("b-held") == before["b-held"]  # its holder keeps it

    # v2 reads every moved row; the held one is still v1's
    v2 = Engine(BuildV2, any_store, clock=clock, owner="w2")
    assert v2.get("b-free").state == "compiling"
    with pytest.raises(MalformedRow):
        v2.get("b-held")

    # the holder gives it back: the next run moves it, and then nothing is left to do
    held = any_store.get("b-held")
    any_store.release_lease("b-held", owner="w1", token=held.lease_token)
    again = migrate_rows(BuildV2, any_store)
    assert again.moved == {("building", "compiling"): 1} and again.done
    assert migrate_rows(BuildV2, any_store).moved == {}  # resumable: a third run finds nothing
    assert migrate_rows(BuildV2, any_store).rewritten == 0  # and never rewrites data twice
    assert check_store(BuildV2, any_store).pending == {}


def test_a_worker_of_the_old_definition_never_claims_what_the_new_one_wrote(
    any_store: Store, clock: ManualClock
) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    v2 = Engine(BuildV2, any_store, clock=clock, owner="w2")
    v2.create("new", data={"label": "x"})
    v1.create("old")
    assert [s.id for s in v1.claim(10)] == ["old"]
    assert [s.id for s in v2.claim(10)] == ["new"]
    assert any_store.get("new").definition == 2


def test_an_old_holders_late_write_to_a_migrated_entity_is_refused(any_store: Store, clock: ManualClock) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    _started(v1, "b-1")
    held = any_store.get("b-1")
    lease = held.lease
    assert lease is not None
    clock.advance(BuildV1.policy.lease_ttl + timedelta(seconds=1))  # the holder stalled past its lease
    report = migrate_rows(BuildV2, any_store)
    assert report.moved == {("building", "compiling"): 1}
    from fsm import FsmError

    with pytest.raises(FsmError):
        v1.fire("b-1", "exited", lease=lease)
    assert any_store.get("b-1").state == "compiling"


def test_a_split_rule_that_raises_leaves_its_entity_and_reports_it(any_store: Store, clock: ManualClock) -> None:
    from fsm import Split

    def by_target(data: dict[str, object]) -> str:
        if data.get("target") == "boom":
            raise ValueError("no rule for boom")
        return "compiling" if data.get("target") == "arm" else "testing"

    class BuildSplit(BuildV2):  # the same states; only the split declared
        data_model = BuildData
        migrations = (Split("building", into=("compiling", "testing"), by=by_target),)

    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    for entity_id, target in (("a", "arm"), ("b", "x86"), ("c", "boom")):
        v1.create(entity_id, data={"target": target})
    for claimed in v1.claim(3):
        any_store.release_lease(claimed.id, owner="w1", token=claimed.lease_token)
    before = any_store.get("c")
    report = migrate_rows(BuildSplit, any_store)
    assert report.moved == {("building", "compiling"): 1, ("building", "testing"): 1}
    assert list(report.failed) == ["c"] and "no rule for boom" in report.failed["c"]
    assert any_store.get("c") == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: check_store(object, s),  # type: ignore[arg-type]
        lambda s: check_store(BuildV2, s, page=0),
        lambda s: migrate_rows(BuildV2, s, page=True),
        lambda s: migrate_rows(BuildV2, s, wait=float("nan")),
        lambda s: migrate_rows(BuildV2, s, wait=-1),
        lambda s: migrate_rows("BuildV2", s),  # type: ignore[arg-type]
    ],
)
def test_hostile_arguments_are_refused_before_anything_moves(
    any_store: Store, clock: ManualClock, call: object
) -> None:
    v1 = Engine(BuildV1, any_store, clock=clock, owner="w1")
    v1.create("q-1")
    before = any_store.get("q-1")
    with pytest.raises(InvalidArgument):
        call(any_store)  # type: ignore[operator]
    assert any_store.get("q-1") == before


def test_a_model_that_only_gains_a_field_with_a_default_reads_old_rows(any_store: Store, clock: ManualClock) -> None:
    from pydantic import BaseModel, ConfigDict

    class Wider(BaseModel):
        model_config = ConfigDict(extra="forbid")
        target: str = "linux"
        steps: list[str] = []
        platform: str = "x86_64"

    class BuildWider(BuildV1):
        data_model = Wider

    Engine(BuildV1, any_store, clock=clock, owner="w1").create("old", data={"target": "arm"})
    report = check_store(BuildWider, any_store)
    assert report.ok and report.pending == {}, report.render()
    wider = Engine(BuildWider, any_store, clock=clock, owner="w2")
    [claimed] = wider.claim(1)
    lease = claimed.lease
    assert lease is not None
    moved = wider.fire("old", "exited", lease=lease, data={"steps": ["compile"]})
    assert moved.snapshot.data == {"target": "arm", "steps": ["compile"], "platform": "x86_64"}


def test_a_model_that_retypes_a_field_is_caught_by_the_check(any_store: Store, clock: ManualClock) -> None:
    from pydantic import BaseModel, ConfigDict

    class Retyped(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        target: int = 0
        steps: list[str] = []

    class BuildRetyped(BuildV1):
        data_model = Retyped

    Engine(BuildV1, any_store, clock=clock, owner="w1").create("old", data={"target": "arm"})
    report = check_store(BuildRetyped, any_store)
    assert not report.ok
    [finding] = report.problems.values()
    assert "target" in finding.what and finding.examples == ["old"]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: {**d, "label": float("nan")},
        lambda d: {**d, "label": {1, 2}},
        lambda d: {**d, "label": "x\ud800"},
        lambda d: ["not", "a", "dict"],
        lambda d: 1 / 0,
    ],
)
def test_a_data_migration_that_returns_what_no_store_takes_leaves_the_entity_as_it_was(
    any_store: Store, clock: ManualClock, change: object
) -> None:
    from fsm import DataMigration

    class Hostile(BuildV2):
        migrations = (Renamed("building", "compiling"), DataMigration(change))  # type: ignore[arg-type]

    Engine(BuildV1, any_store, clock=clock, owner="w1").create("old", data={"target": "arm"})
    before, history = any_store.get("old"), any_store.history("old")
    assert not check_store(Hostile, any_store).ok
    report = migrate_rows(Hostile, any_store)
    assert list(report.failed) == ["old"] and not report.done
    assert any_store.get("old") == before and any_store.history("old") == history
