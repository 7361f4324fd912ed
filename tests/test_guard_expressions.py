"""Guard expressions: ``cond``/``unless`` strings with ``and``/``or``/``not`` (and the
``^``/``v``/``!`` shorthands), ``In('state')`` and constants run as python-statemachine
runs them, judged on the stored entity; a fenced or store-checked guard stays a conjunct
of its own, so the fencing token and the store's re-checks are kept."""

from __future__ import annotations

import itertools

import pytest
from statemachine import State

from fsm import Engine, GuardContext, GuardRejected, Lifecycle, ManualClock, guard, worker
from fsm.diagram import extract, to_mermaid
from fsm.testing.agreement import check_agreement
from stores import MemoryStore
from stores.sql import SqlStore


class Gates(Lifecycle):
    """Each transition guarded by one form of expression."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        review = State()
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active, cond="!blocked"))
    review = worker(active.running.to(active.review, cond="green v waived"))
    back = worker(active.review.to(active.running, unless="green and waived"))
    finish = worker(active.review.to(active.finalizing, cond="holds_lease and (green or waived) and not blocked"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = worker(active.to(failed, cond=["holds_lease", "In('review') or blocked"]))
    skip = worker(queued.to(done, cond="True and not (green or In('active'))"))

    @guard
    def green(ctx: GuardContext) -> bool:
        "the checks passed"
        return bool(ctx.data.get("green"))

    @guard
    def waived(ctx: GuardContext) -> bool:
        "somebody waived the checks"
        return bool(ctx.data.get("waived"))

    @guard
    def blocked(ctx: GuardContext) -> bool:
        "a blocker is open"
        return bool(ctx.data.get("blocked"))


GUARDS = ["green", "waived", "blocked", "holds_lease"]


def test_every_expression_agrees_with_python_statemachine_from_every_leaf() -> None:
    """Every event from every leaf under every combination of the guards' answers."""
    table = Gates.table
    outcomes = [dict(zip(GUARDS, bits, strict=True)) for bits in itertools.product([False, True], repeat=len(GUARDS))]
    for leaf, event, outcome in itertools.product(table.leaves, table.events, outcomes):
        check_agreement(Gates, [(event, outcome)], start=leaf)


def test_a_conjunction_keeps_its_literals_and_makes_one_guard_of_each_other_conjunct() -> None:
    (finish,) = Gates.table.branches_for("review", "finish")
    assert [(g.name, expected) for g, expected in finish.guards] == [
        ("holds_lease", True),
        ("green or waived", True),
        ("blocked", False),
    ]
    assert finish.holds_lease  # the fencing token is still carried by the write
    (start,) = Gates.table.branches_for("queued", "start")
    assert [(g.name, expected) for g, expected in start.guards] == [("blocked", False)]
    (back,) = Gates.table.branches_for("review", "back")
    assert [g.name for g, _ in back.guards] == ["not (green and waived)"]
    assert back.guards[0][0].members == ("green", "waived")


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, clock: ManualClock) -> Engine:
    store = MemoryStore(clock) if request.param == "memory" else SqlStore("sqlite://", clock=clock)
    return Engine(Gates, store, clock=clock)


def test_the_engine_judges_an_expression_on_the_entity_and_names_it_when_refused(engine: Engine) -> None:
    engine.create("g1")
    engine.fire("g1", "start")
    with pytest.raises(GuardRejected) as refused:
        engine.fire("g1", "review")
    assert refused.value.failed == {"running->review": ["green or waived"]}
    assert engine.get("g1").state == "running"  # nothing written
    assert engine.fire("g1", "review", data={"waived": True}).state == "review"
    # unless='green and waived': back is refused only when both hold
    with pytest.raises(GuardRejected):
        engine.fire("g1", "back", data={"green": True})
    assert engine.get("g1").state == "review"
    assert engine.fire("g1", "back", data={"green": False}).state == "running"


def test_in_state_is_judged_on_the_stored_leaf(engine: Engine) -> None:
    lease_holder = engine.create("g2")
    assert lease_holder.state == "queued"
    assert engine.fire("g2", "skip").state == "done"  # not (green or In('active')), from queued
    engine.create("g3")
    engine.fire("g3", "start")
    lease = engine.acquire_lease("g3", owner="w")
    with pytest.raises(GuardRejected) as refused:
        engine.fire("g3", "abort", lease=lease)  # running is not In('review'), nothing blocks
    assert refused.value.failed == {"running->failed": ["In('review') or blocked"]}
    engine.fire("g3", "review", data={"green": True}, lease=lease)
    assert engine.fire("g3", "abort", lease=lease).state == "failed"


def test_a_fenced_conjunct_still_needs_the_current_lease(engine: Engine) -> None:
    engine.create("g4")
    engine.fire("g4", "start")
    engine.fire("g4", "review", data={"green": True})
    with pytest.raises(GuardRejected) as refused:
        engine.fire("g4", "finish")  # green, not blocked, but no lease
    assert refused.value.failed == {"review->finalizing": ["holds_lease"]}
    lease = engine.acquire_lease("g4", owner="w")
    fired = engine.fire("g4", "finish", lease=lease)
    assert fired.state == "finalizing" and fired.record.lease_token == lease.token


def test_the_diagram_draws_the_expression_and_lists_its_guards() -> None:
    diagram = extract(Gates)
    assert {name for name, _ in diagram.guards} == {"blocked", "green", "waived", "holds_lease"}
    assert dict(diagram.guards)["waived"] == "somebody waived the checks"
    text = to_mermaid(diagram)
    assert "running --> review : review [green or waived] (worker)" in text
    assert "not (green and waived)" in text
