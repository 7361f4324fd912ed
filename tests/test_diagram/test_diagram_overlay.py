"""A stored entity drawn on its lifecycle: the highlight follows it, its history is listed."""

from __future__ import annotations

import pytest
from test_diagram_formats import parse_dot, parse_mermaid, plain

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle, UnknownEntity
from fsm.diagram import Diagram, extract, to_dot, to_mermaid
from fsm.records import Actor
from stores import MemoryStore


def highlighted(diagram: Diagram) -> tuple[set[str], set[str], set[str]]:
    """The highlighted state(s) in the model, the Mermaid ``current`` class and the filled DOT nodes."""
    model = {n.id for n in diagram.nodes if n.highlight}
    mermaid = parse_mermaid(to_mermaid(diagram)).classes.get("current", set())
    dot = {name for name, attrs in parse_dot(to_dot(diagram)).nodes.items() if "filled" in attrs.get("style", "")}
    return model, mermaid, dot


def test_highlighted_state_follows_a_stored_job_through_its_transitions(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("j1")
    seen = []

    def look() -> None:
        d = extract(JobLifecycle, store=store, entity_id="j1")
        model, mermaid, dot = highlighted(d)
        assert model == mermaid == dot, (model, mermaid, dot)
        (state,) = model
        assert d.overlay is not None and d.overlay.state == state == engine.get("j1").state
        seen.append(state)

    look()
    lease = engine.fire("j1", "start").lease
    look()
    clock.advance(JobLifecycle.policy.lease_ttl * 2)
    engine.fire("j1", "expire", actor=Actor.REAPER)  # attempts left: back to queued
    look()
    lease = engine.fire("j1", "start").lease
    engine.fire("j1", "exited", lease=lease)
    look()
    engine.fire("j1", "complete", lease=lease)
    look()
    assert seen == ["queued", "running", "queued", "finalizing", "completed"]


def test_overlay_lists_the_last_transitions_oldest_first_with_actor_and_reason(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    engine.create("p1")
    engine.fire("p1", "start")
    clock.advance(PipelineLifecycle.policy.stale_after * 2)
    engine.fire("p1", "expire", actor=Actor.REAPER)
    d = extract(PipelineLifecycle, store=store, entity_id="p1", last=5)
    assert d.overlay is not None
    assert [(r.seq, r.event, r.source, r.target, r.actor, r.reason) for r in d.overlay.history] == [
        (1, "start", "queued", "running", "worker", None),
        (2, "expire", "running", "failed", "reaper", "expired"),
    ]
    mermaid = parse_mermaid(to_mermaid(d))
    (note,) = [lines for state, lines in mermaid.notes if state == "failed"]
    assert note[0] == "entity p1: failed (version 2)"
    assert note[-1] == "v2 expire: running -#gt; failed (reaper, expired)"  # Mermaid's entity code for '>'
    box = plain(parse_dot(to_dot(d)).nodes["__history"]["label"])
    assert "entity p1: failed (version 2)" in box and "running -&gt; failed" not in box
    assert "running -> failed" in box and "expired" in box


def test_overlay_keeps_only_the_last_n_transitions(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("j2")
    for _ in range(3):  # start, then expire back to queued, while attempts remain
        engine.fire("j2", "start")
        clock.advance(JobLifecycle.policy.lease_ttl * 2)
        engine.fire("j2", "expire", actor=Actor.REAPER)
    d = extract(JobLifecycle, store=store, entity_id="j2", last=2)
    assert d.overlay is not None and d.overlay.total == 6
    assert [r.seq for r in d.overlay.history] == [5, 6]
    assert d.overlay.state == "failed"  # attempts spent: the third expire fails it
    assert d.overlay.history_title == "last 2 of 6 transitions"


def test_overlay_of_an_unknown_or_foreign_entity_is_refused(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    Engine(PipelineLifecycle, store, clock=clock).create("p9")
    with pytest.raises(UnknownEntity, match="no entity with id 'nope'"):
        extract(JobLifecycle, store=store, entity_id="nope")
    with pytest.raises(UnknownEntity, match="'p9' is a 'pipeline', not a 'job'"):
        extract(JobLifecycle, store=store, entity_id="p9")
    with pytest.raises(ValueError, match="both a store and an entity id"):
        extract(JobLifecycle, store=store)


def test_an_entity_export_names_the_entity_in_its_header(clock: ManualClock) -> None:
    store = MemoryStore(clock)
    Engine(JobLifecycle, store, clock=clock).create("job 7/a")
    d = extract(JobLifecycle, store=store, entity_id="job 7/a")
    comments = parse_mermaid(to_mermaid(d)).comments
    assert any("entity=job%207%2Fa" in c for c in comments)
