"""Timed transitions: ``reaper(waiting.to(failed), after=timedelta(hours=24))``.

A timed transition fires once the entity has stayed ``after`` in the transition's source
state, unless another transition left that state first.  It is a reaper transition with
one generated guard, ``after_24h``, whose store-side condition (:class:`~fsm.records.TimerDue`)
reads the entity's ``timer_since``: when it entered its *timed state*.  So the reaper's
set-based rules fire timers like any other rule (each row guarded by the statement, a late
timer on an entity that moved on matches nothing), and python-statemachine runs the same
chart with the same guard (the agreement tests need nothing new).

Where the clock starts: a timer on a compound state counts from entering that state, and a
move between its children does not restart it; an external self-transition (``to.itself()``)
leaves and re-enters its state, so it restarts that state's timers, as in every statechart.
To keep one clock column per entity, each leaf's path (the leaf and its ancestors) may hold
timers on one state only; a chart with timers on both a compound state and one of its
children is refused with that advice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta

from statemachine import State
from statemachine.transition import Transition

from fsm.errors import InvalidDefinition
from fsm.guards import Guard, GuardContext
from fsm.records import TimerDue, TimerMode

MIN_AFTER = timedelta(milliseconds=1)
MAX_AFTER = timedelta(days=36500)
"""A timer's delay is at least a millisecond and at most a hundred years."""

_UNITS = (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000), ("ms", 1_000))


def check_after(after: object, where: str = "after") -> timedelta:
    """``after`` as a validated ``timedelta`` (a number is seconds); anything else, a
    non-finite or out-of-range value, or a delay finer than a millisecond is refused."""
    if isinstance(after, bool) or not isinstance(after, timedelta | int | float):
        raise InvalidDefinition(f"{where} must be a timedelta or a number of seconds, got {type(after).__name__}")
    if not isinstance(after, timedelta):
        assert isinstance(after, int | float)
        if not math.isfinite(after):
            raise InvalidDefinition(f"{where} must be finite, got {after!r}")
        if not MIN_AFTER.total_seconds() <= after <= MAX_AFTER.total_seconds():
            raise InvalidDefinition(f"{where} must be between 1 ms and 100 years, got {after!r} s")
        after = timedelta(seconds=after)
    if not MIN_AFTER <= after <= MAX_AFTER:
        raise InvalidDefinition(f"{where} must be between 1 ms and 100 years, got {after}")
    if after % MIN_AFTER:
        raise InvalidDefinition(f"{where} must be a whole number of milliseconds, got {after}")
    return after


def format_delay(after: timedelta) -> str:
    """``24h``, ``1h30m``, ``90s`` -> ``1m30s``, ``500ms``, ``7d``: the compact form diagrams
    and guard names use."""
    left = after // timedelta(microseconds=1)
    parts: list[str] = []
    # days only from two days up: "after 24h" reads better than "after 1d"
    for unit, size in _UNITS if after >= timedelta(days=2) else _UNITS[1:]:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def timer_guard_name(after: timedelta) -> str:
    """The generated guard of a timer: ``after_24h``."""
    return f"after_{format_delay(after)}"


def timer_guard(after: timedelta) -> Guard:
    """The guard a timed transition carries: the entity has been in its timed state for
    ``after``; re-checked by the store at commit (:class:`~fsm.records.TimerDue`)."""

    def due(ctx: GuardContext) -> bool:
        since = ctx.snapshot.timer_since
        return since is not None and since <= ctx.now - after

    condition = TimerDue(after)
    return Guard(
        timer_guard_name(after),
        due,
        f"the entity has been in its timed state for {format_delay(after)}",
        condition=lambda policy: condition,
        after=after,
    )


# -- where each leaf's clock starts -----------------------------------------------------------


def _path(state: State) -> list[State]:
    """``state`` and its ancestors, innermost first."""
    chain = [state]
    while chain[-1].parent is not None:
        chain.append(chain[-1].parent)
    return chain


def timed_scopes(name: str, states: Iterable[State], timed: set[str]) -> dict[str, str | None]:
    """Leaf id -> the one timed state on its path (``None`` when there is none).

    ``timed`` holds the ids of the states with ``after=`` transitions declared on them.
    Two timed states on one path are refused: one ``timer_since`` column cannot hold two
    clocks."""
    scopes: dict[str, str | None] = {}
    for state in states:
        if state.is_compound:
            continue
        on_path = [s.id for s in _path(state) if s.id in timed]
        if len(on_path) > 1:
            raise InvalidDefinition(
                f"{name}: states {' and '.join(repr(s) for s in reversed(on_path))} both have timed "
                f"transitions, and {state.id!r} is inside both; a leaf may be inside one timed state "
                "only (put every timer of that path on one state, or move one into a sibling)"
            )
        scopes[state.id] = on_path[0] if on_path else None
    return scopes


def _domain(transition: Transition) -> State | None:
    """The transition domain: the innermost state a transition stays inside (``None`` for
    the chart itself).  An internal transition to a descendant stays inside its source; an
    external one leaves its source, so the domain is the innermost proper ancestor of the
    source that also contains the target."""
    source, target = transition.source, transition.targets[0]
    target_path = _path(target)
    if transition.internal and source in target_path:
        return source
    for state in _path(source)[1:]:
        if state in target_path[1:]:
            return state
    return None


def timer_mode(
    transition: Transition, source_leaf: str, target_leaf: State, scopes: dict[str, str | None]
) -> TimerMode:
    """What a branch does to the timer clock: ``ARM`` when it enters the target leaf's timed
    state, ``KEEP`` when it stays inside it (or no timed state is involved), ``CLEAR`` when
    it leaves every timed state."""
    scope = scopes.get(target_leaf.id)
    if scope is None:
        return TimerMode.CLEAR if scopes.get(source_leaf) is not None else TimerMode.KEEP
    domain = _domain(transition)
    inside_domain = _path(target_leaf)
    if domain is not None:
        inside_domain = inside_domain[: inside_domain.index(domain)]
    entered = {s.id for s in inside_domain}
    return TimerMode.ARM if scope in entered else TimerMode.KEEP


__all__ = [
    "MAX_AFTER",
    "MIN_AFTER",
    "check_after",
    "format_delay",
    "timed_scopes",
    "timer_guard",
    "timer_guard_name",
    "timer_mode",
]
