"""The engine's side of parallel regions (:mod:`fsm.regions`): entering a parallel state
with its regions' rows in one transaction, and the join once every region is final."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from fsm.engine.announce import announce
from fsm.engine.result import ChainedResult, FireResult
from fsm.engine.writes import write_for
from fsm.errors import (
    ConditionFailed,
    ConfigError,
    FsmError,
    InvalidArgument,
    StaleVersion,
    TransitionNotAllowed,
    UnknownEntity,
)
from fsm.limits import MAX_CREATE_MANY
from fsm.records import Actor, HistoryRecord, LeaseChange, NewEntity, NoLiveLease, Snapshot, TimerMode, TransitionWrite
from fsm.regions import all_final, exit_event, join_event, region_row_id, region_rows, restart_reason
from fsm.table import Branch

if TYPE_CHECKING:
    from fsm.engine.engine import Engine

log = logging.getLogger("fsm.regions")

NO_LIVE_LEASE = NoLiveLease()
"""The store-side check of a region's exit from ``finalizing``: no owner, or an expired lease."""


def live_lease(row: Snapshot, now: datetime) -> bool:
    """The engine's look at what :data:`NO_LIVE_LEASE` re-checks in the statement: an owner
    whose lease has not expired (a reclaimed row has no owner: its lease is free)."""
    expires = row.lease_expires_at
    return row.lease_owner is not None and (expires is None or expires >= now)


