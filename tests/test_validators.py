"""Validators (python-statemachine's ``validators=``): named functions declared with
``@validator`` that refuse a transition by raising.  The engine runs a branch's validators
before its guards, on the entity as read; one that raises refuses the whole event with
``ValidationFailed`` carrying its message (no later branch is tried, as in
python-statemachine), and nothing is written."""

from __future__ import annotations

import itertools

import pytest
from statemachine import State

from fsm import (
    Engine,
    GuardContext,
    GuardRejected,
    InvalidDefinition,
    Lifecycle,
    ManualClock,
    ValidationFailed,
    guard,
    operator_override,
    reaper,
    validator,
    worker,
)
from fsm.diagram import extract
from fsm.testing.agreement import check_agreement
from stores import MemoryStore
from stores.sql import SqlStore


class Payment(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        pending = State(initial=True)
        manual = State()
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    # the first branch validates: when the amount is wrong the event is refused outright,
    # even though the second branch would take it
    charge = worker(active.pending.to(active.finalizing, validators="amount_positive", cond="approved")) | worker(
        active.pending.to(active.manual)
    )
    settle = worker(active.finalizing.to(done, cond="holds_lease", validators=["amount_positive", "currency_known"]))
    abort = operator_override(active.to(failed), reason=None)

    @validator
    def amount_positive(ctx: GuardContext) -> None:
        "the amount is positive"
        if not ctx.data.get("amount", 0) > 0:
            raise ValueError(f"the amount must be positive, not {ctx.data.get('amount')!r}")

    @validator
    def currency_known(ctx: GuardContext) -> None:
        "the currency is one we settle"
        if ctx.data.get("currency") not in ("EUR", "USD"):
            raise LookupError("unknown currency")

    @guard
    def approved(ctx: GuardContext) -> bool:
        "somebody approved it"
        return bool(ctx.data.get("approved"))


NAMES = ["amount_positive", "currency_known", "approved", "holds_lease"]


def test_validators_agree_with_python_statemachine_from_every_leaf() -> None:
    outcomes = [dict(zip(NAMES, bits, strict=True)) for bits in itertools.product([False, True], repeat=len(NAMES))]
    for leaf, event, outcome in itertools.product(Payment.table.leaves, Payment.table.events, outcomes):
        check_agreement(Payment, [(event, outcome)], start=leaf)


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, clock: ManualClock) -> Engine:
    store = MemoryStore(clock) if request.param == "memory" else SqlStore("sqlite://", clock=clock)
    return Engine(Payment, store, clock=clock)


def test_a_raising_validator_refuses_the_whole_event_with_its_reason_and_writes_nothing(engine: Engine) -> None:
    engine.create("p1", data={"amount": 0})
    before = engine.fire("p1", "start").snapshot
    with pytest.raises(ValidationFailed) as refused:
        engine.fire("p1", "charge")
    err = refused.value
    assert isinstance(err, GuardRejected)  # a refusal like a guard's, for callers catching those
    assert (err.validator, err.reason) == ("amount_positive", "the amount must be positive, not 0")
    assert err.failed == {"pending->finalizing": ["amount_positive"]}
    assert isinstance(err.__cause__, ValueError)
    assert "refused by validator 'amount_positive': the amount must be positive" in str(err)
    assert engine.get("p1") == before and len(engine.history("p1")) == 1


def test_a_passing_validator_leaves_the_choice_to_the_guards(engine: Engine) -> None:
    engine.create("p2", data={"amount": 5})
    engine.fire("p2", "start")
    assert engine.fire("p2", "charge").state == "manual"  # validated, not approved: the fallback
    engine.create("p3", data={"amount": 5, "approved": True})
    engine.fire("p3", "start")
    assert engine.fire("p3", "charge").state == "finalizing"


def test_validators_run_in_order_and_the_first_refusal_is_reported(engine: Engine) -> None:
    engine.create("p4", data={"amount": 5, "approved": True})
    engine.fire("p4", "start")
    lease = engine.acquire_lease("p4", owner="w")
    engine.fire("p4", "charge", lease=lease)
    with pytest.raises(ValidationFailed) as refused:
        engine.fire("p4", "settle", lease=lease)
    assert (refused.value.validator, refused.value.reason) == ("currency_known", "unknown currency")
    fired = engine.fire("p4", "settle", lease=lease, data={"currency": "EUR"})
    assert fired.state == "done"


def test_the_diagram_lists_validators_with_their_descriptions() -> None:
    guards = dict(extract(Payment).guards)
    assert guards["amount_positive"] == "the amount is positive"
    assert guards["currency_known"] == "the currency is one we settle"


def _chart(**transitions: object) -> type[Lifecycle]:
    queued = State(initial=True)
    active = type(State.Compound)("active", (State.Compound,), {"running": State(initial=True), "finalizing": State()})
    done = State(final=True)
    failed = State(final=True)
    attrs: dict[str, object] = {"queued": queued, "active": active, "done": done, "failed": failed}
    attrs["finish"] = worker(active.running.to(active.finalizing))
    attrs["succeed"] = worker(active.finalizing.to(done, cond="holds_lease"))
    attrs["abort"] = operator_override(active.to(failed), reason=None)
    attrs["ok"] = validator(description="always")(_ok)
    attrs["plain"] = guard(_plain)
    for name, make in transitions.items():
        attrs[name] = make(attrs)  # type: ignore[operator]
    return type("Chart", (Lifecycle,), attrs)


def _ok(ctx: GuardContext) -> None:
    return None


def _plain(ctx: GuardContext) -> bool:
    return True


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda a: worker(a["queued"].to(a["active"], validators="plain")), "must name a validator"),
        (lambda a: worker(a["queued"].to(a["active"], validators=_ok)), "must name a validator declared"),
        (lambda a: worker(a["queued"].to(a["active"], cond="_ok")), "is a validator"),
        (lambda a: worker(a["queued"].to(a["active"], cond="_plain or _ok")), "is a validator"),
        (
            lambda a: worker(a["queued"].to(a["active"])) | reaper(a["queued"].to(a["failed"], validators="_ok")),
            "a reaper transition cannot have validators",
        ),
    ],
)
def test_a_misused_validator_is_refused_at_declaration(make: object, match: str) -> None:
    with pytest.raises(InvalidDefinition, match=match):
        _chart(start=make)


def test_a_declared_validator_is_accepted() -> None:
    chart = _chart(start=lambda a: worker(a["queued"].to(a["active"], validators="_ok")))
    (branch,) = chart.table.branches_for("queued", "start")
    assert [(g.name, g.validates) for g, _ in branch.guards] == [("_ok", True)]


@pytest.mark.parametrize("bad", ["amount_positive", 5, b"x", object()])
def test_guard_and_validator_refuse_what_is_not_a_named_function(bad: object) -> None:
    for decorator in (guard, validator):
        with pytest.raises(InvalidDefinition, match="decorates a function taking a GuardContext"):
            decorator(bad)
