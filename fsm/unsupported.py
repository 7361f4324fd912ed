"""What a Lifecycle may not declare: python-statemachine features the compiled table cannot
run as python-statemachine runs them.

The engine never builds a StateChart on the hot path: it reads a leaf state id, looks the
event up in the compiled table and commits.  A feature that only lives inside a running
StateChart (callbacks, error routing) would be
accepted by python-statemachine and then silently do nothing, or something else, in the
engine.  Each one is refused here at class creation, naming the feature, where it is
declared and what to write instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from statemachine import State
from statemachine.callbacks import CallbackGroup, CallbackSpec
from statemachine.event import Event
from statemachine.graph import iterate_states
from statemachine.transition import Transition

from fsm.errors import InvalidDefinition
from fsm.guards import Guard
from fsm.limits import MAX_DURATION

CALLBACK_ADVICE = (
    "the engine commits transitions without running python-statemachine callbacks. "
    "Veto a transition with a named @guard; react to a committed transition with the "
    "`transitioned` signal (sent after the commit); do a state's work in the worker's "
    "handler for that state; run a side effect that must happen once through the effects ledger"
)

_GENERIC_CONVENTIONS = {
    "prepare_event": "before every event",
    "before_transition": "before every transition",
    "on_transition": "on every transition",
    "after_transition": "after every transition",
    "on_enter_state": "on entering every state",
    "on_exit_state": "on leaving every state",
    "on_invoke_state": "on entering every state, as an invoked service",
}

_GROUP_ARGUMENT = {
    CallbackGroup.ENTER: "enter=",
    CallbackGroup.EXIT: "exit=",
    CallbackGroup.INVOKE: "invoke=",
    CallbackGroup.BEFORE: "before=",
    CallbackGroup.ON: "on=",
    CallbackGroup.AFTER: "after=",
}


def _states(cls: Any) -> list[State]:
    """Every state in the tree, history pseudo-states included (``states_map`` lists none)."""
    return list(iterate_states(cls.states))


def _transitions(cls: Any) -> Iterator[Transition]:
    for state in _states(cls):
        yield from state.transitions


def _describe(t: Transition) -> str:
    target = t.target.id if t.target is not None else "?"
    return f"transition {t.event!r} from {t.source.id!r} to {target!r}"


def refuse_state_values(name: str, cls: Any) -> None:
    """Custom ``value=`` is allowed, but two states sharing one value would share one key of
    ``states_map``, and one of them would vanish from the compiled table."""
    ids: dict[str, str] = {}
    for state in _states(cls):
        where = state.parent.id if state.parent is not None else "the chart"
        if state.id in ids:
            raise InvalidDefinition(
                f"{name}: two states share the id {state.id!r} (in {ids[state.id]} and in {where}); the engine "
                "persists a state by its id, so ids must be unique in the whole chart: rename one"
            )
        ids[state.id] = where
    seen: dict[Any, str] = {}
    for state in _states(cls):
        if state.value in seen:
            raise InvalidDefinition(
                f"{name}: states {seen[state.value]!r} and {state.id!r} share the value {state.value!r}; "
                "state values must be unique (the engine persists state ids, values are for display)"
            )
        seen[state.value] = state.id


def refuse_flags(name: str, cls: Any) -> None:
    """StateChart switches whose python-statemachine meaning the engine does not have."""
    if cls.allow_event_without_transition is not False:
        raise InvalidDefinition(
            f"{name}: allow_event_without_transition must stay False: the engine refuses an event with "
            "no allowed transition (TransitionNotAllowed), it never ignores one"
        )
    if cls.catch_errors_as_events is not False:
        raise InvalidDefinition(
            f"{name}: catch_errors_as_events must stay False: errors are not routed as error.execution "
            "events; a guard that raises propagates from fire and nothing is written"
        )
    if cls._class_listeners:
        raise InvalidDefinition(
            f"{name}: class-level listeners= hold callbacks, which are not supported: {CALLBACK_ADVICE}"
        )


def declared_delays(cls: Any) -> dict[str, timedelta]:
    """Event id -> the delay it is declared with (``Event(..., delay=ms)``): python-statemachine
    queues such an event to fire later; the engine fires it with ``fire_later``."""
    return {event_id: timedelta(milliseconds=event.delay) for event_id, event in _event_ids(cls).items() if event.delay}


def _event_ids(cls: Any) -> dict[str, Event]:
    found: dict[str, Event] = {str(e): e for e in cls._events}
    for t in _transitions(cls):
        for e in t.events:
            found.setdefault(str(e), e)
    return found


def refuse_events(name: str, cls: Any, guards: Mapping[str, Guard], framework: frozenset[str]) -> None:
    """Delays the engine cannot keep, and event names that would replace a framework
    attribute or shadow a guard.  (Dotted and wildcard descriptors are matched as
    python-statemachine matches them: :func:`fsm.table.matches`.)"""
    for event_id, event in _event_ids(cls).items():
        if event.delay and (
            isinstance(event.delay, bool)
            or not isinstance(event.delay, int | float)
            or not math.isfinite(event.delay)
            or not 1 <= event.delay <= MAX_DURATION.total_seconds() * 1000
        ):
            raise InvalidDefinition(
                f"{name}: event {event_id!r} has delay={event.delay!r}: a delay is a number of milliseconds "
                f"from 1 to {MAX_DURATION.days} days"
            )
        if event_id in framework:
            raise InvalidDefinition(
                f"{name}: event {event_id!r} would replace the framework's Lifecycle.{event_id}; rename the event"
            )
        if event_id in guards:
            raise InvalidDefinition(
                f"{name}: event {event_id!r} has the name of guard {event_id!r}; python-statemachine would "
                f"resolve cond={event_id!r} to the event; rename one of them"
            )


def _explicit_callbacks(cls: Any) -> Iterator[tuple[str, CallbackSpec]]:
    """Callbacks attached to a state or transition by argument or decorator (guards excluded:
    the table compiles them)."""
    for state in _states(cls):
        for spec in state._specs:
            if not spec.is_convention:
                yield f"state {state.id!r}", spec
        for t in state.transitions:
            for spec in t._specs:
                if not spec.is_convention and spec.group is not CallbackGroup.COND:
                    yield _describe(t), spec


def _conventions(cls: Any) -> dict[str, str]:
    """The method names python-statemachine calls by naming convention for this chart, and
    when it calls each."""
    names = dict(_GENERIC_CONVENTIONS)
    for state in _states(cls):
        names[f"on_enter_{state.id}"] = f"on entering state {state.id!r}"
        names[f"on_exit_{state.id}"] = f"on leaving state {state.id!r}"
        names[f"on_invoke_{state.id}"] = f"on entering state {state.id!r}, as an invoked service"
    for event_id in _event_ids(cls):
        names[f"before_{event_id}"] = f"before event {event_id!r}"
        names[f"on_{event_id}"] = f"on event {event_id!r}"
        names[f"after_{event_id}"] = f"after event {event_id!r}"
    return names


def refuse_callbacks(name: str, cls: Any, guards: Mapping[str, Guard], base: type) -> None:
    """Every callback python-statemachine would run: arguments and decorators on states and
    transitions, and methods (or events, or guards) named by its conventions.  ``base`` is
    the framework's own class: what it defines is the framework's, not a user callback."""
    for where, spec in _explicit_callbacks(cls):
        if spec.group is CallbackGroup.VALIDATOR:
            if isinstance(spec.func, str):
                continue  # a named validator: the table runs it (fsm.guards.validator)
            raise InvalidDefinition(
                f"{name}: {where}: validators= must name a validator declared with @validator, so the engine "
                f"can run it on the stored entity; got {spec.func!r}"
            )
        argument = _GROUP_ARGUMENT.get(spec.group, spec.group.name.lower())
        raise InvalidDefinition(
            f"{name}: {where}: callback {spec.attr_name!r} ({argument} / @{spec.group.name.lower()} "
            f"decorator) is not supported: {CALLBACK_ADVICE}"
        )
    for convention, when in _conventions(cls).items():
        if convention in guards:
            raise InvalidDefinition(
                f"{name}: guard {convention!r} is named like the python-statemachine callback run {when}, "
                "which it would also be called as; rename the guard"
            )
        value = getattr(cls, convention, None)
        if value is not None and value is not getattr(base, convention, None):
            what = "event" if isinstance(value, Event) else "method" if callable(value) else "attribute"
            raise InvalidDefinition(
                f"{name}: {what} {convention!r} is, by its name, a python-statemachine callback run {when}; "
                f"callbacks are not supported: {CALLBACK_ADVICE}"
            )


def framework_names(base: type) -> frozenset[str]:
    """Names an event may not take: python-statemachine binds each event as a class
    attribute, so an event named ``restore`` would silently replace ``Lifecycle.restore``."""
    declared = getattr(base, "__annotations__", {})  # ClassVars set per subclass (kind, table)
    return frozenset(dir(base)) | frozenset(declared) | {"_declared_transitions"}


def refuse_unsupported(name: str, cls: Any, guards: Mapping[str, Guard], base: type) -> None:
    """Run every refusal of this module on a freshly created subclass of ``base`` (the
    framework's ``Lifecycle``)."""
    refuse_state_values(name, cls)
    refuse_flags(name, cls)
    refuse_events(name, cls, guards, framework_names(base))
    refuse_callbacks(name, cls, guards, base)


__all__ = ["CALLBACK_ADVICE", "refuse_unsupported"]
