"""Issue 10: every chart python-statemachine accepts either runs the same through the
compiled table or is refused at class creation, naming the feature and what to write
instead.  One test per refused feature; the accepted ones are compared step by step with
python-statemachine in test_faithful_accepted.py and the generated I7 test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from statemachine import State
from statemachine.event import Event

from fsm import Guard, InvalidDefinition, Lifecycle, operator_override, worker

Extra = Callable[[dict[str, Any]], dict[str, Any]]


def _declare(extra: Extra | None = None, active_body: dict[str, Any] | None = None) -> type[Lifecycle]:
    """A valid lifecycle (``queued -> active{running, finalizing} -> done | failed``), plus
    the attributes ``extra`` returns from its states, and extra names in the compound's
    class body."""
    queued = State(initial=True)
    body: dict[str, Any] = {"running": State(initial=True), "finalizing": State(), **(active_body or {})}
    active = type(State.Compound)("active", (State.Compound,), body)
    done = State(final=True)
    failed = State(final=True)
    attrs: dict[str, Any] = {"queued": queued, "active": active, "done": done, "failed": failed}
    attrs.update(extra(attrs) if extra is not None else {})
    defaults: dict[str, Callable[[], Any]] = {
        "start": lambda: worker(queued.to(active)),
        "finish": lambda: worker(active.running.to(active.finalizing)),
        "succeed": lambda: worker(active.finalizing.to(done, cond="holds_lease")),
        "abort": lambda: operator_override(active.to(failed), reason=None),
    }
    # a default is declared only when `extra` does not redeclare the event: a transition
    # left behind without its attribute would be an (eventless) transition of its own
    attrs.update({name: make() for name, make in defaults.items() if name not in attrs})
    return type("Chart", (Lifecycle,), attrs)


def _refused(match: str, extra: Extra | None = None, active_body: dict[str, Any] | None = None) -> str:
    with pytest.raises(InvalidDefinition, match=match) as info:
        _declare(extra, active_body)
    return str(info.value)


def test_the_base_chart_of_these_tests_is_accepted() -> None:
    assert set(_declare().table.events) == {"start", "finish", "succeed", "abort"}


# -- guard expressions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "feature"),
    [
        ("g == h", "comparison"),
        ("g > 1", "comparison"),
        ("g or h == 1", "comparison"),
        ("len(g)", "function call"),
        ("In(g)", "function call"),
        ("1", "constant 1"),
        ("not 'x'", "constant 'x'"),
        ("g and", "does not parse"),
    ],
)
def test_guard_operator_the_table_does_not_evaluate_is_refused_naming_it(expression: str, feature: str) -> None:
    message = _refused(
        "operator not supported, write a named @guard",
        lambda a: {
            "g": Guard("g", lambda ctx: True),
            "h": Guard("h", lambda ctx: True),
            "abort": operator_override(a["active"].to(a["failed"], cond=expression), reason=None),
        },
    )
    assert feature in message and "transition 'abort'" in message


def test_unless_with_an_operator_is_refused_the_same_way() -> None:
    _refused(
        r"'not g > 1' uses comparison.*operator not supported",
        lambda a: {
            "g": Guard("g", lambda ctx: True),
            "abort": operator_override(a["active"].to(a["failed"], unless="g > 1"), reason=None),
        },
    )


@pytest.mark.parametrize("expression", ["g or holds_lease", "not (holds_lease and g)", "!owned v g"])
def test_a_guard_the_store_rechecks_may_not_sit_under_or_or_not(expression: str) -> None:
    """The store re-checks a conjunction of conditions at commit; a fenced or time guard
    inside a disjunction or negation could not be re-checked, so it is refused."""
    message = _refused(
        "is re-checked by the store at commit",
        lambda a: {
            "g": Guard("g", lambda ctx: True),
            "abort": operator_override(a["active"].to(a["failed"], cond=expression), reason=None),
        },
    )
    assert "make it a conjunct of its own" in message


def test_an_expression_naming_an_unknown_guard_or_state_is_refused() -> None:
    _refused(
        "unknown guard 'nope' in 'g or nope'",
        lambda a: {
            "g": Guard("g", lambda ctx: True),
            "abort": operator_override(a["active"].to(a["failed"], cond="g or nope"), reason=None),
        },
    )
    _refused(
        "names no state of the lifecycle: 'nowhere'",
        lambda a: {"abort": operator_override(a["active"].to(a["failed"], cond="In('nowhere')"), reason=None)},
    )


def test_a_negated_guard_the_store_cannot_negate_is_refused() -> None:
    _refused(
        r"unless='lease_stale' \(or 'not lease_stale'\) cannot be re-checked",
        lambda a: {"abort": operator_override(a["active"].to(a["failed"], cond="!lease_stale"), reason=None)},
    )


# -- event names and forms ------------------------------------------------------------------


@pytest.mark.parametrize("event", ["restore", "table", "guards", "kind", "policy", "send", "configuration"])
def test_event_named_like_a_framework_attribute_is_refused(event: str) -> None:
    _refused(
        rf"event '{event}' would replace the framework's Lifecycle.{event}",
        lambda a: {event: worker(a["active"].to(a["failed"]))},
    )


def test_event_named_like_a_guard_is_refused() -> None:
    _refused(
        "event 'ready' has the name of guard 'ready'",
        lambda a: {"ready": worker(a["active"].to(a["failed"])), "gate": Guard("ready", lambda ctx: True)},
    )


def test_delayed_event_is_accepted_and_a_nonsense_delay_refused() -> None:
    lifecycle = _declare(lambda a: {"later": Event(worker(a["queued"].to(a["failed"])), delay=5)})
    assert lifecycle.delays == {"later": timedelta(milliseconds=5)}  # fired with fire_later
    for delay in (-5, float("nan"), float("inf")):
        _refused(
            "event 'later' has delay=.*a delay is a number of milliseconds",
            lambda a, delay=delay: {"later": Event(worker(a["queued"].to(a["failed"])), delay=delay)},
        )


# -- callbacks ------------------------------------------------------------------------------

ADVICE = "`transitioned` signal.*worker's handler.*effects ledger"


@pytest.mark.parametrize("argument", ["before", "on", "after"])
def test_action_argument_on_a_transition_is_refused_saying_where_the_logic_goes(argument: str) -> None:
    message = _refused(
        rf"transition 'abort' from 'active' to 'failed': callback 'notify' \({argument}=",
        lambda a: {"abort": worker(a["active"].to(a["failed"], **{argument: "notify"}))},
    )
    assert "named @guard" in message and "transitioned" in message and "effects ledger" in message


@pytest.mark.parametrize("argument", ["enter", "exit", "invoke"])
def test_action_argument_on_a_state_is_refused(argument: str) -> None:
    _refused(
        rf"state 'parked': callback 'notify' \({argument}=.*{ADVICE}",
        lambda a: {
            "parked": (parked := State(**{argument: "notify"})),
            "park": worker(a["queued"].to(parked)),
            "unpark": worker(parked.to(a["failed"])),
        },
    )


def test_decorated_action_on_an_event_is_refused() -> None:
    def add(a: dict[str, Any]) -> dict[str, Any]:
        abort = worker(a["active"].to(a["failed"]))

        @abort.before  # type: ignore[untyped-decorator]
        def check(self: Any) -> None:
            raise ValueError("veto")

        return {"abort": abort, "check": check}

    _refused(rf"transition 'abort'.*callback 'check' \(before=.*{ADVICE}", add)


def test_decorated_enter_action_on_a_state_is_refused() -> None:
    def add(a: dict[str, Any]) -> dict[str, Any]:
        @a["failed"].enter  # type: ignore[untyped-decorator]
        def page(self: Any) -> None:
            pass

        return {"page": page}

    _refused(rf"state 'failed': callback 'page' \(enter=.*{ADVICE}", add)


def _method(self: Any, *args: Any, **kwargs: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("name", "when"),
    [
        ("before_abort", "before event 'abort'"),
        ("on_abort", "on event 'abort'"),
        ("after_abort", "after event 'abort'"),
        ("on_enter_failed", "on entering state 'failed'"),
        ("on_exit_queued", "on leaving state 'queued'"),
        ("on_invoke_running", "on entering state 'running', as an invoked service"),
        ("on_enter_state", "on entering every state"),
        ("on_exit_state", "on leaving every state"),
        ("before_transition", "before every transition"),
        ("on_transition", "on every transition"),
        ("after_transition", "after every transition"),
        ("prepare_event", "before every event"),
    ],
)
def test_method_named_like_a_callback_is_refused(name: str, when: str) -> None:
    _refused(
        rf"method '{name}' is, by its name, a python-statemachine callback run {when}.*{ADVICE}",
        lambda a: {name: _method},
    )


def test_callback_method_in_a_compound_body_is_refused() -> None:
    _refused("method 'on_enter_running' is, by its name", active_body={"on_enter_running": _method})


def test_event_named_like_the_callback_of_another_event_is_refused() -> None:
    _refused("event 'on_abort' is, by its name", lambda a: {"on_abort": worker(a["queued"].to(a["failed"]))})


def test_guard_named_like_a_callback_is_refused() -> None:
    _refused(
        "guard 'on_enter_done' is named like the python-statemachine callback run on entering state 'done'",
        lambda a: {"gate": Guard("on_enter_done", lambda ctx: True)},
    )


def test_a_validator_not_declared_with_at_validator_is_refused() -> None:
    _refused(
        "validators='v' must name a validator declared on the class with @validator",
        lambda a: {"abort": operator_override(a["active"].to(a["failed"], validators="v"), reason=None)},
    )
    _refused(
        "validators= must name a validator declared with @validator",
        lambda a: {"abort": operator_override(a["active"].to(a["failed"], validators=_method), reason=None)},
    )


def test_class_level_listeners_are_refused() -> None:
    _refused(f"class-level listeners= hold callbacks.*{ADVICE}", lambda a: {"listeners": [object()]})


def test_error_routing_switch_is_refused() -> None:
    _refused("catch_errors_as_events must stay False", lambda a: {"catch_errors_as_events": True})


def test_ignoring_events_without_transition_is_refused() -> None:
    _refused("allow_event_without_transition must stay False", lambda a: {"allow_event_without_transition": True})


def test_helper_methods_and_guards_that_are_no_callbacks_are_accepted() -> None:
    chart = _declare(lambda a: {"describe": _method, "on_call": Guard("on_call", lambda ctx: True)})
    assert "on_call" in chart.guards


# -- state values ---------------------------------------------------------------------------


def test_two_states_sharing_a_value_are_refused() -> None:
    _refused(
        "states 'parked' and 'held' share the value 'P'",
        lambda a: {
            "parked": (parked := State(value="P")),
            "held": (held := State(value="P")),
            "park": worker(a["queued"].to(parked)),
            "hold": worker(parked.to(held)),
            "release": worker(held.to(a["failed"])),
        },
    )


# -- the package -----------------------------------------------------------------------------


def test_fsm_import_path_does_not_import_hypothesis() -> None:
    code = (
        "import sys, fsm, fsm.lifecycle, fsm.lifecycles, fsm.engine, fsm.testing, fsm.testing.agreement, "
        "fsm.diagram, fsm.unsupported, stores; assert 'hypothesis' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_two_states_sharing_an_id_in_sibling_compounds_are_refused() -> None:
    """python-statemachine keeps both (their values differ); the engine persists ids, so
    one of the two would be lost in the table."""

    def extra(a: dict[str, Any]) -> dict[str, Any]:
        g1 = type(State.Compound)("g1", (State.Compound,), {"x": State(initial=True, value="g1__x")})
        g2 = type(State.Compound)("g2", (State.Compound,), {"x": State(initial=True, value="g2__x")})
        return {
            "g1": g1,
            "g2": g2,
            "go": worker(a["queued"].to(g1)),
            "on": worker(g1.to(g2)),
            "back": worker(g2.to(a["active"])),
        }

    _refused(r"two states share the id 'x' \(in g1 and in g2\)", extra)
