"""The typed transition builders: itself() is python-statemachine's self-transition, and the
builders refuse what is not a transition with InvalidDefinition."""

from __future__ import annotations

from typing import Any

import pytest

from fsm import Engine, InvalidDefinition, LeaseChange, Lifecycle, State, itself, operator_override, reaper, worker
from stores import MemoryStore


class Beat(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active), lease=LeaseChange.ACQUIRE)
    beat = worker(itself(active.running, cond="holds_lease"))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = operator_override(active.to(failed))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")


def test_itself_is_a_self_transition_that_keeps_the_state_and_moves_the_version() -> None:
    engine = Engine(Beat, MemoryStore())
    entity = engine.create()
    lease = engine.fire(entity.id, "start").lease
    assert lease is not None
    beaten = engine.fire(entity.id, "beat", lease=lease).snapshot
    assert (beaten.state, beaten.version) == ("running", 2)
    assert [(h.source, h.target) for h in engine.history(entity.id)][-1] == ("running", "running")


@pytest.mark.parametrize("builder", [worker, reaper, operator_override])
@pytest.mark.parametrize("wrong", [None, "queued.to(done)", 42, State(), [1, 2]])
def test_the_builders_refuse_what_is_not_a_transition(builder: Any, wrong: object) -> None:
    with pytest.raises(InvalidDefinition, match="takes transitions"):
        builder(wrong)


def test_itself_refuses_what_is_not_a_state() -> None:
    for wrong in (None, "running", 3):
        with pytest.raises(InvalidDefinition, match="takes a state"):
            itself(wrong)  # type: ignore[arg-type]
