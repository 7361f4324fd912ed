"""Mermaid and DOT exports, parsed structurally; DOT rendered by Graphviz's ``dot``.

The two small parsers below read the exported text back (statements, blocks, attributes),
so the tests check the structure a renderer sees, not the presence of some string.
"""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from dataclasses import dataclass, field

import pytest
from test_definitions import Deploy
from tests_support import Untyped

from fsm import JobLifecycle, Lifecycle, PipelineLifecycle
from fsm.diagram import extract, read_header, render, to_dot, to_mermaid

ALL = [PipelineLifecycle, JobLifecycle, Deploy, Untyped]
needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz `dot` is not installed (apt-get install graphviz); CI installs it"
)


def expected_edges(lifecycle: type[Lifecycle]) -> Counter[tuple[str, str, str]]:
    """(event, declared-on state, declared target) of every declared branch, from the table."""
    seen = {(b.order, b.event, b.declared_on, b.declared_target) for b in lifecycle.table.declared}
    return Counter((event, src, dst) for _order, event, src, dst in seen)


# -- a structural Mermaid stateDiagram-v2 reader ------------------------------------------


@dataclass
class MermaidDoc:
    states: dict[str, str | None] = field(default_factory=dict)
    """state id -> the compound block it was first named in (None: top level)."""
    compounds: set[str] = field(default_factory=set)
    initial: dict[str | None, str] = field(default_factory=dict)
    finals: set[str] = field(default_factory=set)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    """(source, target, label) of every labelled transition."""
    classes: dict[str, set[str]] = field(default_factory=dict)
    class_defs: set[str] = field(default_factory=set)
    notes: list[tuple[str, list[str]]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


ARROW = re.compile(r"^(\[\*\]|\w+) --> (\[\*\]|\w+)(?: : (.+))?$")


def parse_mermaid(text: str) -> MermaidDoc:
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2", "a Mermaid state diagram starts with its type"
    doc = MermaidDoc()
    stack: list[str] = []
    note: tuple[str, list[str]] | None = None

    def name(state: str) -> None:
        doc.states.setdefault(state, stack[-1] if stack else None)

    for raw in lines[1:]:
        line = raw.strip()
        if note is not None:
            if line == "end note":
                doc.notes.append(note)
                note = None
            else:
                note[1].append(line)
            continue
        if not line:
            continue
        if line.startswith("%%"):
            doc.comments.append(line[2:].strip())
        elif m := re.fullmatch(r"state (\w+) \{", line):
            name(m[1])
            doc.compounds.add(m[1])
            stack.append(m[1])
        elif line == "}":
            assert stack, "a '}' closes no state block"
            stack.pop()
        elif m := re.fullmatch(r"note (?:left|right) of (\w+)", line):
            assert m[1] in doc.states, f"note on undeclared state {m[1]}"
            note = (m[1], [])
        elif m := re.fullmatch(r"classDef (\w+) \S+", line):
            doc.class_defs.add(m[1])
        elif m := re.fullmatch(r"class ([\w,]+) (\w+)", line):
            assert m[2] in doc.class_defs, f"class {m[2]} used before its classDef"
            for state in m[1].split(","):
                assert state in doc.states, f"class on undeclared state {state}"
                doc.classes.setdefault(m[2], set()).add(state)
        elif m := ARROW.fullmatch(line):
            src, dst, label = m[1], m[2], m[3]
            if src == "[*]":
                name(dst)
                doc.initial[stack[-1] if stack else None] = dst
            elif dst == "[*]":
                assert src in doc.states, f"final marker on undeclared state {src}"
                doc.finals.add(src)
            else:
                assert label, f"transition without a label: {line}"
                assert src in doc.states and dst in doc.states, f"edge names an undeclared state: {line}"
                doc.edges.append((src, dst, label))
        elif re.fullmatch(r"\w+", line):
            name(line)
        else:
            pytest.fail(f"unexpected Mermaid line: {raw!r}")
    assert not stack, f"unclosed state blocks: {stack}"
    assert note is None, "unclosed note"
    return doc


def mermaid_label(label: str) -> tuple[str, tuple[str, ...], str, str]:
    """(event, guards, actor, effects) of a label ``event [g, g] (actor)<br/>effects``."""
    first, _, effects = label.partition("<br/>")
    m = re.fullmatch(r"(\w+)(?: \[([^\]]*)\])? \((worker|reaper)\)", first)
    assert m, f"label does not read 'event [guards] (actor)': {label!r}"
    return m[1], tuple(m[2].split(", ")) if m[2] else (), m[3], effects


# -- a structural DOT reader --------------------------------------------------------------

TOKEN = re.compile(r'\s+|//[^\n]*|"(?:\\.|[^"\\])*"|->|[\[\]{}=;,]|[\w.#-]+')


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "<":  # an HTML-like string: balanced angle brackets
            depth, end = 0, pos
            while True:
                depth += {"<": 1, ">": -1}.get(text[end], 0)
                end += 1
                if depth == 0:
                    break
            out.append(text[pos:end])
            pos = end
            continue
        m = TOKEN.match(text, pos)
        assert m, f"DOT syntax error near {text[pos : pos + 40]!r}"
        if not (m[0].isspace() or m[0].startswith("//")):
            out.append(m[0])
        pos = m.end()
    return out


def _value(token: str) -> str:
    if token.startswith('"'):
        return token[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return token


@dataclass
class DotDoc:
    name: str = ""
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    node_cluster: dict[str, str | None] = field(default_factory=dict)
    clusters: dict[str, str | None] = field(default_factory=dict)
    """cluster id -> enclosing cluster."""
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


def parse_dot(text: str) -> DotDoc:
    toks = _tokens(text)
    doc = DotDoc()
    i = 0

    def attrs() -> dict[str, str]:
        nonlocal i
        out: dict[str, str] = {}
        if i < len(toks) and toks[i] == "[":
            i += 1
            while toks[i] != "]":
                key, eq, val = toks[i], toks[i + 1], toks[i + 2]
                assert eq == "=", f"bad attribute near {key}"
                out[_value(key)] = _value(val)
                i += 3
                if toks[i] in (",", ";"):
                    i += 1
            i += 1
        return out

    def body(cluster: str | None) -> None:
        nonlocal i
        assert toks[i] == "{"
        i += 1
        while toks[i] != "}":
            tok = toks[i]
            if tok == "subgraph":
                sub = _value(toks[i + 1])
                i += 2
                if sub.startswith("cluster_"):
                    doc.clusters[sub] = cluster
                    body(sub)
                else:
                    body(cluster)
            elif tok == "{":
                body(cluster)
            elif tok in ("graph", "node", "edge"):
                i += 1
                attrs()
            elif toks[i + 1] == "=":
                i += 3
            elif toks[i + 1] == "->":
                tail, head = _value(tok), _value(toks[i + 2])
                i += 3
                doc.edges.append((tail, head, attrs()))
            else:
                node = _value(tok)
                i += 1
                doc.nodes.setdefault(node, {}).update(attrs())
                doc.node_cluster.setdefault(node, cluster)
            if toks[i] == ";":
                i += 1
        i += 1

    assert toks[0] == "digraph", "a DOT export is a digraph"
    doc.name = _value(toks[1])
    i = 2
    body(None)
    assert i == len(toks), "text after the graph's closing brace"
    return doc


def plain(html_label: str) -> str:
    """An HTML-like label's text: tags dropped, <br/> as newlines, entities decoded."""
    text = re.sub(r"<br/>", "\n", html_label.removeprefix("<").removesuffix(">"))
    return html.unescape(re.sub(r"<[^>]+>", "", text))


STATE_EDGE = re.compile(r"^edge_\d+_\w+$")


def state_edges(doc: DotDoc) -> list[tuple[str, str, dict[str, str]]]:
    return [e for e in doc.edges if STATE_EDGE.match(e[2].get("id", ""))]


def dot_edge_key(doc: DotDoc, tail: str, head: str, attrs: dict[str, str]) -> tuple[str, str, str]:
    """(event, drawn-from state, drawn-to state): a clipped end counts as its cluster's state."""
    event = plain(attrs["label"]).split()[0]
    src = attrs.get("ltail", "").removeprefix("cluster_") or tail
    dst = attrs.get("lhead", "").removeprefix("cluster_") or head
    return event, src, dst


# -- Mermaid --------------------------------------------------------------------------------


@pytest.mark.parametrize("lifecycle", ALL, ids=lambda c: c.__name__)
def test_mermaid_has_a_node_per_state_and_an_edge_per_declared_branch(lifecycle: type[Lifecycle]) -> None:
    doc = parse_mermaid(to_mermaid(extract(lifecycle)))
    assert set(doc.states) == set(lifecycle.states_map)
    got = Counter((mermaid_label(label)[0], src, dst) for src, dst, label in doc.edges)
    assert got == expected_edges(lifecycle)


@pytest.mark.parametrize("lifecycle", ALL, ids=lambda c: c.__name__)
def test_mermaid_structure_nests_children_in_their_compound_and_marks_initial_and_final(
    lifecycle: type[Lifecycle],
) -> None:
    doc = parse_mermaid(to_mermaid(extract(lifecycle)))
    for state in lifecycle.states_map.values():
        parent = state.parent.id if state.parent is not None else None
        # first named inside its parent's block, or Mermaid would draw it outside
        assert doc.states[state.id] == parent, state.id
        assert (state.id in doc.compounds) == bool(state.is_compound)
    assert doc.initial[None] == lifecycle.table.initial
    assert doc.initial["active"] == "running"
    assert doc.finals == set(lifecycle.table.finals)
    assert doc.classes["final"] == set(lifecycle.table.finals)


def test_mermaid_labels_carry_guards_actor_and_effects_for_every_job_branch() -> None:
    doc = parse_mermaid(to_mermaid(extract(JobLifecycle)))
    labels = {(src, dst, *mermaid_label(label)[:3]): mermaid_label(label)[3] for src, dst, label in doc.edges}
    parsed = set(labels)
    assert ("running", "queued", "expire", ("lease_stale", "attempts_left"), "reaper") in parsed
    assert ("running", "failed", "expire", ("lease_stale",), "reaper") in parsed
    assert ("finalizing", "failed", "expire", ("lease_stale", "reclaims_exhausted"), "reaper") in parsed
    assert ("finalizing", "finalizing", "reclaim", ("lease_stale", "reclaims_left"), "reaper") in parsed
    assert ("running", "finalizing", "exited", ("holds_lease",), "worker") in parsed
    effects = {(src, dst, ev): eff for (src, dst, ev, _g, _a), eff in labels.items()}
    assert effects[("finalizing", "finalizing", "reclaim")] == "reason=reclaimed, acquires lease, reclaims+1"
    assert effects[("queued", "active", "start")] == "acquires lease, attempt+1"


def test_mermaid_reaper_edges_are_told_apart_and_a_legend_note_explains_them() -> None:
    doc = parse_mermaid(to_mermaid(extract(PipelineLifecycle)))
    actors = Counter(mermaid_label(label)[2] for _s, _d, label in doc.edges)
    assert actors == Counter({"worker": 5, "reaper": 3})
    (legend,) = [lines for state, lines in doc.notes if state == "queued"]
    assert any("(reaper)" in line for line in legend) and any("(worker)" in line for line in legend)
    assert any("fsm-diagram ref=fsm.lifecycles:PipelineLifecycle format=mermaid" in c for c in doc.comments)
    supersede = [label for _s, _d, label in doc.edges if label.startswith("supersede")]
    assert supersede == ["supersede [superseded] (reaper)<br/>reason=duplicate"]


def test_mermaid_escapes_text_that_would_break_a_statement() -> None:
    from statemachine import State

    from fsm import reaper, worker

    class Odd(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        end = State(final=True)  # a Mermaid keyword as a state id
        start = worker(queued.to(active))
        finish = worker(active.running.to(active.finalizing))
        close = worker(active.finalizing.to(end))
        expire = reaper(active.to(end, cond="lease_stale"), reason="stale; #1 <x>")

    text = to_mermaid(extract(Odd))
    assert 'state "end" as state_end' in text
    (line,) = [ln for ln in text.splitlines() if ": expire" in ln]
    assert ";" not in line.replace("#59;", "").replace("#35;", "").replace("#lt;", "").replace("#gt;", "")
    assert "<x>" not in line


# -- DOT -----------------------------------------------------------------------------------


@pytest.mark.parametrize("lifecycle", ALL, ids=lambda c: c.__name__)
def test_dot_has_a_node_per_leaf_a_cluster_per_compound_and_an_edge_per_declared_branch(
    lifecycle: type[Lifecycle],
) -> None:
    doc = parse_dot(to_dot(extract(lifecycle)))
    leaves = {s.id for s in lifecycle.states_map.values() if not s.is_compound}
    compounds = {s.id for s in lifecycle.states_map.values() if s.is_compound}
    assert {n for n in doc.nodes if not n.startswith("__")} == leaves
    assert set(doc.clusters) == {f"cluster_{c}" for c in compounds}
    assert doc.node_cluster["running"] == doc.node_cluster["finalizing"] == "cluster_active"
    assert doc.node_cluster[lifecycle.table.initial] is None
    got = Counter(dot_edge_key(doc, *edge) for edge in state_edges(doc))
    assert got == expected_edges(lifecycle)


def test_dot_edges_carry_guards_and_actor_and_reaper_edges_are_dashed_and_red() -> None:
    doc = parse_dot(to_dot(extract(JobLifecycle)))
    edges = state_edges(doc)
    for _tail, _head, attrs in edges:
        first = plain(attrs["label"]).splitlines()[0]
        actor = "reaper" if first.endswith("(reaper)") else "worker"
        assert first.endswith(f"({actor})")
        assert attrs["style"] == ("dashed" if actor == "reaper" else "solid")
        assert attrs["class"] == actor
    dashed_colors = {a["color"] for _t, _h, a in edges if a["style"] == "dashed"}
    solid_colors = {a["color"] for _t, _h, a in edges if a["style"] == "solid"}
    assert len(dashed_colors) == len(solid_colors) == 1 and dashed_colors != solid_colors
    expires = sorted(plain(a["label"]) for _t, _h, a in edges if plain(a["label"]).startswith("expire"))
    assert expires == [
        "expire [lease_stale, attempts_left] (reaper)\nreason=expired, clears lease",
        "expire [lease_stale, reclaims_exhausted] (reaper)\nreason=expired",
        "expire [lease_stale] (reaper)\nreason=expired",
    ]


def test_dot_draws_a_compound_declared_transition_once_clipped_at_the_cluster() -> None:
    doc = parse_dot(to_dot(extract(Deploy)))
    aborts = [(t, h, a) for t, h, a in state_edges(doc) if plain(a["label"]).startswith("abort")]
    assert len(aborts) == 1
    assert aborts[0][2]["ltail"] == "cluster_active" and doc.node_cluster[aborts[0][0]] == "cluster_active"
    (start,) = [a for _t, _h, a in state_edges(doc) if plain(a["label"]).startswith("start")]
    assert start["lhead"] == "cluster_active"


def test_dot_marks_initial_and_final_states_and_has_a_legend_with_guard_meanings() -> None:
    doc = parse_dot(to_dot(extract(Deploy)))
    assert doc.nodes["deployed"]["peripheries"] == "2" and doc.nodes["failed"]["peripheries"] == "2"
    assert "peripheries" not in doc.nodes["queued"]
    assert ("__initial", "queued") in {(t, h) for t, h, _a in doc.edges}
    assert ("__initial_active", "running") in {(t, h) for t, h, _a in doc.edges}
    legend = plain(doc.nodes["__legend"]["label"])
    assert "tests_green" in legend and "every test step passed" in legend
    assert "worker" in legend and "reaper" in legend and "dashed" in legend


def test_exports_are_deterministic_and_name_their_lifecycle() -> None:
    assert to_dot(extract(JobLifecycle)) == to_dot(extract(JobLifecycle))
    assert to_mermaid(extract(JobLifecycle)) == to_mermaid(extract(JobLifecycle))
    header = read_header(to_dot(extract(JobLifecycle)).encode())
    assert header is not None and (header.ref, header.format) == ("fsm.lifecycles:JobLifecycle", "dot")


# -- Graphviz ------------------------------------------------------------------------------


@needs_dot
@pytest.mark.parametrize("lifecycle", ALL, ids=lambda c: c.__name__)
def test_dot_output_is_accepted_by_graphviz_without_warnings(lifecycle: type[Lifecycle]) -> None:
    result = subprocess.run(
        ["dot", "-Tsvg"], input=to_dot(extract(lifecycle)).encode(), capture_output=True, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    # any warning (an unknown attribute, a cluster clip Graphviz could not apply...) fails;
    # font substitution notices depend on the machine's fonts, not on our DOT
    warnings = [w for w in result.stderr.decode().splitlines() if w.strip() and "font" not in w.lower()]
    assert warnings == []
    root = ET.fromstring(result.stdout)
    assert root.tag.endswith("svg")


@needs_dot
def test_svg_export_draws_every_branch_and_carries_its_provenance() -> None:
    diagram = extract(JobLifecycle)
    svg = render(diagram, "svg")
    header = read_header(svg)
    assert header is not None and header.format == "svg" and header.dot_sha256
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    ids = {g.get("id") for g in root.iter(f"{ns}g")}
    assert {f"edge_{e.order}_{e.event}" for e in diagram.edges} <= ids
    assert {f"state_{n.id}" for n in diagram.nodes if not n.compound} <= ids
    assert "cluster_active" in ids


@needs_dot
def test_png_export_is_a_png_carrying_its_provenance() -> None:
    png = render(extract(PipelineLifecycle), "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    kinds, pos = [], 8
    while pos < len(png):  # every chunk, the inserted tEXt included, has a valid CRC
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, payload = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + payload), kind
        kinds.append(kind)
        pos += 12 + length
    assert kinds[:2] == [b"IHDR", b"tEXt"] and kinds[-1] == b"IEND"
    header = read_header(png)
    assert header is not None and header.ref == "fsm.lifecycles:PipelineLifecycle" and header.format == "png"
