"""Diagram extraction: a Lifecycle class -> the neutral model every format draws."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from test_definitions import Deploy

from fsm import JobLifecycle, PipelineLifecycle
from fsm.diagram import Diagram, extract, load_lifecycle, ref_of
from fsm.diagram.refs import LifecycleNotFound
from fsm.records import Actor, LeaseChange


def _edges(diagram: Diagram) -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    return [(e.event, e.source, e.target, e.actor.value, e.guards) for e in diagram.edges]


def test_compound_active_state_holds_running_and_finalizing_with_running_initial() -> None:
    d = extract(JobLifecycle)
    active = d.node("active")
    assert active.compound and active.parent is None
    assert active.children == ("running", "finalizing")
    assert d.node("running").parent == "active" and d.node("running").initial
    assert d.node("finalizing").parent == "active" and not d.node("finalizing").initial
    assert [n.id for n in d.roots] == ["queued", "active", "completed", "failed"]
    assert d.node("queued").initial
    assert {n.id for n in d.nodes if n.final} == {"completed", "failed"}


def test_every_guarded_branch_of_job_is_an_edge_including_all_five_expire_branches() -> None:
    edges = _edges(extract(JobLifecycle))
    assert edges == [
        ("start", "queued", "active", "worker", ()),
        ("cancel", "queued", "failed", "worker", ()),  # the operator overrides: no guard, drawn apart
        ("resubmit", "queued", "queued", "worker", ()),
        ("exited", "running", "finalizing", "worker", ("holds_lease",)),
        ("fail", "running", "failed", "worker", ("holds_lease",)),
        ("retry", "running", "queued", "worker", ("holds_lease",)),
        ("expire", "running", "queued", "reaper", ("lease_stale", "owned", "attempts_left")),
        ("expire", "running", "failed", "reaper", ("lease_stale", "owned")),
        ("expire", "running", "failed", "reaper", ("lease_stale", "unclaimed")),
        ("cancel", "running", "failed", "worker", ()),
        ("release", "running", "queued", "worker", ()),
        ("complete", "finalizing", "completed", "worker", ("holds_lease",)),
        ("fail", "finalizing", "failed", "worker", ("holds_lease",)),
        ("retry", "finalizing", "finalizing", "worker", ("holds_lease",)),
        ("expire", "finalizing", "failed", "reaper", ("lease_stale", "owned", "reclaims_exhausted")),
        ("expire", "finalizing", "failed", "reaper", ("lease_stale", "unclaimed")),
        ("reclaim", "finalizing", "finalizing", "reaper", ("lease_stale", "owned", "reclaims_left")),
        ("release", "finalizing", "finalizing", "worker", ()),  # no cancel out of a live finalizer
    ]


def test_pipeline_edges_carry_reasons_expired_and_duplicate_and_the_finalizer_lease() -> None:
    d = extract(PipelineLifecycle)
    by = {(e.event, e.source): e for e in d.edges}
    assert by[("expire", "running")].reason == "expired"
    assert by[("expire", "finalizing")].reason == "expired"
    assert by[("supersede", "running")].reason == "duplicate"
    assert by[("supersede", "running")].guards == ("superseded",)
    assert by[("finish", "running")].lease is LeaseChange.ACQUIRE
    assert "acquires lease" in by[("finish", "running")].effects
    assert len(d.edges) == len(PipelineLifecycle.table.declared)  # no compound-declared transitions here


def test_job_labels_show_lease_effects_counters_and_reclaimed_reason() -> None:
    by = {(e.event, e.source, e.target, e.guards): e for e in extract(JobLifecycle).edges}
    by |= {key[:3]: e for key, e in by.items() if "unclaimed" not in key[3]}
    assert by[("start", "queued", "active")].effects == ("acquires lease", "attempt+1")
    assert by[("reclaim", "finalizing", "finalizing")].effects == ("reason=reclaimed", "acquires lease", "reclaims+1")
    assert by[("expire", "running", "queued")].effects == ("reason=expired", "clears lease")
    # entering a final state always clears the lease: implied, not repeated on each edge
    assert by[("expire", "running", "failed")].effects == ("reason=expired",)
    assert by[("expire", "running", "failed")].title == "expire [lease_stale, owned] (reaper)"
    backstop = by[("expire", "running", "failed", ("lease_stale", "unclaimed"))]
    assert backstop.effects == ("reason=unclaimed",)


def test_transition_declared_on_the_compound_is_one_edge_from_the_compound_not_one_per_leaf() -> None:
    d = extract(Deploy)
    counts = Counter((e.event, e.source, e.target) for e in d.edges)
    assert counts[("abort", "active", "failed")] == 1
    assert counts[("expire", "active", "failed")] == 1
    assert not any(e.event in ("abort", "expire") and e.source in ("running", "finalizing") for e in d.edges)
    (expire,) = [e for e in d.edges if e.event == "expire"]
    assert expire.leaves == ("running", "finalizing") and expire.actor is Actor.REAPER
    # every declared branch appears exactly once: the table's per-leaf copies fold back
    declared = {(b.order, b.event, b.declared_on) for b in Deploy.table.declared}
    assert len(d.edges) == len(declared) == 5
    assert all(n == 1 for n in counts.values())


def test_user_guard_and_its_description_reach_the_model() -> None:
    d = extract(Deploy)
    (promote,) = [e for e in d.edges if e.event == "promote"]
    assert promote.guards == ("holds_lease", "tests_green")
    assert ("tests_green", "every test step passed") in d.guards


def test_negated_guard_reads_not_name() -> None:
    from statemachine import State

    from fsm import Lifecycle, worker

    class Gate(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        done = State(final=True)
        start = worker(queued.to(active, unless="attempts_left"))
        finish = worker(active.running.to(active.finalizing))
        succeed = worker(active.finalizing.to(done, cond="holds_lease"))

    (start,) = [e for e in extract(Gate).edges if e.event == "start"]
    assert start.guards == ("not attempts_left",)


def test_extraction_is_deterministic() -> None:
    assert extract(JobLifecycle) == extract(JobLifecycle)
    assert extract(Deploy).edges == extract(Deploy).edges


def test_references_round_trip_and_bad_references_are_refused_clearly() -> None:
    assert ref_of(JobLifecycle) == "fsm.lifecycles:JobLifecycle"
    assert load_lifecycle("fsm.lifecycles:JobLifecycle") is JobLifecycle
    with pytest.raises(LifecycleNotFound, match="expected MODULE:CLASS"):
        load_lifecycle("fsm.lifecycles.JobLifecycle")
    with pytest.raises(LifecycleNotFound, match="cannot be imported"):
        load_lifecycle("no_such_module_xyz:Thing")
    with pytest.raises(LifecycleNotFound, match="has no attribute 'Nope'"):
        load_lifecycle("fsm.lifecycles:Nope")
    with pytest.raises(LifecycleNotFound, match="not a Lifecycle subclass"):
        load_lifecycle("fsm.lifecycles:JobData")


def test_extract_refuses_what_is_not_a_lifecycle() -> None:
    with pytest.raises(TypeError, match="Lifecycle subclass"):
        extract(int)  # type: ignore[arg-type]


def test_importing_fsm_does_not_import_the_diagram_package() -> None:
    code = "import sys, fsm; fsm.JobLifecycle; assert 'fsm.diagram' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
