"""Issue 11, items 4 and 7: definitions that would let live work be killed, and the small
things a newcomer hit (one test per item, each failing without its fix)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from statemachine import State
from tests_support import guide_text

from fsm import (
    ConfigError,
    Engine,
    GuardContext,
    InvalidDefinition,
    JobLifecycle,
    Lifecycle,
    ManualClock,
    PipelineLifecycle,
    Policy,
    guard,
    operator_override,
    reaper,
    worker,
)
from fsm.diagram import extract, to_dot, to_mermaid
from fsm.errors import GuardRejected, LeaseLost
from fsm.reaping import Reaper, ReapPolicy
from stores import MemoryStore

ROOT = Path(__file__).resolve().parents[1]


def _shape(**transitions: Any) -> dict[str, Any]:
    """The class body of a lifecycle ``queued -> active{running -> finalizing} -> done | failed``
    plus ``transitions`` (each a function of the namespace)."""
    ns: dict[str, Any] = {"queued": State(initial=True)}

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    ns["active"] = active
    ns["done"] = State(final=True)
    ns["failed"] = State(final=True)
    ns["start"] = worker(ns["queued"].to(active), lease=_acquire())
    ns["finish"] = worker(active.running.to(active.finalizing, cond="holds_lease"))
    ns["succeed"] = worker(active.finalizing.to(ns["done"], cond="holds_lease"))
    ns["expire"] = reaper(active.to(ns["failed"], cond="lease_stale"), reason="expired")
    for name, make in transitions.items():
        ns[name] = make(ns)
    return ns


def _acquire() -> Any:
    from fsm import LeaseChange

    return LeaseChange.ACQUIRE


# -- item 4: definitions that let live work be killed ---------------------------------------


def test_a_worker_transition_out_of_finalizing_without_holds_lease_is_refused_unless_an_operator_override() -> None:
    with pytest.raises(InvalidDefinition, match=r"'abort' from 'finalizing'.*lacks the 'holds_lease' guard"):
        type("Deploy", (Lifecycle,), _shape(abort=lambda ns: worker(ns["active"].to(ns["failed"]))))
    # the named override is accepted, recorded and drawn apart from worker edges
    deploy = type("Deploy", (Lifecycle,), _shape(abort=lambda ns: operator_override(ns["active"].to(ns["failed"]))))
    (branch,) = deploy.table.branches_for("finalizing", "abort")
    assert branch.override and branch.reason == "operator"
    diagram = extract(deploy)
    assert "abort (operator override)" in to_mermaid(diagram)
    assert 'class="operator-override"' in to_dot(diagram) and "style=bold" in to_dot(diagram)
    # and it does fail a live finalizer, on purpose
    clock = ManualClock()
    engine = Engine(deploy, MemoryStore(clock))
    engine.create("d1")
    lease = engine.fire("d1", "start").lease
    engine.fire("d1", "finish", lease=lease)
    assert engine.fire("d1", "abort").record.reason == "operator"


def test_a_misspelt_state_in_renewal_budget_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match=r"renewal_budget names 'finalising'.*did you mean 'finalizing'"):

        class Misspelt(JobLifecycle):
            policy = Policy(renewal_budget={"finalising": timedelta(hours=1)})

    with pytest.raises(ConfigError, match="renewal_budget names 'finalising'"):
        Engine(JobLifecycle, MemoryStore(), policy=Policy(renewal_budget={"finalising": timedelta(hours=1)}))
    with pytest.raises(ConfigError, match="'completed', a final state"):
        Reaper(MemoryStore(), {JobLifecycle: Policy(renewal_budget={"completed": timedelta(hours=1)})})


def test_a_leased_state_without_an_explicit_budget_is_capped_by_the_default_budget() -> None:
    # Pipeline names a budget for finalizing only; a lease taken on a running pipeline is
    # still never renewed past the default budget, so a hung holder cannot keep it forever
    assert "running" not in PipelineLifecycle.policy.renewal_budget
    assert PipelineLifecycle.policy.budget_for("running") == timedelta(hours=6)
    clock = ManualClock()
    pipelines = Engine(PipelineLifecycle, MemoryStore(clock), clock=clock)
    pipelines.create("p1")
    pipelines.fire("p1", "start")
    lease = pipelines.acquire_lease("p1")
    for _ in range(6 * 60):  # a hung holder renewing every minute, for ever
        clock.advance(timedelta(minutes=1))
        try:
            lease = pipelines.renew_lease(lease)
        except LeaseLost as err:
            assert "renewal budget of state 'running' is spent" in str(err)
            break
    else:
        pytest.fail("the lease was renewed past the default renewal budget")
    # the cap can still be lifted, explicitly
    assert Policy(default_renewal_budget=None).budget_for("running") is None


def test_actor_reaper_passed_by_hand_is_still_held_to_the_reapers_guards() -> None:
    # actor="reaper" is documented as the Reaper's (and tests'); whoever passes it, the
    # store-side lease_stale re-check keeps a fresh finalizer alive (I1)
    clock = ManualClock()
    jobs = Engine(JobLifecycle, MemoryStore(clock), clock=clock)
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    with pytest.raises(GuardRejected):
        jobs.fire("j1", "expire", actor="reaper")
    assert jobs.get("j1").state == "finalizing"
    readme = guide_text()
    assert '`actor="reaper"` is for the reaper' in readme


# -- item 7: small things a newcomer hit ---------------------------------------------------------


def test_lease_lost_after_a_spent_budget_says_the_budget_is_spent() -> None:
    clock = ManualClock()
    jobs = Engine(JobLifecycle, MemoryStore(clock), clock=clock)
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    for _ in range(6 * 60):
        clock.advance(timedelta(minutes=1))
        try:
            lease = jobs.renew_lease(lease)
        except LeaseLost as err:
            message = str(err)
            break
    assert "renewal budget of state 'running' is spent" in message
    assert "the caller holds token 1, the entity holds token 1" not in message


def test_a_builtin_lifecycle_instantiates_like_a_statemachine_chart() -> None:
    chart = JobLifecycle()  # used to fail: Did not found name 'holds_lease'
    chart.send("start")
    assert chart.configuration_values == {"active", "running"}
    guarded = JobLifecycle(guards={"holds_lease": True})
    guarded.send("start")
    guarded.send("exited")
    assert guarded.configuration_values == {"active", "finalizing"}


def test_a_plain_method_guard_is_refused_with_a_hint_to_use_the_guard_decorator() -> None:
    def ns_with_method(ns: dict[str, Any]) -> Any:
        ns["tests_green"] = lambda self: True  # a plain method, not @guard
        return worker(ns["active"].running.to(ns["failed"], cond="tests_green"))

    with pytest.raises(InvalidDefinition, match=r"unknown guard 'tests_green'.*decorated with @guard"):
        type("Deploy", (Lifecycle,), _shape(bail=ns_with_method))

    @guard
    def tests_green(ctx: GuardContext) -> bool:
        return True

    attrs = _shape(bail=lambda ns: worker(ns["active"].running.to(ns["failed"], cond="tests_green")))
    attrs["tests_green"] = tests_green
    assert "tests_green" in type("Deploy", (Lifecycle,), attrs).guards


def test_a_transition_not_wrapped_in_worker_or_reaper_is_refused() -> None:
    with pytest.raises(InvalidDefinition, match="'bail' from 'running' to 'failed' does not name its actor"):
        type("Deploy", (Lifecycle,), _shape(bail=lambda ns: ns["active"].running.to(ns["failed"])))


def test_a_subclass_that_only_changes_the_policy_keeps_the_kind() -> None:
    class PatientJobs(JobLifecycle):
        policy = Policy(lease_ttl=timedelta(minutes=10), renewal_budget={"finalizing": timedelta(hours=4)})

    assert PatientJobs.kind == "job"  # the same rows; used to become "patientjobs"

    class OtherJobs(JobLifecycle):
        kind = "other-job"

    assert OtherJobs.kind == "other-job"


def test_a_reap_policy_given_under_its_lifecycle_does_not_repeat_it() -> None:
    reaper_ = Reaper(MemoryStore(), {JobLifecycle: ReapPolicy(max_active=timedelta(hours=8))})
    (rp,) = reaper_.policies
    assert rp.lifecycle is JobLifecycle and rp.policy == JobLifecycle.policy
    listed = Reaper(MemoryStore(), [ReapPolicy(lifecycle=JobLifecycle, max_active=timedelta(hours=8))])
    assert listed.policies[0].lifecycle is JobLifecycle
    with pytest.raises(ConfigError, match="is a ReapPolicy of PipelineLifecycle"):
        Reaper(MemoryStore(), {JobLifecycle: ReapPolicy(lifecycle=PipelineLifecycle)})


def test_two_lifecycles_of_one_kind_are_refused_by_one_reaper() -> None:
    class PatientJobs(JobLifecycle):
        policy = Policy(lease_ttl=timedelta(minutes=10))

    with pytest.raises(ConfigError, match="share kind 'job'"):
        Reaper(MemoryStore(), [JobLifecycle, PatientJobs])


def test_the_benchmarks_need_an_explicit_postgres_url() -> None:
    bench = ROOT / "tests" / "benchmarks"
    for path in bench.glob("*.py"):
        assert "127.0.0.1:5432" not in path.read_text(), path.name  # no silent default database
    env = {k: v for k, v in os.environ.items() if k not in ("FSM_BENCH_POSTGRES_URL", "FSM_TEST_POSTGRES_URL")}
    shown = subprocess.run(
        [sys.executable, str(bench / "run.py"), "--help"], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert "none: skipped" in shown


def test_pytest_ra_reports_the_postgres_skip_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FSM_TEST_POSTGRES_URL", "FSM_REQUIRE_POSTGRES")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-ra",
            "-p",
            "no:cacheprovider",
            "-n",  # parallel, as the suite's addopts run it, with two workers rather than one per core or more
            "2",
            "tests/test_stores/test_work_contract.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1, done.stdout
    assert "tests/conftest.py" in skipped[0] and "FSM_TEST_POSTGRES_URL" in skipped[0]
