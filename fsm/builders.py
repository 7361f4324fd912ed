"""Transition expressions, typed for user code checked with ``mypy --strict``.

python-statemachine ships type hints, with two gaps a user's strict mypy run trips on:

- ``state.to.itself(...)`` is not annotated at all, so strict mypy refuses the call
  ("Call to untyped function "itself" in typed context"): :func:`itself` is the same
  self-transition, typed;
- a compound state's ``.to(...)`` (``class active(State.Compound)``, then
  ``active.to(failed)``) is typed by python-statemachine's class-level hint as its
  builder, ``_ToState``, although at run time the compound class is a ``State`` and the call
  returns a ``TransitionList``: :data:`Transitions` names what the builders
  (:func:`fsm.worker`, :func:`fsm.reaper`, :func:`fsm.operator_override`) take, that type
  included, so ``reaper(active.to(failed, cond="lease_stale"))`` checks clean.

The builders still check at run time what they were given (``InvalidDefinition``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, cast

from statemachine.state import NestedStateFactory, State
from statemachine.transition import Transition
from statemachine.transition_list import TransitionList

from fsm.errors import InvalidDefinition

if TYPE_CHECKING:
    from statemachine.state import _ToState

Transitions: TypeAlias = "TransitionList | Transition | _ToState"
"""A transition expression as mypy sees it: ``a.to(b)``, ``a.to(b) | c.to(d)``, one
``Transition``, or a compound state's ``.to(...)`` (``_ToState`` to mypy, a
``TransitionList`` at run time)."""


def itself(state: State | NestedStateFactory, **kwargs: Any) -> TransitionList:
    """``state.to.itself(**kwargs)``, typed: a self-transition of ``state`` (``cond=``,
    ``event=`` and the rest as python-statemachine takes them)::

        heartbeat = worker(itself(active.running, cond="holds_lease"))
    """
    if not isinstance(state, State):
        raise InvalidDefinition(f"itself() takes a state, not {state!r:.80}")
    found = cast(Any, state.to).itself(**kwargs)
    if not isinstance(found, TransitionList):  # pragma: no cover - python-statemachine's contract
        raise InvalidDefinition(f"{state.id}.to.itself() gave {found!r:.80}, not transitions")
    return found


def transition_list(transitions: object, builder: str) -> TransitionList:
    """``transitions`` as a ``TransitionList``, or ``InvalidDefinition`` naming ``builder``."""
    if isinstance(transitions, TransitionList):
        return transitions
    if isinstance(transitions, Transition):
        return TransitionList([transitions])
    raise InvalidDefinition(
        f"{builder}() takes transitions (state.to(target), a | b, itself(state)), not {transitions!r:.80}"
    )


__all__ = ["Transitions", "itself", "transition_list"]
