"""Typed errors of fsm-lifecycles.

Every error the library raises derives from :class:`FsmError` and carries the facts a
caller needs to react (entity id, event, state, expected and found version or token) as
attributes, not only in the message.  A refused write never changes a row (I10).

The tree::

    FsmError
    ├── InvalidDefinition          a lifecycle class breaks a rule (at class creation)
    ├── ConfigError                a policy, config or store setting is invalid
    ├── InvalidArgument            ill-typed argument (also a ValueError)
    ├── UnknownEntity, EntityExists, UnknownEvent
    ├── TransitionNotAllowed, GuardRejected, ConditionFailed, IdempotencyKeyReused
    ├── StaleVersion               another writer got there first (I3)
    ├── Fenced                     the caller no longer owns the work: stop (one except)
    │   ├── LeaseLost              the lease was taken over, expired or its budget spent
    │   └── EntityMovedOn          the reaper moved the entity away from its holder
    ├── EffectFailed               a recorded effect failed and its policy says: do not retry
    ├── InvalidData, MalformedRow
    └── StoreUnavailable
"""

from __future__ import annotations

from typing import Any


class FsmError(Exception):
    """Root of every error raised by fsm-lifecycles."""


class InvalidDefinition(FsmError):
    """A lifecycle declaration breaks a rule of the framework.

    Raised at class creation, so a broken lifecycle never reaches a store.
    """


class ConfigError(FsmError):
    """A policy or service configuration is invalid; ``problems`` lists what is wrong."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class InvalidArgument(FsmError, ValueError):
    """An argument has the wrong type or value (a non-string reason, a negative TTL...);
    refused before anything is read or written."""


class UnknownEntity(FsmError):
    """No (live) entity has this id, or it belongs to another lifecycle."""

    def __init__(self, entity_id: str, *, kind: str | None = None, found_kind: str | None = None) -> None:
        self.entity_id = entity_id
        self.kind = kind
        self.found_kind = found_kind
        if found_kind is not None and kind is not None:
            msg = f"entity {entity_id!r} is a {found_kind!r}, not a {kind!r}"
        else:
            msg = f"no entity with id {entity_id!r}"
        super().__init__(msg)


class EntityExists(FsmError):
    """An entity with this id exists already."""

    def __init__(self, entity_id: str) -> None:
        self.entity_id = entity_id
        super().__init__(f"an entity with id {entity_id!r} exists already")


class UnknownEvent(FsmError):
    """The lifecycle declares no event with this name."""

    def __init__(self, event: str, *, lifecycle: str, known: list[str], hint: str = "") -> None:
        self.event = event
        self.lifecycle = lifecycle
        self.known = known
        said = f"{lifecycle} has no event {event!r}; its events are: {', '.join(known)}"
        super().__init__(f"{said}; {hint}" if hint else said)


class TransitionNotAllowed(FsmError):
    """The event has no transition from the entity's current state for this actor."""

    def __init__(self, *, entity_id: str, event: str, state: str, actor: str, detail: str = "") -> None:
        self.entity_id = entity_id
        self.event = event
        self.state = state
        self.actor = actor
        msg = f"{event!r} is not allowed from state {state!r} of entity {entity_id!r} for the {actor}"
        super().__init__(msg + (f": {detail}" if detail else ""))


class GuardRejected(FsmError):
    """Transitions exist for the event, but every branch had a guard that did not pass.

    ``failed`` maps each tried branch (``"source->target"``) to the guards that refused it.
    """

    def __init__(self, *, entity_id: str, event: str, state: str, failed: dict[str, list[str]]) -> None:
        self.entity_id = entity_id
        self.event = event
        self.state = state
        self.failed = failed
        detail = "; ".join(f"{branch}: {', '.join(guards)}" for branch, guards in failed.items())
        super().__init__(f"{event!r} from {state!r} of entity {entity_id!r} refused by guards ({detail})")


