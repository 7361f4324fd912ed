"""Timed transitions in every diagram format: an edge labelled ``after 24h`` in the reaper's
style, its generated guard (``after_24h``) never drawn as a guard, the entity overlay's
pending timers with their due time; exports stay checkable (``fsm diagram --check``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path

import pytest
from statemachine import State
from test_diagram_formats import (
    MERMAID_DIR,
    MERMAID_PARSE,
    expected_edges,
    parse_dot,
    parse_mermaid,
    plain,
    state_edges,
)
from test_timers.charts import Approval, Nested, Reminder

from fsm import Engine, JobLifecycle, Lifecycle, ManualClock, reaper, worker
from fsm.diagram import check_dir, extract, read_header, render, to_dot, to_mermaid, write_dir
from fsm.diagram.dot import REAPER_COLOR
from fsm.diagram.mermaid import TIMER_LEGEND
from fsm.diagram.provenance import sha256_text
from fsm.diagram.refs import ref_of
from fsm.records import LeaseChange
from stores import MemoryStore

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
SVG = "{http://www.w3.org/2000/svg}"
GENERATED = re.compile(r"after_\d")
"""A generated timer guard's name (``after_24h``, ``after_1h30m``): never drawn."""


class Nudged(Lifecycle):
    """A timed self-loop (an external self-transition restarts its state's clock), a timer
    with an ``unless`` guard beside it, and a timer of days."""

    kind = "nudged"
    open = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    closed = State(final=True)
    expired = State(final=True)

    start = worker(open.to(active), lease=LeaseChange.ACQUIRE)
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    close = worker(active.finalizing.to(closed, cond="holds_lease"))
    nudge = reaper(open.to.itself(), after=timedelta(minutes=10), reason="nudged")  # type: ignore[no-untyped-call]
    expire = reaper(open.to(expired, unless="owned"), after=timedelta(days=7), reason="expired")


TIMED = [Approval, Reminder, Nested, Nudged]
TITLES = {
    Approval: {
        "timeout": "timeout after 24h (reaper)",
        "deadline": "deadline after 1h30m [lease_stale] (reaper)",
    },
    Reminder: {"expire": "expire after 1h (reaper)"},
    Nested: {"deadline": "deadline after 30m [lease_stale] (reaper)"},  # on a compound holding a compound
    Nudged: {"nudge": "nudge after 10m (reaper)", "expire": "expire after 7d [not owned] (reaper)"},
}
"""The first label line of each timed edge, as every format draws it."""


def timed_titles(lifecycle: type[Lifecycle], fmt: str) -> dict[str, str]:
    """Event -> the first line of its edge's label, read back from ``fmt``'s output, for each
    timed transition (the text a reader sees: markup dropped, entities decoded)."""
    diagram = extract(lifecycle)
    events = {e.event for e in diagram.edges if e.after is not None}
    if fmt == "mermaid":
        text = to_mermaid(diagram)
        doc = parse_mermaid(text)
        # a self-loop's label is short (its guards and effects are in the legend note)
        found = {label.split("<br/>")[0].removesuffix(", see note") for _s, _d, label in doc.edges}
        return {t.split()[0]: t for t in found if t.split()[0] in events}
    if fmt == "dot":
        dot = parse_dot(to_dot(diagram))
        found = {plain(attrs["label"]).splitlines()[0] for _t, _h, attrs in state_edges(dot)}
        return {t.split()[0]: t for t in found if t.split()[0] in events}
    assert fmt == "svg"
    root = ET.fromstring(render(diagram, "svg"))
    out = {}
    for group in root.iter(f"{SVG}g"):
        edge = next((e for e in diagram.edges if group.get("id") == f"edge_{e.order}_{e.event}"), None)
        if edge is not None and edge.after is not None:
            # Graphviz writes each differently styled run as its own <text>: the label's
            # first line is the runs up to the effects' (italic) line
            runs = [t.text or "" for t in group.iter(f"{SVG}text")]
            line = "".join(runs).replace("\xa0", " ")
            out[edge.event] = line[: line.index(")") + 1]
    return out


@pytest.mark.parametrize("fmt", ["mermaid", "dot", pytest.param("svg", marks=needs_dot)])
@pytest.mark.parametrize("lifecycle", TIMED, ids=lambda c: c.__name__)
def test_every_format_labels_a_timed_edge_after_its_delay(lifecycle: type[Lifecycle], fmt: str) -> None:
    assert timed_titles(lifecycle, fmt) == TITLES[lifecycle]


