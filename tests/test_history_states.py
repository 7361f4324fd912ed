"""History states (shallow and deep), persisted: a transition that leaves a compound with a
history state records where it was left in the entity's memory, in the same compare-and-set
as the transition; a transition into the history state re-enters it there.  python-statemachine
takes the same steps (random event sequences), on every store the memory round-trips, and
the paths no caller's fire takes (the reaper's batch, a claim's start) are refused where
they would need the memory."""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import STORE_FACTORIES
from statemachine import HistoryState, State

from fsm import (
    Engine,
    GuardContext,
    InvalidArgument,
    InvalidDefinition,
    Lifecycle,
    ManualClock,
    guard,
    operator_override,
    reaper,
    starts,
    worker,
)
from fsm.engine import Fire
from fsm.records import LeaseChange, TransitionWrite
from fsm.testing.agreement import Disagreement, check_agreement


class Resumable(Lifecycle):
    """A pipeline that can be paused and picks up where it was: its build step, or the
    stage of its checks it had reached."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)

        class checks(State.Compound):
            lint = State(initial=True)
            test = State()

            linted = worker(lint.to(test))

        finalizing = State()
        h = HistoryState()
        hd = HistoryState(type="deep")

    paused = State()
    done = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    hold = worker(queued.to(paused))  # paused before it ever ran: the history has no memory yet
    check = worker(active.running.to(active.checks))
    finish = worker(active.checks.to(active.finalizing), lease=LeaseChange.ACQUIRE)
    pause = worker(active.running.to(paused) | active.checks.to(paused), lease=LeaseChange.CLEAR)
    resume = worker(paused.to(active.h))
    resume_exactly = worker(paused.to(active.hd))
    restart = worker(active.checks.to(active.checks))  # leaves and re-enters checks: no history there
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")  # into a final: nothing to recall
    abort = operator_override(active.to(failed) | paused.to(failed), reason=None)


def test_the_table_knows_what_each_branch_remembers_and_restores() -> None:
    table = Resumable.table
    assert table.remembered == {"active": frozenset({"running", "lint", "test", "finalizing"})}
    (pause,) = table.branches_for("test", "pause")
    assert pause.remembers == ("active",)
    (check,) = table.branches_for("running", "check")
    assert check.remembers == ()  # stays inside active
    (resume,) = table.branches_for("paused", "resume")
    assert (resume.restores, resume.target) == ("active", "running")  # never left: the initial state
    assert dict((leaf, b.target) for leaf, b in resume.variants) == {
        "running": "running",
        "lint": "lint",
        "test": "lint",  # shallow: checks, entered at its initial state
        "finalizing": "finalizing",
    }
    (exactly,) = table.branches_for("paused", "resume_exactly")
    assert dict((leaf, b.target) for leaf, b in exactly.variants)["test"] == "test"  # deep: the very leaf
    assert set(resume.targets) == {"running", "lint", "finalizing"}


def test_random_sequences_agree_with_python_statemachine() -> None:
    rng = random.Random(7)
    events = list(Resumable.table.events)
    for _ in range(300):
        outcome = {"holds_lease": rng.random() < 0.7, "lease_stale": rng.random() < 0.3}
        check_agreement(Resumable, [(rng.choice(events), outcome) for _ in range(12)])


class Nested(Lifecycle):
    """History on two levels, defaults, a self-transition of a compound and an internal one."""

    idle = State(initial=True)

    class active(State.Compound):
        class stage(State.Compound):
            a = State(initial=True)
            b = State()

            class c(State.Compound):
                c1 = State(initial=True)
                c2 = State()

                go_c2 = worker(c1.to(c2))

            inner = HistoryState(type="deep")
            go_b = worker(a.to(b))
            go_c = worker(b.to(c))
            back = worker(c.to(a))
            _ = inner.to(b)  # a default: b until the stage was left once

        other = State()
        finalizing = State()
        h = HistoryState()
        to_other = worker(stage.to(other))
        to_finalize = worker(other.to(finalizing))
        to_stage = worker(other.to(stage.inner))
        _ = h.to(other)  # a default: other until active was left once

    away = State()
    done = State(final=True)

    enter = worker(idle.to(active.h))
    leave = worker(active.stage.to(away) | active.other.to(away))
    come_back = worker(away.to(active.h))
    deep_back = worker(away.to(active.stage.inner))
    reset = worker(active.stage.to(active.stage))  # leaves stage: its memory is written
    poke = worker(active.stage.to.itself(internal=True))  # leaves stage: a compound's self-transition
    skip = worker(active.stage.to(active.stage.b, internal=True))  # internal, into a descendant: leaves nothing
    finish = worker(active.finalizing.to(done, cond="holds_lease") | away.to(done))


def test_nested_histories_with_defaults_agree_with_python_statemachine() -> None:
    rng = random.Random(11)
    events = list(Nested.table.events)
    for _ in range(600):
        check_agreement(Nested, [(rng.choice(events), {"holds_lease": rng.random() < 0.5}) for _ in range(14)])


def test_the_checker_sees_a_wrong_restore() -> None:
    """The agreement check is not vacuous: a table that restored a shallow history as a deep
    one is caught."""
    from dataclasses import replace

    table = Resumable.table
    (resume,) = table.branches_for("paused", "resume")
    wrong = tuple((leaf, replace(b, target=leaf)) for leaf, b in resume.variants)
    broken = {**table.branches, ("paused", "resume"): (replace(resume, variants=wrong),)}
    steps = [(e, {}) for e in ("start", "check", "linted", "pause", "resume")]
    check_agreement(Resumable, steps)
    original = Resumable.table
    try:
        Resumable.table = replace(table, branches=broken)
        with pytest.raises(Disagreement, match="resume"):
            check_agreement(Resumable, steps)
    finally:
        Resumable.table = original


@pytest.fixture(params=sorted(STORE_FACTORIES))
def engine(request: pytest.FixtureRequest, clock: ManualClock) -> Any:
    store: Any = STORE_FACTORIES[request.param](clock)
    yield Engine(Resumable, store, clock=clock)
    if request.param != "memory":
        store.close()


def _to_test(engine: Engine, entity_id: str) -> None:
    engine.create(entity_id)
    for event in ("start", "check", "linted"):
        engine.fire(entity_id, event)


def test_a_shallow_history_re_enters_the_child_at_its_initial_state(engine: Engine) -> None:
    _to_test(engine, "p1")
    paused = engine.fire("p1", "pause")
    assert paused.snapshot.memory == engine.get("p1").memory == {"active": "test"}
    resumed = engine.fire("p1", "resume")
    assert (resumed.record.source, resumed.record.target) == ("paused", "lint")
    assert engine.get("p1").state == "lint"
    assert engine.get("p1").memory == {"active": "test"}  # entering reads it; only leaving writes it


def test_a_deep_history_re_enters_the_very_leaf(engine: Engine) -> None:
    _to_test(engine, "p2")
    engine.fire("p2", "pause")
    resumed = engine.fire("p2", "resume_exactly")
    assert resumed.record.target == resumed.snapshot.state == engine.get("p2").state == "test"
    # the history rows say where each transition went, as for any other
    assert [(h.event, h.target) for h in engine.history("p2")][-2:] == [("pause", "paused"), ("resume_exactly", "test")]


def test_each_leaving_overwrites_the_memory(engine: Engine) -> None:
    _to_test(engine, "p3")
    engine.fire("p3", "pause")
    engine.fire("p3", "resume_exactly")
    engine.fire("p3", "restart")  # checks -> checks: lint; active is not left
    assert engine.get("p3").memory == {"active": "test"}
    engine.fire("p3", "pause")
    assert engine.get("p3").memory == {"active": "lint"}
    assert engine.fire("p3", "resume_exactly").snapshot.state == "lint"


def test_before_the_compound_was_ever_left_its_initial_state_is_entered(engine: Engine) -> None:
    """No default transition and no memory: the compound's initial state (python-statemachine
    would enter nothing at all there: the engine never rests in no state)."""
    engine.create("p4")
    engine.fire("p4", "hold")
    assert engine.get("p4").memory is None
    assert engine.fire("p4", "resume").snapshot.state == "running"


def test_fire_many_gives_a_write_with_memory_a_commit_of_its_own(engine: Engine) -> None:
    _to_test(engine, "m1")
    _to_test(engine, "m2")
    engine.fire("m2", "restart")  # back to lint
    held = [engine.get("m1"), engine.get("m2")]
    results = engine.fire_many([Fire(held[0], "pause"), Fire(held[1], "pause")])
    assert [r.state for r in results] == ["paused", "paused"]  # type: ignore[union-attr]
    assert (engine.get("m1").memory, engine.get("m2").memory) == ({"active": "test"}, {"active": "lint"})
    assert engine.fire("m1", "resume_exactly").snapshot.state == "test"


def test_a_stale_memory_leaf_falls_back_to_the_default(engine: Engine) -> None:
    """A memory naming a leaf the compound no longer has (a renamed state): the default."""
    _to_test(engine, "s1")
    paused = engine.fire("s1", "pause").snapshot
    store: Any = engine.store
    store.apply(TransitionWrite("s1", "edit", "paused", "paused", "worker", paused.version, memory={"active": "gone"}))
    assert engine.fire("s1", "resume_exactly").snapshot.state == "running"


@pytest.mark.parametrize(
    "memory",
    [
        {"active": 5},
        {"active": "a\x00b"},
        {"\ud800": "lint"},
        {"active": "x" * 5000},
        {f"s{i}": "lint" for i in range(300)},
        ["active", "lint"],
        "active",
    ],
    ids=["not-str", "nul", "surrogate", "huge", "too-many", "list", "str"],
)
def test_a_hostile_memory_is_refused_with_a_typed_error_and_the_row_unchanged(any_store: Any, memory: Any) -> None:
    engine = Engine(Resumable, any_store)
    _to_test(engine, "h1")
    before = engine.get("h1")
    with pytest.raises(InvalidArgument):
        any_store.apply(TransitionWrite("h1", "pause", "test", "paused", "worker", before.version, memory=memory))
    assert engine.get("h1") == before
    assert len(engine.history("h1")) == 3


def test_a_held_snapshot_with_a_broken_memory_keeps_only_what_is_well_formed(engine: Engine) -> None:
    """A caller's held snapshot is the caller's: a malformed memory in it never reaches the store."""
    _to_test(engine, "b1")
    held = engine.get("b1")._replace(memory={"active": 5, 7: "x", "other": "lint"})  # type: ignore[dict-item]
    (result,) = engine.fire_many([Fire(held, "pause")])
    assert not isinstance(result, Exception)
    assert engine.get("b1").memory == {"active": "test"}  # "other" is no compound of this lifecycle


# -- what no caller's fire carries ------------------------------------------------------------


def _chart(**transitions: Any) -> type[Lifecycle]:
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()
        h = HistoryState()

    paused = State()
    done = State(final=True)
    failed = State(final=True)
    attrs: dict[str, Any] = {"queued": queued, "active": active, "paused": paused, "done": done, "failed": failed}
    defaults: dict[str, Any] = {
        "start": lambda: worker(queued.to(active)),
        "finish": lambda: worker(active.running.to(active.finalizing), lease=LeaseChange.ACQUIRE),
        "succeed": lambda: worker(active.finalizing.to(done, cond="holds_lease")),
        "pause": lambda: worker(active.running.to(paused)),
        "abort": lambda: operator_override(active.to(failed) | paused.to(failed), reason=None),
    }
    attrs.update({name: make(attrs) for name, make in transitions.items()})
    # a default is made only when not redeclared: one left unnamed would be an eventless transition
    attrs.update({name: make() for name, make in defaults.items() if name not in attrs})
    return type("Chart", (Lifecycle,), attrs)


@pytest.mark.parametrize(
    ("transitions", "match"),
    [
        (
            {"wake": lambda a: reaper(a["paused"].to(a["active"].h, cond="lease_stale"))},
            "reaper transition 'wake' from 'paused' targets the history state of 'active'",
        ),
        (
            {"park": lambda a: reaper(a["active"].running.to(a["paused"], cond="lease_stale"))},
            "reaper transition 'park' from 'running' leaves 'active', which has a history state",
        ),
        (
            {"start": lambda a: starts(a["queued"].to(a["active"].h))},
            r"'start' from 'queued' \(a claim's start\) targets the history state of 'active'",
        ),
    ],
    ids=["reaper-into-history", "reaper-out-of-compound", "claim-into-history"],
)
def test_a_path_that_cannot_read_or_write_the_memory_is_refused(transitions: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidDefinition, match=match):
        _chart(**transitions)


def test_a_reaper_transition_into_a_final_state_may_leave_a_compound_with_history() -> None:
    chart = _chart(expire=lambda a: reaper(a["active"].to(a["failed"], cond="lease_stale")))
    (expire,) = chart.table.branches_for("running", "expire")
    assert expire.remembers == ("active",) and expire.to_final


def test_a_guarded_history_default_is_refused() -> None:
    @guard
    def ready(ctx: GuardContext) -> bool:
        "ready"
        return True

    with pytest.raises(InvalidDefinition, match="default is taken unconditionally"):

        class Guarded(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()
                h = HistoryState()
                _ = h.to(finalizing, cond="ready")

            done = State(final=True)
            start = worker(queued.to(active.h))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))
            guards_ = ready


# -- the tools ---------------------------------------------------------------------------------


def test_the_diagram_draws_history_states_inside_their_compound() -> None:
    from fsm.diagram import extract, to_dot, to_mermaid

    diagram = extract(Resumable)
    assert {n.id: n.history for n in diagram.nodes if n.history} == {"h": "shallow", "hd": "deep"}
    mermaid = to_mermaid(diagram)
    assert 'state "H" as h' in mermaid and 'state "H*" as hd' in mermaid
    assert "paused --> h : resume (worker)" in mermaid
    assert "H*: the very state" in mermaid
    dot = to_dot(diagram)
    assert '"h" [label="H"' in dot and '"hd" [label="H*"' in dot


def test_the_path_finder_reaches_the_states_only_a_restore_reaches() -> None:
    """Deep history restores 'test' straight from 'paused': a branch only memory takes."""
    from fsm.testing.paths import shortest_paths

    paths = shortest_paths(Resumable)
    assert "resume_exactly: paused -> active.hd (worker)" in paths.transitions
    assert set(paths.states) >= {"paused", "running", "lint", "test", "finalizing", "done", "failed"}


def test_the_property_machine_runs_a_lifecycle_with_history() -> None:
    from hypothesis import settings

    from fsm.testing import lifecycle_machine, memory_stores

    machine = lifecycle_machine(Resumable, memory_stores())
    case = machine.TestCase
    case.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
    case().runTest()


def test_fsm_show_and_the_inspector_say_where_each_compound_was_left(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    from urllib.parse import urlencode

    pytest.importorskip("starlette")
    from inspect_support import http, serve_asgi, stop_serving

    from fsm.cli import main
    from fsm.inspect.app import create_app
    from stores.sql import SqlStore

    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    store = SqlStore(url)
    engine = Engine(Resumable, store)
    _to_test(engine, "v1")
    engine.fire("v1", "pause")
    engine.create("v2")
    store.close()
    assert main(["show", "--db", url, "v1"]) == 0
    out = capsys.readouterr().out
    assert "  history memory: active was left in test\n" in out
    assert main(["show", "--db", url, "v2"]) == 0
    assert "history memory" not in capsys.readouterr().out  # it left nothing
    assert main(["show", "--db", url, "--json", "v1"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"] == {"active": "test"}
    reader = SqlStore(url, create=False)
    server, thread, base = serve_asgi(create_app(reader, [Resumable]))
    try:
        answer: Any = http(f"{base}/entity?" + urlencode({"id": "v1"}))
        assert answer.status == 200
        assert "<th>history memory</th><td>active was left in test</td>" in str(answer.body)
    finally:
        stop_serving(server, thread)
        reader.close()


class Redo(Lifecycle):
    """A compound that re-enters its own history (python-statemachine records the history of
    what a transition leaves before it works out what to enter), and an internal transition
    into its own history (which leaves nothing, so records nothing)."""

    class setup(State.Compound):
        a = State(initial=True)
        b = State()
        c = State()
        h = HistoryState()
        hd = HistoryState(type="deep")

        go_b = worker(a.to(b))
        go_c = worker(b.to(c) | a.to(c))
        hop = worker(b.to(h))
        _ = h.to(a)  # a default: poke before setup was ever left

    away = State()

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

        fin = worker(running.to(finalizing))

    done = State(final=True)

    redo = worker(setup.to(setup.hd))  # leaves setup, re-enters it where it just was
    poke = worker(setup.to(setup.h, internal=True))  # stays inside: the older memory
    out = worker(setup.to(away))
    back = worker(away.to(setup))
    start = worker(away.to(active))
    finish = worker(active.finalizing.to(done, cond="holds_lease"))


def test_a_compound_re_entering_its_own_history_restores_where_it_just_was(engine: Engine) -> None:
    redo = Engine(Redo, engine.store)
    redo.create("r1")
    for event in ("go_b", "out", "back", "go_b", "go_c"):
        redo.fire("r1", event)
    fired = redo.fire("r1", "redo")
    assert (fired.record.source, fired.record.target) == ("c", "c")  # not b, the memory before it left
    assert redo.get("r1").memory == {"setup": "c"}


def test_an_internal_transition_into_its_own_history_keeps_the_older_memory(engine: Engine) -> None:
    redo = Engine(Redo, engine.store)
    redo.create("i1")
    for event in ("go_b", "out", "back", "go_c"):
        redo.fire("i1", event)
    fired = redo.fire("i1", "poke")  # setup is not left: its memory still says b
    assert (fired.record.target, redo.get("i1").memory) == ("b", {"setup": "b"})


def test_re_entries_and_internal_transitions_agree_with_python_statemachine() -> None:
    rng = random.Random(3)
    events = list(Redo.table.events)
    check_agreement(Redo, [(e, {}) for e in ("go_b", "out", "back", "go_b", "go_c", "redo")])
    check_agreement(Redo, [(e, {}) for e in ("go_b", "out", "back", "go_c", "poke", "hop")])
    for _ in range(400):
        check_agreement(Redo, [(rng.choice(events), {"holds_lease": rng.random() < 0.5}) for _ in range(12)])


@pytest.mark.parametrize(
    "memory",
    [
        {f"c{i}": "lint" for i in range(5000)},
        {"active": "x" * 100_000},
        {"active": "a\x00b"},
        {"active": "\ud800"},
        {"elsewhere": "test"},
        {"active": "done"},  # a leaf, but not one inside active
    ],
    ids=["many", "huge", "nul", "surrogate", "not-a-compound", "not-inside"],
)
def test_a_held_snapshots_memory_keeps_only_what_the_lifecycle_can_hold(engine: Engine, memory: Any) -> None:
    _to_test(engine, "k1")
    held = engine.get("k1")._replace(memory=memory)
    assert engine.fire(held, "pause").snapshot.memory == engine.get("k1").memory == {"active": "test"}


def test_a_held_snapshots_memory_that_is_no_mapping_is_ignored(engine: Engine) -> None:
    class Hostile:
        def __bool__(self) -> bool:
            raise RuntimeError("no truth")

    _to_test(engine, "k2")
    held = engine.get("k2")._replace(memory=Hostile())
    assert engine.would_fire(held, "pause") is not None
    (result,) = engine.fire_many([Fire(held, "pause")])
    assert engine.get("k2").memory == {"active": "test"} and not isinstance(result, Exception)


def test_a_lifecycle_migration_moves_a_renamed_leaf_in_the_memory(engine: Engine) -> None:
    from fsm import Renamed
    from fsm.evolution import migrate_rows

    _to_test(engine, "g1")
    engine.fire("g1", "pause")
    assert engine.get("g1").memory == {"active": "test"}

    class ResumableV2(Lifecycle):
        kind = "resumable"
        version = 2
        migrations = (Renamed("test", "testing"),)
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)

            class checks(State.Compound):
                lint = State(initial=True)
                testing = State()

                linted = worker(lint.to(testing))

            finalizing = State()
            h = HistoryState()
            hd = HistoryState(type="deep")

        paused = State()
        done = State(final=True)
        failed = State(final=True)

        start = starts(queued.to(active))
        check = worker(active.running.to(active.checks))
        finish = worker(active.checks.to(active.finalizing), lease=LeaseChange.ACQUIRE)
        pause = worker(active.running.to(paused) | active.checks.to(paused), lease=LeaseChange.CLEAR)
        resume = worker(paused.to(active.h))
        resume_exactly = worker(paused.to(active.hd))
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))
        abort = operator_override(active.to(failed) | paused.to(failed), reason=None)

    report = migrate_rows(ResumableV2, engine.store)
    assert report.rewritten == 1
    v2 = Engine(ResumableV2, engine.store)
    assert v2.get("g1").memory == {"active": "testing"}
    assert v2.fire("g1", "resume_exactly").state == "testing"
