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
DEFAULT_RENEWAL_BUDGET = timedelta(hours=6)
"""The renewal budget of every state ``renewal_budget`` does not name: the backstop holds by
default, so a live-but-hung holder loses its lease at most this long (plus one TTL) after
entering the state."""
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_MAX_RECLAIMS = 2


class Policy(BaseModel):
    """Timing and retry budgets of one lifecycle.

    ``renewal_budget`` caps, per leaf state, how long after entering that state a lease may
    still be renewed: a live-but-hung holder cannot keep an entity forever.  A state it
    does not name gets ``default_renewal_budget`` (6 hours); ``default_renewal_budget=None``
    lifts the cap from those states (a hung holder may then keep its lease forever).  The
    lifecycle refuses a ``renewal_budget`` key that is not one of its non-final states.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # defaults as default=...: a user's mypy without the pydantic plugin reads only the
    # keyword (dataclass_transform), and would call every field a required argument
    stale_after: timedelta = Field(
        default=DEFAULT_STALE_AFTER, description="idle time that makes a lease-less entity stale"
    )
    lease_ttl: timedelta = Field(default=DEFAULT_LEASE_TTL, description="lifetime of a lease after acquire or renew")
    renewal_budget: dict[str, timedelta] = Field(
        default_factory=dict, description="per state: how long after entering it a lease may be renewed"
    )
    default_renewal_budget: timedelta | None = Field(
        default=DEFAULT_RENEWAL_BUDGET, description="renewal budget of every state renewal_budget does not name"
    )
    max_attempts: int = Field(
        default=DEFAULT_MAX_ATTEMPTS,
        ge=1,
        le=MAX_INT64,
        strict=True,
        description="starts before expire fails the entity",
    )
    max_reclaims: int = Field(
        default=DEFAULT_MAX_RECLAIMS,
        ge=0,
        le=MAX_INT64,
        strict=True,
        description="finalizer reclaims before expire fails it",
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

    @field_validator("default_renewal_budget", mode="before")
    @classmethod
    def _positive_default(cls, value: Any) -> timedelta | None:
        return None if value is None else duration(value)  # positive and finite, as every duration

    @model_validator(mode="after")
    def _budget_exceeds_ttl(self) -> Policy:
        short = [s for s, b in self.renewal_budget.items() if b < self.lease_ttl]
        if self.default_renewal_budget is not None and self.default_renewal_budget < self.lease_ttl:
            short.append("default_renewal_budget")
        if short:
            raise ValueError(
                f"renewal budget of {', '.join(short)} is shorter than lease_ttl ({self.lease_ttl}); "
                "a holder could not even keep its first lease"
            )
        return self

    def budget_for(self, state: str) -> timedelta | None:
        """The renewal budget of ``state``: its own, else ``default_renewal_budget``."""
        return self.renewal_budget.get(state, self.default_renewal_budget)


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
    "DEFAULT_RENEWAL_BUDGET",
    "DEFAULT_STALE_AFTER",
    "Policy",
    "duration",
]
