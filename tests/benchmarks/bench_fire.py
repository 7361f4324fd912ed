"""In-memory ``fire`` against python-statemachine's ``send`` and the ``transitions`` library.

The same lifecycle (Pipeline: start, finish, succeed) runs in all three; only the event
calls are timed, on objects created before the clock starts.
"""

from __future__ import annotations

from collections.abc import Callable

from harness import Report

from fsm import Engine, PipelineLifecycle
from stores import MemoryStore

N = 5_000
N_SLOW = 500
"""python-statemachine costs ~60 us per send: fewer objects keep the CI smoke run short."""
EVENTS = ("start", "finish", "succeed")


def _fsm_fire() -> Callable[[], int]:
    engine = Engine(PipelineLifecycle, MemoryStore())
    ids = [engine.create().id for _ in range(N)]

    def body() -> int:
        fire = engine.fire
        for i in ids:
            fire(i, "start")
            lease = fire(i, "finish").lease
            fire(i, "succeed", lease=lease)
        return 3 * N

    return body


def _statemachine_send() -> Callable[[], int]:
    machines = [PipelineLifecycle.restore("queued", {"holds_lease": True}) for _ in range(N_SLOW)]

    def body() -> int:
        for sm in machines:
            sm.send("start")
            sm.send("finish")
            sm.send("succeed")
        return 3 * N_SLOW

    return body


def _transitions_trigger() -> Callable[[], int]:
    from transitions import Machine

    class Model:
        def holds_lease(self) -> bool:
            return True

    machine = Machine(
        model=None,
        states=["queued", "running", "finalizing", "completed", "failed"],
        transitions=[
            {"trigger": "start", "source": "queued", "dest": "running"},
            {"trigger": "finish", "source": "running", "dest": "finalizing"},
            {"trigger": "succeed", "source": "finalizing", "dest": "completed", "conditions": "holds_lease"},
            {"trigger": "fail", "source": ["running", "finalizing"], "dest": "failed"},
        ],
        initial="queued",
        auto_transitions=False,
    )
    models = [Model() for _ in range(N)]
    for m in models:
        machine.add_model(m)

    def body() -> int:
        for m in models:
            m.trigger("start")  # type: ignore[attr-defined]
            m.trigger("finish")  # type: ignore[attr-defined]
            m.trigger("succeed")  # type: ignore[attr-defined]
        return 3 * N

    return body


def run(report: Report, **_: object) -> None:
    print("fire: in-memory engine vs python-statemachine vs transitions (Pipeline start/finish/succeed)")
    report.measure(
        {
            "fire/memory (fsm Engine + MemoryStore)": _fsm_fire,
            "send/python-statemachine (StateChart.send)": _statemachine_send,
            "trigger/transitions (Machine.trigger)": _transitions_trigger,
        }
    )
    report.ratio(
        "memory fire vs python-statemachine send",
        "fire/memory (fsm Engine + MemoryStore)",
        "send/python-statemachine (StateChart.send)",
        15.0,
    )
    report.ratio(
        "memory fire vs transitions trigger",
        "fire/memory (fsm Engine + MemoryStore)",
        "trigger/transitions (Machine.trigger)",
        1.5,
    )
