"""Parallel regions, persisted: a row per region, entered in one transaction, joined by the
completion event once every region is final (on every store), reaped per region, and
agreeing with python-statemachine on random event sequences."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from conftest import STORE_FACTORIES
from faults.release import Release
from hypothesis import example, given, settings
from hypothesis import strategies as st
from statemachine import State
from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed

from fsm import Engine, Lifecycle, ManualClock, Policy
from fsm.errors import (
    ConfigError,
    EntityExists,
    FsmError,
    InvalidArgument,
    InvalidDefinition,
    StaleVersion,
    TransitionNotAllowed,
)
from fsm.lifecycle import reaper, starts, worker
from fsm.reaping.service import Reaper
from fsm.records import LeaseChange, NewEntity, TransitionWrite
from fsm.regions import region_row_id
from stores.base import Store
from stores.memory import MemoryStore

# -- the declaration ---------------------------------------------------------------------------


def test_the_entity_row_rests_in_the_parallel_state_and_each_region_is_a_lifecycle() -> None:
    assert Release.table.leaves == ("queued", "checks", "released", "done", "cancelled")
    assert Release.table.parallel == {"checks": ("build", "tests")}
    build, tests = Release.regions["checks"]["build"], Release.regions["checks"]["tests"]
    assert (build.kind, tests.kind) == ("release.build", "release.tests")
    # a running region's row rests in left_checks when a cancel leaves the parallel state
    assert build.table.finals == {"built", "broken", "left_checks"}
    assert tests.table.finals == {"passed", "red", "left_checks"}
    assert build.table.configurations["finalizing"] == ("active", "finalizing")
    assert build.region_of == (Release, "checks", "build")
    assert build.policy == Release.policy and Release.region_of is None


def test_an_unknown_region_is_refused_naming_the_regions(store: MemoryStore) -> None:
    engine = Engine(Release, store)
    assert engine.region("build") is engine.region("build")
    with pytest.raises(InvalidArgument, match="regions: build, tests"):
        engine.region("deploy")
    with pytest.raises(InvalidArgument):
        engine.region(7)  # type: ignore[arg-type]


def _chart(body: dict[str, Any]) -> type[Lifecycle]:
    return type(Lifecycle)("Chart", (Lifecycle,), {"__module__": __name__, **body})


REFUSALS = {
    "history over a parallel state": "a history state cannot restore a parallel state's regions",
    "reaper leaves through its compound": "the reaper's set-based batch cannot",
    "eventless leaves through its compound": "an eventless transition leaves parallel state",
    "reaper enters through its compound": "reaper transition enters parallel state",
    "eventless enters through its compound taking a lease": r"\(eventless\) from 'prep': enters parallel state",
    "a claim starts into it": "transition start from 'idle': enters parallel state 'p' taking a lease",
    "region not a compound": "must be a compound state",
    "leaves its region": "leaves region",
    "targets inside a region": "is inside a region",
    "shared event": "is declared in region",
    "reaper enters": "reaper transition enters parallel state",
    "reaper leaves": "the reaper's set-based batch cannot",
    "history inside a region": "history state",
}


def _regions() -> tuple[Any, Any]:
    """Two fresh regions (a chart takes its states for its own): ``r1`` (``a -> a_end``) and
    ``r2`` (a finalizer, then ``b_end``)."""

    class r1(State.Compound):
        a = State(initial=True)
        a_end = State(final=True)
        a_go = worker(a.to(a_end))

    class r2(State.Compound):
        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        b_end = State(final=True)
        b_fin = worker(active.running.to(active.finalizing))
        b_go = worker(active.finalizing.to(b_end, cond="holds_lease"))

    return r1, r2


def _refused(case: str) -> None:
    from statemachine import HistoryState

    if case == "history over a parallel state":

        class A(Lifecycle):
            idle = State(initial=True)

            class outer(State.Compound):
                class p(State.Parallel):
                    r1, r2 = _regions()

                h = HistoryState()

            gone = State(final=True)
            enter = worker(idle.to(outer))
            pause = worker(outer.to(idle))
            resume = worker(idle.to(outer.h))
            drop = worker(idle.to(gone))

    elif case == "reaper leaves through its compound":

        class A2(Lifecycle):
            idle = State(initial=True)

            class outer(State.Compound):
                class p(State.Parallel):
                    r1, r2 = _regions()

            gone = State(final=True)
            enter = worker(idle.to(outer))
            expire = reaper(outer.to(gone, cond="lease_stale"))

    elif case == "eventless leaves through its compound":

        class A3(Lifecycle):
            idle = State(initial=True)
            gone = State(final=True)

            class outer(State.Compound):
                class p(State.Parallel):
                    r1, r2 = _regions()

            enter = worker(idle.to(outer))
            worker(outer.to(gone, cond="holds_lease"))  # eventless, from the compound holding p

    elif case == "a claim starts into it":

        class A6(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            gone = State(final=True)
            start = starts(idle.to(p))
            leave = worker(p.to(gone))

    elif case == "eventless enters through its compound taking a lease":

        class A5(Lifecycle):
            idle = State(initial=True)
            prep = State()

            class outer(State.Compound):
                class p(State.Parallel):
                    r1, r2 = _regions()

            gone = State(final=True)
            go = worker(idle.to(prep))
            worker(prep.to(outer), lease=LeaseChange.ACQUIRE)  # eventless: would hold a lease in p
            leave = worker(outer.to(gone))

    elif case == "reaper enters through its compound":

        class A4(Lifecycle):
            idle = State(initial=True)

            class outer(State.Compound):
                class p(State.Parallel):
                    r1, r2 = _regions()

            gone = State(final=True)
            enter = reaper(idle.to(outer), reason="expired")
            leave = worker(outer.to(gone))

    elif case == "region not a compound":

        class B(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                solo = State()

                class r2(State.Compound):
                    class active(State.Compound):
                        running = State(initial=True)
                        finalizing = State()

                    b_end = State(final=True)
                    b_fin = worker(active.running.to(active.finalizing))
                    b_go = worker(active.finalizing.to(b_end, cond="holds_lease"))

            enter = worker(idle.to(p))

    elif case == "leaves its region":

        class C(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            out = State(final=True)
            enter = worker(idle.to(p))
            escape = worker(p.r1.a.to(out))

    elif case == "targets inside a region":

        class D(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            enter = worker(idle.to(p.r1.a_end))

    elif case == "shared event":

        class E(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                class r1(State.Compound):
                    a = State(initial=True)
                    a_end = State(final=True)
                    a_go = worker(a.to(a_end))
                    go = worker(a.to(a_end))

                class r2(State.Compound):
                    class active(State.Compound):
                        running = State(initial=True)
                        finalizing = State()

                    b_end = State(final=True)
                    b_fin = worker(active.running.to(active.finalizing))
                    b_go = worker(active.finalizing.to(b_end, cond="holds_lease"))
                    go = worker(active.to(b_end))

            enter = worker(idle.to(p))

    elif case == "reaper enters":

        class F(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            enter = reaper(idle.to(p, cond="lease_stale"))

    elif case == "reaper leaves":

        class G(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            gone = State(final=True)
            enter = worker(idle.to(p))
            cancel = reaper(p.to(gone, cond="lease_stale"))

    elif case == "history inside a region":

        class H(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                class r1(State.Compound):
                    class inner(State.Compound):
                        a = State(initial=True)
                        h = HistoryState()

                    a_end = State(final=True)
                    a_go = worker(inner.to(a_end))

                class r2(State.Compound):
                    class active(State.Compound):
                        running = State(initial=True)
                        finalizing = State()

                    b_end = State(final=True)
                    b_fin = worker(active.running.to(active.finalizing))
                    b_go = worker(active.finalizing.to(b_end, cond="holds_lease"))

            enter = worker(idle.to(p))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_cannot_be_persisted_is_refused_at_class_creation_with_its_reason(case: str) -> None:
    with pytest.raises(InvalidDefinition, match=REFUSALS[case]):
        _refused(case)


# -- entering, running, joining on every store -------------------------------------------------


@pytest.fixture(params=sorted(STORE_FACTORIES))
def release_store(request: pytest.FixtureRequest, clock: ManualClock) -> Any:
    store = STORE_FACTORIES[request.param](clock)
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _build(engine: Engine, entity_id: str, outcome: str = "succeed") -> None:
    build = engine.region("build")
    (claimed,) = build.claim(owner="builder")
    assert claimed.id == region_row_id(entity_id, "build")
    lease = claimed.lease
    result = build.fire(claimed, "finish", lease=lease)
    build.fire(result, outcome, lease=lease)


def _test(engine: Engine, entity_id: str, event: str = "test_pass") -> None:
    tests = engine.region("tests")
    (claimed,) = tests.claim(owner="tester")
    tests.fire(claimed, event, lease=claimed.lease)


def test_entering_creates_every_region_row_with_the_entity_data_in_the_same_commit(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1", data={"sha": "abc"})
    result = engine.fire("r1", "begin")
    assert result.snapshot.state == "checks" and result.snapshot.lease_owner is None
    rows = {s.id: s for s in release_store.children("r1")}
    assert sorted(rows) == ["r1/build", "r1/tests"]
    assert (rows["r1/build"].kind, rows["r1/build"].state) == ("release.build", "compiling")
    assert (rows["r1/tests"].kind, rows["r1/tests"].state) == ("release.tests", "testing")
    assert all(row.data == {"sha": "abc"} and row.parent_id == "r1" for row in rows.values())


def test_the_join_fires_once_the_last_region_ends_and_not_before(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    _build(engine, "r1")
    assert engine.get("r1").state == "checks"  # tests still runs
    _test(engine, "r1")
    assert engine.get("r1").state == "released"
    events = [(h.event, h.source, h.target) for h in release_store.history("r1")]
    assert events == [("begin", "queued", "checks"), ("done.state.checks", "checks", "released")]
    build_events = [h.event for h in release_store.history("r1/build")]
    assert build_events == ["start", "finish", "succeed"]


def test_a_caller_cannot_fire_the_join_while_regions_run(release_store: Store) -> None:
    from fsm.engine.many import Fire

    engine = Engine(Release, release_store)
    engine.create("r1")
    snap = engine.fire("r1", "begin").snapshot
    for event in ("done.state.checks", "done_state_checks"):
        with pytest.raises(TransitionNotAllowed, match="fired by the engine once every region is final"):
            engine.fire("r1", event)
        (refused,) = engine.fire_many([Fire(snap, event)])
        assert isinstance(refused, TransitionNotAllowed)
    assert engine.get("r1").state == "checks" and engine.get("r1").version == 1


def test_leaving_by_an_event_ends_every_running_region_in_the_same_commit(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    _test(engine, "r1")  # tests ended (passed): it stays as it is
    build = engine.region("build")
    (claimed,) = build.claim(owner="builder")  # running, under a live lease
    result = engine.fire("r1", "cancel")
    assert result.snapshot.state == "cancelled"
    row = release_store.get("r1/build")
    assert (row.state, row.lease_owner) == ("left_checks", None)
    last = release_store.history("r1/build")[-1]
    assert (last.event, last.source, last.target, last.reason) == ("cancel", "running", "left_checks", "checks left")
    assert release_store.get("r1/tests").state == "passed"
    with pytest.raises(FsmError):  # the builder's lease went with its region
        build.fire(claimed, "finish", lease=claimed.lease)
    with pytest.raises(TransitionNotAllowed, match="the engine's, when 'checks' is left"):
        build.fire("r1/build", "exit_checks")


def test_leaving_never_cuts_off_a_live_finalizer(release_store: Store, clock: ManualClock) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    build = engine.region("build")
    (claimed,) = build.claim(owner="builder")
    build.fire(claimed, "finish", lease=claimed.lease)
    before = engine.get("r1")
    with pytest.raises(TransitionNotAllowed, match="finalizing under a live lease"):
        engine.fire("r1", "cancel")
    assert engine.get("r1") == before and release_store.get("r1/build").state == "finalizing"
    clock.advance(seconds=5)  # the finalizer's lease lapsed: its holder is gone
    assert engine.fire("r1", "cancel").snapshot.state == "cancelled"
    assert release_store.get("r1/build").state == "left_checks"


def test_a_self_transition_restarts_every_region_but_never_a_live_finalizer(
    release_store: Store, clock: ManualClock
) -> None:
    engine = Engine(Fork, release_store)
    engine.create("f")
    engine.fire("f", "go")
    right = engine.region("right")
    engine.region("left").fire("f/left", "l_go")
    right.fire("f/right", "r_fin")
    assert engine.fire("f", "redo").snapshot.state == "both"  # nobody holds the finalizer's lease
    rows = {s.id: s for s in release_store.children("f")}
    assert (rows["f/left"].state, rows["f/right"].state) == ("l1", "running")
    assert release_store.history("f/right")[-1].reason == "entered both again"
    right.fire("f/right", "r_fin")
    right.acquire_lease("f/right", owner="finisher", ttl=timedelta(seconds=30))  # a live finalizer
    with pytest.raises(TransitionNotAllowed, match="finalizing under a live lease"):
        engine.fire("f", "touch")
    assert release_store.get("f/right").state == "finalizing"
    clock.advance(seconds=60)
    assert engine.fire("f", "touch").snapshot.state == "both"
    assert release_store.get("f/right").state == "running"


def test_moving_from_one_parallel_state_into_another_ends_one_set_and_starts_the_other(
    release_store: Store,
) -> None:
    engine = Engine(Fork, release_store)
    engine.create("f")
    engine.fire("f", "go")
    engine.region("left").fire("f/left", "l_go")
    assert engine.fire("f", "hop").snapshot.state == "pair"
    rows = {s.id: s.state for s in release_store.children("f")}
    assert rows == {"f/left": "left_both", "f/right": "left_both", "f/up": "u1", "f/down": "d1"}
    engine.region("up").fire("f/up", "u_go")
    assert engine.get("f").state == "pair"  # down has no final state: never joined


def test_a_finalizer_the_reaper_reclaimed_holds_no_live_lease(release_store: Store, clock: ManualClock) -> None:
    engine = Engine(Release, release_store)
    build = engine.region("build")
    engine.create("r1")
    engine.fire("r1", "begin")
    (claimed,) = build.claim(owner="w1")
    build.fire(claimed, "finish", lease=claimed.lease)
    clock.advance(seconds=30)
    Reaper(release_store, [Release]).run_once()  # reclaimed: no holder, a claim takes it at once
    row = release_store.get("r1/build")
    assert (row.state, row.lease_owner) == ("finalizing", None) and row.reclaims == 1
    assert engine.fire("r1", "cancel").snapshot.state == "cancelled"
    assert release_store.get("r1/build").state == "left_checks"


def test_a_second_visit_restarts_every_region_at_its_initial_state(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    _build(engine, "r1")
    _test(engine, "r1", "test_fail")
    assert engine.get("r1").state == "released"
    engine.fire("r1", "fix", data={"sha": "def"})
    rows = {s.id: s for s in release_store.children("r1")}
    assert (rows["r1/build"].state, rows["r1/tests"].state) == ("compiling", "testing")
    assert rows["r1/build"].data == {"sha": "def"} and rows["r1/build"].lease_owner is None
    last = release_store.history("r1/tests")[-1]
    assert (last.event, last.source, last.target, last.reason) == ("fix", "red", "testing", "entered checks again")
    _build(engine, "r1")
    _test(engine, "r1")
    assert engine.get("r1").state == "released"
    assert [h.event for h in release_store.history("r1")].count("done.state.checks") == 2


def test_a_refused_entry_leaves_the_entity_and_creates_no_region(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    before = engine.get("r1")
    release_store.create(NewEntity(id="r1/tests", kind="someone.else", state="x", data={}))
    with pytest.raises((ConfigError, EntityExists)):
        engine.fire("r1", "begin")
    assert engine.get("r1") == before
    assert [h.event for h in release_store.history("r1")] == []
    with pytest.raises(FsmError):
        release_store.get("r1/build")


def test_apply_group_is_all_or_nothing_and_refuses_malformed_calls(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    stale = TransitionWrite("r1", "begin", "queued", "checks", "worker", expect_version=7)
    made = NewEntity(id="x1", kind="release.build", state="compiling", data={})
    with pytest.raises(StaleVersion):
        release_store.apply_group([stale], [made])  # type: ignore[attr-defined]
    with pytest.raises(FsmError):
        release_store.get("x1")
    for writes, creates in (
        ("not a list", [made]),
        ([], []),
        ([], [made, made]),
        ([stale], "x"),
        ([object()], [made]),
        ([], [NewEntity(id="a\x00b", kind="release.build", state="compiling", data={})]),
    ):
        with pytest.raises((InvalidArgument, EntityExists)):
            release_store.apply_group(writes, creates)  # type: ignore[attr-defined]
    assert engine.get("r1").version == 0 and release_store.children("r1") == []


def test_two_regions_ending_at_once_join_exactly_once(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    build, tests = engine.region("build"), engine.region("tests")
    (b,) = build.claim(owner="builder")
    b = build.fire(b, "finish", lease=b.lease).snapshot
    (t,) = tests.claim(owner="tester")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def end(engine_: Engine, snap: Any, event: str) -> None:
        try:
            barrier.wait()
            engine_.fire(snap, event, lease=snap.lease)
        except BaseException as err:
            errors.append(err)

    threads = [
        threading.Thread(target=end, args=(build, b, "succeed")),
        threading.Thread(target=end, args=(tests, t, "test_pass")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    if engine.get("r1").state == "checks":  # both looked before the other's commit: the reaper joins
        Reaper(release_store, [Release]).run_once()
    assert engine.get("r1").state == "released"
    assert [h.event for h in release_store.history("r1")].count("done.state.checks") == 1


def test_the_reaper_reaps_a_region_while_its_sibling_finalizes_and_joins_what_it_ended(
    release_store: Store, clock: ManualClock
) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    build, tests = engine.region("build"), engine.region("tests")
    (b,) = build.claim(owner="builder")
    b = build.fire(b, "finish", lease=b.lease).snapshot  # finalizing, lease fresh
    tests.claim(owner="tester")  # its holder dies
    clock.advance(seconds=1.5)
    assert b.lease is not None
    build.renew_lease(b.lease)
    clock.advance(seconds=1.5)  # the tester's lease (2 s) lapsed; the builder renewed its own
    reaper_ = Reaper(release_store, {Release: Policy(lease_ttl=2.0, max_attempts=1)})
    result = reaper_.run_once()
    assert release_store.get("r1/tests").state == "red"
    assert release_store.get("r1/build").state == "finalizing"  # a fresh finalizer is never touched
    assert engine.get("r1").state == "checks" and result.moved["release.tests.test_expire"] == 1
    b = release_store.get("r1/build")
    build.fire(b, "succeed", lease=b.lease)
    assert engine.get("r1").state == "released"


def test_the_reaper_joins_an_entity_whose_last_region_it_moved(release_store: Store, clock: ManualClock) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    _build(engine, "r1")
    engine.region("tests").claim(owner="tester")
    clock.advance(seconds=5)
    result = Reaper(release_store, {Release: Policy(lease_ttl=2.0, max_attempts=1)}).run_once()
    assert result.moved["release.join"] == 1
    assert engine.get("r1").state == "released"
    assert release_store.history("r1")[-1].event == "done.state.checks"


# -- agreement with python-statemachine -------------------------------------------------------


class Fork(Lifecycle):
    """Two regions with choices, loops and a compound, for the agreement test."""

    idle = State(initial=True)

    class both(State.Parallel):
        class left(State.Compound):
            l1 = State(initial=True)

            class l_mid(State.Compound):
                l2 = State(initial=True)
                l3 = State()

            l_end = State(final=True)
            l_go = worker(l1.to(l_mid))
            l_step = worker(l_mid.l2.to(l_mid.l3) | l_mid.l3.to(l1))
            l_done = worker(l_mid.to(l_end))

        class right(State.Compound):
            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            r_end = State(final=True)
            r_fin = worker(active.running.to(active.finalizing))
            # holds_lease: no caller here holds one, and python-statemachine answers it False too
            r_done = worker(active.finalizing.to(r_end, cond="holds_lease") | active.running.to(r_end))

    class pair(State.Parallel):
        class up(State.Compound):
            u1 = State(initial=True)
            u_end = State(final=True)
            u_go = worker(u1.to(u_end))

        class down(State.Compound):
            d1 = State(initial=True)
            d2 = State()
            d_go = worker(d1.to(d2) | d2.to(d1))

    after = State()
    gone = State(final=True)

    go = worker(idle.to(both))
    abort = worker(both.to(idle))
    redo = worker(both.to(both))  # external: every region starts over
    touch = worker(both.to.itself(internal=True))  # internal: SCXML restarts the regions too
    hop = worker(both.to(pair))  # from one parallel state into another
    back = worker(pair.to(after))
    done_state_both = worker(both.to(after))
    again = worker(after.to(both))
    leave = worker(after.to(gone))


def _region_events(lifecycle: type[Lifecycle]) -> dict[str, str]:
    """Each region event of ``lifecycle`` -> its region."""
    return {e: r for regions in lifecycle.regions.values() for r, c in regions.items() for e in c.table.events}


def _sent_events(lifecycle: type[Lifecycle]) -> list[str]:
    """What a caller sends: the entity's events and its regions', not a completion (a
    join among them) nor a region's exit, which the engine takes by itself."""
    sent = {*lifecycle.table.events, *(e for e in _region_events(lifecycle) if not e.startswith("exit_"))}
    return sorted(e for e in sent if not e.startswith(("done.state.", "done_state_")))


