"""How the workers of one lifecycle share the work: concurrency limits, rate limits, and
the answer to priorities' starvation.

A lifecycle declares ``limits = Limits(...)`` (a worker may pass its own, which wins); the
engine hands the store a :class:`~fsm.records.ClaimLimits` with every claim, and the store
counts what the limits count *in the store*, under the claim's own transaction, so they
hold across every worker process and machine:

- ``per_key=N``: at most N entities with the same key hold a live lease at once.  The key
  is the entity's ``concurrency_key``, or with ``key="field"`` the value of that data
  field at create (a string or an integer; the create stores it as the concurrency key).
- ``total=N``: at most N entities of the lifecycle hold a live lease at once.
- ``rate=Rate(R, per=period)`` and ``key_rate=``: at most R *starts* (claims that start
  an entity, not resumes of parked or reclaimed ones) in any window of ``period``, for the
  lifecycle and per key.

A slot is a live lease: an entity parked by a durable sleep, a wait or a wait for its
children holds none, and the slot of a worker that died frees when its lease expires.  An
entity whose key is full waits in its queue (``waiting for its key`` in ``fsm show`` and
the inspector) and keeps its place in the line.  A limit changes *which* rows a claim
takes, never the guard of a write: every taken row is taken by the same fenced write as
without limits.

``starve_after``: priorities are strict by default (a claim takes the highest priority
first, then the longest due).  With ``starve_after=d``, each claim first takes, per state,
the one entity that has been due the longest, if it has been due for ``d`` or more,
whatever its priority: a flood of urgent work slows the rest, never stops it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from fsm.errors import ConfigError
from fsm.limits import MAX_LIMIT, as_duration, duration_problem
from fsm.policy import config_errors
from fsm.records import ClaimLimits

_UNSET: Any = object()


def _duration(value: Any, name: str) -> timedelta:
    problem = duration_problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return as_duration(value)


class Rate(BaseModel):
    """At most ``count`` starts in any window of length ``per`` (a timedelta or seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    count: int = Field(ge=1, le=MAX_LIMIT, description="starts allowed per window")
    per: timedelta = Field(description="the window's length")

    def __init__(self, count: int = _UNSET, per: timedelta | float = _UNSET, **extra: Any) -> None:
        given = {name: value for name, value in (("count", count), ("per", per)) if value is not _UNSET}
        super().__init__(**given, **extra)  # a missing field is pydantic's to name (a ConfigError)

    @field_validator("per", mode="before")
    @classmethod
    def _period(cls, value: Any) -> timedelta:
        return _duration(value, "per")

    def pair(self) -> tuple[int, timedelta]:
        return (self.count, self.per)


class Limits(BaseModel):
    """Concurrency and rate limits of a lifecycle's claims, and its starvation rule (see
    the module doc).  Every field is optional; ``Limits()`` limits nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    per_key: int | None = Field(default=None, ge=1, le=MAX_LIMIT, description="leases at once per key")
    total: int | None = Field(default=None, ge=1, le=MAX_LIMIT, description="leases at once of the lifecycle")
    key: str | None = Field(
        default=None, min_length=1, max_length=64, description="data field the key is read from at create"
    )
    rate: Rate | None = Field(default=None, description="starts per window of the lifecycle")
    key_rate: Rate | None = Field(default=None, description="starts per window per key")
    starve_after: timedelta | None = Field(default=None, description="due this long: taken before priorities")

    @field_validator("starve_after", mode="before")
    @classmethod
    def _starve(cls, value: Any) -> timedelta | None:
        return None if value is None else _duration(value, "starve_after")

    @field_validator("key")
    @classmethod
    def _key_name(cls, value: str | None) -> str | None:
        if value is not None and not value.isidentifier():
            raise ValueError(f"key must name a data field (an identifier), not {value[:40]!r}")
        return value

    def replace(self, **changes: Any) -> Limits:
        """A copy with ``changes`` applied, validated again."""
        return Limits(**{**self.model_dump(), **changes})

    @property
    def counts(self) -> bool:
        """Whether a claim has anything to count."""
        return any(v is not None for v in (self.per_key, self.total, self.rate, self.key_rate))

    def for_claim(self, leased: Iterable[str]) -> ClaimLimits | None:
        """What the store counts, with the lifecycle's ``leased`` states; ``None`` when
        nothing is limited."""
        if not self.counts:
            return None
        return ClaimLimits(
            leased=tuple(sorted(leased)),
            per_key=self.per_key,
            total=self.total,
            rate=None if self.rate is None else self.rate.pair(),
            key_rate=None if self.key_rate is None else self.key_rate.pair(),
        )

    def key_of(self, data: dict[str, Any]) -> str | None:
        """The concurrency key a create stores for ``data`` (``key=``): the field's value as
        text, ``None`` when the field is absent or null."""
        if self.key is None:
            return None
        value = data.get(self.key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"the key field {self.key!r} must hold a string or an integer, not {type(value).__name__}")
        return str(value)


def check_limits(value: object) -> Limits | None:
    """A worker's ``limits=``: an :class:`Limits` or ``None``."""
    if value is not None and not isinstance(value, Limits):
        raise ConfigError(f"limits must be an fsm.Limits or None, not {type(value).__name__}")
    return value


__all__ = ["Limits", "Rate", "check_limits"]
