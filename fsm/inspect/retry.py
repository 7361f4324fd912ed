"""Retry a failed entity as a **new** entity: the failed one stays as it is (I5).

A final state is absorbing, so a retry never moves an entity out of ``failed``.  It creates
a new entity of the same kind with the failed one's data (and concurrency key), and records
its creation as its first transition: the lifecycle's declared *resubmit* override, an
``operator_override`` from the initial state to itself, fired in the same transaction as
the create (SQL stores), its reason naming the operator and the original::

    resubmit = operator_override(queued.to.itself(), reason="retry")   # declares the action
    # history of the new entity:  resubmit  queued -> queued  "operator alice: retry of job-7"

The override's declared ``changes`` apply to the copied data in that write (a pipeline's
steps are queued again: :data:`fsm.lifecycles.RESET_STEPS`).

**Which id.** The new id is derived from the original's, ``job-7`` -> ``job-7~retry1``,
and a retry of a retry counts on (``job-7~retry1`` -> ``job-7~retry2``), so each failed
entity has at most one retry, found from its page with one read by id (no scan of the
history at a million rows), and a second retry of the same entity (a double submit, two
operators at once) is refused by the create itself (``EntityExists``).  The link is
checked both ways: a page says "retry of X" or "retried as Y" only when Y's first history
row is the resubmit naming X, so a user's own entity that happens to be named ``x~retry1``
is never shown as a retry.

**Which states.** A retry is offered from a final state that a reaper or an operator
transition can enter (the built-ins: ``failed``; never ``completed``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fsm.errors import InvalidArgument, StaleVersion, TransitionNotAllowed, UnknownEntity
from fsm.limits import MAX_ID_LENGTH
from fsm.records import Actor, HistoryRecord, LeaseChange, Snapshot

SUFFIX = "~retry"
"""What the derived id appends: ``<root>~retry<n>``."""

_NUMBERED = re.compile(r"^(?P<root>.+)~retry(?P<n>[1-9][0-9]{0,5})$", re.S)


def retry_id(entity_id: str) -> str:
    """The id a retry of ``entity_id`` gets (``InvalidArgument`` when it would be too long)."""
    found = _NUMBERED.match(entity_id)
    root, n = (found["root"], int(found["n"])) if found else (entity_id, 0)
    made = f"{root}{SUFFIX}{n + 1}"
    if len(made) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{entity_id!r} is too long to name its retry ({len(made)} > {MAX_ID_LENGTH} characters)")
    return made


def retried_id(entity_id: str) -> str | None:
    """The id ``entity_id`` would be a retry of (the inverse of :func:`retry_id`), if any."""
    found = _NUMBERED.match(entity_id)
    if found is None:
        return None
    n = int(found["n"])
    return found["root"] if n == 1 else f"{found['root']}{SUFFIX}{n - 1}"


def resubmit_event(lifecycle: Any) -> str | None:
    """The lifecycle's declared resubmit: an operator override from its initial state to
    itself that leaves the lease alone; ``None`` when it declares none (no retry offered)."""
    table = lifecycle.table
    for branch in table.declared:
        if (
            branch.override
            and branch.source == branch.target == table.initial
            and branch.lease_effect is LeaseChange.KEEP
        ):
            return str(branch.event)
    return None


def retryable_states(lifecycle: Any) -> frozenset[str]:
    """Final states a reaper or an operator override can enter: where failures end."""
    table = lifecycle.table
    return frozenset(
        b.target for b in table.declared if b.target in table.finals and (b.override or b.actor is Actor.REAPER)
    )


def reason_for(operator: str, original: str, note: str = "") -> str:
    """The resubmit's recorded reason: ``operator alice: retry of job-7[: note]``."""
    return f"operator {operator}: retry of {original}" + (f": {note}" if note else "")


def is_retry_of(history: list[HistoryRecord], original: str, event: str | None) -> bool:
    """Whether ``history`` (of a candidate) begins with the resubmit naming ``original``."""
    if event is None or not history:
        return False
    first = history[0]
    reason = first.reason or ""
    marker = f": retry of {original}"
    return (
        first.seq == 1
        and first.event == event
        and reason.startswith("operator ")
        and (reason.endswith(marker) or f"{marker}: " in reason)
    )


def links(
    snap: Snapshot,
    history: list[HistoryRecord],
    lifecycle: Any,
    read_history: Callable[[str], list[HistoryRecord]],
) -> tuple[str | None, str | None]:
    """``(retry of, retried as)`` for the entity's page, each checked as the module says;
    ``read_history(id)`` reads another entity's history (``UnknownEntity`` when none)."""
    if lifecycle is None:
        return None, None
    event = resubmit_event(lifecycle)
    if event is None:
        return None, None
    parent = retried_id(snap.id)
    of = parent if parent is not None and is_retry_of(history, parent, event) else None
    child: str | None = None
    if snap.state in lifecycle.table.finals:
        try:
            candidate = retry_id(snap.id)
            if is_retry_of(read_history(candidate), snap.id, event):
                child = candidate
        except (UnknownEntity, InvalidArgument):
            pass
    return of, child


def retry_failed(engine: Any, entity: str, *, operator: str, note: str = "", version: int | None = None) -> Snapshot:
    """Create the retry of the failed entity ``entity`` through ``engine`` (any store) and
    record its creation as the lifecycle's resubmit; the new entity's snapshot.

    ``version``: the version the operator saw (``StaleVersion`` when it differs).  Refused
    with a typed error, nothing created: ``TransitionNotAllowed`` when no resubmit is
    declared or the entity is not in a retryable final state (or deleted); ``EntityExists``
    when it was retried already; ``InvalidArgument`` for an id too long to derive.  On a SQL store the create and the
    resubmit commit together (:meth:`fsm.Engine.within`); the memory store runs them one
    after the other in its own lock-step calls."""
    lifecycle = engine.lifecycle
    event = resubmit_event(lifecycle)
    snap: Snapshot = engine.get(entity)

    def refuse(detail: str) -> TransitionNotAllowed:
        return TransitionNotAllowed(entity_id=snap.id, event="retry", state=snap.state, actor="operator", detail=detail)

    if event is None:
        raise refuse(f"{lifecycle.__name__} declares no resubmit (operator_override(initial.to.itself()))")
    if version is not None and snap.version != version:
        raise StaleVersion(snap.id, expected=version, found=snap.version)
    if snap.deleted or snap.state not in retryable_states(lifecycle):
        raise refuse("only a failed entity (a final state a reaper or an operator enters) is retried")
    new_id = retry_id(snap.id)
    reason = reason_for(operator, snap.id, note)

    def make() -> Snapshot:
        created = engine.create(new_id, data=snap.data, concurrency_key=snap.concurrency_key)
        return engine.fire(created, event, reason=reason).snapshot  # type: ignore[no-any-return]

    sql = getattr(engine.store, "engine", None)
    if getattr(engine.store, "joined", None) is None or sql is None:
        return make()
    with sql.connect() as connection:
        with engine.within(connection):
            made = make()
        connection.commit()
    return made


__all__ = [
    "SUFFIX",
    "is_retry_of",
    "links",
    "reason_for",
    "resubmit_event",
    "retried_id",
    "retry_failed",
    "retry_id",
    "retryable_states",
]
