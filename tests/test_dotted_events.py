"""Dotted and wildcard event descriptors, matched as python-statemachine matches them: a
transition declared for ``error`` also takes ``error.timeout``, ``abort.*`` takes ``abort``
and ``abort.now``, ``*`` takes every event, and an attribute named ``error_timeout`` also
declares ``error.timeout``.  The statechart's order decides between several matches; the
history row records the event as it was sent."""

from __future__ import annotations

import itertools

import pytest
from statemachine import State

from fsm import (
    Engine,
    InvalidArgument,
    Lifecycle,
    ManualClock,
    TransitionNotAllowed,
    UnknownEvent,
    operator_override,
    worker,
)
from fsm.testing.agreement import check_agreement
from stores import MemoryStore
from stores.sql import SqlStore


class Alarms(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        paused = State()
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    error = worker(active.running.to(active.paused))
    error_timeout = worker(active.paused.to(failed))  # also declares 'error.timeout'
    error_disk = worker(active.running.to(failed))  # and 'error.disk', tried after 'error'
    resume = worker(active.paused.to(active.running, event="resume.soon resume."))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = operator_override(active.to(failed, event="abort.*"), reason="aborted")
    operator_override(active.paused.to(failed, event="halt.*"), reason="halted")  # no plain 'halt' declared


class Catchall(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    anything = worker(active.running.to(failed, event="*"))


SENT = [
    "start",
    "error",
    "error.timeout",
    "error.disk.full",
    "errors",
    "error_timeout",
    "resume",
    "resume.soon",
    "resume.now",
    "abort",
    "abort.now",
    "abortive",
    "finish",
    "succeed",
    "whatever",
    "error.",
    "halt",
    "halt.now",
]


@pytest.mark.parametrize("lifecycle", [Alarms, Catchall])
def test_every_sent_name_agrees_with_python_statemachine_from_every_leaf(lifecycle: type[Lifecycle]) -> None:
    for leaf, event, holds in itertools.product(lifecycle.table.leaves, SENT, [False, True]):
        check_agreement(lifecycle, [(event, {"holds_lease": holds})], start=leaf)


def test_the_statechart_order_decides_between_matching_descriptors() -> None:
    table = Alarms.table
    assert [b.target for b in table.branches_for("running", "error.disk.full")] == ["paused", "failed"]
    assert [b.target for b in table.branches_for("running", "error.disk")] == ["paused", "failed"]
    assert [b.target for b in table.branches_for("running", "error.timeout")] == ["paused"]
    assert [b.target for b in table.branches_for("paused", "error.timeout")] == ["failed"]
    assert table.branches_for("running", "errors") == ()  # a prefix only at a dot
    assert {b.event for b in table.branches_for("running", "abort.now")} == {"abort.now"}
    assert [b.target for b in table.branches_for("paused", "halt")] == ["failed"]  # 'halt.*' takes 'halt'
    assert table.knows("halt") and not table.knows("haltx")


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _engine(lifecycle: type[Lifecycle], kind: str, clock: ManualClock) -> Engine:
    store = MemoryStore(clock) if kind == "memory" else SqlStore("sqlite://", clock=clock)
    return Engine(lifecycle, store, clock=clock)


def test_a_dotted_event_fires_the_matching_transition_and_history_records_it(
    store_kind: str, clock: ManualClock
) -> None:
    engine = _engine(Alarms, store_kind, clock)
    engine.create("a1")
    engine.fire("a1", "start")
    assert engine.fire("a1", "error.disk.full").state == "paused"  # declared for 'error'
    assert engine.fire("a1", "resume.soon").state == "running"
    assert engine.fire("a1", "error").state == "paused"
    fired = engine.fire("a1", "error.timeout")
    assert fired.state == "failed"
    assert [h.event for h in engine.history("a1")][-4:] == ["error.disk.full", "resume.soon", "error", "error.timeout"]


def test_a_name_no_descriptor_matches_is_unknown_and_one_that_matches_elsewhere_is_not_allowed(
    store_kind: str, clock: ManualClock
) -> None:
    engine = _engine(Alarms, store_kind, clock)
    engine.create("a2")
    with pytest.raises(UnknownEvent):
        engine.fire("a2", "abortive")
    with pytest.raises(TransitionNotAllowed):
        engine.fire("a2", "error.timeout")  # matched, but not from queued
    assert engine.get("a2").state == "queued" and engine.history("a2") == []


def test_a_wildcard_takes_any_event_its_state_has_no_earlier_transition_for(
    store_kind: str, clock: ManualClock
) -> None:
    engine = _engine(Catchall, store_kind, clock)
    engine.create("c1")
    with pytest.raises(TransitionNotAllowed):
        engine.fire("c1", "whatever")  # a known event now, but queued declares none that takes it
    engine.fire("c1", "start")
    assert engine.fire("c1", "whatever.else").state == "failed"


@pytest.mark.parametrize("event", ["error.\x00", "error." + "x" * 5000, "error.\ud800"])
def test_a_hostile_dotted_name_is_refused_as_invalid_and_writes_nothing(
    event: str, store_kind: str, clock: ManualClock
) -> None:
    engine = _engine(Alarms, store_kind, clock)
    engine.create("a3")
    engine.fire("a3", "start")
    with pytest.raises(InvalidArgument):
        engine.fire("a3", event)
    assert engine.get("a3").state == "running" and len(engine.history("a3")) == 1


def test_the_property_machine_names_a_rule_for_each_sent_name() -> None:
    from hypothesis import settings

    from fsm.testing import lifecycle_machine, memory_stores

    machine = lifecycle_machine(Alarms, memory_stores())
    assert {"fire_error_timeout", "fire_error_timeout_2", "fire_error_disk", "fire_resume_soon"} <= set(vars(machine))
    assert not any(name.endswith("_") for name in vars(machine) if name.startswith("fire_"))  # no 'abort.*' rule
    case = machine.TestCase
    case.settings = settings(max_examples=30, stateful_step_count=12, deadline=None)
    case().runTest()


def test_the_reaper_plans_one_rule_per_declared_branch_not_one_per_matching_event(clock: ManualClock) -> None:
    """'error.timeout' is declared (a worker's), so its branch list also holds the reaper's
    'error' transition, renamed; the reaper must fire that one as 'error' only."""
    from fsm import reaper
    from fsm.reaping.rules import plan_rules

    class Watched(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            paused = State()
            finalizing = State()

        done = State(final=True)
        failed = State(final=True)

        start = worker(queued.to(active))
        error = reaper(active.running.to(failed, cond=["lease_stale", "owned"]))
        error_timeout = worker(active.running.to(active.paused))
        finish = worker(active.to(active.finalizing))
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))

    table = Watched.table
    assert [b.event for b in table.branches_for("running", "error.timeout")] == ["error.timeout", "error.timeout"]
    rules = plan_rules(Engine(Watched, MemoryStore(clock), clock=clock))
    assert [(r.branch.source, r.branch.event) for r in rules] == [("running", "error")]
