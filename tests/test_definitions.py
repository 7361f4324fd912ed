"""Declaring lifecycles: the rules checked at class creation, the compiled table, restore."""

from __future__ import annotations

import pytest
from statemachine import State

from fsm import (
    Engine,
    GuardContext,
    InvalidDefinition,
    JobLifecycle,
    Lifecycle,
    ManualClock,
    guard,
    operator_override,
    reaper,
    worker,
)
from fsm.records import Actor, LeaseChange
from stores import MemoryStore


def test_reaper_transition_leaving_finalizing_without_lease_stale_is_refused_naming_it() -> None:
    with pytest.raises(
        InvalidDefinition, match=r"reaper transition 'expire' from 'finalizing' to 'failed'.*lease_stale"
    ):

        class Bad(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            failed = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            expire = reaper(active.finalizing.to(failed, cond="attempts_left"))


def test_reaper_transition_declared_on_the_compound_parent_also_counts_as_leaving_finalizing() -> None:
    with pytest.raises(InvalidDefinition, match=r"'expire' from 'finalizing'.*declared on 'active'"):

        class Bad(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            failed = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            expire = reaper(active.to(failed))


def test_finalizing_at_top_level_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="sub-state of a compound active state"):

        class Flat(Lifecycle):
            running = State(initial=True)
            finalizing = State()
            done = State(final=True)
            finish = worker(running.to(finalizing))
            succeed = worker(finalizing.to(done))


def test_a_lifecycle_without_finalizing_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="explicit 'finalizing' state"):

        class NoFinalizer(Lifecycle):
            queued = State(initial=True)
            done = State(final=True)
            go = worker(queued.to(done))


def test_unknown_guard_name_is_refused_naming_the_transition() -> None:
    with pytest.raises(InvalidDefinition, match=r"transition 'finish'.*unknown guard 'tests_green'"):

        class Typo(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing, cond="tests_green"))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))


def test_a_fenced_guard_under_or_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="'holds_lease' is re-checked by the store at commit"):

        class Expr(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing, cond="holds_lease or lease_stale"))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))


def test_python_statemachine_definition_errors_surface_as_our_invalid_definition() -> None:
    with pytest.raises(InvalidDefinition, match="Trap"):

        class Trap(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            stuck = State()
            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))
            jam = worker(active.running.to(stuck))


