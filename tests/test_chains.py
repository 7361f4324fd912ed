"""Eventless transitions, final states nested in a compound and completion events
(``done.state.<compound>``), taken in the event's own commit: one history row per taken
transition, every write guarded by its own version, all or nothing; python-statemachine
takes the same steps (random event sequences from the initial state)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from conftest import STORE_FACTORIES
from statemachine import State

from fsm import (
    ActiveDuplicate,
    Actor,
    ConditionFailed,
    Engine,
    EntityExists,
    Guard,
    GuardContext,
    InvalidDefinition,
    Lifecycle,
    ManualClock,
    TransitionNotAllowed,
    UnknownEntity,
    guard,
    operator_override,
    reaper,
    starts,
    worker,
)
from fsm.chains import MAX_CHAIN
from fsm.engine import Fire
from fsm.engine.chained import chain_writes
from fsm.records import LeaseStale
from fsm.table import AUTOMATIC
from fsm.testing.agreement import check_agreement
from stores import MemoryStore


class Build(Lifecycle):
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)

        class checks(State.Compound):
            lint = State(initial=True)
            test = State()
            passed = State(final=True)

            worker(lint.to(test, cond="lint_ok"))  # eventless: taken once its guard holds
            worker(test.to(passed, cond="tests_ok"))

        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    check = worker(active.running.to(active.checks))
    poke = worker(active.checks.to.itself(internal=True))  # an event that lets the eventless ones look again
    done_state_checks = worker(active.checks.to(active.finalizing))  # the completion event of checks
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = operator_override(active.to(failed), reason=None)

    @guard
    def lint_ok(ctx: GuardContext) -> bool:
        "the linter passed"
        return bool(ctx.data.get("lint_ok"))

    @guard
    def tests_ok(ctx: GuardContext) -> bool:
        "the tests passed"
        return bool(ctx.data.get("tests_ok"))


GUARDS = ["lint_ok", "tests_ok", "holds_lease"]


def test_random_sequences_agree_with_python_statemachine() -> None:
    """Each sequence with one set of guard answers, as a stored entity's data answers them
    between fires (the engine takes eventless steps after a transition, on the entity as
    it leaves it; python-statemachine also looks before an event when its guards changed
    in between, which a stored entity's cannot without a write)."""
    rng = random.Random(7)
    events = [*Build.table.events, "done.state.checks"]
    for _ in range(1500):
        answers = {g: rng.random() < 0.6 for g in GUARDS}
        check_agreement(Build, [(rng.choice(events), answers) for _ in range(rng.randint(1, 7))])


def test_the_table_knows_the_chain() -> None:
    table = Build.table
    assert table.completion == {"passed": "done.state.checks"}
    assert [(b.source, b.target, b.event) for b in table.automatic["lint"]] == [("lint", "test", AUTOMATIC)]
    assert table.chain_heads == {"lint", "test", "passed"}
    assert "passed" not in table.finals  # a nested final completes its compound; the entity goes on


@pytest.fixture(params=sorted(STORE_FACTORIES))
def engine(request: pytest.FixtureRequest, clock: ManualClock) -> Any:
    store: Any = STORE_FACTORIES[request.param](clock)
    yield Engine(Build, store, clock=clock)
    if request.param != "memory":
        store.close()


def test_an_event_takes_its_eventless_and_completion_steps_in_one_commit(engine: Engine) -> None:
    engine.create("b1", data={"lint_ok": True, "tests_ok": True})
    engine.fire("b1", "start")
    fired = engine.fire("b1", "check")
    assert fired.state == "finalizing"
    assert fired.record.event == "check" and fired.record.target == "lint"
    assert [(r.event, r.source, r.target) for r in fired.automatic] == [
        (AUTOMATIC, "lint", "test"),
        (AUTOMATIC, "test", "passed"),
        ("done.state.checks", "passed", "finalizing"),
    ]
    history = engine.history("b1")
    assert [h.event for h in history] == ["start", "check", AUTOMATIC, AUTOMATIC, "done.state.checks"]
    assert [h.seq for h in history] == [1, 2, 3, 4, 5] and engine.get("b1").version == 5


def test_a_guard_that_does_not_hold_stops_the_chain_where_it_is(engine: Engine) -> None:
    engine.create("b2", data={"lint_ok": True})
    engine.fire("b2", "start")
    assert engine.fire("b2", "check").state == "test"
    # the eventless steps look again after the next transition, with the data it brings
    # (poke re-enters checks at its initial state, lint)
    fired = engine.fire("b2", "poke", data={"tests_ok": True})
    assert fired.state == "finalizing"
    assert [r.event for r in fired.automatic] == [AUTOMATIC, AUTOMATIC, "done.state.checks"]


def test_a_refused_step_undoes_the_whole_chain(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.create("b3", data={"lint_ok": True, "tests_ok": True})
    before = engine.fire("b3", "start").snapshot
    store: Any = engine.store
    calls = {"n": 0}
    apply_checked = store.apply_checked

    def second_step_refused(write: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the event's write and one step went through; the next is refused
            raise ConditionFailed(write.entity_id, condition="somebody else's")
        return apply_checked(write)

    monkeypatch.setattr(store, "apply_checked", second_step_refused)
    with pytest.raises(ConditionFailed):
        engine.fire("b3", "check")
    monkeypatch.undo()
    assert calls["n"] == 3
    assert engine.get("b3") == before and [h.event for h in engine.history("b3")] == ["start"]
    assert engine.fire("b3", "check").state == "finalizing"  # nothing left behind in the way


def test_fire_many_gives_a_chained_outcome_a_commit_of_its_own(engine: Engine) -> None:
    engine.create("b4", data={"lint_ok": True, "tests_ok": True})
    engine.create("b5")
    a = engine.fire("b4", "start")
    b = engine.fire("b5", "start")
    done = engine.fire_many([Fire(a, "check"), Fire(b, "abort")])
    assert [r.state for r in done] == ["finalizing", "failed"]  # type: ignore[union-attr]


def test_an_eventless_cycle_that_never_settles_is_refused_and_writes_nothing(clock: ManualClock) -> None:
    class Spin(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            ping = State()
            pong = State()
            finalizing = State()

            worker(ping.to(pong))
            worker(pong.to(ping))

        done = State(final=True)
        start = worker(queued.to(active))
        spin = worker(active.running.to(active.ping))
        finish = worker(active.to(active.finalizing))
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))

    engine = Engine(Spin, MemoryStore(clock), clock=clock)
    engine.create("s1")
    engine.fire("s1", "start")
    with pytest.raises(TransitionNotAllowed, match=f"did not settle within {MAX_CHAIN} steps"):
        engine.fire("s1", "spin")
    assert engine.get("s1").state == "running" and len(engine.history("s1")) == 1


def _declare(entry: str) -> type[Lifecycle]:
    """A chart whose ``gate`` takes an eventless transition, entered by ``entry``."""
    queued = State(initial=entry != "initial")
    gate = State(initial=entry == "initial")
    active = type(State.Compound)("active", (State.Compound,), {"running": State(initial=True), "finalizing": State()})
    done = State(final=True)
    failed = State(final=True)
    worker(gate.to(active, cond="ready"))  # eventless
    body: dict[str, Any] = {"queued": queued, "gate": gate, "active": active, "done": done, "failed": failed}
    body["finish"] = worker(active.running.to(active.finalizing))
    body["succeed"] = worker(active.finalizing.to(done, cond="holds_lease"))
    body["abort"] = operator_override(active.to(failed), reason=None)
    body["ready"] = Guard("ready", lambda ctx: True)
    if entry == "initial":
        body["back"] = worker(active.running.to(queued))
        body["go"] = worker(queued.to(gate))
    elif entry == "reaper":
        body["stall"] = reaper(queued.to(gate))
    elif entry == "claim":
        body["begin"] = starts(queued.to(gate))
    else:
        body["go"] = worker(queued.to(gate))
    return type("Chart", (Lifecycle,), body)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("reaper", "reaper transition 'stall' from 'queued' enters 'gate'.*the reaper's set-based batch"),
        ("claim", "'begin' from 'queued' is a claim's start into 'gate'"),
    ],
)
def test_a_chain_where_no_caller_fires_is_refused_at_declaration(entry: str, match: str) -> None:
    with pytest.raises(InvalidDefinition, match=match):
        _declare(entry)


