"""Microstep chains: eventless transitions and completion events, in the event's own write.

python-statemachine (after SCXML) does not stop where an event's transition lands: once a
transition is taken, every *eventless* transition whose guards hold is taken too, one
after another, and entering a final state nested in a compound raises the completion
event ``done.state.<compound>``, whose transitions are taken next (eventless ones first,
then the queued completion events, until nothing more is enabled).  A persisted chart must
do the same, or a stored entity would rest in a state python-statemachine never rests in.

The engine therefore judges the whole chain when it judges the event (:func:`settle`, on
the entity as the chain leaves it: state, lease, counters, data) and hands the store the
event's write followed by one write per microstep (:meth:`stores.Store.apply_chain`), each
guarded by its own version and conditions, committed together or not at all: one commit,
one history row per taken transition.

A new entity whose initial state takes steps by itself takes them in its create: the engine
judges them on the entity as it would be created and the store commits the insert and the
steps together (:meth:`stores.Store.create_chains`).  Where a chain would start outside a
caller's fire or create it is refused at class creation, until those paths can carry one:
after a reaper transition (the reaper's set-based batch) and after a claim's start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fsm.errors import InvalidDefinition, TransitionNotAllowed
from fsm.records import Actor, LeaseChange, Snapshot, TransitionWrite
from fsm.table import Branch, CompiledTable

MAX_CHAIN = 64
"""The most microsteps one event may take by itself (an eventless cycle whose guards
always hold would never settle: it is refused, nothing written)."""


def settle(
    table: CompiledTable,
    entity_id: str,
    event: str,
    leaf: str,
    passes: Callable[[Branch], bool],
    taken: Callable[[Branch], None],
    resolve: Callable[[Branch], Branch] | None = None,
) -> list[Branch]:
    """The microsteps after entering ``leaf``, in the order python-statemachine takes them:
    the first eventless transition whose guards ``passes`` accepts, else the first
    transition of the oldest queued completion event; ``taken`` is told of each one before
    the next is judged (so ``passes`` sees the entity as the chain leaves it).  ``resolve``
    turns a step that targets a history state into the one the entity's memory picks
    (:func:`fsm.history.resolve`)."""
    steps: list[Branch] = []
    queued: deque[str] = deque()
    if leaf in table.completion:
        queued.append(table.completion[leaf])
    while True:
        step = next((b for b in table.automatic.get(leaf, ()) if passes(b)), None)
        while step is None and queued:
            internal = queued.popleft()
            step = next((b for b in table.branches_for(leaf, internal) if passes(b)), None)
        if step is None:
            return steps
        if len(steps) == MAX_CHAIN:
            raise TransitionNotAllowed(
                entity_id=entity_id,
                event=event,
                state=leaf,
                actor="automatic",
                detail=f"its eventless and completion transitions did not settle within {MAX_CHAIN} steps",
            )
        if resolve is not None and step.restores is not None:
            step = resolve(step)
        steps.append(step)
        taken(step)
        leaf = step.target
        if leaf in table.completion:
            queued.append(table.completion[leaf])


def after_write(snap: Snapshot, write: TransitionWrite) -> Snapshot:
    """The entity as ``write`` leaves it, as far as the next microstep's judgement and write
    need it (state, version, lease holder and token, counters, data, history memory)."""
    owner, token, expires = snap.lease_owner, snap.lease_token, snap.lease_expires_at
    if write.lease_change is LeaseChange.ACQUIRE:
        owner, token = write.new_owner, token + 1
    elif write.lease_change is LeaseChange.CLEAR:
        owner, expires = None, None
    attempt = snap.attempt + 1 if write.bump_attempt else snap.attempt
    reclaims = 0 if write.bump_attempt else snap.reclaims + (1 if write.bump_reclaims else 0)
    return snap._replace(
        state=write.target,
        version=snap.version + 1,
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=expires,
        attempt=attempt,
        reclaims=reclaims,
        data=snap.data if write.data is None else write.data,
        memory=snap.memory if write.memory is None else write.memory,
    )


def check_chains(name: str, table: CompiledTable) -> None:
    """Refuse a chain that would start where no caller's fire carries it (see the module)."""
    heads = table.chain_heads
    if not heads:
        return
    for branch in table.declared:
        if branch.target not in heads:
            continue
        if branch.actor is Actor.REAPER:
            raise InvalidDefinition(
                f"{name}: reaper transition {branch.event!r} from {branch.source!r} enters {branch.target!r}, which "
                "takes eventless or completion transitions by itself; the reaper's set-based batch does not take "
                "them: target a state without them"
            )
        if branch.lease_effect is LeaseChange.ACQUIRE and not branch.guards and branch.actor is Actor.WORKER:
            raise InvalidDefinition(
                f"{name}: {branch.event!r} from {branch.source!r} is a claim's start into {branch.target!r}, which "
                "takes eventless or completion transitions by itself; a claim does not take them: start into a "
                "state without them"
            )


__all__ = ["MAX_CHAIN", "after_write", "check_chains", "settle"]
