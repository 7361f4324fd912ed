"""I7: the compiled table and python-statemachine's own engine agree.

Hypothesis drives random event sequences, with random guard outcomes at every step,
through both; after each step they must be in the same configuration, and a StateChart
restored from the persisted leaf alone must be in that configuration too.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed
from test_definitions import Deploy
from tests_support import Untyped

from fsm import JobLifecycle, Lifecycle, PipelineLifecycle

LIFECYCLES: list[type[Lifecycle]] = [PipelineLifecycle, JobLifecycle, Deploy, Untyped]


def _steps(lifecycle: type[Lifecycle]) -> Any:
    names = sorted(lifecycle.guards)
    guard_values = st.fixed_dictionaries({n: st.booleans() for n in names})
    return st.lists(st.tuples(st.sampled_from(lifecycle.table.events), guard_values), max_size=25)


def _agree(lifecycle: type[Lifecycle], steps: list[tuple[str, dict[str, bool]]]) -> None:
    table = lifecycle.table
    values: dict[str, bool] = {}
    reference = lifecycle.restore(table.initial, values)
    leaf = table.initial
    for event, outcome in steps:
        values.clear()
        values.update(outcome)
        branch = table.select(leaf, event, lambda b, o=outcome: all(o[g.name] is want for g, want in b.guards))
        try:
            reference.send(event)
            moved = True
        except SmNotAllowed:
            moved = False
        assert moved == (branch is not None), (leaf, event, outcome)
        if branch is not None:
            leaf = branch.target
        assert set(reference.configuration_values) == set(table.configurations[leaf]), (leaf, event, outcome)
        restored = lifecycle.restore(leaf, values)
        assert set(restored.configuration_values) == set(reference.configuration_values)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_I7_compiled_table_and_statemachine_agree_on_random_sequences(data: st.DataObject) -> None:
    lifecycle = data.draw(st.sampled_from(LIFECYCLES))
    _agree(lifecycle, data.draw(_steps(lifecycle)))


def test_I7_every_declared_branch_is_reachable_and_agrees() -> None:
    """A deterministic sweep: from every leaf, every event under every single-guard outcome."""
    for lifecycle in LIFECYCLES:
        names = sorted(lifecycle.guards)
        outcomes = [dict.fromkeys(names, True), dict.fromkeys(names, False)]
        outcomes += [{**dict.fromkeys(names, True), n: False} for n in names]
        for leaf in lifecycle.table.leaves:
            for event in lifecycle.table.events:
                for outcome in outcomes:
                    reference = lifecycle.restore(leaf, outcome)
                    branch = lifecycle.table.select(
                        leaf, event, lambda b, o=outcome: all(o[g.name] is e for g, e in b.guards)
                    )
                    try:
                        reference.send(event)
                    except SmNotAllowed:
                        assert branch is None, (lifecycle.__name__, leaf, event, outcome)
                        continue
                    assert branch is not None, (lifecycle.__name__, leaf, event, outcome)
                    assert set(reference.configuration_values) == set(lifecycle.table.configurations[branch.target])
