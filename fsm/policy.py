"""Per-lifecycle timing policy: how long a lease lives, how long it may be renewed.

Part of the data model (no framework imports): stores receive the numbers they need,
the engine evaluates guards with them, the reaper will validate its config against them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from fsm.limits import MAX_INT64, as_duration, duration_problem

DEFAULT_STALE_AFTER = timedelta(minutes=60)
"""A running entity with no lease is stale once not updated for this long (seeds/000)."""
DEFAULT_LEASE_TTL = timedelta(minutes=2)
"""A lease lives this long after its last renewal; holders renew every third of it."""
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_MAX_RECLAIMS = 2


class Policy(BaseModel):
    """Timing and retry budgets of one lifecycle.

    ``renewal_budget`` caps, per leaf state, how long after entering that state a lease may
    still be renewed: a live-but-hung holder cannot keep an entity forever.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    stale_after: timedelta = Field(DEFAULT_STALE_AFTER, description="idle time that makes a lease-less entity stale")
    lease_ttl: timedelta = Field(DEFAULT_LEASE_TTL, description="lifetime of a lease after acquire or renew")
    renewal_budget: dict[str, timedelta] = Field(
        default_factory=dict, description="per state: how long after entering it a lease may be renewed"
    )
    max_attempts: int = Field(
        DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_INT64, strict=True, description="starts before expire fails the entity"
    )
    max_reclaims: int = Field(
        DEFAULT_MAX_RECLAIMS, ge=0, le=MAX_INT64, strict=True, description="finalizer reclaims before expire fails it"
    )

    @field_validator("stale_after", "lease_ttl", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> timedelta:
        return duration(value)

    @field_validator("renewal_budget", mode="before")
    @classmethod
    def _positive_budgets(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic says what is wrong
        bad = []
        checked: dict[Any, timedelta] = {}
        for state, budget in value.items():
            try:
                checked[state] = duration(budget)
            except ValueError as err:
                bad.append(f"{state}: {err}")
        if bad:
            raise ValueError(f"renewal budgets must be valid durations ({'; '.join(bad)})")
        return checked

    @model_validator(mode="after")
    def _budget_exceeds_ttl(self) -> Policy:
        short = [s for s, b in self.renewal_budget.items() if b < self.lease_ttl]
        if short:
            raise ValueError(
                f"renewal budget of {', '.join(short)} is shorter than lease_ttl ({self.lease_ttl}); "
                "a holder could not even keep its first lease"
            )
        return self

    def budget_for(self, state: str) -> timedelta | None:
        return self.renewal_budget.get(state)


_TIMEDELTA: TypeAdapter[timedelta] = TypeAdapter(timedelta)


def duration(value: Any) -> timedelta:
    """``value`` as a duration under the one rule of :func:`fsm.limits.duration_problem`
    (a timedelta or seconds, positive, finite, at most ``MAX_DURATION``); an ISO-8601 or
    ``HH:MM:SS`` string is parsed first.  Raises ``ValueError`` (inside a pydantic model,
    a ``ValidationError`` naming the field).  ``Engine.renew_lease`` applies the same rule.
    """
    if isinstance(value, str):
        value = _TIMEDELTA.validate_python(value)
    problem = duration_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return as_duration(value)


__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_RECLAIMS",
    "DEFAULT_STALE_AFTER",
    "Policy",
    "duration",
]
