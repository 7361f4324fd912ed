"""Issue 10: a lifecycle using every feature the compiled table accepts behaves as
python-statemachine does, step by step, from every state; custom state values are
persisted as state ids and restored from them."""

from __future__ import annotations

import itertools

import pytest
from statemachine import State

from fsm import Engine, Guard, InvalidDefinition, Lifecycle, ManualClock, operator_override, worker
from fsm.testing.agreement import check_agreement
from stores import MemoryStore


class Kitchen(Lifecycle):
    """Every accepted feature at once: compounds three deep, custom values (strings and
    ints), one event on a leaf and on its ancestors, guarded fallbacks, self-loops,
    internal transitions, ``event="a b"``, ``a ^ b``, ``unless=``."""

    queued = State(initial=True, value="Q")

    class active(State.Compound, value=2):
        running = State(initial=True, value="R")

        class checks(State.Compound):
            lint = State()
            test = State(initial=True, value=7)

            class deep(State.Compound):
                probe = State()

        finalizing = State(value="F")

    done = State(final=True, value="D")
    failed = State(final=True)

    start = worker(queued.to(active))
    # `poke` on the leaf, its parent and the compound: the deepest enabled one wins
    poke = (
        worker(active.checks.test.to(active.checks.lint, cond="ready ^ holds_lease"))
        | worker(active.checks.to(active.checks.deep, internal=True))
        | worker(active.to(active.finalizing, unless="ready"))
        | operator_override(active.to.itself(internal=True), reason=None)
    )
    check = worker(active.running.to(active.checks)) | worker(active.checks.deep.probe.to(active))
    retry = worker(active.checks.to.itself()) | worker(active.checks.lint.to.itself(internal=True))
    worker(active.checks.lint.to(active.finalizing, event="finish wrap", cond=["ready", "holds_lease"]))
    # worker transitions that may leave a live finalizer without its lease: the named override
    succeed = operator_override(active.finalizing.to(done, cond="ready"), reason=None) | operator_override(
        active.finalizing.to(failed), reason=None
    )
    abort = operator_override(active.to(failed, unless="holds_lease"), reason=None)

    ready = Guard("ready", lambda ctx: bool(ctx.data.get("ready")), "the kitchen is ready")


def _outcomes(names: list[str]) -> list[dict[str, bool]]:
    return [dict(zip(names, bits, strict=True)) for bits in itertools.product([False, True], repeat=len(names))]


def test_every_accepted_feature_behaves_as_python_statemachine_from_every_leaf() -> None:
    """From every leaf, every event under every combination of the guards it uses."""
    table = Kitchen.table
    assert set(table.events) >= {"poke", "check", "retry", "finish", "wrap", "succeed", "abort"}
    for leaf, event, outcome in itertools.product(table.leaves, table.events, _outcomes(["ready", "holds_lease"])):
        check_agreement(Kitchen, [(event, outcome)], start=leaf)


def test_deepest_enabled_transition_wins_and_fallbacks_follow_document_order() -> None:
    branches = Kitchen.table.branches_for("test", "poke")
    assert [(b.declared_on, b.target) for b in branches] == [
        ("test", "lint"),
        ("checks", "probe"),
        ("active", "finalizing"),
        ("active", "running"),
    ]
    assert [g.name for g, _ in branches[0].guards] == ["ready", "holds_lease"]  # 'ready ^ holds_lease'


def test_custom_state_values_are_persisted_as_state_ids_and_restore_from_them(clock: ManualClock) -> None:
    engine = Engine(Kitchen, MemoryStore(clock), clock=clock)
    engine.create("k1")
    engine.fire("k1", "start")
    snap = engine.fire("k1", "check")
    assert snap.state == "test"  # the id, as the store and a binding's status_of persist it
    restored = Kitchen.restore(snap.state)
    assert {s.id for s in restored.configuration} == {"active", "checks", "test"}
    assert set(restored.configuration_values) == {2, "checks", 7}  # python-statemachine's values
    restored.send("abort")
    assert {s.id for s in restored.configuration} == {"failed"}


def test_restore_takes_a_state_id_never_a_custom_value() -> None:
    with pytest.raises(InvalidDefinition, match="no leaf state 'R'"):
        Kitchen.restore("R")


def test_the_engine_takes_a_dotted_name_as_python_statemachine_prefix_matches_it(clock: ManualClock) -> None:
    """python-statemachine lets 'abort.now' fire the transition declared for 'abort'; so does
    the engine, and the history row records the event as sent."""
    engine = Engine(Kitchen, MemoryStore(clock), clock=clock)
    engine.create("k2")
    engine.fire("k2", "start")
    fired = engine.fire("k2", "abort.now")
    assert fired.state == "failed" and fired.record.event == "abort.now"


def test_the_diagram_draws_an_accepted_chart_from_the_same_table() -> None:
    """The definition check, the table and the diagram agree: every branch the table holds
    for the chart is drawn (callbacks, which the diagram could not show, are refused)."""
    from fsm.diagram import extract, to_mermaid

    text = to_mermaid(extract(Kitchen))
    for b in Kitchen.table.declared:
        guards = f" [{', '.join(b.guard_names)}]" if b.guards else ""
        who = "operator override" if b.override else "worker"
        label = f"{b.event}{guards} ({who})"
        if b.declared_on == b.declared_target:  # a self-loop's label is spelled out in the legend note
            label = f"{b.event} ({who}), see note"
        assert f"{b.declared_on} --> {b.declared_target} : {label}" in text
