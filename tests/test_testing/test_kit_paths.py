"""Path generation covers every state and transition of the built-ins and of the README's
example lifecycle; each path replays on a real engine as a readable pytest case; the
coverage report names what a deliberately thin suite never fired."""

from __future__ import annotations

import pytest
from tests_support import README_GUARD_DATA, readme_lifecycle

from fsm import Engine, Fenced, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.testing import HandlerEnvironment, TransitionCoverage, branch_name, path_cases, replay, shortest_paths
from fsm.testing.paths import Path
from stores import MemoryStore

Deploy = readme_lifecycle()
LIFECYCLES = [(JobLifecycle, None), (PipelineLifecycle, None), (Deploy, README_GUARD_DATA)]


@pytest.mark.parametrize(("lifecycle", "guard_data"), LIFECYCLES, ids=lambda c: getattr(c, "__name__", ""))
def test_every_state_and_every_transition_has_a_path(lifecycle: type, guard_data: object) -> None:
    found = shortest_paths(lifecycle, guard_data=guard_data)  # type: ignore[arg-type]
    assert found.unreachable_states == [] and found.unreachable_transitions == []
    assert set(found.states) == set(lifecycle.table.leaves)
    assert set(found.transitions) == {branch_name(b) for b in lifecycle.table.declared}


def test_paths_carry_the_clock_moves_and_guard_values_they_need() -> None:
    found = shortest_paths(JobLifecycle)
    exhausted = found.transitions["expire: finalizing -> failed [lease_stale, owned, reclaims_exhausted] (reaper)"]
    assert [s.event for s in exhausted.steps if s.kind == "fire"] == [
        "start", "exited", "reclaim", "reclaim", "expire"
    ]  # fmt: skip
    # a reclaim counts a death: a new holder must take the lease before the next one
    assert [s.kind for s in exhausted.steps].count("acquire") == 2
    assert len(exhausted.clock_moves) == 3 and exhausted.guard_values["reclaims_exhausted"] is True
    supersede = shortest_paths(PipelineLifecycle).transitions["supersede: running -> failed [superseded] (reaper)"]
    assert [s.kind for s in supersede.steps] == ["fire", "sibling", "fire"]
    green = shortest_paths(Deploy, guard_data=README_GUARD_DATA).states["finalizing"]
    assert any(s.patch == {"tests_passed": True} for s in green.steps)
    assert "needs holds_lease, tests_green" in green.describe()


ALL_CASES = [
    pytest.param(lifecycle, *case.values, id=f"{lifecycle.__name__} {case.id}")
    for lifecycle, guard_data in LIFECYCLES
    for case in path_cases(lifecycle, guard_data=guard_data)  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("lifecycle", "path"), ALL_CASES)
def test_path_replays_on_a_real_engine(lifecycle: type, path: Path | None) -> None:
    assert path is not None, "unreachable"
    clock = ManualClock()
    engine = Engine(lifecycle, MemoryStore(clock=clock), clock=clock, owner="replayer")
    snap = replay(path, engine, clock)
    last = path.steps[-1] if path.steps else None
    assert last is None or last.target is None or snap.state == last.target


def test_the_coverage_report_names_what_a_thin_suite_never_fired() -> None:
    coverage = TransitionCoverage(JobLifecycle)
    clock = ManualClock()
    jobs = Engine(JobLifecycle, MemoryStore(clock=clock), clock=clock, owner="thin")
    with coverage.recording():  # the thin suite: only the happy path
        jobs.create("j1")
        lease = jobs.fire("j1", "start").lease
        jobs.fire("j1", "exited", lease=lease)
        jobs.fire("j1", "complete", lease=lease)
    report = coverage.report(JobLifecycle)
    assert "reclaim: finalizing -> finalizing [lease_stale, owned, reclaims_left] (reaper)" in report.missed
    assert "complete: finalizing -> completed [holds_lease] (worker)" in report.fired
    assert not report.complete and "NEVER FIRED  reclaim" in report.format()
    # the same from a store's history
    again = TransitionCoverage(JobLifecycle)
    again.add_history(jobs.store)
    assert again.report(JobLifecycle) == report


def test_a_handler_runs_in_a_fake_job_and_learns_it_lost_the_lease() -> None:
    def finalize(job: object) -> str:
        job.run("security", lambda key: {"status": "passed"})  # type: ignore[attr-defined]
        job.progress({"done": "security"})  # type: ignore[attr-defined]
        return "complete"

    env = HandlerEnvironment(JobLifecycle, state="finalizing")
    assert env.run(finalize) == "complete" and env.allowed("complete")
    assert env.effects() == {"security": {"status": "passed"}} and env.progress == [{"done": "security"}]
    assert env.renew()
    env.lose_lease()
    with pytest.raises(Fenced):
        env.run(lambda job: job.run("deploy", lambda key: "x"))