def _configuration(engine: Engine, store: Store, entity_id: str) -> set[str]:
    """The entity's configuration: its row's, and each region row's while it is inside."""
    table, regions = engine.lifecycle.table, engine.lifecycle.regions
    snap = engine.get(entity_id)
    found = set(table.configurations[snap.state])
    if snap.state in table.parallel:
        for region, cls in regions[snap.state].items():
            row = store.get(region_row_id(entity_id, region))
            found |= {region, *cls.table.configurations[row.state]}
    return found


def _agrees(lifecycle: type[Lifecycle], events: list[str]) -> None:
    """Send ``events`` to python-statemachine and fire them on the persisted entity (a
    region's on its row): the same decision and the same configuration after each."""
    store = MemoryStore()
    engine = Engine(lifecycle, store)
    engine.create("f")
    chart = lifecycle()
    regions = _region_events(lifecycle)
    for event in events:
        try:
            chart.send(event)
            allowed = True
        except SmNotAllowed:
            allowed = False
        region = regions.get(event)
        target = engine if region is None else engine.region(region)
        try:
            target.fire("f" if region is None else region_row_id("f", region), event)
            fired = True
        except (TransitionNotAllowed, FsmError):
            fired = False
        assert fired == allowed, event
        assert _configuration(engine, store, "f") == {s.id for s in chart.configuration}, event


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_sent_events(Fork)), max_size=25))
@example(["go", "l_go", "l_done", "r_done", "again", "l_go", "l_step", "l_step", "r_done", "l_go", "l_done"])
@example(["go", "l_go", "r_fin", "touch", "l_step", "redo", "l_go", "l_done", "hop", "u_go", "d_go", "back", "again"])
def test_the_persisted_regions_agree_with_python_statemachine(events: list[str]) -> None:
    _agrees(Fork, events)