def test_a_chain_a_caller_fires_is_accepted() -> None:
    assert _declare("worker").table.automatic["gate"][0].target == "running"


def test_apply_chain_refuses_hostile_input_and_leaves_the_row_as_it_was(engine: Engine) -> None:
    from fsm import InvalidArgument, InvalidData

    engine.create("h1", data={"lint_ok": True, "tests_ok": True})
    engine.create("h2")
    snap = engine.fire("h1", "start").snapshot
    other = engine.fire("h2", "start").snapshot
    write, branch, _ = engine._prepare("h1", "check", Actor.WORKER, None, None, None, None, None)
    writes, _ = chain_writes(engine, write, branch, None, None)
    (other_write, _, _) = engine._prepare("h2", "check", Actor.WORKER, None, None, None, None, None)
    store: Any = engine.store
    hostile: list[Any] = [
        None,
        "writes",
        [],
        [object()],
        writes * 40,  # too many
        [writes[0], other_write],  # two entities
        [writes[0], writes[2]],  # a version skipped
        [*writes[:1], replace(writes[1], event="x\x00")],
        [*writes[:1], replace(writes[1], data={"n": float("nan")})],
    ]
    for bad in hostile:
        with pytest.raises((InvalidArgument, InvalidData)):  # a typed refusal, before anything is written
            store.apply_chain(bad)
    assert engine.get("h1") == snap and engine.get("h2") == other
    assert [h.event for h in engine.history("h1")] == ["start"]


