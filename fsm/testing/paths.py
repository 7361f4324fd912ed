"""Path generation, as XState's model-based testing does it, with leases, a clock and a
reaper: the shortest sequence of steps to every state and to every transition branch.

A step is one of

- ``fire``: an event by an actor (worker with the lease it holds, or reaper), with the
  data patch a user guard needs (from ``guard_data``);
- ``acquire``: the worker takes the entity's free or expired lease;
- ``clock``: time passes, past the lease TTL or past ``stale_after``;
- ``sibling``: a newer entity with the same concurrency key is driven to the same state
  (what ``superseded`` needs).

The search is breadth first over *concrete* runs on a memory store and a manual clock,
so every guard is judged by the engine itself (counters, lease staleness, the order in
which the statechart tries branches); each path records the guard values its fires
needed.  :func:`replay` runs a path on any engine and checks that every fire took the
branch the path says; :func:`path_cases` turns paths into readable pytest parameters.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from fsm.clock import ManualClock
from fsm.engine import Engine
from fsm.engine.judge import choose
from fsm.errors import FsmError
from fsm.lifecycle import Lifecycle
from fsm.records import Actor, Snapshot
from fsm.regions import exit_event, region_row_id
from fsm.table import AUTOMATIC
from fsm.testing.coverage import branch_name
from stores.memory import MemoryStore

GuardHints = Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]
MAIN = "path-entity"
CONCURRENCY_KEY = "path-key"


@dataclass(frozen=True)
class Step:
    """One step of a path; ``source``/``target``/``guards``/``branch`` are filled once run."""

    kind: str
    event: str | None = None
    actor: Actor | None = None
    data: str | None = None
    """The fire's data patch, as JSON (steps are hashable)."""
    advance: timedelta | None = None
    source: str | None = None
    target: str | None = None
    guards: tuple[tuple[str, bool], ...] = ()
    branch: str | None = None
    region: str | None = None
    """A region's step (:mod:`fsm.regions`): the event is fired on that region's row."""

    @property
    def patch(self) -> dict[str, Any] | None:
        return None if self.data is None else dict(json.loads(self.data))

    def describe(self) -> str:
        if self.kind == "fire":
            needs = ", ".join(n if v else f"not {n}" for n, v in self.guards)
            data = f" with data {self.data}" if self.data else ""
            actor = self.actor.value if self.actor is not None else "?"
            where = f" on region {self.region}" if self.region else ""
            return f"{actor} fires {self.event}{where}{data}: {self.source} -> {self.target}" + (
                f" (needs {needs})" if needs else ""
            )
        of = f" of region {self.region}" if self.region else ""
        if self.kind == "acquire":
            return f"the worker takes the lease{of}"
        if self.kind == "release":
            return f"the worker gives the lease{of} back (a stopping worker)"
        if self.kind == "clock":
            return f"the clock advances {self.advance}"
        return "a newer entity with the same concurrency key reaches the same state"


