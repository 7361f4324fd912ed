"""Checking the engine's arguments before anything is read or written (I10).

Every public entry point of the engine refuses ill-typed input here, with
``InvalidArgument`` or ``InvalidData``, so that the firing code only ever sees values of
the types it declares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from fsm.errors import InvalidArgument, InvalidData
from fsm.records import Actor, Lease

_ACTORS = tuple(a.value for a in Actor)


def check_arguments(reason: object, idempotency_key: object, data: object) -> None:
    """Refuse an ill-typed reason, idempotency key or data patch."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string, not {type(reason).__name__}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise InvalidArgument(f"idempotency_key must be a non-empty string, not {idempotency_key!r}")
    if data is not None and not isinstance(data, Mapping):
        raise InvalidArgument(f"data must be a mapping (a patch of top-level keys), not {type(data).__name__}")


def text(name: str, value: object) -> str:
    """``value`` if it is a non-empty string, else ``InvalidArgument`` naming ``name``."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty string, not {value!r}")
    return value


def lease_arg(value: object) -> Lease:
    """``value`` if it is a :class:`Lease`."""
    if not isinstance(value, Lease):
        raise InvalidArgument(f"expected a Lease (from a FireResult or acquire_lease), not {value!r}")
    return value


def optional_lease(value: object) -> Lease | None:
    if value is not None and not isinstance(value, Lease):
        raise InvalidArgument(f"lease must be a Lease (from a FireResult or acquire_lease), not {value!r}")
    return value


def check_ttl(ttl: timedelta | None) -> None:
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta()):
        raise InvalidArgument(f"ttl must be a positive timedelta, not {ttl!r}")


def actor_arg(actor: Actor | str) -> Actor:
    """The :class:`Actor` named by ``actor`` (an Actor or its value)."""
    if actor.__class__ is Actor:
        return actor
    if actor not in _ACTORS:
        raise InvalidArgument(f"actor must be one of {', '.join(_ACTORS)}, not {actor!r}")
    return Actor(actor)


def validate_data(
    model: type[BaseModel] | None, kind: str, data: dict[str, Any], entity_id: str | None
) -> dict[str, Any]:
    """``data`` validated by the lifecycle's model (if any) and checked to be JSON."""
    if model is not None:
        try:
            data = model.model_validate(data).model_dump(mode="json")
        except ValidationError as err:
            raise InvalidData(lifecycle=kind, entity_id=entity_id, errors=[dict(e) for e in err.errors()]) from None
    try:  # every store keeps JSON: refuse here what a SQL store would refuse, on every store
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidData(
            lifecycle=kind, entity_id=entity_id, errors=[{"loc": (), "msg": f"not JSON: {err}"}]
        ) from None
    return data


__all__ = [
    "actor_arg",
    "check_arguments",
    "check_ttl",
    "lease_arg",
    "optional_lease",
    "text",
    "validate_data",
]
