"""Firing many events at once: each judged as ``fire`` judges it, written in one transaction.

A worker's handlers finish at about the same time; writing each outcome in a transaction
of its own costs a commit each.  :func:`fire_many` judges every item on the snapshot its
caller holds (no read), builds its guarded write, and hands the writes to the store's
``apply_many``: one transaction, each write still fenced by its own version and token, and
each refusal answered in its own place.  What the caller gets back is, per item, the
:class:`FireResult` or the error ``fire`` would have raised for it: a stale held snapshot
is judged again on the row (as ``fire`` does), a fenced holder's error sends ``lease_lost``.
Signals follow the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fsm.engine.announce import announce
from fsm.engine.arguments import check_arguments, event_arg, lease_arg, optional_lease
from fsm.engine.parallel import join_refused
from fsm.engine.result import FireResult, fire_result
from fsm.errors import Fenced, FsmError, InvalidArgument, StaleVersion, UnknownEvent
from fsm.limits import MAX_APPLY_MANY, check_id
from fsm.records import Actor, HistoryRecord, Lease, Snapshot, TransitionWrite
from fsm.table import Branch

if TYPE_CHECKING:
    from fsm.engine.engine import Engine


class Fire(NamedTuple):
    """One event to fire in a batch, from the snapshot its caller holds."""

    entity: Snapshot | FireResult
    event: str
    lease: Lease | None = None
    data: Mapping[str, Any] | None = None


Fired = FireResult | FsmError


def _held(entity: object) -> Snapshot:
    if isinstance(entity, FireResult):
        return entity.snapshot
    if isinstance(entity, Snapshot):
        return entity
    raise InvalidArgument(f"fire_many fires from a held Snapshot or FireResult, not {type(entity).__name__}")


def fire_many(
    engine: Engine,
    items: Sequence[Fire],
    apply_many: Callable[[Sequence[TransitionWrite]], list[tuple[Snapshot, HistoryRecord] | FsmError]],
) -> list[Fired]:
    """See :meth:`fsm.Engine.fire_many`."""
    if not isinstance(items, list | tuple) or len(items) > MAX_APPLY_MANY:
        raise InvalidArgument(f"fire_many takes a list of at most {MAX_APPLY_MANY} Fire items")
    # a malformed item is the caller's bug: refused for the whole call, before any write
    events, delays = engine._events, engine._delays
    snaps: list[Snapshot] = []
    for item in items:
        if item.__class__ is not Fire and not isinstance(item, Fire):
            raise InvalidArgument(f"fire_many takes Fire items, not {type(item).__name__}")
        entity, event, lease = item.entity, item.event, item.lease
        # a worker's items hold FireResults or Snapshots: a class test each before isinstance
        cls = entity.__class__
        if cls is FireResult:
            snaps.append(entity.snapshot)  # type: ignore[union-attr]
        else:
            snaps.append(entity if cls is Snapshot else _held(entity))  # type: ignore[arg-type]
        if (event.__class__ is not str or event not in events) and not engine.table.knows(
            check_id("event", event_arg(event))
        ):
            raise UnknownEvent(event, lifecycle=engine.kind, known=list(engine.table.events))
        if delays:
            engine.refuse_delayed(event)
        if item.data is not None:
            check_arguments(None, None, item.data)
        if lease is not None:
            if lease.__class__ is Lease:
                lease_arg(lease)
            else:
                optional_lease(lease)
    results: list[Fired | None] = [None] * len(items)
    planned: list[tuple[int, TransitionWrite, Branch, Snapshot | None]] = []
    for i, item in enumerate(items):
        try:
            snap = snaps[i]
            if engine._join_events and item.event in engine._join_events:
                raise join_refused(engine, snap, item.event, "worker")
            write, branch, held = engine._prepare(
                snap.id, item.event, Actor.WORKER, item.lease, None, None, item.data, None, snap
            )
            if branch.target in engine._heads or write.memory is not None or branch.source in engine._parallel:
                # its microsteps (or its history memory): a commit of its own, through fire's
                # path (judged again on the same held snapshot, without reading the row: rare)
                results[i] = engine._fire(
                    snap.id, item.event, Actor.WORKER, item.lease, None, None, item.data, None, snap
                )
                continue
            planned.append((i, write, branch, held))
        except FsmError as err:
            results[i] = _refused(engine, item, err)
    answers = apply_many([write for _, write, _, _ in planned]) if planned else []
    for (i, _, branch, held), answer in zip(planned, answers, strict=True):
        item = items[i]
        if isinstance(answer, StaleVersion) and held is not None:
            # the held snapshot was stale: judge the event on the row, as fire does
            try:
                results[i] = engine._fire(held.id, item.event, Actor.WORKER, item.lease, None, None, item.data, None)
            except FsmError as err:
                results[i] = _refused(engine, item, err)
        elif isinstance(answer, FsmError):
            results[i] = _refused(engine, item, answer)
        else:
            new, record = answer
            announce(engine.kind, new, record, branch)
            results[i] = fire_result(new, record)
    return [r for r in results if r is not None]


def _refused(engine: Engine, item: Fire, err: FsmError) -> FsmError:
    if isinstance(err, Fenced) and item.lease is not None:
        engine._lease_lost(item.lease, err, "fire", item.event)
    return err


__all__ = ["Fire", "Fired", "fire_many"]