def region_entities(
    engine: Engine, entity_id: str, parallel: str, data: dict[str, Any], key: str | None
) -> list[NewEntity]:
    """A new row per region of ``parallel`` for the entity, each at its initial state, with
    the entity's data and concurrency key (the limits' ``key`` field of that data, else the
    entity's own key: a region's claims keep the entity's per-key limits)."""
    made: list[NewEntity] = []
    for region, cls in engine.lifecycle.regions[parallel].items():
        made.append(
            NewEntity(
                id=region_row_id(entity_id, region),
                kind=cls.kind,
                state=cls.table.initial,
                concurrency_key=engine._data_key(data) or key,
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
        creates += [entity, *region_entities(engine, entity.id, parallel, entity.data, entity.concurrency_key)]
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


def _entity_result(engine: Engine, mine: list[tuple[Snapshot, HistoryRecord]], branches: list[Branch]) -> FireResult:
    """The entity's own writes of a group, announced, as its fire's result."""
    for (new, record), branch in zip(mine, branches, strict=True):
        announce(engine.kind, new, record, branch)
    if len(mine) == 1:
        return FireResult(*mine[0])
    return ChainedResult(mine[-1][0], mine[0][1], steps=tuple(record for _, record in mine[1:]))


def _notify(engine: Engine, parallel: str) -> None:
    """Wake the regions' workers: their rows are claimable (a restarted row wakes no one
    by itself)."""
    notify = getattr(engine.store, "notify_work", None)
    if notify is not None:
        for cls in engine.lifecycle.regions[parallel].values():
            notify(cls.kind)


def _finalizer_fence(
    cls: Any,
    region: str,
    row: Snapshot,
    first: TransitionWrite,
    parallel: str,
    now: datetime | None,
    override: bool,
) -> tuple[Any, ...]:
    """What a write that ends or restarts a running region's row must keep: a region in its
    lifecycle's finalizing state under a live lease refuses it (a live finalizer is never cut
    off, unless the transition is an operator override); one whose lease was free when looked
    at is written only if it still is (a lease moves without a version: the store re-checks)."""
    if override or row.state != cls.finalizing_state:
        return ()
    assert now is not None  # the caller read the store's clock before looking at running rows
    if live_lease(row, now):
        raise TransitionNotAllowed(
            entity_id=first.entity_id,
            event=first.event,
            state=parallel,
            actor=first.actor,
            detail=f"region {region!r} is finalizing under a live lease ({row.id}); wait for it, or declare "
            "the transition with operator_override(...)",
        )
    return (NO_LIVE_LEASE,)


def _entry(
    engine: Engine,
    entity_id: str,
    parallel: str,
    data: dict[str, Any],
    key: str | None,
    first: TransitionWrite,
    again: bool,
    override: bool,
) -> tuple[list[NewEntity], list[TransitionWrite]]:
    """The creates and restarts that put every region of ``parallel`` at its initial state.
    ``again``: the entity re-enters the parallel state it is in (an external self-transition):
    a region still running restarts too, unless it finalizes under a fresh lease (refused,
    and checked again in the statement), as an exit would refuse it."""
    lifecycles = engine.lifecycle.regions[parallel]
    creates: list[NewEntity] = []
    restarts: list[TransitionWrite] = []
    now = engine.store.now() if again else None  # a running row is met only on a self-transition
    for region, row in region_rows(engine.store, entity_id, lifecycles).items():
        cls = lifecycles[region]
        table = cls.table
        arms = table.arms_on_create()
        if row is None:
            made = region_entities(engine, entity_id, parallel, data, key)
            creates += [e for e in made if e.kind == cls.kind]
            continue
        running = row.state not in table.finals
        if row.deleted or row.kind != cls.kind or (running and not again):
            raise ConfigError(
                f"cannot enter {parallel!r} on {entity_id!r}: region row {row.id!r} is "
                f"{'deleted' if row.deleted else repr(row.kind) + ' in ' + repr(row.state)}, not a final state of "
                f"region {region!r}"
            )
        require = _finalizer_fence(cls, region, row, first, parallel, now, override) if running else ()
        # the region starts again at its initial state, due at once, with fresh counters
        restarts.append(
            TransitionWrite(
                entity_id=row.id,
                event=first.event,
                source=row.state,
                target=table.initial,
                actor=first.actor,
                expect_version=row.version,
                require=require,
                lease_change=LeaseChange.CLEAR,
                data=dict(data),
                reason=restart_reason(parallel),
                restart=True,
                run_after=timedelta(0),
                timer=TimerMode.ARM if arms else (TimerMode.CLEAR if table.has_timers else TimerMode.KEEP),
                before=row,
            )
        )
    return creates, restarts


def _entered(engine: Engine, writes: list[TransitionWrite]) -> tuple[dict[str, Any], str | None]:
    """The data and concurrency key the entity enters a parallel state with."""
    before = writes[0].before
    if before is None:
        before = engine.store.get(writes[0].entity_id)
    data = next((w.data for w in reversed(writes) if w.data is not None), None)
    return (before.data if data is None else data), before.concurrency_key


def enter_regions(engine: Engine, writes: list[TransitionWrite], branches: list[Branch]) -> FireResult:
    """Commit the entity's writes into a parallel state with a row per region (created, or
    restarted at its initial state on a later visit) in one ``store.apply_group``."""
    parallel = branches[-1].target
    data, key = _entered(engine, writes)
    creates, restarts = _entry(
        engine, writes[0].entity_id, parallel, data, key, writes[-1], False, branches[0].override
    )
    results, _ = _apply_group(engine, [*writes, *restarts], creates)
    _notify(engine, parallel)
    return _entity_result(engine, results[: len(writes)], branches)


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


def region_hint(engine: Engine, event: str) -> str:
    """For an event a region declares, fired on the entity: where to fire it instead."""
    for regions in engine.lifecycle.regions.values():
        for region, cls in regions.items():
            if event in cls.table.events:
                return f"region {region!r} declares it: fire it on the region's row with engine.region({region!r})"
    return ""


def join_refused(engine: Engine, entity: object, event: str, actor: str) -> TransitionNotAllowed:
    """The refusal of a caller's fire of an event only the engine fires (:func:`reserved_events`),
    naming the state the entity is in (read when the caller gave only its id)."""
    _, why = engine._join_events[event]
    snap = getattr(entity, "snapshot", entity)
    if isinstance(snap, Snapshot):
        entity_id, state = snap.id, snap.state
    else:
        entity_id, state = str(entity)[:255], "?"
        with contextlib.suppress(FsmError):  # an unknown entity: the refusal stands, its state unknown
            state = engine.store.get(entity_id).state
    return TransitionNotAllowed(entity_id=entity_id, event=event, state=state, actor=actor, detail=f"{event!r} {why}")


def exit_regions(
    engine: Engine, writes: list[TransitionWrite], branches: list[Branch], look_again: bool = True
) -> FireResult:
    """Commit the entity's writes out of a parallel state by an event (not its join) with a
    write per region still running, moving its row to :func:`fsm.regions.exit_state`, in one
    ``store.apply_group``.  A region in its lifecycle's finalizing state under a fresh lease
    refuses it (a live finalizer is never cut off), unless the transition is an operator
    override."""
    parallel = branches[0].source
    entity_id = writes[0].entity_id
    first = writes[0]
    target = branches[-1].target
    creates: list[NewEntity] = []
    moves: list[TransitionWrite] = []
    if target in engine.table.parallel:  # into a parallel state: its regions (re)start in the same commit
        data, key = _entered(engine, writes)
        # a self-transition (internal or not: SCXML exits and enters the regions either way)
        # restarts the very rows
        itself = target == parallel
        creates, moves = _entry(engine, entity_id, target, data, key, first, itself, branches[0].override)
        if itself:
            return _grouped(engine, writes, branches, moves, creates, target, look_again)
    regions = engine.lifecycle.regions[parallel]
    now = engine.store.now()
    for region, row in region_rows(engine.store, entity_id, regions).items():
        cls = regions[region]
        if row is None or row.deleted or row.state in cls.table.finals:
            continue
        fence = _finalizer_fence(cls, region, row, first, parallel, now, branches[0].override)
        step = engine.region(region).table.branches_for(row.state, exit_event(parallel))[0]
        region_policy = engine.region(region).policy
        move = write_for(region_policy, engine.owner, row, step, None, None, f"{parallel} left", None, None, None)
        move.event, move.actor = first.event, first.actor
        move.require = (*move.require, *fence)
        moves.append(move)
    entered = target if target in engine.table.parallel else None
    return _grouped(engine, writes, branches, moves, creates, entered, look_again)


def _grouped(
    engine: Engine,
    writes: list[TransitionWrite],
    branches: list[Branch],
    moves: list[TransitionWrite],
    creates: list[NewEntity],
    entered: str | None,
    look_again: bool,
) -> FireResult:
    """The entity's writes, its regions' moves and creates, in one ``store.apply_group``."""
    try:
        results, _ = _apply_group(engine, [*writes, *moves], creates)
    except ConditionFailed:
        if not look_again:
            raise
        # a finalizer took its lease since the look (no version moves with a lease): look
        # again, and refuse it by name
        return exit_regions(engine, writes, branches, look_again=False)
    if entered is not None:
        _notify(engine, entered)
    return _entity_result(engine, results[: len(writes)], branches)


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


JOIN_ATTEMPTS = 3
"""How many times a join looks again when the entity moved between its look and its write."""


def try_join(parent: Engine, entity_id: str, parallel: str) -> FireResult | None:
    """Fire ``done.state.<parallel>`` on the entity if it rests in ``parallel`` and every
    region's row is final: a compare-and-set on the entity's row at the version the regions
    were looked at under, so of two joins one moves it, and a join never fires on a later
    visit than the one it looked at (the entity moved: it looks again from the start)."""
    for _ in range(JOIN_ATTEMPTS):
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
        event = join_event(parallel)
        if parent.would_fire(snap, event) is None:  # no join branch's guards hold: it rests inside
            log.info("join of %s: no branch of %s passes its guards", entity_id, event)
            return None
        try:  # the engine's own path (a caller's fire of the join is refused), on this snapshot only
            return parent._fire(
                snap.id, event, Actor.WORKER, None, None, None, None, None, snap, None, reread=False, joining=True
            )
        except StaleVersion:
            continue  # the entity moved since the look: look again
        except FsmError as err:  # no join branch's guards hold
            log.info("join of %s did not move it: %s", entity_id, err)
            return None
    return None


def sweep_joins(parent: Engine, limit: int) -> int:
    """Join the entities of ``parent``'s lifecycle resting in a parallel state whose regions
    are all final (the reaper's tick: a region moved by the set-based reaper, or a join a
    crash cut off): at most ``limit`` looked at per parallel state and call, each call going
    on by id where the last one stopped, and from the first again once past the last, so
    every entity is looked at within a few ticks however many rest there.  Returns how many
    it joined."""
    joined = 0
    cursors: dict[str, str | None] = parent.__dict__.setdefault("_sweep_cursors", {})
    for parallel in parent.table.parallel:
        after = cursors.get(parallel)
        wrapped = after is None  # started from the first: the end means everything was seen
        seen = 0
        while seen < limit:
            asked = min(500, limit - seen)
            page: list[Snapshot] = parent.store.entities(parent.kind, state=parallel, limit=asked, after_id=after)
            for snap in page:
                if try_join(parent, snap.id, parallel) is not None:
                    joined += 1
            seen += len(page)
            if len(page) < asked:  # past the last: on from the first
                after = None
                if wrapped:
                    break
                wrapped = True
                continue
            after = page[-1].id
        cursors[parallel] = after
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