class ValidationFailed(GuardRejected):
    """A validator refused the event (python-statemachine's ``validators=``): it raised,
    and its message is the reason.  Nothing was written; as in python-statemachine, no
    later branch of the event is tried.  The validator's exception is the ``__cause__``."""

    def __init__(self, *, entity_id: str, event: str, state: str, branch: str, validator: str, reason: str) -> None:
        self.validator = validator
        self.reason = reason
        super().__init__(entity_id=entity_id, event=event, state=state, failed={branch: [validator]})
        self.args = (f"{event!r} from {state!r} of entity {entity_id!r} refused by validator {validator!r}: {reason}",)

    def __str__(self) -> str:
        return str(self.args[0])


class StaleVersion(FsmError):
    """A compare-and-set on the version lost: somebody else wrote the entity first (I3)."""

    def __init__(self, entity_id: str, *, expected: int, found: int | None) -> None:
        self.entity_id = entity_id
        self.expected = expected
        self.found = found
        super().__init__(f"entity {entity_id!r} is at version {found}, the write expected version {expected}")


class Fenced(FsmError):
    """The caller no longer owns the work on this entity and must stop.

    The base of every fencing refusal (DESIGN section 7), so that a worker needs one
    ``except Fenced`` to learn it: its lease was taken over or lapsed (:class:`LeaseLost`),
    or the reaper moved the entity away from it (:class:`EntityMovedOn`).  Nothing the
    fenced caller tried to write was written.
    """

    entity_id: str


class LeaseLost(Fenced):
    """The caller's lease (owner, token) is no longer the entity's current, live lease."""

    def __init__(
        self,
        entity_id: str,
        *,
        expected_token: int | None,
        found_token: int | None,
        owner: str | None = None,
        detail: str = "",
    ) -> None:
        self.entity_id = entity_id
        self.expected_token = expected_token
        self.found_token = found_token
        self.owner = owner
        if expected_token is not None and expected_token == found_token:
            # the same token: nobody took the lease over; it ran out (expired, budget spent)
            # or was given up
            why = detail or "the lease expired or was released"
            msg = f"lease on entity {entity_id!r} lost: {why} (token {expected_token}, not taken over)"
        elif expected_token is None or found_token is None:
            msg = f"lease on entity {entity_id!r} lost" + (f" (token {expected_token})" if expected_token else "")
            msg += f": {detail}" if detail else ""
        else:
            msg = (
                f"lease on entity {entity_id!r} lost: the caller holds token {expected_token}, "
                f"the entity holds token {found_token}"
            ) + (f" ({detail})" if detail else "")
        super().__init__(msg)


class EntityMovedOn(Fenced):
    """A lease holder's entity was moved on without it: expired, requeued or reclaimed by the
    reaper (or finished by another holder).  ``state`` is where the entity is now."""

    def __init__(
        self,
        entity_id: str,
        *,
        state: str,
        token: int | None,
        found_token: int,
        owner: str | None,
        cause: str | None = None,
    ) -> None:
        self.entity_id = entity_id
        self.state = state
        self.expected_token = token
        self.found_token = found_token
        self.owner = owner
        self.cause = cause
        """What moved it, when known: the transition's event and reason (``cancel (operator
        alice: wrong branch)``)."""
        by = f", by {cause}" if cause else ""
        super().__init__(
            f"entity {entity_id!r} moved on without its holder {owner!r} (token {token}){by}: it is now in "
            f"{state!r} with token {found_token}; stop working on it"
        )


class EffectFailed(FsmError):
    """A side effect whose recorded outcome is a failure, and whose policy says the next
    owner must not run it again.  ``error`` is the recorded error (type and message)."""

    def __init__(self, entity_id: str, *, key: str, error: Any) -> None:
        self.entity_id = entity_id
        self.key = key
        self.error = error
        super().__init__(f"effect {key!r} of entity {entity_id!r} failed and is not retried: {error}")


class ConditionFailed(FsmError):
    """A guard re-checked by the store at the commit point no longer held.

    The entity is unchanged.  ``condition`` names the guard (``lease_stale``, ``superseded``...).
    """

    def __init__(self, entity_id: str, *, condition: str) -> None:
        self.entity_id = entity_id
        self.condition = condition
        super().__init__(f"entity {entity_id!r}: {condition!r} no longer held at commit")


class ActiveDuplicate(EntityExists):
    """A create unique while active found a live, not final entity with the same key
    (``existing``): nothing was created."""

    def __init__(self, entity_id: str, *, key: str, existing: str) -> None:
        super().__init__(entity_id)
        self.key = key
        self.existing = existing
        self.args = (f"entity {existing!r} with key {key!r} is active: {entity_id!r} was not created",)


