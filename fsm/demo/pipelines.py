"""``fsm demo``: the main job.  Replays the seeds' scenarios on a real store.

Time is simulated (a :class:`ManualClock` handed to the store), so an hour of zombie
pipeline or forty minutes of finalizer gates pass in a second; everything else is what
an application would do: engines, leases, the reaper, signals and a database.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
from datetime import timedelta
from typing import Any

import signals
from fsm.clock import ManualClock, SystemClock
from fsm.engine import Engine
from fsm.errors import Fenced, FsmError
from fsm.lifecycles import JobLifecycle, PipelineLifecycle
from fsm.reaping import Reaper
from fsm.records import Lease
from stores.base import Store
from stores.factory import DEFAULT_URL, open_store

DEMO_PREFIX = "fsm_demo_"
"""The demo's table prefix on a SQL store, apart from the default ``fsm_`` tables."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="replay the zombie-pipeline and live-finalizer scenarios on a store",
        description="The main job: pipelines and jobs driven through their lifecycles, with a reaper.",
    )
    parser.add_argument("--db", default=DEFAULT_URL, help="store URL (default: %(default)s)")
    parser.set_defaults(func=run)


def open_simulated(url: str, clock: ManualClock) -> Store:
    """A store whose ``now`` follows ``clock`` (so the demo can skip an hour), in tables of
    its own: the demo's simulated hour must never move an application's entities."""
    return open_store(url, table_prefix=DEMO_PREFIX, clock=clock)


def say(text: str = "") -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:
    if not args.verbose:  # the narrative says what moved; -v shows the reaper's own log lines
        logging.getLogger("fsm.reaper").setLevel(logging.WARNING)
    clock = ManualClock(SystemClock().now())
    try:
        store = open_simulated(args.db, clock)
    except FsmError as err:  # a bad URL, a missing driver, an unreachable database
        print(f"fsm demo: error: {err}", file=sys.stderr)
        return 2
    run_id = secrets.token_hex(3)
    seen: list[str] = []

    def on_transition(sender: str, payload: Any) -> None:
        r = payload.record
        seen.append(f"{sender} {r.entity_id}: {r.source} -> {r.target} ({r.event} by {r.actor})")

    signals.transitioned.connect(on_transition)
    try:
        pipelines_demo(store, clock, run_id)
        jobs_demo(store, clock, run_id)
    except FsmError as err:
        print(f"fsm demo: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    finally:
        signals.transitioned.disconnect(on_transition)
    say()
    where = args.db if args.db == "memory://" else f"{args.db} (tables {DEMO_PREFIX}*)"
    say(f"{len(seen)} transitions committed and signalled; store: {where}")
    if args.db != "memory://":
        say(
            f"see one: fsm diagram fsm.lifecycles:JobLifecycle --db {args.db} --prefix {DEMO_PREFIX} "
            f"--id job-{run_id}-crashed --format svg --out job.svg"
        )
    return 0


def pipelines_demo(store: Store, clock: ManualClock, run_id: str) -> None:
    say("== seeds/000: zombie pipelines ==")
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


def jobs_demo(store: Store, clock: ManualClock, run_id: str) -> None:
    say()
    say("== seeds/002: a slow finalizer is never reaped; a dead one is reclaimed ==")
    slow_worker = Engine(JobLifecycle, store, clock=clock, owner=f"worker-a-{run_id}")
    dead_worker = Engine(JobLifecycle, store, clock=clock, owner=f"worker-b-{run_id}")
    reaper = Reaper(store, [JobLifecycle], clock=clock)
    rescuer = Engine(JobLifecycle, store, clock=clock, owner=f"worker-c-{run_id}")
    rescue: dict[str, Lease] = {}

    def resume_finalization(sender: str, payload: Any) -> None:
        # a reclaim fences the dead owner and leaves the lease free: a worker claims it
        if payload.snapshot.id == dead:
            for snap in rescuer.claim(limit=10):
                if snap.id == dead and snap.lease is not None:
                    rescue["lease"] = snap.lease

    slow, dead = f"job-{run_id}-deploy-staging", f"job-{run_id}-crashed"
    slow_worker.create(slow)
    lease = slow_worker.fire(slow, "start").lease
    assert lease is not None
    slow_worker.fire(slow, "exited", lease=lease, data={"exit_code": 0})
    dead_worker.create(dead)
    dead_lease = dead_worker.fire(dead, "start").lease
    assert dead_lease is not None
    dead_worker.fire(dead, "exited", lease=dead_lease, data={"exit_code": 0})
    say(f"{slow}: finalizing; runs security, merge-gate re-test, coverage, image-freshness for 40 min")
    say(f"{dead}: finalizing; its monitor process dies")
    signals.reclaimed.connect(resume_finalization)
    ticks = 0
    try:
        for minute in range(1, 41):
            clock.advance(timedelta(minutes=1))
            lease = slow_worker.renew_lease(lease)  # the live finalizer heartbeats every minute
            if "lease" in rescue:
                rescue["lease"] = slow_worker.renew_lease(rescue["lease"])  # the new owner heartbeats too
            if minute % 5 == 0:
                reaper.run_once()
                ticks += 1
    finally:
        signals.reclaimed.disconnect(resume_finalization)
    say(f"after 40 min and {ticks} reaper ticks (a fixed 300 s grace would have re-run the gates):")
    for jid in (slow, dead):
        snap = slow_worker.get(jid)
        say(f"  {jid}: {snap.state}, lease owner {snap.lease_owner}, token {snap.lease_token}")
    slow_worker.fire(slow, "complete", lease=lease, data={"gates": {"merge-gate": {"status": "passed"}}})
    say(f"  {slow}: completed by its own finalizer, never expired nor reclaimed")
    try:
        dead_worker.fire(dead, "complete", lease=dead_lease)
    except Fenced as err:
        say(f"  the dead monitor's late write is refused: {err}")
    new_lease = rescue["lease"]
    slow_worker.fire(dead, "complete", lease=new_lease)
    say(f"  {dead}: reclaimed once, claimed and completed by a new owner (token {new_lease.token})")
    history = " -> ".join(f"{r.event}" for r in store.history(dead))
    say(f"  history of {dead}: {history}")


__all__ = ["register", "run"]
