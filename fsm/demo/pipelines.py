"""The demo's first act (seeds/000): zombie pipelines, on simulated time.

Time is simulated (a :class:`ManualClock` handed to the store), so an hour of zombie
pipeline passes in a moment; everything else is what an application would do: engines,
the reaper, signals and a database.
"""

from __future__ import annotations

from datetime import timedelta

from fsm.clock import ManualClock, SystemClock
from fsm.engine import Engine
from fsm.lifecycles import PipelineLifecycle
from fsm.reaping import Reaper
from fsm.reaping.ticklog import TickLog
from stores.base import Store
from stores.factory import open_store

DEMO_PREFIX = "fsm_demo_"
"""The demo's table prefix on a SQL store, apart from the default ``fsm_`` tables."""


def open_simulated(url: str, clock: ManualClock) -> Store:
    """A store whose ``now`` follows ``clock`` (so the demo can skip an hour), in tables of
    its own: the demo's simulated hour must never move an application's entities."""
    return open_store(url, table_prefix=DEMO_PREFIX, clock=clock)


def say(text: str = "") -> None:
    print(text, flush=True)


def pipelines_demo(store: Store, clock: ManualClock, run_id: str) -> list[str]:
    """The zombie pipelines; returns their ids."""
    say("== zombie pipelines ==")
    pipelines = Engine(PipelineLifecycle, store, clock=clock)
    reaper = Reaper(store, [PipelineLifecycle], clock=clock)
    steps = {"steps": [{"name": "build", "status": "completed"}, {"name": "deploy", "status": "running"}]}
    zombie, fresh = f"pipe-{run_id}-lost-webhook", f"pipe-{run_id}-fresh"
    old, new = f"pipe-{run_id}-main-old", f"pipe-{run_id}-main-new"
    pipelines.create(zombie, data=steps)
    pipelines.fire(zombie, "start")
    say(f"{zombie}: running; its success webhook is lost")
    clock.advance(timedelta(minutes=30))
    pipelines.create(old, data=steps, concurrency_key=f"{run_id}/main")
    pipelines.fire(old, "start")
    clock.advance(timedelta(minutes=20))
    pipelines.create(fresh, data=steps)
    pipelines.fire(fresh, "start")
    pipelines.create(new, data=steps, concurrency_key=f"{run_id}/main")
    pipelines.fire(new, "start")
    say(f"{new}: a newer run of the same branch starts while {old} still runs")
    clock.advance(timedelta(minutes=11))
    result = reaper.run_once()
    TickLog(store).record(result, reaper.owner)  # fsm inspect shows it
    say(f"reaper tick at +61 min: {result.summary()}")
    say("  (expired: idle for 60 min; duplicate: a newer run of the same concurrency key is running)")
    for pid in (zombie, fresh, old, new):
        snap = pipelines.get(pid)
        last = pipelines.history(pid)[-1]
        reason = f" (reason: {last.reason})" if last.reason else ""
        say(f"  {pid}: {snap.state}{reason}")
    for pid in (fresh, new):  # their webhooks do arrive: finish, then succeed under the finalizer lease
        lease = pipelines.fire(pid, "finish").lease
        pipelines.fire(pid, "succeed", lease=lease)
    say(f"  {fresh}, {new}: finished and succeeded under their finalizer leases")
    clock.set(max(clock.now(), SystemClock().now()))  # what follows runs in real time
    return [zombie, fresh, old, new]


__all__ = ["DEMO_PREFIX", "open_simulated", "pipelines_demo"]