class IdempotencyKeyReused(FsmError):
    """An idempotency key was already used on this entity for another event."""

    def __init__(self, entity_id: str, *, key: str, recorded_event: str, event: str) -> None:
        self.entity_id = entity_id
        self.key = key
        self.recorded_event = recorded_event
        self.event = event
        super().__init__(
            f"idempotency key {key!r} of entity {entity_id!r} was used for {recorded_event!r}, not {event!r}"
        )


class InvalidData(FsmError):
    """Entity data does not validate against the lifecycle's data model; nothing was written."""

    def __init__(self, *, lifecycle: str, entity_id: str | None, errors: list[dict[str, Any]]) -> None:
        self.lifecycle = lifecycle
        self.entity_id = entity_id
        self.errors = errors
        where = f"entity {entity_id!r}" if entity_id else "new entity"
        shown = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors[:5])
        super().__init__(f"invalid data for {lifecycle} {where}: {shown}")


class MalformedRow(FsmError):
    """A stored row cannot be read (unknown state, broken JSON...); ``entity_id`` names it."""

    def __init__(self, entity_id: str, *, reason: str) -> None:
        self.entity_id = entity_id
        self.reason = reason
        super().__init__(f"entity {entity_id!r} is malformed: {reason}")


class StoreUnavailable(FsmError):
    """The store cannot be reached (database down or restarting).

    A call refused before it reached the database wrote nothing; when the connection drops
    during a commit, the outcome is unknown: retry with the same idempotency key, which
    returns the first result if the write did land.
    """


__all__ = [
    "ActiveDuplicate",
    "ChildFailed",
    "ConditionFailed",
    "ConfigError",
    "ConstraintViolated",
    "EffectFailed",
    "EntityExists",
    "EntityMovedOn",
    "Fenced",
    "FsmError",
    "GuardRejected",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidData",
    "InvalidDefinition",
    "LeaseLost",
    "MalformedRow",
    "StaleVersion",
    "StoreCorrupt",
    "StoreUnavailable",
    "TransitionNotAllowed",
    "UnknownEntity",
    "UnknownEvent",
    "WaitTimedOut",
]


class WaitTimedOut(FsmError):
    """``job.wait_for(name, timeout=...)`` saw no message ``name`` before its timeout.  A
    replay of the handler raises it again at the same step (the timeout is recorded)."""

    def __init__(self, entity_id: str, *, name: str, step: str) -> None:
        self.entity_id = entity_id
        self.name = name
        self.step = step
        super().__init__(f"entity {entity_id!r} waited for message {name!r} and timed out ({step})")


class ChildFailed(FsmError):
    """``job.wait_children()`` (``on_failure="fail"``, the default) saw a child end in a
    failed state.  Not retried: the parent fails at once (a replay raises it again at the
    same step: the outcome is recorded).  ``child`` is its :class:`~fsm.work.ChildResult`."""

    retryable = False

    def __init__(self, entity_id: str, *, child: Any) -> None:
        self.entity_id = entity_id
        self.child = child
        super().__init__(f"entity {entity_id!r}: child {child.id!r} ({child.kind}) ended {child.state!r}")


class StoreCorrupt(StoreUnavailable):
    """The store's database file (or its tables) cannot be read as a database: a garbage
    header, a garbage page, a truncated file.  ``path`` names the file (or the URL).

    Not transient like an outage: restore the file from a backup, or move it away.
    """

    def __init__(self, path: str, *, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"the store at {path} is corrupt or not a database: {reason}")


class ConstraintViolated(InvalidArgument):
    """The database refused a row the library itself considers valid: a constraint of an
    application's table (a ``NOT NULL`` column of its own, a ``CHECK``...).  Nothing was
    written; ``detail`` is the database's message.  Pass the application's own columns to
    ``Engine.create(..., columns={...})``."""

    def __init__(self, entity_id: str, *, detail: str) -> None:
        self.entity_id = entity_id
        self.detail = detail
        super().__init__(f"the database refused entity {entity_id!r}: {detail}")
