"""Per-lifecycle timing policy: how long a lease lives, how long it may be renewed.

Part of the data model (no framework imports): stores receive the numbers they need,
the engine evaluates guards with them, the reaper will validate its config against them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from fsm.errors import ConfigError
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
DEFAULT_MAX_WAIT = timedelta(hours=24)
"""The backstop of an entity waiting, with no owner, for a worker to claim it (a reclaimed
finalizer, a released or retried one): the reaper fails it (reason ``unclaimed``) once it
has waited this long, never sooner however busy the workers are (seeds/002 NFR-6)."""

DEFAULT_RETRY_ATTEMPTS = 3
"""Attempts of a handler before its error fails the entity (the first run counts)."""
DEFAULT_INITIAL_INTERVAL = timedelta(seconds=1)
"""Backoff before the first retry."""
DEFAULT_BACKOFF_COEFFICIENT = 2.0
"""Each retry waits this many times the previous backoff..."""
DEFAULT_MAX_INTERVAL = timedelta(minutes=5)
"""... never longer than this."""
DEFAULT_JITTER = 0.1
"""Each backoff is spread by up to this fraction either way, so retries do not march in step."""


StateName = Annotated[str, Strict()]
"""A state name as a key of :class:`Policy`'s per-state maps: a ``str`` (bytes or another
type are refused, not converted)."""


def config_errors(model: str, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Validate ``data`` with ``handler``; a pydantic ``ValidationError`` becomes the
    library's :class:`~fsm.errors.ConfigError` naming every problem (a model of the
    library's configuration, built directly or by ``replace``, answers with its typed
    error, never pydantic's)."""
    try:
        return handler(data)
    except ValidationError as err:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in err.errors()]
        raise ConfigError(f"invalid {model}: " + "; ".join(problems), problems=problems) from None


