"""python-statemachine's delayed events (``Event(..., delay=ms)``) run as delayed fires:
``fire`` refuses them (they are never fired at once), ``fire_later`` waits the declared
delay, and when due the event fires if the chart allows it, as python-statemachine
processes it then, or is dropped with the refusal python-statemachine raises."""

from __future__ import annotations

from datetime import timedelta

import pytest
from statemachine import Event, State
from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed

from fsm import Engine, InvalidArgument, Lifecycle, ManualClock, reaper, starts, worker
from fsm.reaping import Reaper
from stores import MemoryStore


class Remind(Lifecycle):
    """A reminder that nags 200 ms after it is asked to, unless it was closed meanwhile."""

    kind = "remind"
    idle = State(initial=True)
    waiting = State()

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    nagged = State(final=True)
    closed = State(final=True)

    ask = worker(idle.to(waiting))
    nag = Event(worker(waiting.to(nagged)), delay=200)
    close = worker(waiting.to(closed) | idle.to(closed))
    start = starts(idle.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(closed, cond="holds_lease"))
    reap = reaper(active.finalizing.to(closed, cond="lease_stale"))


def test_a_delayed_event_is_never_fired_at_once() -> None:
    clock = ManualClock()
    engine = Engine(Remind, MemoryStore(clock=clock), clock=clock)
    engine.create("r1")
    engine.fire("r1", "ask")
    with pytest.raises(InvalidArgument, match="declared with delay=200 ms: fire it with fire_later"):
        engine.fire("r1", "nag")
    assert engine.get("r1").state == "waiting"


@pytest.mark.parametrize("close_first", [False, True])
def test_a_delayed_event_ends_where_python_statemachine_ends(close_first: bool) -> None:
    """The same steps through python-statemachine (which blocks for the delay, then
    processes the event) and through the engine (fire_later, then the reaper when due)."""
    chart = Remind.restore("idle")
    chart.send("ask")
    refused = None
    if close_first:
        chart.send("close")
    try:
        chart.send("nag")  # waits 200 ms, then processes it
    except SmNotAllowed as err:
        refused = err
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    engine = Engine(Remind, store, clock=clock)
    engine.create("r1")
    engine.fire("r1", "ask")
    request = engine.fire_later("r1", "nag")
    assert request.due == clock.now() + timedelta(milliseconds=200)  # the declared delay
    if close_first:
        engine.fire("r1", "close")
    clock.advance(timedelta(milliseconds=200))
    Reaper(store, [Remind], clock=clock).run_once()
    assert {s.id for s in chart.configuration} == set(Remind.table.configurations[engine.get("r1").state])
    outcome = engine.delayed(request.id)
    assert (outcome.state == "dropped") is (refused is not None)
    if refused is not None:
        assert outcome.outcome is not None and outcome.outcome.startswith("TransitionNotAllowed")
