"""An event's write with its microsteps: the writes :func:`fsm.chains.settle` adds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsm.chains import after_write, settle
from fsm.engine.base import StoreClock
from fsm.engine.writes import write_for
from fsm.guards import GuardContext
from fsm.history import resolve
from fsm.records import Lease, NewEntity, Snapshot, TransitionWrite, apply_changes
from fsm.table import Branch

if TYPE_CHECKING:
    from fsm.engine.engine import Engine


def chain_writes(
    engine: Engine, write: TransitionWrite, branch: Branch, lease: Lease | None, owner: str | None
) -> tuple[list[TransitionWrite], list[Branch]]:
    """``write`` (the event's, into one of the table's chain heads) followed by a write per
    microstep it takes by itself, each judged on the entity as the steps before leave it
    (guards see its state, lease, counters and data; the caller's lease stays its own while
    the chain keeps it)."""
    before = write.before
    assert before is not None  # the engine's writes carry the snapshot they were judged on
    writes, branches = steps_from(engine, after_write(before, write), write.event, lease, owner)
    return [write, *writes], [branch, *branches]


def create_steps(engine: Engine, entity: NewEntity) -> tuple[list[TransitionWrite], list[Branch]]:
    """The writes a new entity's initial state takes by itself, judged on the entity as it
    would be created (its data, no lease, version 0); none when no guard lets it move."""
    now = engine.clock.now()
    new = Snapshot(
        entity.id, entity.kind, entity.state, 0, None, 0, None, now, now, now, False, entity.concurrency_key,
        0, 0, entity.data, None, None, entity.priority, entity.parent_id, entity.definition,
    )  # fmt: skip
    return steps_from(engine, new, "create", None, None, created=True)


def steps_from(
    engine: Engine, current: Snapshot, event: str, lease: Lease | None, owner: str | None, created: bool = False
) -> tuple[list[TransitionWrite], list[Branch]]:
    """The writes (and branches) of the microsteps the entity ``current`` takes by itself
    where it rests, after ``event`` (named in a refusal); ``created``: ``current`` is an
    entity about to be created (no newer sibling can exist yet: none was created after it)."""
    writes: list[TransitionWrite] = []
    branches: list[Branch] = []
    clock = StoreClock(engine.store)

    def holder() -> Lease | None:
        if lease is None or current.lease_owner != lease.owner:
            return None
        return lease._replace(token=current.lease_token)

    def passes(step: Branch) -> bool:
        ctx = GuardContext(
            snapshot=current,
            clock=clock,
            lease=holder(),
            policy=engine.policy,
            newer_sibling=(lambda: False) if created else lambda: engine.store.has_newer_sibling(current.id),
        )
        return all(bool(g.check(ctx)) is expected for g, expected in step.guards)

    def taken(step: Branch) -> None:
        nonlocal current
        data = None
        if step.changes:
            changed = apply_changes(step.changes, current.data)
            if changed is not None:
                data = engine._validate(changed, entity_id=current.id)
        held = holder()
        made = write_for(engine.policy, engine.owner, current, step, held, None, None, data, None, owner)
        made.before = None  # judged on a snapshot the store never held: it reads the row back
        if held is not None:  # the caller's step: fenced by its lease, and its history row says whose
            made.expect_owner, made.expect_token = held.owner, held.token
        writes.append(made)
        branches.append(step)
        current = after_write(current, made)

    settle(
        engine.table,
        current.id,
        event,
        current.state,
        passes,
        taken,
        lambda b: resolve(b, current.memory, current.state),
    )
    return writes, branches


__all__ = ["chain_writes", "create_steps", "steps_from"]
