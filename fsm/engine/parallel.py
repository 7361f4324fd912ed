"""The engine's side of parallel regions (:mod:`fsm.regions`): entering a parallel state
with its regions' rows in one transaction, and the join once every region is final."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fsm.engine.announce import announce
from fsm.engine.result import ChainedResult, FireResult
from fsm.engine.writes import write_for
from fsm.errors import ConfigError, FsmError, InvalidArgument, TransitionNotAllowed, UnknownEntity
from fsm.limits import MAX_CREATE_MANY
from fsm.records import Actor, HistoryRecord, LeaseChange, NewEntity, Snapshot, TimerMode, TransitionWrite
from fsm.regions import all_final, exit_event, join_event, region_row_id, region_rows
from fsm.table import Branch

if TYPE_CHECKING:
    from fsm.engine.engine import Engine

log = logging.getLogger("fsm.regions")


def region_entities(engine: Engine, entity_id: str, parallel: str, data: dict[str, Any]) -> list[NewEntity]:
    """A new row per region of ``parallel`` for the entity, each at its initial state."""
    made: list[NewEntity] = []
    for region, cls in engine.lifecycle.regions[parallel].items():
        made.append(
            NewEntity(
                id=region_row_id(entity_id, region),
                kind=cls.kind,
                state=cls.table.initial,
                data=dict(data),
                arm_timer=cls.table.arms_on_create(),
                parent_id=entity_id,
                definition=cls.version,
            )
        )
    return made


def create_with_regions(engine: Engine, entities: list[NewEntity]) -> list[Snapshot]:
    """Entities created in their (parallel) initial state with every region's row, all in
    one ``store.apply_group``."""
    parallel = engine.table.initial
    rows = 1 + len(engine.table.parallel[parallel])
    if len(entities) * rows > MAX_CREATE_MANY:
        raise InvalidArgument(
            f"a create of this lifecycle inserts {rows} rows per entity (the entity and its regions): at most "
            f"{MAX_CREATE_MANY // rows} entities per call, not {len(entities)}"
        )
    creates: list[NewEntity] = []
    for entity in entities:
        creates += [entity, *region_entities(engine, entity.id, parallel, entity.data)]
    _, made = _apply_group(engine, [], creates)
    _notify(engine, parallel)
    mine = {entity.id for entity in entities}
    return [snap for snap in made if snap.id in mine]


def _apply_group(
    engine: Engine, writes: list[TransitionWrite], creates: list[NewEntity]
) -> tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]]:
    apply_group = getattr(engine.store, "apply_group", None)
    if apply_group is None:
        raise ConfigError(f"{type(engine.store).__name__} cannot enter a parallel state (it has no apply_group)")
    done: tuple[list[tuple[Snapshot, HistoryRecord]], list[Snapshot]] = apply_group(writes, creates)
    return done


def _notify(engine: Engine, parallel: str) -> None:
    """Wake the regions' workers: their rows are claimable (a restarted row wakes no one
    by itself)."""
    notify = getattr(engine.store, "notify_work", None)
    if notify is not None:
        for cls in engine.lifecycle.regions[parallel].values():
            notify(cls.kind)


def enter_regions(engine: Engine, writes: list[TransitionWrite], branches: list[Branch]) -> FireResult:
    """Commit the entity's writes into a parallel state with a row per region (created, or
    restarted at its initial state on a later visit) in one ``store.apply_group``."""
    parallel = branches[-1].target
    entity_id = writes[0].entity_id
    data = next((w.data for w in reversed(writes) if w.data is not None), None)
    if data is None:
        before = writes[0].before
        data = before.data if before is not None else engine.store.get(entity_id).data
    lifecycles = engine.lifecycle.regions[parallel]
    creates: list[NewEntity] = []
    restarts: list[TransitionWrite] = []
    for region, row in region_rows(engine.store, entity_id, lifecycles).items():
        cls = lifecycles[region]
        table = cls.table
        arms = table.arms_on_create()
        if row is None:
            creates += [e for e in region_entities(engine, entity_id, parallel, data) if e.kind == cls.kind]
        elif row.deleted or row.kind != cls.kind or row.state not in table.finals:
            raise ConfigError(
                f"cannot enter {parallel!r} on {entity_id!r}: region row {row.id!r} is "
                f"{'deleted' if row.deleted else repr(row.kind) + ' in ' + repr(row.state)}, not a final state of "
                f"region {region!r}"
            )
        else:  # a later visit: the region starts again at its initial state, due at once
            restarts.append(
                TransitionWrite(
                    entity_id=row.id,
                    event=writes[-1].event,
                    source=row.state,
                    target=table.initial,
                    actor=writes[-1].actor,
                    expect_version=row.version,
                    lease_change=LeaseChange.CLEAR,
                    data=dict(data),
                    reason=f"entered {parallel} again",
                    run_after=timedelta(0),
                    timer=TimerMode.ARM if arms else (TimerMode.CLEAR if table.has_timers else TimerMode.KEEP),
                    before=row,
                )
            )
    results, _ = _apply_group(engine, [*writes, *restarts], creates)
    _notify(engine, parallel)
    mine = results[: len(writes)]
    for (new, record), branch in zip(mine, branches, strict=True):
        announce(engine.kind, new, record, branch)
    if len(mine) == 1:
        return FireResult(*mine[0])
    return ChainedResult(mine[-1][0], mine[0][1], steps=tuple(record for _, record in mine[1:]))


def region_engine(engine: Engine, region: object) -> Engine:
    """The engine of one region of ``engine``'s lifecycle, on the same store (made once)."""
    from fsm.engine.engine import Engine
    from fsm.errors import InvalidArgument

    made: dict[str, Engine] = engine.__dict__.setdefault("_region_engines", {})
    if isinstance(region, str) and region in made:
        return made[region]
    found = {r: cls for regions in engine.lifecycle.regions.values() for r, cls in regions.items()}
    if not isinstance(region, str) or region not in found:
        known = ", ".join(sorted(found)) or "none: it has no parallel state"
        raise InvalidArgument(f"{engine.lifecycle.__name__} has no region {str(region)[:60]!r} (regions: {known})")
    made[region] = Engine(found[region], engine.store, clock=engine.clock, policy=engine.policy, owner=engine.owner)
    return made[region]


