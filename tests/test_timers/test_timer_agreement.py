"""Each timed branch's timer mode is what python-statemachine's own microstep does (the
random-sequence agreement of I7 runs these lifecycles too, in
tests/test_table_agrees_with_statemachine.py): ``ARM`` exactly when the target's timed
state is entered, ``KEEP`` when the entity stays inside it, ``CLEAR`` when it leaves every
timed state.  The oracle is a listener on a live chart, not the framework's own code."""

from __future__ import annotations

from typing import Any

import pytest
from statemachine import State

from fsm import Lifecycle, reaper, starts, worker
from fsm.records import TimerMode

from .charts import Approval, Nested, Reminder

LIFECYCLES: list[type[Lifecycle]] = [Approval, Reminder, Nested]


class _Entered:
    """A python-statemachine listener recording the states each microstep exits and enters."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.exited: list[str] = []

    def on_enter_state(self, state: Any) -> None:
        self.entered.append(state.id)

    def on_exit_state(self, state: Any) -> None:
        self.exited.append(state.id)


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda lc: lc.__name__)
def test_each_branch_arms_keeps_or_clears_as_the_statechart_enters_and_leaves(lifecycle: type[Lifecycle]) -> None:
    table = lifecycle.table
    for branch in table.declared:
        outcome = {g.name: expected for g, expected in branch.guards}
        chart = lifecycle.restore(branch.source, outcome)
        watch = _Entered()
        chart.add_listener(watch)  # type: ignore[no-untyped-call]
        chart.send(branch.event)
        assert {s.id for s in chart.configuration} == set(table.configurations[branch.target])
        scope = table.timed.get(branch.target)
        if scope is None:
            expected = TimerMode.CLEAR if table.timed.get(branch.source) else TimerMode.KEEP
        else:
            expected = TimerMode.ARM if scope in watch.entered else TimerMode.KEEP
        assert branch.timer is expected, (lifecycle.__name__, branch.event, branch.source, watch.entered)


def test_timers_on_two_states_of_one_path_are_refused() -> None:
    from fsm import InvalidDefinition

    with pytest.raises(InvalidDefinition, match="both have timed transitions"):

        class Both(Lifecycle):
            a = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            b = State(final=True)
            go = starts(a.to(active))
            finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
            outer = reaper(active.to(b, cond="lease_stale"), after=60)
            inner = reaper(active.running.to(b), after=30)


def test_a_user_guard_cannot_take_a_timer_guard_name() -> None:
    from fsm import GuardContext, InvalidDefinition, guard

    with pytest.raises(InvalidDefinition, match="generated guard"):

        class Clash(Lifecycle):
            a = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            b = State(final=True)
            go = starts(a.to(active))
            finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
            succeed = worker(active.finalizing.to(b, cond="holds_lease"))
            late = reaper(a.to(b), after=60)

            @guard
            def after_1m(ctx: GuardContext) -> bool:
                return True
