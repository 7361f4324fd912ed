"""Checking the engine's arguments before anything is read or written (I10).

Every public entry point of the engine refuses ill-typed input here, with
``InvalidArgument`` or ``InvalidData``, so that the firing code only ever sees values of
the types it declares.  The limits themselves (lengths, NUL, surrogates, JSON, durations,
tokens) are :mod:`fsm.limits`, the rule every store applies too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from fsm.errors import InvalidArgument, InvalidData
from fsm.limits import (
    MAX_INT64,
    check_duration,
    check_free_text,
    check_id,
    check_int,
    check_optional_id,
    check_time,
    json_copy,
    plain_names,
)
from fsm.records import Actor, Lease

_ACTORS = tuple(a.value for a in Actor)


def check_arguments(reason: object, idempotency_key: object, data: object) -> None:
    """Refuse an ill-typed reason, idempotency key or data patch."""
    if reason is not None:
        check_free_text("reason", reason)
    if idempotency_key is not None:
        check_id("idempotency_key", idempotency_key)
    if data is not None and not isinstance(data, Mapping):
        raise InvalidArgument(f"data must be a mapping (a patch of top-level keys), not {type(data).__name__}")


def text(name: str, value: object) -> str:
    """``value`` if it is a valid id, key or owner (:func:`fsm.limits.check_id`)."""
    return check_id(name, value)


def optional_text(name: str, value: object) -> str | None:
    return check_optional_id(name, value)


def event_arg(value: object) -> str:
    """An event name: a string (``fire(id, ['start'])`` is refused, not hashed)."""
    if value.__class__ is str:
        return value  # checked against the table's events next
    return check_id("event", value)


_CHECKED_LEASES: dict[int, Lease] = {}
"""Leases that passed :func:`lease_arg`, by ``id``: a Lease is an immutable tuple, so one
checked once stays valid, and a worker's leases are checked at each of their fires.  The
dict holds each lease itself, so an id found here is that object's (never a reused id)."""
_MAX_CHECKED_LEASES = 4096


def lease_arg(value: object) -> Lease:
    """``value`` if it is a :class:`Lease` whose fields have their declared types."""
    if _CHECKED_LEASES.get(id(value)) is value:
        return value  # type: ignore[return-value]
    if value.__class__ is Lease:  # the common case, decided by C-level checks (a held result's lease)
        entity_id, owner, token, expires_at = value
        if (
            token.__class__ is int
            and 0 <= token <= MAX_INT64
            and expires_at.__class__ is datetime
            and expires_at.tzinfo is UTC
            and plain_names(entity_id, owner)
        ):
            return value
    if not isinstance(value, Lease):
        raise InvalidArgument(f"expected a Lease (from a FireResult or acquire_lease), not {value!r}")
    check_id("lease.entity_id", value.entity_id)
    check_id("lease.owner", value.owner)
    check_int("lease.token", value.token)
    check_time("lease.expires_at", value.expires_at)
    if len(_CHECKED_LEASES) >= _MAX_CHECKED_LEASES:
        _CHECKED_LEASES.clear()  # bounded; the next fires check their leases again
    _CHECKED_LEASES[id(value)] = value
    return value


def optional_lease(value: object) -> Lease | None:
    if value is None:
        return None
    if not isinstance(value, Lease):
        raise InvalidArgument(f"lease must be a Lease (from a FireResult or acquire_lease), not {value!r}")
    return lease_arg(value)


def check_ttl(ttl: object) -> timedelta | None:
    """``None``, or ``ttl`` (a timedelta or seconds) as a valid duration: the same rule as
    ``Policy.lease_ttl`` (:func:`fsm.limits.check_duration`)."""
    return None if ttl is None else check_duration("ttl", ttl)


def actor_arg(actor: object) -> Actor:
    """The :class:`Actor` named by ``actor`` (an Actor or its value)."""
    if actor.__class__ is Actor:
        return actor
    if not isinstance(actor, str) or actor not in _ACTORS:
        raise InvalidArgument(f"actor must be one of {', '.join(_ACTORS)}, not {actor!r}")
    return Actor(actor)