def reserved_events(engine: Engine) -> dict[str, tuple[str, str]]:
    """The events only the engine fires -> (the state they leave, why): a parallel state's
    join (once every region is final) and a region's exit (when its parallel state is left)."""
    found: dict[str, tuple[str, str]] = {}
    for branch in engine.table.declared:
        if branch.source in engine.table.parallel and branch.event in (
            join_event(branch.source),
            f"done_state_{branch.source}",
        ):
            found[branch.event] = (branch.source, "is fired by the engine once every region is final, not by a caller")
    region_of = engine.lifecycle.region_of
    if region_of is not None:
        event = exit_event(region_of[1])
        if event in engine.table.events:
            found[event] = (region_of[1], f"is the engine's, when {region_of[1]!r} is left, not a caller's")
    return found


def join_refused(engine: Engine, entity_id: str, event: str, actor: str) -> TransitionNotAllowed:
    """The refusal of a caller's fire of an event only the engine fires (:func:`reserved_events`)."""
    state, why = engine._join_events[event]
    return TransitionNotAllowed(entity_id=entity_id, event=event, state=state, actor=actor, detail=f"{event!r} {why}")


def exit_regions(engine: Engine, writes: list[TransitionWrite], branches: list[Branch]) -> FireResult:
    """Commit the entity's writes out of a parallel state by an event (not its join) with a
    write per region still running, moving its row to :func:`fsm.regions.exit_state`, in one
    ``store.apply_group``.  A region in its lifecycle's finalizing state under a fresh lease
    refuses it (a live finalizer is never cut off), unless the transition is an operator
    override."""
    parallel = branches[0].source
    entity_id = writes[0].entity_id
    first = writes[0]
    regions = engine.lifecycle.regions[parallel]
    now = engine.store.now()
    moves: list[TransitionWrite] = []
    for region, row in region_rows(engine.store, entity_id, regions).items():
        cls = regions[region]
        if row is None or row.deleted or row.state in cls.table.finals:
            continue
        live = row.lease_owner is not None and row.lease_expires_at is not None and row.lease_expires_at > now
        if row.state == cls.finalizing_state and live and not branches[0].override:
            raise TransitionNotAllowed(
                entity_id=entity_id,
                event=first.event,
                state=parallel,
                actor=first.actor,
                detail=f"region {region!r} is finalizing under a live lease ({row.id}); wait for it, or declare "
                "the transition with operator_override(...)",
            )
        step = engine.region(region).table.branches_for(row.state, exit_event(parallel))[0]
        region_policy = engine.region(region).policy
        move = write_for(region_policy, engine.owner, row, step, None, None, f"{parallel} left", None, None, None)
        move.event, move.actor = first.event, first.actor
        moves.append(move)
    results, _ = _apply_group(engine, [*writes, *moves], [])
    mine = results[: len(writes)]
    for (new, record), branch in zip(mine, branches, strict=True):
        announce(engine.kind, new, record, branch)
    if len(mine) == 1:
        return FireResult(*mine[0])
    return ChainedResult(mine[-1][0], mine[0][1], steps=tuple(record for _, record in mine[1:]))


