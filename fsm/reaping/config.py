"""The reaper's configuration and results: what a tick may do, and what it did.

``ReaperConfig`` (interval, batch size, kill switch, leader), ``ReapPolicy`` (a lifecycle's
policy plus ``max_active`` and the backstop rule checked against it) and ``ReapResult``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from fsm.definition_rules import leased_states as _leased_states
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy, config_errors, duration
from fsm.records import LeaseChange

DEFAULT_INTERVAL = timedelta(minutes=5)
DEFAULT_BATCH_SIZE = 500


class ReaperConfig(BaseModel):
    """How often and how much the reaper sweeps.  ``enabled=False`` is the kill switch: a
    tick then reads and writes nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    # defaults as default=...: a user's mypy without the pydantic plugin reads only the
    # keyword (dataclass_transform), and would call every field a required argument
    interval: timedelta = Field(default=DEFAULT_INTERVAL, description="time between two ticks")
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE, ge=1, le=100_000, strict=True, description="candidates per keyset page"
    )
    enabled: bool = Field(default=True, strict=True, description="kill switch: off means a tick touches nothing")
    leader: bool = Field(default=False, strict=True, description="one reaper at a time: tick only while leading")
    leader_ttl: timedelta | None = Field(default=None, description="leader lease lifetime (default: 3 x interval)")

    @field_validator("interval", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> timedelta:
        return duration(value)  # the one rule of every TTL: positive, finite, bounded

    @field_validator("leader_ttl", mode="before")
    @classmethod
    def _positive_ttl(cls, value: Any) -> timedelta | None:
        return None if value is None else duration(value)

    @model_validator(mode="after")
    def _leader_outlives_a_tick(self) -> ReaperConfig:
        if self.leader_ttl is not None and self.leader_ttl <= self.interval:
            raise ValueError(
                f"leader_ttl ({self.leader_ttl}) must exceed interval ({self.interval}), "
                "or a live leader would lose its lease between two ticks"
            )
        return self

    @property
    def effective_leader_ttl(self) -> timedelta:
        return self.leader_ttl or self.interval * 3


class ReapPolicy(BaseModel):
    """One lifecycle's timing as the reaper sees it: the lifecycle's :class:`Policy` plus
    ``max_active``, the longest an entity may stay in one active state.

    The backstop rule is checked here (it is a check, not another timer): in every state
    the reaper watches, a live-but-hung holder keeps its lease at most renewal budget +
    lease TTL after entering it (once more per reclaim, which re-enters the state), and the
    reaper sees the lapse within one interval; ``max_active`` must exceed that sum, or the
    promise cannot hold and the config is refused naming the numbers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    @model_validator(mode="wrap")
    @classmethod
    def _config_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return config_errors(cls.__name__, data, handler)

    lifecycle: type[Lifecycle] | None = None
    """Optional where the Reaper's mapping key names it already (``{JobLifecycle: ReapPolicy(...)}``)."""
    policy: Policy | None = None
    """``None``: the lifecycle's own ``policy``."""
    max_active: timedelta | None = None

    @field_validator("max_active", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> timedelta | None:
        return None if value is None else duration(value)

    def bind(self, lifecycle: type[Lifecycle]) -> ReapPolicy:
        """This policy for ``lifecycle`` (the mapping key it was given under); refuses a
        ReapPolicy that names another lifecycle."""
        if self.lifecycle is not None and self.lifecycle is not lifecycle:
            raise ValueError(f"the policy given for {lifecycle.__name__} is a ReapPolicy of {self.lifecycle.__name__}")
        return self.model_copy(update={"lifecycle": lifecycle, "policy": self.policy or lifecycle.policy})

    @property
    def bound_lifecycle(self) -> type[Lifecycle]:
        if self.lifecycle is None:
            raise ValueError(
                "a ReapPolicy without a lifecycle is given under its lifecycle: {Lifecycle: ReapPolicy(...)}"
            )
        return self.lifecycle

    @property
    def effective_policy(self) -> Policy:
        return self.policy if self.policy is not None else self.bound_lifecycle.policy

    def check_backstop(self, interval: timedelta = DEFAULT_INTERVAL) -> list[str]:
        if self.max_active is None:
            return []
        problems = []
        lifecycle = self.bound_lifecycle
        policy = self.effective_policy
        table = lifecycle.table
        ttl = policy.lease_ttl
        for state in sorted(watched_states(lifecycle) | leased_states(lifecycle)):
            budget = policy.budget_for(state)
            if budget is None:
                problems.append(
                    f"{lifecycle.kind}: state {state!r} has no renewal budget, so a hung holder could keep "
                    f"its lease forever and max_active={self.max_active} cannot hold"
                )
                continue
            # a reclaim re-enters the state with a fresh lease and a fresh budget
            reclaims = (
                policy.max_reclaims
                if any(b.source == state == b.target and b.lease_effect is LeaseChange.ACQUIRE for b in table.declared)
                else 0
            )
            try:
                worst = (budget + ttl) * (reclaims + 1) + interval
            except OverflowError:
                worst = timedelta.max
            if self.max_active <= worst:
                spelled = f"({budget} + {ttl})" + (f" x (1 + {reclaims} reclaims)" if reclaims else "")
                problems.append(
                    f"{lifecycle.kind}: max_active={self.max_active} must exceed the renewal budget of "
                    f"{state!r} + lease_ttl{' for each entry' if reclaims else ''} + the reaper interval: "
                    f"{spelled} + {interval} = {worst}"
                )
        return problems


def watched_states(lifecycle: type[Lifecycle]) -> set[str]:
    """States the reaper moves entities out of once their lease is stale.  Any non-final
    state can be leased (``Engine.acquire_lease``), so each of these needs a budget."""
    return {
        b.source for b in lifecycle.table.declared if b.actor.value == "reaper" and LEASE_STALE_NAME in b.guard_names
    }


LEASE_STALE_NAME = "lease_stale"


def leased_states(lifecycle: type[Lifecycle]) -> set[str]:
    """Non-final states an entity can be in while a lease is held (see
    :func:`fsm.definition_rules.leased_states`)."""
    return _leased_states(lifecycle.table)


@dataclass
class ReapResult:
    """What one tick did.  ``moved`` counts per ``kind.event`` (``"job.reclaim"``)."""

    moved: Counter[str] = field(default_factory=Counter)
    lost_races: int = 0
    refused: int = 0
    """Candidates a guard only Python can judge refused (rules the store cannot run set-based)."""
    bad_rows: int = 0
    errors: int = 0
    duration_s: float = 0.0
    dry_run: bool = False
    enabled: bool = True
    leading: bool = True
    """False when ``config.leader`` is on and other reapers lead every kind this one serves."""
    standby: list[str] = field(default_factory=list)
    """With ``config.leader``: the kinds this reaper served as a standby this tick (another
    reaper leads them); the other kinds it reaped."""
    would_move: list[tuple[str, str, str, str]] = field(default_factory=list)
    """In a dry run: ``(kind, entity id, event, target)`` of each row a tick would move."""
    scheduled: Counter[str] = field(default_factory=Counter)
    """Kind -> how many runs its schedules created this tick."""
    delayed: Counter[str] = field(default_factory=Counter)
    """``kind.fired`` / ``kind.dropped`` -> delayed fires delivered this tick."""

    @property
    def total_moved(self) -> int:
        return sum(self.moved.values())

    def counts(self) -> dict[str, int]:
        return {
            **{f"moved.{k}": v for k, v in sorted(self.moved.items())},
            "lost_races": self.lost_races,
            "refused": self.refused,
            "bad_rows": self.bad_rows,
            "errors": self.errors,
            "would_move": len(self.would_move),
            **{f"scheduled.{k}": v for k, v in sorted(self.scheduled.items())},
            **{f"delayed.{k}": v for k, v in sorted(self.delayed.items())},
        }

    def summary(self) -> str:
        moved = ", ".join(f"{k}={v}" for k, v in sorted(self.moved.items())) or "nothing"
        head = "dry run, would move" if self.dry_run else "moved"
        if self.dry_run:
            moved = str(len(self.would_move))
        if not self.enabled:
            return "reaper disabled: touched nothing"
        if not self.leading:
            return f"standby: another reaper leads {', '.join(self.standby) or 'every kind'}"
        standby = f"; standby for {', '.join(self.standby)}" if self.standby else ""
        if self.scheduled:
            moved += "; scheduled " + ", ".join(f"{k}={v}" for k, v in sorted(self.scheduled.items()))
        if self.delayed:
            moved += "; delayed " + ", ".join(f"{k}={v}" for k, v in sorted(self.delayed.items()))
        return (
            f"{head} {moved}; lost races {self.lost_races}; refused {self.refused}; bad rows {self.bad_rows}; "
            f"errors {self.errors}; {self.duration_s * 1000:.1f} ms{standby}"
        )


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_INTERVAL",
    "ReapPolicy",
    "ReapResult",
    "ReaperConfig",
    "leased_states",
    "watched_states",
]