class Nest(Lifecycle):
    """A parallel state nested in a compound: entered through the compound (or straight
    into it), left by the compound's event, joined inside it, and the compound's own
    completion taken in the same commit as the step that ends it."""

    idle = State(initial=True)

    class stage(State.Compound):
        prep = State(initial=True)

        class both(State.Parallel):
            class left(State.Compound):
                l1 = State(initial=True)
                l_end = State(final=True)
                l_go = worker(l1.to(l_end))

            class right(State.Compound):
                class active(State.Compound):
                    running = State(initial=True)
                    finalizing = State()

                r_end = State(final=True)
                r_fin = worker(active.running.to(active.finalizing))
                r_done = worker(active.finalizing.to(r_end, cond="holds_lease") | active.running.to(r_end))

        joined = State()
        finish = State(final=True)
        start_both = worker(prep.to(both))
        done_state_both = worker(both.to(joined))
        wrap = worker(joined.to(finish))

    out = State()
    begin = worker(idle.to(stage))
    abort = worker(stage.to(idle))  # leaves the parallel state from the compound holding it
    skip = worker(idle.to(stage.both))
    done_state_stage = worker(stage.to(out))
    reset = worker(out.to(idle))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_sent_events(Nest)), max_size=25))
@example(["begin", "start_both", "l_go", "r_fin", "abort", "skip", "l_go", "r_done", "wrap", "reset", "begin"])
def test_a_parallel_state_nested_in_a_compound_agrees_with_python_statemachine(events: list[str]) -> None:
    _agrees(Nest, events)