class RetryPolicy(BaseModel):
    """How a worker retries a handler that raised, after Temporal's ``RetryPolicy``.

    The n-th attempt that fails waits ``initial_interval * backoff_coefficient ** (n - 1)``,
    capped at ``max_interval`` and spread by ``jitter``, before the entity is due again;
    once ``max_attempts`` attempts failed, the entity fails with reason ``error``.  An error
    retries when it is an instance of one of ``retry_on`` (every ``Exception`` when empty)
    and of none of ``non_retryable``; a type may be given as a class or by name (its
    ``__name__`` or ``module.qualname``, matched along its MRO).  Attempts are counted per
    state, from the entity's history: the n-th error of a handler in a state is attempt n
    there (each ``retry`` out of the state recorded one before it), so ``running`` and
    ``finalizing`` each get their own ``max_attempts``, and a holder's death (the reaper's
    business, ``max_attempts`` and ``max_reclaims`` of :class:`Policy`) is not counted.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    max_attempts: int = Field(default=DEFAULT_RETRY_ATTEMPTS, ge=1, le=10_000, strict=True)
    initial_interval: timedelta = Field(default=DEFAULT_INITIAL_INTERVAL)
    # numbers are strict (an int or float; never a str or bool), finite, within their range
    backoff_coefficient: float = Field(
        default=DEFAULT_BACKOFF_COEFFICIENT, ge=1.0, le=100.0, allow_inf_nan=False, strict=True
    )
    max_interval: timedelta = Field(default=DEFAULT_MAX_INTERVAL)
    jitter: float = Field(default=DEFAULT_JITTER, ge=0.0, le=1.0, allow_inf_nan=False, strict=True)
    retry_on: tuple[type[BaseException] | str, ...] = Field(default=())
    non_retryable: tuple[type[BaseException] | str, ...] = Field(default=())

    @field_validator("initial_interval", "max_interval", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> timedelta:
        return duration(value)

    @field_validator("retry_on", "non_retryable", mode="before")
    @classmethod
    def _types(cls, value: Any) -> Any:
        if isinstance(value, type | str):
            value = (value,)
        if isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, str):
                    if not item or len(item) > 255 or "\x00" in item:
                        raise ValueError(f"an exception type name must be 1 to 255 characters, not {item!r}")
                elif not (isinstance(item, type) and issubclass(item, BaseException)):
                    raise ValueError(f"exception types are classes or names, not {item!r}")
            return tuple(value)
        # a set, a mapping, a generator...: pydantic would turn it into a tuple without the
        # checks above, so it is refused
        raise ValueError(f"exception types are a class, a name, or a list or tuple of them, not {value!r:.80}")

    @model_validator(mode="after")
    def _cap_above_start(self) -> RetryPolicy:
        if self.max_interval < self.initial_interval:
            raise ValueError(
                f"max_interval ({self.max_interval}) is shorter than initial_interval ({self.initial_interval})"
            )
        return self

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` is retried (before counting attempts)."""
        if not isinstance(error, Exception) or getattr(error, "retryable", True) is False:
            return False  # an error that says so itself (a failed child) is never retried
        if any(_matches(error, t) for t in self.non_retryable):
            return False
        return not self.retry_on or any(_matches(error, t) for t in self.retry_on)

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> timedelta:
        """How long the entity waits after its ``attempt``-th attempt failed."""
        base = self.initial_interval.total_seconds()
        try:
            delay = base * self.backoff_coefficient ** max(0, attempt - 1)
        except OverflowError:
            delay = float("inf")
        delay = min(delay, self.max_interval.total_seconds())
        if self.jitter:
            delay *= 1 + self.jitter * (2 * rand() - 1)
        return timedelta(seconds=max(0.0, delay))

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with ``changes``, validated (``ConfigError`` naming every problem)."""
        replaced: RetryPolicy = _replaced(self, changes)
        return replaced


NO_RETRY = RetryPolicy(max_attempts=1)
"""A retry policy that never retries: the first error fails the entity."""


def _matches(error: BaseException, kind: type[BaseException] | str) -> bool:
    if isinstance(kind, type):
        return isinstance(error, kind)
    return any(kind in (c.__name__, f"{c.__module__}.{c.__qualname__}") for c in type(error).__mro__)


class Policy(BaseModel):
    """Timing and retry budgets of one lifecycle.

    ``renewal_budget`` caps, per leaf state, how long after entering that state a lease may
    still be renewed: a live-but-hung holder cannot keep an entity forever.  A state it
    does not name gets ``default_renewal_budget`` (6 hours); ``default_renewal_budget=None``
    lifts the cap from those states (a hung holder may then keep its lease forever).  The
    lifecycle refuses a ``renewal_budget`` key that is not one of its non-final states.

    ``retry`` names, per leaf state, how the worker retries a handler error there
    (:class:`RetryPolicy`); a state it does not name gets ``default_retry``.  A retry fires
    the lifecycle's ``retry`` event; a lifecycle without one fails the entity at the first
    error.  ``max_wait`` bounds how long an entity may wait, unowned, for a worker before
    the reaper fails it (only where the lifecycle declares that backstop).

    Every field has a default; change one with :meth:`replace`
    (``JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=30))``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    # defaults as default=...: a user's mypy without the pydantic plugin reads only the
    # keyword (dataclass_transform), and would call every field a required argument
    stale_after: timedelta = Field(
        default=DEFAULT_STALE_AFTER, description="idle time that makes a lease-less entity stale"
    )
    lease_ttl: timedelta = Field(default=DEFAULT_LEASE_TTL, description="lifetime of a lease after acquire or renew")
    renewal_budget: dict[StateName, timedelta] = Field(
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
        description="holder deaths in a state before expire fails the entity",
    )
    max_wait: timedelta = Field(
        default=DEFAULT_MAX_WAIT, description="backstop of an entity waiting, unowned, for a worker"
    )
    retry: dict[StateName, RetryPolicy] = Field(default_factory=dict, description="per state: how handler errors retry")
    default_retry: RetryPolicy | None = Field(
        default_factory=RetryPolicy, description="retry policy of every state retry does not name; None: no retry"
    )

    @field_validator("stale_after", "lease_ttl", "max_wait", mode="before")
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
        slow = sorted(s for s, r in self.retry.items() if r.max_interval >= self.max_wait)
        if self.default_retry is not None and self.default_retry.max_interval >= self.max_wait:
            slow.append("default_retry")
        if slow:
            raise ValueError(
                f"the retry backoff of {', '.join(slow)} may reach max_wait ({self.max_wait}): the reaper "
                "would fail a retried entity before it is due"
            )
        if self.max_wait <= self.lease_ttl:
            raise ValueError(
                f"max_wait ({self.max_wait}) must exceed lease_ttl ({self.lease_ttl}): a reclaimed entity "
                "could be failed before a worker had one claim window to take it"
            )
        return self

    def budget_for(self, state: str) -> timedelta | None:
        """The renewal budget of ``state``: its own, else ``default_renewal_budget``."""
        return self.renewal_budget.get(state, self.default_renewal_budget)

    def retry_for(self, state: str) -> RetryPolicy | None:
        """The retry policy of handler errors in ``state``: its own, else ``default_retry``."""
        return self.retry.get(state, self.default_retry)

    def replace(self, **changes: Any) -> Policy:
        """A copy with ``changes``, validated as a new policy (``ConfigError`` naming every
        problem): ``JobLifecycle.policy.replace(lease_ttl=timedelta(seconds=30))``."""
        replaced: Policy = _replaced(self, changes)
        return replaced


def _replaced(model: Any, changes: dict[str, Any]) -> Any:
    unknown = sorted(set(changes) - set(type(model).model_fields))
    if unknown:
        raise ConfigError(
            f"{type(model).__name__} has no field {', '.join(unknown)}",
            problems=[f"unknown field {name!r}" for name in unknown],
        )
    try:
        return type(model)(**{**{k: getattr(model, k) for k in type(model).model_fields}, **changes})
    except ValidationError as err:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'policy'}: {e['msg']}" for e in err.errors()]
        raise ConfigError(f"invalid {type(model).__name__}: " + "; ".join(problems), problems=problems) from None


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
    "DEFAULT_BACKOFF_COEFFICIENT",
    "DEFAULT_INITIAL_INTERVAL",
    "DEFAULT_JITTER",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_INTERVAL",
    "DEFAULT_MAX_RECLAIMS",
    "DEFAULT_MAX_WAIT",
    "DEFAULT_RENEWAL_BUDGET",
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_STALE_AFTER",
    "NO_RETRY",
    "Policy",
    "RetryPolicy",
    "duration",
]