def parent_engine(engine: Engine) -> Engine:
    """The engine of the lifecycle a region engine's region belongs to (made once)."""
    made: Engine | None = engine.__dict__.get("_parent_engine")
    if made is None:
        from fsm.engine.engine import Engine

        assert engine.lifecycle.region_of is not None
        made = Engine(engine.lifecycle.region_of[0], engine.store, clock=engine.clock, owner=engine.owner)
        engine.__dict__["_parent_engine"] = made
    return made


def join_after(engine: Engine, snap: Snapshot) -> FireResult | None:
    """After a region's row entered a final state (committed): the join, if every region
    is final now.  Never raises: the reaper joins what this misses."""
    if snap.parent_id is None:
        return None
    region_of = engine.lifecycle.region_of
    assert region_of is not None
    try:
        return try_join(parent_engine(engine), snap.parent_id, region_of[1])
    except Exception:  # the region's own write committed; the reaper's tick joins later
        log.exception("joining %s after its region %s ended failed", snap.parent_id, snap.id)
        return None


def try_join(parent: Engine, entity_id: str, parallel: str) -> FireResult | None:
    """Fire ``done.state.<parallel>`` on the entity if it rests in ``parallel`` and every
    region's row is final: a compare-and-set on its row, so of two joins one moves it."""
    try:
        snap = parent.store.get(entity_id)
    except UnknownEntity:
        return None
    if snap.state != parallel:
        return None
    lifecycles = parent.lifecycle.regions[parallel]
    rows = region_rows(parent.store, entity_id, lifecycles)
    if not all_final(rows, {r: cls.table.finals for r, cls in lifecycles.items()}):
        return None
    try:  # the engine's own path: a caller's fire of the join is refused (join_refused)
        return parent._fire(
            snap.id, join_event(parallel), Actor.WORKER, None, None, None, None, None, snap, joining=True
        )
    except FsmError as err:  # another join won, or no join branch's guards hold
        log.info("join of %s did not move it: %s", entity_id, err)
        return None


def sweep_joins(parent: Engine, limit: int) -> int:
    """Join every entity of ``parent``'s lifecycle resting in a parallel state whose regions
    are all final (the reaper's tick: a region moved by the set-based reaper, or a join a
    crash cut off); at most ``limit`` entities looked at per parallel state.  Returns how
    many it joined."""
    joined = 0
    for parallel in parent.table.parallel:
        after: str | None = None
        seen = 0
        size = min(500, limit)
        while seen < limit:
            page: list[Snapshot] = parent.store.entities(parent.kind, state=parallel, limit=size, after_id=after)
            for snap in page:
                if try_join(parent, snap.id, parallel) is not None:
                    joined += 1
            seen += len(page)
            if len(page) < size:
                break
            after = page[-1].id
    return joined


__all__ = [
    "create_with_regions",
    "enter_regions",
    "exit_regions",
    "join_after",
    "join_refused",
    "parent_engine",
    "region_engine",
    "reserved_events",
    "sweep_joins",
    "try_join",
]