@pytest.mark.parametrize("lifecycle", TIMED, ids=lambda c: c.__name__)
def test_the_generated_guard_is_never_drawn_but_the_declared_ones_are(lifecycle: type[Lifecycle]) -> None:
    diagram = extract(lifecycle)
    assert not any(GENERATED.match(g) for e in diagram.edges for g in e.guards)
    assert not any(GENERATED.match(name) for name, _ in diagram.guards)  # nor in the legend's guards
    for text in (to_mermaid(diagram), to_dot(diagram)):
        assert not GENERATED.search(text)
    declared = {g.name for b in lifecycle.table.declared for g, _ in b.guards if g.after is None}
    assert {name for name, _ in diagram.guards} == declared
    # the engine still has the guard: the diagram only draws it as "after 24h"
    assert any(GENERATED.match(g) for b in lifecycle.table.timers() for g in b.guard_names)


def test_the_model_keeps_the_delay_and_the_other_guards() -> None:
    edges = {e.event: e for e in extract(Approval).edges}
    assert edges["timeout"].after == timedelta(hours=24) and edges["timeout"].guards == ()
    assert edges["timeout"].timer == "after 24h"
    assert edges["deadline"].after == timedelta(minutes=90) and edges["deadline"].guards == ("lease_stale",)
    assert edges["deadline"].source == "active" and edges["deadline"].leaves == ("running", "finalizing")
    assert edges["cancel"].after is None and edges["cancel"].timer is None
    assert edges["timeout"].label_lines() == ("timeout after 24h (reaper)", "reason=timed out")


def test_a_timed_edge_keeps_the_reapers_style_in_dot_and_the_legend_explains_timers() -> None:
    doc = parse_dot(to_dot(extract(Approval)))
    timed = {plain(a["label"]).split()[0]: a for _t, _h, a in state_edges(doc) if "after" in plain(a["label"])}
    assert set(timed) == {"timeout", "deadline"}
    for attrs in timed.values():
        assert (attrs["class"], attrs["style"], attrs["color"], attrs["fontcolor"]) == (
            "reaper",
            "dashed",
            REAPER_COLOR,
            REAPER_COLOR,
        )
    assert "<b>timeout</b>&#160;after 24h (reaper)" in timed["timeout"]["label"]
    legend = plain(doc.nodes["__legend"]["label"])
    assert "after ta timer: the reaper fires it once the entity has been in the state it leaves for t" in legend
    # a lifecycle without timers draws what it drew before: no timer row in its legend
    assert "a timer" not in plain(parse_dot(to_dot(extract(JobLifecycle))).nodes["__legend"]["label"])
    assert TIMER_LEGEND not in to_mermaid(extract(JobLifecycle))


def test_the_mermaid_legend_note_explains_timers_and_a_timed_self_loop() -> None:
    doc = parse_mermaid(to_mermaid(extract(Nudged)))
    (legend,) = [lines for state, lines in doc.notes if state == "open"]
    assert TIMER_LEGEND in legend
    assert "open loop: nudge after 10m (reaper): reason=nudged, clears lease" in legend
    assert ("open", "open", "nudge after 10m (reaper), see note") in doc.edges


@pytest.mark.parametrize("lifecycle", TIMED, ids=lambda c: c.__name__)
def test_every_timed_branch_is_drawn_once(lifecycle: type[Lifecycle]) -> None:
    doc = parse_mermaid(to_mermaid(extract(lifecycle)))
    assert len(doc.edges) == sum(expected_edges(lifecycle).values())
    assert len(state_edges(parse_dot(to_dot(extract(lifecycle))))) == sum(expected_edges(lifecycle).values())


@needs_dot
@pytest.mark.parametrize("lifecycle", TIMED, ids=lambda c: c.__name__)
def test_graphviz_draws_timed_lifecycles_without_warnings(lifecycle: type[Lifecycle]) -> None:
    dot = to_dot(extract(lifecycle)).encode()
    result = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    warnings = [w for w in result.stderr.decode().splitlines() if w.strip() and "font" not in w.lower()]
    assert warnings == []


@needs_dot
def test_the_svg_draws_the_timed_edge_dashed_and_red_and_the_png_is_of_that_dot() -> None:
    diagram = extract(Approval)
    root = ET.fromstring(render(diagram, "svg"))
    edge = next(e for e in diagram.edges if e.event == "timeout")
    (group,) = [g for g in root.iter(f"{SVG}g") if g.get("id") == f"edge_{edge.order}_timeout"]
    (path,) = group.iter(f"{SVG}path")
    assert path.get("stroke") == REAPER_COLOR and path.get("stroke-dasharray")
    assert {t.get("fill") for t in group.iter(f"{SVG}text")} == {REAPER_COLOR}
    png = render(diagram, "png")
    header = read_header(png)
    assert png.startswith(b"\x89PNG") and header is not None
    assert header.dot_sha256 == sha256_text(to_dot(diagram))  # drawn from the DOT whose labels are checked above


