"""Timed lifecycles agree with python-statemachine (I7), and each branch's timer mode is
what python-statemachine's own microstep does: ``ARM`` exactly when the target's timed
state is entered, ``KEEP`` when the entity stays inside it, ``CLEAR`` when it leaves every
timed state.  The oracle is a listener on a live chart, not the framework's own code."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statemachine import State

from fsm import Lifecycle, reaper, starts, worker
from fsm.records import TimerMode
from fsm.testing.agreement import check_agreement

from .charts import Approval, Reminder


class Nested(Lifecycle):
    """A timer on a compound state with a nested compound inside, internal and external
    self-transitions, and a transition from the timed state into its own child."""

    kind = "nested"
    idle = State(initial=True)

    class active(State.Compound):
        class running(State.Compound):
            fetch = State(initial=True)
            build = State()

        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(idle.to(active))
    step = worker(active.running.fetch.to(active.running.build))
    again = worker(active.running.to.itself(internal=True))  # type: ignore[no-untyped-call]
    restart = worker(active.running.to.itself())  # type: ignore[no-untyped-call]
    reset = worker(active.to(active.running.build, cond="holds_lease"))  # external: leaves and re-enters ``active``
    finish = worker(active.running.build.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    deadline = reaper(active.to(failed, cond="lease_stale"), after=timedelta(minutes=30))


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


def _steps(lifecycle: type[Lifecycle]) -> Any:
    names = sorted(lifecycle.guards)
    guard_values = st.fixed_dictionaries({n: st.booleans() for n in names})
    return st.lists(st.tuples(st.sampled_from(lifecycle.table.events), guard_values), max_size=25)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_I7_timed_lifecycles_agree_with_statemachine(data: st.DataObject) -> None:
    lifecycle = data.draw(st.sampled_from(LIFECYCLES))
    check_agreement(lifecycle, data.draw(_steps(lifecycle)))


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