class Deploy(Lifecycle):
    """A user-declared lifecycle with its own guard."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    deployed = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active), lease=LeaseChange.ACQUIRE)
    promote = worker(active.running.to(active.finalizing, cond=["holds_lease", "tests_green"]))
    done = worker(active.finalizing.to(deployed, cond="holds_lease"))
    abort = operator_override(active.to(failed))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")

    @guard
    def tests_green(ctx: GuardContext) -> bool:
        "every test step passed"
        return bool(ctx.data.get("tests_passed"))


def test_user_lifecycle_gets_kind_guards_and_a_compiled_table() -> None:
    assert Deploy.kind == "deploy"
    assert "tests_green" in Deploy.guards and Deploy.guards["tests_green"].description == "every test step passed"
    assert not hasattr(Deploy, "tests_green") or not callable(Deploy.tests_green)
    branches = Deploy.table.branches_for("finalizing", "abort")
    assert [(b.source, b.target, b.declared_on) for b in branches] == [("finalizing", "failed", "active")]
    assert Deploy.table.configurations["finalizing"] == ("active", "finalizing")
    assert Deploy.table.initial == "queued"
    assert Deploy.table.finals == {"deployed", "failed"}


def test_user_guard_decides_the_transition_through_the_engine(clock: ManualClock) -> None:
    engine = Engine(Deploy, MemoryStore(clock), clock=clock)
    engine.create("d1")
    lease = engine.fire("d1", "start").lease
    from fsm import GuardRejected

    with pytest.raises(GuardRejected, match="tests_green"):
        engine.fire("d1", "promote", lease=lease)
    result = engine.fire("d1", "promote", lease=lease, data={"tests_passed": True})
    assert result.state == "finalizing"


def test_restore_from_a_leaf_rebuilds_the_compound_configuration() -> None:
    sm = JobLifecycle.restore("finalizing")
    assert set(sm.configuration_values) == {"active", "finalizing"}


def test_transition_declared_on_the_parent_works_after_restore_from_finalizing(clock: ManualClock) -> None:
    sm = Deploy.restore("finalizing")
    sm.send("abort")
    assert set(sm.configuration_values) == {"failed"}
    engine = Engine(Deploy, MemoryStore(clock), clock=clock)
    engine.create("d2")
    lease = engine.fire("d2", "start").lease
    engine.fire("d2", "promote", lease=lease, data={"tests_passed": True})
    # a fresh engine over the same store: only the leaf 'finalizing' was persisted
    again = Engine(Deploy, engine.store, clock=clock)
    assert again.configuration("d2") == ("active", "finalizing")
    assert again.fire("d2", "abort").state == "failed"


def test_restore_of_an_unknown_leaf_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="no leaf state 'nope'"):
        JobLifecycle.restore("nope")


def test_worker_and_reaper_helpers_record_actor_reason_and_lease_effect() -> None:
    (reclaim,) = JobLifecycle.table.branches_for("finalizing", "reclaim")
    assert reclaim.actor is Actor.REAPER and reclaim.reason == "reclaimed"
    assert reclaim.lease_effect is LeaseChange.ACQUIRE and reclaim.bump_reclaims
    (start,) = JobLifecycle.table.branches_for("queued", "start")
    assert start.actor is Actor.WORKER and start.bump_attempt and start.lease_effect is LeaseChange.ACQUIRE
    (complete,) = JobLifecycle.table.branches_for("finalizing", "complete")
    assert complete.lease_effect is LeaseChange.CLEAR  # entering a final state drops the lease


def _base(**extra: object) -> dict[str, object]:
    """The shape every test lifecycle shares, plus ``extra`` class attributes."""
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)
    attrs: dict[str, object] = {
        "queued": queued,
        "active": active,
        "done": done,
        "failed": failed,
        "start": worker(queued.to(active)),
        "finish": worker(active.running.to(active.finalizing)),
        "succeed": worker(active.finalizing.to(done, cond="holds_lease")),
    }
    attrs.update({k: (v(attrs) if callable(v) else v) for k, v in extra.items()})
    return attrs


def test_unless_combining_fenced_guards_is_refused_because_its_meaning_is_a_disjunction() -> None:
    with pytest.raises(InvalidDefinition, match="may not appear under 'or' or 'not'"):
        type(
            "Ambiguous",
            (Lifecycle,),
            _base(abort=lambda a: worker(a["active"].running.to(a["failed"], unless="holds_lease and superseded"))),
        )


def test_validators_must_name_a_declared_validator() -> None:
    with pytest.raises(InvalidDefinition, match=r"validators='check' must name a validator declared on the class"):
        type(
            "Validated",
            (Lifecycle,),
            _base(abort=lambda a: worker(a["active"].running.to(a["failed"], validators="check"))),
        )


def test_an_eventless_transition_must_name_its_actor() -> None:
    with pytest.raises(InvalidDefinition, match="does not name its actor"):

        class Eventless(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            active.finalizing.to(done)  # no event: python-statemachine would take it by itself


def test_an_eventless_transition_leaving_finalizing_must_hold_the_lease() -> None:
    with pytest.raises(InvalidDefinition, match=r"worker transition '\(automatic\)' from 'finalizing' to 'done'"):

        class Unfenced(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            worker(active.finalizing.to(done))  # taken by itself: any caller's fire into finalizing


def test_an_eventless_reaper_transition_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="is declared with reaper"):

        class Reaped(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))
            reaper(active.running.to(active.finalizing, cond="lease_stale"))


def test_a_final_state_nested_in_the_compound_needs_its_exits_fenced() -> None:
    """A nested final completes its compound (done.state.active); the entity goes on, so
    the compound's transitions still leave it, and the finalizer's rules still hold."""
    with pytest.raises(InvalidDefinition, match="worker transition 'abort' from 'finalizing'"):

        class NestedFinal(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()
                shipped = State(final=True)

            failed = State(final=True)
            start = worker(queued.to(active))
            finish = worker(active.running.to(active.finalizing))
            ship = worker(active.finalizing.to(active.shipped, cond="holds_lease"))
            abort = worker(active.to(failed))


def test_a_subclass_may_change_policy_but_not_declare_transitions() -> None:
    from datetime import timedelta

    from fsm import Policy

    class PatientJob(JobLifecycle):
        kind = "patient-job"
        policy = Policy(lease_ttl=timedelta(minutes=10), renewal_budget={"finalizing": timedelta(hours=4)})

    assert PatientJob.table.events == JobLifecycle.table.events and PatientJob.kind == "patient-job"
    with pytest.raises(InvalidDefinition, match="not declare states or transitions"):

        class Abortable(JobLifecycle):
            abort = worker(JobLifecycle.active.to(JobLifecycle.failed))

    assert "abort" not in JobLifecycle.table.events  # the parent is untouched
    assert all(str(t.event) != "abort" for s in JobLifecycle.states_map.values() for t in s.transitions)


def test_unless_on_a_time_guard_is_refused_since_the_store_cannot_recheck_its_negation() -> None:
    with pytest.raises(InvalidDefinition, match=r"unless='lease_stale' .* cannot be re-checked"):
        type(
            "FreshOnly", (Lifecycle,), _base(abort=lambda a: worker(a["active"].to(a["failed"], unless="lease_stale")))
        )


def test_unless_on_a_counter_guard_is_rechecked_as_its_negation() -> None:
    from fsm import Policy
    from fsm.records import CounterAtLeast
    from fsm.table import branch_conditions

    retry = type(
        "Retry",
        (Lifecycle,),
        _base(
            give_up=lambda a: reaper(
                a["active"].running.to(a["failed"], cond="lease_stale", unless="attempts_left"), reason="spent"
            )
        ),
    )
    (branch,) = retry.table.branches_for("running", "give_up")
    conditions = branch_conditions(branch, Policy(max_attempts=4))
    assert CounterAtLeast("attempt", 4) in conditions and branch.rechecked


def test_a_refused_subclass_leaves_the_parent_statechart_as_it_was_even_for_hidden_transitions() -> None:
    before = [(t.target.id, t.event) for t in JobLifecycle.queued.transitions]  # start, cancel, resubmit
    with pytest.raises(InvalidDefinition):

        class Sneaky(JobLifecycle):
            hidden = [JobLifecycle.queued.to(JobLifecycle.failed)]  # not an attribute the check sees
            abort = worker(JobLifecycle.active.to(JobLifecycle.failed))

    sm = JobLifecycle.restore("queued")
    sm.send("start")
    assert set(sm.configuration_values) == {"active", "running"}
    assert [(t.target.id, t.event) for t in JobLifecycle.queued.transitions] == before


def test_built_in_guard_names_cannot_be_redefined() -> None:
    with pytest.raises(InvalidDefinition, match="holds_lease are built in"):

        class Audited(Lifecycle):
            queued = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            done = State(final=True)
            start = worker(queued.to(active), lease=LeaseChange.ACQUIRE)
            finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
            succeed = worker(active.finalizing.to(done, cond="holds_lease"))

            @guard
            def holds_lease(ctx: GuardContext) -> bool:
                "a look-alike that would drop the fencing token"
                return ctx.lease is not None


def test_unless_on_a_user_guard_whose_condition_cannot_be_negated_is_refused() -> None:
    from fsm import Guard
    from fsm.records import LeaseStale

    custom = Guard("idle_long", lambda ctx: True, "idle", condition=lambda p: LeaseStale(p.stale_after * 2))
    attrs = _base(abort=lambda a: worker(a["active"].to(a["failed"], unless="idle_long")))
    attrs["idle_long"] = custom
    with pytest.raises(InvalidDefinition, match=r"unless='idle_long' .* cannot be re-checked"):
        type("Custom", (Lifecycle,), attrs)


def test_a_guard_returning_a_truthy_value_counts_as_true_as_in_python_statemachine(clock: ManualClock) -> None:
    from fsm import Guard

    owner_set = Guard("owner_set", lambda ctx: ctx.data.get("owner"), "an owner name is set")
    attrs = _base(
        assign=lambda a: worker(a["active"].running.to(a["active"].finalizing, cond="owner_set")),
        abort=lambda a: worker(a["active"].running.to(a["failed"])),
    )
    attrs["owner_set"] = owner_set
    assignable = type("Assignable", (Lifecycle,), attrs)
    engine = Engine(assignable, MemoryStore(clock), clock=clock)
    engine.create("a1")
    engine.fire("a1", "start")
    assert engine.fire("a1", "assign", data={"owner": "alice"}).state == "finalizing"