def test_exports_of_a_timed_lifecycle_are_checked_fresh(tmp_path: Path) -> None:
    formats = ("mermaid", "dot", "svg") if shutil.which("dot") else ("mermaid", "dot")
    written = write_dir(tmp_path, [ref_of(Approval), ref_of(Nudged)], formats)
    assert {w.status for w in written} == {"wrote"}
    report = check_dir(tmp_path)
    assert report.ok and report.count(report.findings[0].status) == len(written), report
    assert to_mermaid(extract(Approval)) == to_mermaid(extract(Approval))  # byte-identical, every time


# -- an entity's pending timers, overlaid -----------------------------------------------------


def overlaid(*events: str, advance: timedelta = timedelta()) -> tuple[Engine, ManualClock, str]:
    clock = ManualClock()
    engine = Engine(Approval, MemoryStore(clock), clock=clock)
    engine.create("req-1")
    for event in events:
        engine.fire("req-1", event)
    clock.advance(advance)
    return engine, clock, "req-1"


def test_the_overlay_lists_the_pending_timer_and_its_edge_says_when_it_is_due() -> None:
    engine, clock, entity = overlaid(advance=timedelta(hours=2))
    since = engine.get(entity).timer_since
    assert since is not None
    due = (since + timedelta(hours=24)).isoformat(timespec="seconds")
    diagram = extract(Approval, store=engine.store, entity_id=entity)
    assert diagram.overlay is not None and [t.event for t in diagram.overlay.timers] == ["timeout"]

    doc = parse_dot(to_dot(diagram))
    box = plain(doc.nodes["__history"]["label"])
    assert f"timer timeout after 24h in waiting: due {due}" in box
    labels = {plain(a["label"]).split()[0]: plain(a["label"]) for _t, _h, a in state_edges(doc)}
    assert labels["timeout"].splitlines()[-1] == f"due {due}"
    assert "due" not in labels["deadline"] and "due" not in labels["cancel"]  # not the entity's timer

    mermaid = parse_mermaid(to_mermaid(diagram))
    (note,) = [lines for state, lines in mermaid.notes if state == "waiting"]
    assert any(f"timer timeout after 24h in waiting: due {due}" in line for line in note)
    (timeout,) = [label for src, dst, label in mermaid.edges if label.startswith("timeout")]
    assert timeout.endswith(f"<br/>due {due}")


def test_the_overlay_says_what_else_a_timer_needs_and_nothing_once_no_timer_runs() -> None:
    engine, _clock, entity = overlaid("start")
    diagram = extract(Approval, store=engine.store, entity_id=entity)
    box = plain(parse_dot(to_dot(diagram)).nodes["__history"]["label"])
    assert "timer deadline after 1h30m in active (also needs lease_stale): due " in box
    assert "timer deadline after 1h30m in active (also needs lease_stale): due " in to_mermaid(diagram)

    engine.fire(entity, "finish", lease=engine.get(entity).lease)
    assert [t.event for t in extract(Approval, store=engine.store, entity_id=entity).overlay.timers] == [  # type: ignore[union-attr]
        "deadline"
    ]  # a move inside the timed compound keeps its clock
    engine.fire(entity, "succeed", lease=engine.get(entity).lease)
    done = extract(Approval, store=engine.store, entity_id=entity)
    assert done.overlay is not None and done.overlay.timers == ()
    assert "timer " not in plain(parse_dot(to_dot(done)).nodes["__history"]["label"])
    assert not re.search(r"<br/>due ", to_mermaid(done))


@needs_dot
def test_an_overlaid_timed_entity_renders(tmp_path: Path) -> None:
    engine, _clock, entity = overlaid("start")
    diagram = extract(Approval, store=engine.store, entity_id=entity)
    svg = render(diagram, "svg")
    ET.fromstring(svg)
    assert b"due " in svg and b"also needs lease_stale" in svg
    (tmp_path / "overlay.png").write_bytes(render(diagram, "png"))


@pytest.mark.skipif(not MERMAID_DIR or shutil.which("node") is None, reason="set FSM_TEST_MERMAID_DIR (and node)")
def test_mermaid_itself_parses_timed_exports_and_overlays(tmp_path: Path) -> None:
    engine, _clock, entity = overlaid(advance=timedelta(minutes=1))
    diagrams = [extract(lc) for lc in TIMED] + [extract(Approval, store=engine.store, entity_id=entity)]
    files = []
    for i, diagram in enumerate(diagrams):
        files.append(tmp_path / f"{i}.mmd")
        files[-1].write_text(to_mermaid(diagram))
    script = tmp_path / "parse.mjs"
    script.write_text(MERMAID_PARSE)
    result = subprocess.run(["node", str(script), *map(str, files)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for diagram, line in zip(diagrams, result.stdout.splitlines(), strict=True):
        assert int(line.rsplit(" ", 1)[1]) in (-1, len(diagram.edges)), line