_CONSTANT_FACTORIES: frozenset[object] = frozenset({dict, list, set, frozenset, tuple, str, int, float, bool})
"""Default factories whose every call makes an equal value (``dict()`` is always ``{}``)."""

_EMPTY_VALIDATED: dict[type[BaseModel], dict[str, Any] | None] = {}
"""Per model: what validating empty data gives, when that is the same every time (None: it
may not be, validate each time)."""


def _empty_result(model: type[BaseModel]) -> dict[str, Any] | None:
    """What ``model`` makes of ``{}``, if every validation of ``{}`` makes the same: no
    validator, serializer or computed field of its own, every default a constant or made
    by a constant factory, none validated.  A job queued with empty data is the common
    case (``create_many`` of thousands): the model then runs once, not once per item."""
    if model in _EMPTY_VALIDATED:
        return _EMPTY_VALIDATED[model]
    found: dict[str, Any] | None = None
    decorators = model.__pydantic_decorators__
    pure = not any(
        (
            decorators.validators,
            decorators.field_validators,
            decorators.root_validators,
            decorators.field_serializers,
            decorators.model_serializers,
            decorators.model_validators,
            decorators.computed_fields,
        )
    )
    pure = pure and not model.model_config.get("validate_default", False)
    overrides = ("model_post_init", "model_validate", "model_dump", "__init__", "__pydantic_private__")
    for klass in model.__mro__:
        if klass is not BaseModel and issubclass(klass, BaseModel) and any(n in klass.__dict__ for n in overrides):
            pure = False  # its own code runs on every validation (private attributes' too)
    for field in model.model_fields.values():
        factory = field.default_factory
        if field.validate_default or (factory is not None and factory not in _CONSTANT_FACTORIES):
            pure = False
    if pure:
        try:
            found = json_copy(model.model_validate({}).model_dump(mode="json"), lifecycle=model.__name__)
        except (ValidationError, ValueError, TypeError, RecursionError, InvalidData):
            found = None  # a required field, or a model that chokes: validated (and refused) each time
    _EMPTY_VALIDATED[model] = found
    return found


def _fresh(value: Any) -> Any:
    """A copy of ``value``, JSON already checked (:func:`_empty_result`'s), its containers new."""
    if value.__class__ is dict:
        return {k: _fresh(v) for k, v in value.items()}
    if value.__class__ is list:
        return [_fresh(v) for v in value]
    return value


def validate_data(
    model: type[BaseModel] | None, kind: str, data: dict[str, Any], entity_id: str | None
) -> dict[str, Any]:
    """A fresh copy of ``data``, validated by the lifecycle's model (if any) and checked to
    be JSON within the limits every store applies (:func:`fsm.limits.json_copy`)."""
    if not data and data.__class__ is dict and model is not None:
        empty = _empty_result(model)
        if empty is not None:
            fresh: dict[str, Any] = _fresh(empty)
            return fresh
    data = json_copy(data, lifecycle=kind, entity_id=entity_id)  # refused, never coerced by the model
    if model is not None:
        try:
            data = model.model_validate(data).model_dump(mode="json")
        except ValidationError as err:
            raise InvalidData(lifecycle=kind, entity_id=entity_id, errors=[dict(e) for e in err.errors()]) from None
        except (ValueError, TypeError, RecursionError) as err:  # a model that chokes on hostile input
            raise InvalidData(
                lifecycle=kind, entity_id=entity_id, errors=[{"loc": (), "msg": f"{type(err).__name__}: {err}"}]
            ) from None
    copied: dict[str, Any] = json_copy(data, lifecycle=kind, entity_id=entity_id)
    return copied


__all__ = [
    "actor_arg",
    "check_arguments",
    "check_ttl",
    "event_arg",
    "lease_arg",
    "optional_lease",
    "optional_text",
    "text",
    "validate_data",
]