def test_a_nested_parallel_state_runs_on_every_store(any_store: Store) -> None:
    """Through the compound into its parallel state, a region finalizing under a lease,
    the join inside the compound and the compound's completion in the last region's
    commit chain; then the compound's event leaves the regions of a second visit."""
    engine = Engine(Nest, any_store)
    engine.create("n1")
    engine.fire("n1", "begin")
    assert engine.fire("n1", "start_both").state == "both"
    left, right = engine.region("left"), engine.region("right")
    left.fire(region_row_id("n1", "left"), "l_go")
    row_id = region_row_id("n1", "right")
    lease = right.acquire_lease(row_id, owner="r")
    fin = right.fire(row_id, "r_fin", lease=lease)
    assert fin.state == "finalizing"
    right.fire(fin, "r_done", lease=lease)
    assert engine.get("n1").state == "joined"  # the join, inside the compound
    done = engine.fire("n1", "wrap")
    assert done.state == "out" and [r.event for r in done.automatic] == ["done.state.stage"]
    engine.fire("n1", "reset")
    engine.fire("n1", "skip")  # straight into the nested parallel state: its rows restart
    assert {any_store.get(region_row_id("n1", r)).state for r in ("left", "right")} == {"l1", "running"}
    engine.fire("n1", "abort")  # the compound's event leaves the regions too
    assert engine.get("n1").state == "idle"
    assert {any_store.get(region_row_id("n1", r)).state for r in ("left", "right")} == {"left_both"}