@dataclass(frozen=True)
class Path:
    """The steps to a goal (a state, or a transition branch) from a new entity."""

    goal: str
    steps: tuple[Step, ...]

    @property
    def name(self) -> str:
        return f"{self.goal} in {len(self.steps)}: " + ", ".join(_short(s) for s in self.steps)

    def describe(self) -> str:
        lines = [f"to {self.goal}:"]
        lines += [f"  {i}. {s.describe()}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)

    @property
    def clock_moves(self) -> list[timedelta]:
        return [s.advance for s in self.steps if s.advance is not None]

    @property
    def guard_values(self) -> dict[str, bool]:
        return {n: v for s in self.steps for n, v in s.guards}


def _short(step: Step) -> str:
    if step.kind == "fire":
        return f"{step.event}{'(reaper)' if step.actor is Actor.REAPER else ''}"
    if step.kind == "clock":
        return f"+{step.advance}"
    return step.kind


@dataclass(frozen=True)
class PathSet:
    """Shortest paths to every reachable state and branch, and what was unreachable."""

    lifecycle: str
    states: dict[str, Path]
    transitions: dict[str, Path]
    unreachable_states: list[str]
    unreachable_transitions: list[str]

    def all(self) -> list[Path]:
        return [*self.states.values(), *self.transitions.values()]


class _Run:
    """One concrete run of steps on an engine, entity ``MAIN``."""

    def __init__(self, engine: Engine, clock: ManualClock, guard_data: GuardHints, entity_id: str = MAIN) -> None:
        self.engine = engine
        self.clock = clock
        self.guard_data = guard_data
        self.entity_id = entity_id
        self.sibling: str | None = None
        self.done: list[Step] = []
        engine.create(entity_id, concurrency_key=CONCURRENCY_KEY)

    @property
    def snap(self) -> Snapshot:
        return self.engine.get(self.entity_id)

    def _lease(self, snap: Snapshot) -> Any:
        lease = snap.lease
        return lease if lease is not None and lease.owner == self.engine.owner else None

    def step(self, step: Step) -> Step:
        """Run ``step``; raise ``AssertionError`` saying what failed."""
        snap = self.snap
        if step.kind == "clock":
            assert step.advance is not None
            self.clock.advance(step.advance)
            ran = step
        elif step.kind in ("acquire", "release"):
            engine, entity_id = self.engine, self.entity_id
            if step.region is not None:  # a region's row
                engine, entity_id = engine.region(step.region), region_row_id(entity_id, step.region)
                snap = engine.get(entity_id)
            if step.kind == "acquire":
                engine.acquire_lease(entity_id)
            else:
                lease = self._lease(snap)
                if lease is None:
                    raise AssertionError("the worker holds no lease to give back")
                engine.release_lease(lease)
            ran = step
        elif step.kind == "sibling":
            sibling = f"{self.entity_id}-sibling-{len(self.done)}"
            mirror = _Run(self.engine, self.clock, self.guard_data, sibling)
            for done in self.done:
                if done.kind in ("fire", "acquire"):
                    mirror.step(replace(done, source=None, target=None, guards=(), branch=None))
            if mirror.snap.state != snap.state:
                raise AssertionError(f"the sibling reached {mirror.snap.state}, not {snap.state}")
            self.sibling = sibling
            ran = step
        else:
            assert step.event is not None and step.actor is not None
            engine, entity_id = self.engine, self.entity_id
            if step.region is not None:  # a region's event, on its row
                engine, entity_id = engine.region(step.region), region_row_id(entity_id, step.region)
                snap = engine.get(entity_id)
            judged = snap if step.data is None else snap._replace(data={**snap.data, **(step.patch or {})})
            lease = self._lease(snap) if step.actor is Actor.WORKER else None
            branch = choose(
                engine.table,
                engine.policy,
                self.clock,
                engine.store,
                judged,
                step.event,
                step.actor,
                lease,
            )
            result = engine.fire(entity_id, step.event, lease=lease, actor=step.actor, data=step.patch)
            if step.target is not None and result.state != step.target:
                raise AssertionError(f"{step.describe()}: went to {result.state} instead")
            ran = replace(
                step,
                source=snap.state,
                target=result.state,
                guards=tuple((g.name, expected) for g, expected in branch.guards),
                branch=branch_name(branch),
            )
        self.done.append(ran)
        return ran

    def key(self) -> tuple[Any, ...]:
        snap = self.snap
        now, policy = self.clock.now(), self.engine.policy
        stale = snap.lease_is_stale(now, policy.stale_after)
        unclaimed = snap.lease_owner is None and snap.updated_at < now - policy.max_wait
        sibling = None if self.sibling is None else self.engine.get(self.sibling).state
        regions = tuple(
            (
                row.state,
                self._lease(row) is not None,
                row.lease_owner is None,
                row.lease_is_stale(now, policy.stale_after),
                row.lease_owner is None and row.updated_at < now - policy.max_wait,
                row.attempt,
                row.reclaims,
            )
            for region in self.engine.table.parallel.get(snap.state, ())
            for row in (self.engine.store.get(region_row_id(self.entity_id, region)),)
        )
        return (
            regions,
            snap.state,
            self._lease(snap) is not None,
            snap.lease_owner is None,
            stale,
            unclaimed,
            snap.attempt,
            snap.reclaims,
            json.dumps(snap.data, sort_keys=True),
            json.dumps(snap.memory, sort_keys=True),
            sibling,
        )

    def actions(self) -> list[Step]:
        snap = self.snap
        table = self.engine.table
        if snap.state in table.finals:
            return []
        found: list[Step] = []
        policy = self.engine.policy
        for event in table.events:
            branches = table.branches_for(snap.state, event)
            for actor in sorted({b.actor for b in branches}):
                patches: list[str | None] = [None]
                for b in branches:
                    # the branch's guards, and those of the eventless steps it may take next
                    for g, _ in (*b.guards, *(x for a in table.automatic.get(b.target, ()) for x in a.guards)):
                        for name in g.names:
                            patches += [json.dumps(dict(p), sort_keys=True) for p in self.guard_data.get(name, ())]
                found += [Step("fire", event, actor, p) for p in dict.fromkeys(patches)]
        for region in table.parallel.get(snap.state, ()):  # each region's events, on its row
            engine = self.engine.region(region)
            row = engine.get(region_row_id(self.entity_id, region))
            if row.state in engine.table.finals:
                continue
            for event in engine.table.events:
                actors = {b.actor for b in engine.table.branches_for(row.state, event)}
                found += [Step("fire", event, actor, region=region) for actor in sorted(actors)]
            found.append(Step("acquire", region=region))
            if self._lease(row) is not None:
                found.append(Step("release", region=region))
        found.append(Step("acquire"))
        if self._lease(snap) is not None:
            found.append(Step("release"))
        found += [
            Step("clock", advance=d)
            for d in (
                policy.lease_ttl + timedelta(seconds=1),
                policy.stale_after + timedelta(seconds=1),
                policy.max_wait + timedelta(seconds=1),  # a wait for a worker reaches its backstop
            )
        ]
        if self.sibling is None and any(g.name == "superseded" for b in table.declared for g, _ in b.guards):
            found.append(Step("sibling"))
        return found


def _joined(lifecycle: type[Lifecycle], run: _Run) -> list[str]:
    """The join branches (under each of their event names) the run's last step took, if it
    joined the entity (the engine fires the join itself after a region's final write)."""
    parallel = lifecycle.table.parallel
    for last in reversed(run.engine.store.history(run.entity_id)):
        if last.source in parallel and last.event.startswith("done.state."):
            break  # the join
        if last.event.startswith("done.state.") or last.event == AUTOMATIC:
            continue  # a step the join took in its commit (a holding compound's completion...)
        return []
    else:
        return []
    return [
        branch_name(b)
        for b in lifecycle.table.declared
        if b.source == last.source and b.target == last.target and b.event in run.engine._join_events
    ]


def shortest_paths(
    lifecycle: type[Lifecycle], *, guard_data: GuardHints | None = None, max_length: int = 12
) -> PathSet:
    """The shortest path to every state and to every declared branch of ``lifecycle``.

    ``guard_data``: for each of your ``@guard`` names, a data patch making it true and
    one making it false (as for :func:`fsm.testing.lifecycle_machine`).
    """
    hints = dict(guard_data or {})
    states: dict[str, Path] = {}
    transitions: dict[str, Path] = {}
    seen: set[tuple[Any, ...]] = set()
    queue: deque[tuple[Step, ...]] = deque([()])
    while queue:
        steps = queue.popleft()
        clock = ManualClock()
        engine = Engine(lifecycle, MemoryStore(clock=clock), clock=clock, owner="path-worker")
        run = _Run(engine, clock, hints)
        try:
            ran = tuple(run.step(s) for s in steps)
        except (FsmError, AssertionError):
            continue
        if ran and ran[-1].branch is not None:
            transitions.setdefault(ran[-1].branch, Path(ran[-1].branch, ran))
        if ran and ran[-1].region is not None:  # a region's last step may have joined the entity
            for name in _joined(lifecycle, run):
                transitions.setdefault(name, Path(name, ran))
        state = run.snap.state
        states.setdefault(state, Path(f"state {state}", ran))
        key = run.key()
        if key in seen or len(steps) >= max_length:
            continue
        seen.add(key)
        queue.extend((*steps, a) for a in run.actions())
    # each region's branches too, but not a region's exit (the engine's, taken when its
    # parallel state is left)
    exits = {exit_event(p) for p in lifecycle.table.parallel}
    regions = [c.table for found in lifecycle.regions.values() for c in found.values()]
    declared = list(
        dict.fromkeys(
            [
                *(branch_name(b) for b in lifecycle.table.declared),
                *(branch_name(b) for t in regions for b in t.declared if b.event not in exits),
            ]
        )
    )
    return PathSet(
        lifecycle=lifecycle.__name__,
        states={s: states[s] for s in lifecycle.table.leaves if s in states},
        transitions={n: transitions[n] for n in declared if n in transitions},
        unreachable_states=[s for s in lifecycle.table.leaves if s not in states],
        unreachable_transitions=[n for n in declared if n not in transitions],
    )


def replay(path: Path, engine: Engine, clock: ManualClock, entity_id: str | None = None) -> Snapshot:
    """Run ``path`` on ``engine`` (whose store uses ``clock``) on a new entity; every
    fire must take the branch the path names.  Returns the entity at the end."""
    run = _Run(engine, clock, {}, entity_id or f"{MAIN}-{id(path):x}")
    for i, step in enumerate(path.steps, 1):
        try:
            ran = run.step(step)
        except (FsmError, AssertionError) as err:
            raise AssertionError(f"step {i} of the path {path.goal}: {step.describe()}: {err}") from err
        if step.branch is not None and ran.branch != step.branch:
            raise AssertionError(f"step {i} took {ran.branch}, the path expected {step.branch}")
    return run.snap


def path_cases(lifecycle: type[Lifecycle], *, guard_data: GuardHints | None = None) -> list[Any]:
    """Every shortest path as a ``pytest.param`` with a readable id, for
    ``@pytest.mark.parametrize("path", path_cases(MyLifecycle))``; unreachable states or
    branches become failing params naming them."""
    import pytest

    found = shortest_paths(lifecycle, guard_data=guard_data)
    cases = [pytest.param(p, id=p.name) for p in found.all()]
    for missing in [*found.unreachable_states, *found.unreachable_transitions]:
        cases.append(pytest.param(None, id=f"UNREACHABLE {missing}"))
    return cases


__all__ = ["Path", "PathSet", "Step", "path_cases", "replay", "shortest_paths"]