BUILD_HINTS = {
    "lint_ok": ({"lint_ok": True}, {"lint_ok": False}),
    "tests_ok": ({"tests_ok": True}, {"tests_ok": False}),
}


def test_the_path_finder_steers_the_guards_of_the_steps_an_event_takes_next() -> None:
    from fsm.testing.paths import shortest_paths

    paths = shortest_paths(Build, guard_data=BUILD_HINTS)
    # 'test' is where a check rests when lint passes and tests do not; 'passed' is never a
    # resting state (its completion event is always taken)
    assert set(paths.states) == {"queued", "running", "lint", "test", "finalizing", "done", "failed"}


def test_the_property_machine_runs_a_lifecycle_with_chains() -> None:
    from hypothesis import settings

    from fsm.testing import lifecycle_machine, memory_stores

    machine = lifecycle_machine(Build, memory_stores(), guard_data=BUILD_HINTS)
    case = machine.TestCase
    case.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
    case().runTest()


class Pipe(Lifecycle):
    """A worker's lifecycle whose handler outcome takes a chain: running -check-> lint
    -(automatic)-> passed -done.state.checks-> finalizing."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)

        class checks(State.Compound):
            lint = State(initial=True)
            passed = State(final=True)

            worker(lint.to(passed, cond="lint_ok"))

        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    check = worker(active.running.to(active.checks, cond="holds_lease"))
    done_state_checks = worker(active.checks.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(completed, cond="holds_lease"))
    fail = operator_override(active.to(failed), reason=None)

    @guard
    def lint_ok(ctx: GuardContext) -> bool:
        "the linter passed"
        return bool(ctx.data.get("lint_ok"))


@pytest.mark.parametrize("where", ["memory", "sqlite"])
def test_a_worker_outcome_takes_its_chain_through_the_completer(where: str, tmp_path: Any) -> None:
    import threading
    import time

    from fsm import Worker
    from stores.sql import SqlStore

    store: Any = MemoryStore() if where == "memory" else SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    engine = Engine(Pipe, store)
    ids = [engine.create(data={"lint_ok": True}).id for _ in range(12)]
    handlers: dict[str, Any] = {"running": lambda job: "check", "finalizing": lambda job: "complete"}
    handlers["lint"] = lambda job: "fail"  # the chain never rests in lint here
    work = Worker(engine, handlers)
    thread = threading.Thread(target=work.run, kwargs={"install_signals": False})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(engine.get(i).state != "completed" for i in ids):
            time.sleep(0.02)
    finally:
        work.stop()
        thread.join()
    assert {engine.get(i).state for i in ids} == {"completed"}
    for i in ids:
        events = [h.event for h in engine.history(i)]
        assert events == ["start", "check", AUTOMATIC, "done.state.checks", "complete"]


@pytest.mark.parametrize("where", ["memory", "sqlite"])
def test_a_retried_chained_fire_is_replayed_to_its_holder_not_fenced(where: str, tmp_path: Any) -> None:
    """The event's history row is no longer the entity's last move (its steps follow): the
    holder's retry with the same key is still its own, whether the chain kept the lease
    or ended it in a final state."""
    from stores.sql import SqlStore

    store: Any = MemoryStore() if where == "memory" else SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    engine = Engine(Pipe, store)
    engine.create("p1", data={"lint_ok": True})
    (claimed,) = engine.claim(1)
    lease = claimed.lease
    assert lease is not None
    first = engine.fire("p1", "check", lease=lease, idempotency_key="k1")
    assert first.state == "finalizing" and len(first.automatic) == 2
    again = engine.fire("p1", "check", lease=lease, idempotency_key="k1")
    assert again.replayed and again.record == first.record and again.state == "finalizing"
    steps = engine.history("p1")[-2:]
    assert all((h.owner, h.lease_token) == (lease.owner, lease.token) for h in steps)


def test_the_diagram_draws_eventless_edges_and_says_what_a_nested_final_does() -> None:
    from fsm.diagram import extract, to_dot, to_mermaid

    text = to_mermaid(extract(Build))
    assert "lint --> test : (automatic) [lint_ok] (worker)" in text
    assert "passed --> [*]" in text  # the nested final, inside checks
    assert "checks --> finalizing : done.state.checks (worker)" in text
    assert "one inside a compound completes it" in text
    assert "inside a compound: completes it" in to_dot(extract(Build))


# -- steps a new entity takes in its create -------------------------------------------------


class Intake(Lifecycle):
    """A request that starts itself once its data says it is complete: the initial state
    takes an eventless transition, judged on the data the create brings."""

    received = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    worker(received.to(active, cond="complete"))  # eventless, from the initial state
    amend = worker(received.to.itself())  # new data, and the eventless step looks again
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = operator_override(active.to(failed) | received.to(failed), reason=None)

    @guard
    def complete(ctx: GuardContext) -> bool:
        "the request has everything it needs"
        return bool(ctx.data.get("complete"))


@pytest.fixture(params=sorted(STORE_FACTORIES))
def intake(request: pytest.FixtureRequest, clock: ManualClock) -> Any:
    store: Any = STORE_FACTORIES[request.param](clock)
    yield Engine(Intake, store, clock=clock)
    if request.param != "memory":
        store.close()


def test_a_create_takes_the_initial_states_steps_in_its_own_commit(intake: Engine) -> None:
    made = intake.create("r1", data={"complete": True})
    assert (made.state, made.version) == ("running", 1)
    assert [(h.event, h.source, h.target, h.seq) for h in intake.history("r1")] == [
        (AUTOMATIC, "received", "running", 1)
    ]
    rests = intake.create("r2")  # its guard does not hold: it rests where it starts
    assert (rests.state, rests.version, intake.history("r2")) == ("received", 0, [])
    moved = intake.fire("r2", "amend", data={"complete": True})
    assert moved.state == "running" and [r.event for r in moved.automatic] == [AUTOMATIC]


def test_create_many_takes_each_entitys_steps_all_or_nothing(intake: Engine) -> None:
    made = intake.create_many([{"complete": True}, None], ids=["m1", "m2"])
    assert [(s.id, s.state) for s in made] == [("m1", "running"), ("m2", "received")]
    with pytest.raises(EntityExists):
        intake.create_many([{"complete": True}, {"complete": True}], ids=["m3", "m1"])
    with pytest.raises(UnknownEntity):
        intake.get("m3")  # nothing of the refused batch was written


def test_a_refused_create_step_creates_nothing(intake: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    store: Any = intake.store

    def refused(write: Any) -> Any:
        raise ConditionFailed(write.entity_id, condition="planted")

    monkeypatch.setattr(store, "apply_checked", refused)
    with pytest.raises(ConditionFailed):
        intake.create("x1", data={"complete": True})
    monkeypatch.undo()
    with pytest.raises(UnknownEntity):
        intake.get("x1")
    assert intake.create("x1").state == "received"  # the id is free: nothing was left behind


def test_a_unique_create_with_steps_still_refuses_an_active_duplicate(intake: Engine) -> None:
    first = intake.create("u1", data={"complete": True}, concurrency_key="k", unique=True)
    with pytest.raises(ActiveDuplicate):
        intake.create("u2", data={"complete": True}, concurrency_key="k", unique=True)
    assert intake.create("u3", concurrency_key="k", unique=True, if_active="return").id == first.id


def test_create_chains_refuses_hostile_input_and_writes_nothing(intake: Engine) -> None:
    from fsm import InvalidArgument
    from fsm.records import NewEntity, TransitionWrite

    store: Any = intake.store
    new = NewEntity("h1", "intake", "received")
    good = TransitionWrite("h1", AUTOMATIC, "received", "running", "worker", 0)
    for bad, error in [
        ([], InvalidArgument),
        ("nope", InvalidArgument),
        ([(new,)], InvalidArgument),
        ([(new, [TransitionWrite("other", "e", "received", "running", "worker", 0)])], InvalidArgument),
        ([(new, [TransitionWrite("h1", "e", "received", "running", "worker", 3)])], InvalidArgument),
        ([(new, [good]), (new, [good])], EntityExists),
        ([(NewEntity("h1\x00", "intake", "received"), [])], InvalidArgument),
    ]:
        with pytest.raises(error):
            store.create_chains(bad)
    with pytest.raises(UnknownEntity):
        intake.get("h1")


def test_random_sequences_from_a_create_agree_with_python_statemachine() -> None:
    rng = random.Random(5)
    events = list(Intake.table.events)
    for _ in range(200):  # one set of guard answers per sequence, as a stored entity's data gives
        outcome = {"complete": rng.random() < 0.5, "holds_lease": rng.random() < 0.5}
        check_agreement(Intake, [(rng.choice(events), outcome) for _ in range(8)])


def test_a_refused_create_chains_leaves_no_idempotency_key_behind(intake: Engine) -> None:
    from fsm.records import NewEntity, TransitionWrite

    store: Any = intake.store
    first = NewEntity("k1", "intake", "received")
    keyed = TransitionWrite("k1", "go", "received", "running", "worker", 0, idempotency_key="key1")
    refused = TransitionWrite("k2", "go", "received", "running", "worker", 0, require=(LeaseStale(timedelta(days=1)),))
    with pytest.raises(ConditionFailed):
        store.create_chains([(first, [keyed]), (NewEntity("k2", "intake", "received"), [refused])])
    assert store.find_transition("k1", "key1") is None
    ((_, moved),) = store.create_chains([(first, [keyed])])  # the key is free again
    assert moved[0][1].idempotency_key == "key1"


def test_a_chain_carrying_one_key_twice_is_refused_before_any_statement(intake: Engine) -> None:
    from fsm import InvalidArgument
    from fsm.records import NewEntity, TransitionWrite

    store: Any = intake.store
    twice = [
        TransitionWrite("d1", "go", "received", "running", "worker", 0, idempotency_key="same"),
        TransitionWrite("d1", "finish", "running", "finalizing", "worker", 1, idempotency_key="same"),
    ]
    with pytest.raises(InvalidArgument, match="same idempotency key"):
        store.create_chains([(NewEntity("d1", "intake", "received"), twice)])
    with pytest.raises(UnknownEntity):
        store.get("d1")


class Dedup(Lifecycle):
    """A create whose initial step asks for a newer sibling: a new entity has none."""

    received = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    dropped = State(final=True)

    worker(received.to(dropped, cond="superseded"))  # eventless, from the initial state
    start = worker(received.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    abort = operator_override(active.to(dropped), reason=None)


def test_a_create_judges_superseded_as_false_for_the_entity_it_creates(any_store: Any) -> None:
    dedup = Engine(Dedup, any_store)
    assert dedup.create("a", concurrency_key="k").state == "received"
    assert dedup.create("b", concurrency_key="k").state == "received"
    assert dedup.create("c").state == "received"