def test_the_property_machine_and_the_path_finder_run_a_nested_parallel_state() -> None:
    """The machine's restore check sees the compounds around a parallel state, and the
    path finder covers a join whose commit also completes the compound holding it."""
    from hypothesis import stateful

    from fsm.testing import lifecycle_machine, shortest_paths

    machine = lifecycle_machine(Nest)
    stateful.run_state_machine_as_test(
        machine, settings=settings(max_examples=30, stateful_step_count=25, deadline=None)
    )

    class JoinEnds(Lifecycle):
        idle = State(initial=True)

        class stage(State.Compound):
            class both(State.Parallel):
                r1, r2 = _regions()

            finish = State(final=True)
            done_state_both = worker(both.to(finish))  # the join ends the compound

        out = State(final=True)
        begin = worker(idle.to(stage))
        done_state_stage = worker(stage.to(out))

    paths = shortest_paths(JoinEnds, max_length=6)
    assert not any("done_state_both" in t or "done.state.both" in t for t in paths.unreachable_transitions)


def test_the_region_rows_are_the_entity_children_and_time_out_alone(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    assert {s.kind for s in release_store.children("r1")} == {"release.build", "release.tests"}
    assert release_store.count_states("release.build") == {"compiling": 1}
    assert release_store.count_states("release") == {"checks": 1}


class Watch(Lifecycle):
    """Starts in its parallel state; region ``b`` has no final state, so it never joins."""

    class on(State.Parallel):
        class a(State.Compound):
            a1 = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            a_end = State(final=True)
            a_go = worker(a1.to(active))
            a_fin = worker(active.running.to(active.finalizing))
            a_done = worker(active.finalizing.to(a_end, cond="holds_lease") | active.running.to(a_end))

        class b(State.Compound):
            b1 = State(initial=True)
            b2 = State()
            b_go = worker(b1.to(b2))
            b_back = worker(b2.to(b1))

    off = State(final=True)
    stop = worker(on.to(off))


def test_a_lifecycle_starting_in_its_parallel_state_creates_every_region_with_it(release_store: Store) -> None:
    engine = Engine(Watch, release_store)
    made = engine.create("w1", data={"k": 1})
    assert made.state == "on"
    rows = {s.id: (s.kind, s.state, s.data) for s in release_store.children("w1")}
    assert rows == {"w1/a": ("watch.a", "a1", {"k": 1}), "w1/b": ("watch.b", "b1", {"k": 1})}
    pair = engine.create_many([{"k": 2}, {"k": 3}], ids=["w2", "w3"])
    assert [s.id for s in pair] == ["w2", "w3"] and all(s.state == "on" for s in pair)
    assert {s.id for s in release_store.children("w3")} == {"w3/a", "w3/b"}
    with pytest.raises(EntityExists):  # all or nothing: w4's rows are not left behind
        engine.create_many([{"k": 4}, {"k": 1}], ids=["w4", "w1"])
    with pytest.raises(FsmError):
        release_store.get("w4/a")
    a = engine.region("a")
    a.fire("w1/a", "a_go")
    a.fire("w1/a", "a_done")
    assert engine.get("w1").state == "on"  # region b has no final state: never joined
    assert engine.fire("w1", "stop").snapshot.state == "off"
    assert release_store.get("w1/b").state == "left_on" and release_store.get("w1/a").state == "a_end"


def test_the_diagram_draws_each_region_inside_its_parallel_state() -> None:
    from fsm.diagram import extract, to_dot, to_mermaid

    diagram = extract(Release)
    text = to_mermaid(diagram)
    checks = text[text.index("state checks {") :]
    assert checks.index("state build {") < checks.index("\n        --\n") < checks.index("state tests {")
    assert "run --> passed : test_pass [holds_lease] (worker)" in text
    assert "exit_checks" not in text and "left_checks" not in text  # the engine's own exit is not drawn
    assert "a parallel state runs its regions side by side" in text
    dot = to_dot(diagram)
    assert dot.count('style="rounded,dashed"') == 2  # the two regions
    assert "dashed box" in dot


def test_fsm_show_prints_each_region_state(release_store: Store) -> None:
    from fsm.commands import region_lines

    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    engine.region("build").claim(owner="builder")
    snap = engine.get("r1")
    from fsm.regions import region_rows

    rows = region_rows(release_store, "r1", Release.regions["checks"])
    lines = region_lines(Release, snap, rows)
    assert lines == ["  regions of checks: build: active > running (held by builder); tests: testing"]
    assert region_lines(None, snap, {}) == []


# -- what a review found, each kept fixed ------------------------------------------------------


def test_a_join_looks_again_when_the_entity_moved_and_never_joins_a_later_visit(
    release_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsm.engine.engine as engine_module
    from fsm.engine.parallel import try_join

    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    monkeypatch.setattr(engine_module, "join_after", lambda *_: None)  # both regions end; no join yet
    _build(engine, "r1")
    _test(engine, "r1")
    monkeypatch.undo()
    slow = Engine(Release, release_store)
    real = slow._fire

    def late(*args: Any, **kwargs: Any) -> Any:  # between the slow join's look and its write:
        slow._fire = real  # type: ignore[method-assign]
        other = Engine(Release, release_store)
        try_join(other, "r1", "checks")  # another joins first,
        other.fire("r1", "fix")  # and the release goes back to its checks
        return real(*args, **kwargs)

    slow._fire = late  # type: ignore[method-assign]
    assert try_join(slow, "r1", "checks") is None
    assert engine.get("r1").state == "checks"  # the second visit's regions have not run: no join
    assert [h.event for h in release_store.history("r1")] == ["begin", "done.state.checks", "fix"]


def test_an_exit_racing_a_finalizer_that_takes_its_lease_is_refused(release_store: Store, clock: ManualClock) -> None:
    engine = Engine(Release, release_store)
    build = engine.region("build")
    engine.create("r1")
    engine.fire("r1", "begin")
    (claimed,) = build.claim(owner="builder-1")
    build.fire(claimed, "finish", lease=claimed.lease)
    clock.advance(seconds=5)  # builder-1 died: its lease lapsed
    real = release_store.apply_group  # type: ignore[attr-defined]

    def interleaved(writes: Any, creates: Any) -> Any:  # a new finalizer takes over meanwhile
        release_store.apply_group = real  # type: ignore[attr-defined]
        build.acquire_lease("r1/build", owner="builder-2")
        return real(writes, creates)

    release_store.apply_group = interleaved  # type: ignore[attr-defined]
    with pytest.raises(TransitionNotAllowed, match="finalizing under a live lease"):
        engine.fire("r1", "cancel")
    row = release_store.get("r1/build")
    assert (row.state, row.lease_owner) == ("finalizing", "builder-2") and engine.get("r1").state == "checks"


def test_a_second_visit_starts_each_region_with_fresh_counters(release_store: Store, clock: ManualClock) -> None:
    engine = Engine(Release, release_store)
    tests = engine.region("tests")
    engine.create("r1")
    engine.fire("r1", "begin")
    _build(engine, "r1")
    reaper_ = Reaper(release_store, {Release: Policy(lease_ttl=2.0, max_attempts=2)})
    for _ in range(2):  # two dead testers: the region ends red
        tests.claim(owner="tester")
        clock.advance(seconds=5)
        reaper_.run_once()
    assert release_store.get("r1/tests").state == "red" and engine.get("r1").state == "released"
    engine.fire("r1", "fix")
    row = release_store.get("r1/tests")
    assert (row.state, row.attempt, row.reclaims) == ("testing", 0, 0)
    tests.claim(owner="tester")
    clock.advance(seconds=5)
    reaper_.run_once()  # one death of the second visit is a retry, not the end
    assert release_store.get("r1/tests").state == "testing"


def test_region_rows_keep_the_entity_concurrency_key(release_store: Store) -> None:
    engine = Engine(Release, release_store)
    engine.create("r1", concurrency_key="repo-a")
    engine.fire("r1", "begin")
    assert {s.concurrency_key for s in release_store.children("r1")} == {"repo-a"}


def test_the_reaper_of_a_region_alone_joins_and_looks_past_its_batch(release_store: Store, clock: ManualClock) -> None:
    import fsm.engine.engine as engine_module

    engine = Engine(Release, release_store)
    for n in range(7):
        engine.create(f"r{n}")
        engine.fire(f"r{n}", "begin")
    real = engine_module.join_after
    engine_module.join_after = lambda *_: None  # type: ignore[assignment]
    try:  # the last release in id order ends both regions; its join is cut off
        build, tests = engine.region("build"), engine.region("tests")
        for snap in build.claim(limit=10, owner="b"):
            if snap.id == "r6/build":
                result = build.fire(snap, "finish", lease=snap.lease)
                build.fire(result, "succeed", lease=snap.lease)
        for snap in tests.claim(limit=10, owner="t"):
            if snap.id == "r6/tests":
                tests.fire(snap, "test_pass", lease=snap.lease)
    finally:
        engine_module.join_after = real
    region_reaper = Reaper(release_store, [Release.regions["checks"]["tests"]], {"batch_size": 3})
    for _ in range(3):  # three ticks of three look at all seven
        region_reaper.run_once()
    assert engine.get("r6").state == "released"


def test_pruning_a_lifecycle_prunes_its_regions_rows_and_a_pruned_region_counts_as_ended(
    release_store: Store, clock: ManualClock
) -> None:
    engine = Engine(Release, release_store)
    engine.create("old")
    engine.fire("old", "begin")
    _build(engine, "old")
    _test(engine, "old")
    engine.fire("old", "publish")
    engine.create("slow")
    engine.fire("slow", "begin")
    _build(engine, "slow")  # slow/build ended; slow/tests still runs
    clock.advance(seconds=3600)
    result = engine.prune(timedelta(minutes=30))
    assert result.removed == ["old"]
    assert sorted(i for r in result.regions for i in r.removed) == ["old/build", "old/tests", "slow/build"]
    assert "of their regions' rows" in result.summary()
    _test(engine, "slow")  # its pruned build had ended: the join goes on
    assert engine.get("slow").state == "released"


def test_a_dry_runs_summary_says_or_more_when_a_region_found_more_than_it_lists() -> None:
    from datetime import UTC, datetime

    from fsm.engine.retention import PruneResult

    cut = datetime(2026, 1, 1, tzinfo=UTC)
    listed = PruneResult("release.build", cut, ["a/build"], dry_run=True)
    more = PruneResult("release.tests", cut, ["a/tests"], dry_run=True, more=True)
    whole = PruneResult("release", cut, ["a"], dry_run=True, regions=(listed, more))
    assert "would remove 1 final entities" in whole.summary()
    assert "and 2 or more of their regions' rows" in whole.summary()
    exact = PruneResult("release", cut, ["a"], dry_run=True, regions=(listed,))
    assert "and 1 of their regions' rows" in exact.summary()


def test_a_reaper_checks_max_active_against_each_region(release_store: Store) -> None:
    from fsm.errors import ConfigError
    from fsm.reaping import ReapPolicy

    with pytest.raises(ConfigError, match=r"release\.build: max_active"):
        Reaper(release_store, {Release: ReapPolicy(max_active=timedelta(seconds=30))})


def test_more_refusals_at_class_creation() -> None:
    with pytest.raises(InvalidDefinition, match="could never fire"):

        class Leased(Lifecycle):
            idle = State(initial=True)

            class p(State.Parallel):
                r1, r2 = _regions()

            out = State(final=True)
            enter = worker(idle.to(p))
            done_state_p = worker(p.to(out, cond="holds_lease"))


def test_callers_are_told_where_a_region_event_goes(release_store: Store) -> None:
    from fsm.errors import UnknownEvent

    engine = Engine(Release, release_store)
    engine.create("r1")
    engine.fire("r1", "begin")
    with pytest.raises(UnknownEvent, match=r"engine.region\('build'\)"):
        engine.fire("r1", "finish")
    assert "done.state.checks" not in engine.allowed_events("r1")
    assert "exit_checks" not in engine.region("build").allowed_events("r1/build")
    with pytest.raises(TransitionNotAllowed, match="from state 'compiling'"):
        engine.region("build").fire("r1/build", "exit_checks")


def test_the_path_finder_keeps_a_lifecycle_own_events_named_like_a_region_exit() -> None:
    from fsm import recovery, starts
    from fsm.testing.paths import shortest_paths

    class Early(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        done = State(final=True)
        failed = State(final=True)
        left = State(final=True)

        start = starts(queued.to(active))
        finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))
        exit_early = worker(queued.to(left))
        expire, reclaim = recovery(queued=queued, running=active.running, finalizing=active.finalizing, failed=failed)

    paths = shortest_paths(Early, max_length=3)
    assert "exit_early: queued -> left (worker)" in paths.transitions


def test_the_path_finder_goes_through_the_regions_and_covers_the_join() -> None:
    from fsm.testing.paths import replay, shortest_paths

    paths = shortest_paths(Release, max_length=7)  # done is 7 steps away
    assert paths.unreachable_states == []
    assert "done.state.checks: checks -> released (worker)" in paths.transitions
    assert "succeed: finalizing -> built [holds_lease] (worker)" in paths.transitions  # a region's branch
    done = paths.states["done"]
    assert [s.region for s in done.steps if s.region] == ["build", "build", "build", "tests", "tests"]
    clock = ManualClock()
    engine = Engine(Release, MemoryStore(clock=clock), clock=clock, owner="path-worker")
    for path in paths.all():
        replay(path, engine, clock)


def test_a_worker_per_region_runs_releases_to_the_end_on_every_store(release_store: Store) -> None:
    from fsm.work import Job, Worker

    engine = Engine(Release, release_store)
    for n in range(3):
        engine.create(f"r{n}")
        engine.fire(f"r{n}", "begin")

    def publish(job: Job) -> str:
        job.run("upload", lambda key: {"key": key})
        return "succeed"

    builders = Worker(engine.region("build"), {"running": lambda job: "finish", "finalizing": publish})
    testers = Worker(engine.region("tests"), {"run": lambda job: "test_pass"})
    with builders, testers:
        for _ in range(400):
            builders.run_once()
            testers.run_once()
            if all(engine.get(f"r{n}").state == "released" for n in range(3)):
                break
            time.sleep(0.01)
    assert [engine.get(f"r{n}").state for n in range(3)] == ["released"] * 3
    assert [e.key for e in release_store.effects("r0/build")] == ["upload"]


def test_the_property_machines_rules_never_shadow_its_own_methods_and_keep_its_name() -> None:
    from fsm.testing import lifecycle_machine
    from fsm.testing.machine import LifecycleMachine, _rule_name

    for event in ("event", "region_event", "region event"):  # fire_event, fire_region_event are the machine's
        name = _rule_name(event, {})
        assert not hasattr(LifecycleMachine, name), name
    machine = lifecycle_machine(Release, name="ReleaseMachine")
    assert machine.__name__ == "ReleaseMachine"
    assert machine.fire_region_event is LifecycleMachine.fire_region_event


def test_a_paused_holder_never_lands_a_write_that_enters_or_leaves_regions() -> None:
    """Entering a parallel state (or leaving one) is the engine's group write with every
    region row, never a lone write a paused holder could land late."""
    from hypothesis import given
    from hypothesis import strategies as st

    from fsm.testing import lifecycle_machine

    machine = lifecycle_machine(Release)

    @given(st.data())
    @settings(max_examples=30, deadline=None)
    def pause(data: st.DataObject) -> None:
        m = machine()
        try:
            m._take("e0")  # a holder of e0 in queued, where begin enters the checks
            m.holder_pauses(data)
            pending = m.holders[-1].pending
            assert pending is None or pending[1].event == "cancel", pending
        finally:
            m.teardown()

    pause()


@pytest.mark.parametrize("where", ["memory", "sqlite"])
def test_the_property_machine_drives_each_regions_rows(where: str) -> None:
    """The entity's events and each region's, on its own row: claims by a region's worker,
    holders that renew, pause, die and run effects, the clock and the reaper; I1 on the
    build region's finalizer, the join only once both regions ended, I5 per visit of a
    region (a fix sends a release back through its checks)."""
    from hypothesis import stateful

    from fsm.testing import lifecycle_machine, memory_stores, sqlite_stores

    machine = lifecycle_machine(Release, memory_stores() if where == "memory" else sqlite_stores())
    rules = {n for n in dir(machine) if n.startswith(("fire_", "claim"))}
    assert {"fire_build__finish", "fire_build__succeed", "fire_tests__test_pass", "claim_region"} <= rules
    assert not any("exit_checks" in n for n in rules)  # the engine takes a region's exit
    examples = 60 if where == "memory" else 8
    stateful.run_state_machine_as_test(
        machine, settings=settings(max_examples=examples, stateful_step_count=30, deadline=None)
    )
