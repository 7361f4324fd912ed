"""Mermaid and DOT exports, parsed structurally; DOT rendered by Graphviz's ``dot``.

The two small parsers below read the exported text back (statements, blocks, attributes),
so the tests check the structure a renderer sees, not the presence of some string.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
import textwrap
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from statemachine import State
from test_definitions import Deploy
from tests_support import Untyped

from fsm import Engine, JobLifecycle, Lifecycle, ManualClock, PipelineLifecycle, reaper, worker
from fsm.diagram import Header, extract, read_header, render, to_dot, to_mermaid
from fsm.diagram.provenance import stamp_svg
from stores import MemoryStore


class Looping(Lifecycle):
    """Transitions that leave the compound ``active`` and come back into it."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    restart = worker(active.to(active, cond="holds_lease"))  # declared on the compound, back to itself
    rewind = reaper(active.to(active.running, cond="lease_stale"), reason="rewound")  # compound -> own child
    retry = worker(active.running.to(active))  # a child to its own compound


ALL = [PipelineLifecycle, JobLifecycle, Deploy, Untyped, Looping]
needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz `dot` is not installed (apt-get install graphviz); CI installs it"
)


def expected_edges(lifecycle: type[Lifecycle]) -> Counter[tuple[str, str, str]]:
    """(event, declared-on state, declared target) of every declared branch, from the table."""
    seen = {(b.order, b.event, b.declared_on, b.declared_target) for b in lifecycle.table.declared}
    return Counter((event, src, dst) for _order, event, src, dst in seen)


# -- a structural Mermaid stateDiagram-v2 reader ------------------------------------------


MERMAID_KEYWORDS = frozenset(
    w.lower()
    for w in (
        "click",
        "href",
        "default",
        "scale",
        "accTitle",
        "accDescr",
        "classDef",
        "class",
        "style",
        "state",
        "note",
    )
)
"""Words Mermaid 11's stateDiagram lexer takes for a keyword where a state id stands (its
rules are case-insensitive): a state id must never be one of them."""


@dataclass
class MermaidDoc:
    states: dict[str, str | None] = field(default_factory=dict)
    """state name -> the compound block it was first named in (None: top level)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Mermaid id -> state name (the same for a state declared bare)."""
    compounds: set[str] = field(default_factory=set)
    initial: dict[str | None, str] = field(default_factory=dict)
    finals: set[str] = field(default_factory=set)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    """(source, target, label) of every labelled transition, by state name."""
    classes: dict[str, set[str]] = field(default_factory=dict)
    class_defs: set[str] = field(default_factory=set)
    notes: list[tuple[str, list[str]]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


ARROW = re.compile(r"^(\[\*\]|\w+) --> (\[\*\]|\w+)(?: : (.+))?$")
ALIASED = re.compile(r'state "([^"]+)" as (\w+)( \{)?')


def parse_mermaid(text: str) -> MermaidDoc:
    """Read an export back, checking what Mermaid needs: every id declared (bare, or as
    ``state "name" as id``) before use, no id a Mermaid keyword, no id standing for two
    states; states, edges, notes and classes are reported by state name."""
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2", "a Mermaid state diagram starts with its type"
    doc = MermaidDoc()
    stack: list[str] = []
    note: tuple[str, list[str]] | None = None
    entered: list[tuple[str, str | None]] = []  # "[*] --> id" may name an id declared just after

    def declare(sid: str, state: str) -> str:
        assert sid.lower() not in MERMAID_KEYWORDS, f"Mermaid reads the id {sid!r} as a keyword"
        assert doc.aliases.setdefault(sid, state) == state, f"id {sid!r} stands for two states"
        return state

    def known(sid: str) -> str:
        assert sid in doc.aliases, f"id {sid!r} used before it is declared"
        return doc.aliases[sid]

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
            state = declare(m[1], m[1])
            name(state)
            doc.compounds.add(state)
            stack.append(state)
        elif m := ALIASED.fullmatch(line):
            state = declare(m[2], m[1])
            name(state)
            if m[3]:
                doc.compounds.add(state)
                stack.append(state)
        elif line == "}":
            assert stack, "a '}' closes no state block"
            stack.pop()
        elif m := re.fullmatch(r"note (?:left|right) of (\w+)", line):
            note = (known(m[1]), [])
        elif m := re.fullmatch(r"classDef (\w+) \S+", line):
            doc.class_defs.add(m[1])
        elif m := re.fullmatch(r"class ([\w,]+) (\w+)", line):
            assert m[2] in doc.class_defs, f"class {m[2]} used before its classDef"
            for sid in m[1].split(","):
                doc.classes.setdefault(m[2], set()).add(known(sid))
        elif m := ARROW.fullmatch(line):
            src, dst, label = m[1], m[2], m[3]
            if src == "[*]":
                entered.append((dst, stack[-1] if stack else None))
            elif dst == "[*]":
                doc.finals.add(known(src))
            else:
                assert label, f"transition without a label: {line}"
                doc.edges.append((known(src), known(dst), label))
        elif re.fullmatch(r"\w+", line):
            name(declare(line, line))
        else:
            pytest.fail(f"unexpected Mermaid line: {raw!r}")
    for sid, block in entered:
        doc.initial[block] = known(sid)
        doc.states.setdefault(known(sid), block)
    assert not stack, f"unclosed state blocks: {stack}"
    assert note is None, "unclosed note"
    return doc


def mermaid_label(label: str) -> tuple[str, tuple[str, ...], str, str]:
    """(event, guards, actor, effects) of a label ``event [g, g] (actor)<br/>effects``."""
    first, _, effects = label.partition("<br/>")
    m = re.fullmatch(r"(\w+)(?: \[([^\]]*)\])? \((worker|reaper|operator override)\)(?:, see note)?", first)
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
    return html.unescape(re.sub(r"<[^>]+>", "", text)).replace("\xa0", " ")  # no-break spaces read as spaces


STATE_EDGE = re.compile(r"^edge_\d+_\w+$")


def state_edges(doc: DotDoc) -> list[tuple[str, str, dict[str, str]]]:
    return [e for e in doc.edges if STATE_EDGE.match(e[2].get("id", ""))]


def dot_edge_key(doc: DotDoc, tail: str, head: str, attrs: dict[str, str]) -> tuple[str, str, str]:
    """(event, drawn-from state, drawn-to state): a clipped end counts as its cluster's state;
    an edge drawn in two halves through a ``__via`` point ends where its second half does."""
    event = plain(attrs["label"]).split()[0]
    src = attrs.get("ltail", "").removeprefix("cluster_") or tail
    if head.startswith("__via"):
        ((_via, head, attrs),) = [e for e in doc.edges if e[0] == head]
    dst = attrs.get("lhead", "").removeprefix("cluster_") or head
    return event, src, dst


def lifecycle_from_source(
    extra: str = "done", *, initial: str = "queued", reason: str = "r", description: str = "d"
) -> type[Lifecycle]:
    """A lifecycle whose names and texts a test picks: its initial state is ``initial``, its
    final one ``extra``; ``reason`` is recorded by ``bail``, ``description`` is guard ``g``'s."""
    source = textwrap.dedent(
        f"""
        from statemachine import State
        from fsm import GuardContext, LeaseChange, Lifecycle, guard, reaper, worker

        class Picked(Lifecycle):
            kind = "picked"
            {initial} = State(initial=True)

            class active(State.Compound):
                running = State(initial=True)
                finalizing = State()

            {extra} = State(final=True)
            start = worker({initial}.to(active), lease=LeaseChange.ACQUIRE)
            finish = worker(active.running.to(active.finalizing, cond="g"))
            close = worker(active.finalizing.to({extra}, cond="holds_lease"))
            bail = reaper(active.to({extra}, cond="lease_stale"), reason={reason!r})

            @guard(description={description!r})
            def g(ctx: GuardContext) -> bool:
                return True
        """
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<picked>", "exec"), namespace)
    lifecycle: type[Lifecycle] = namespace["Picked"]
    return lifecycle


MERMAID_CODE = re.compile(r"#(\w+);")


def mermaid_decode(text: str) -> str:
    """What Mermaid shows for a label: its entity codes (``#35;``, ``#lt;``) decoded, once."""
    return MERMAID_CODE.sub(lambda m: chr(int(m[1])) if m[1].isdigit() else html.unescape(f"&{m[1]};"), text)


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
    assert ("running", "queued", "expire", ("lease_stale", "owned", "attempts_left"), "reaper") in parsed
    assert ("running", "failed", "expire", ("lease_stale", "owned"), "reaper") in parsed
    assert ("running", "failed", "expire", ("lease_stale", "unclaimed"), "reaper") in parsed
    assert ("finalizing", "failed", "expire", ("lease_stale", "owned", "reclaims_exhausted"), "reaper") in parsed
    # a self-loop's label is short (Mermaid sets it over its state's other labels): its
    # guards and effects are spelled out in the legend note
    assert ("finalizing", "finalizing", "reclaim", (), "reaper") in parsed
    (legend,) = [lines for state, lines in doc.notes if state == "queued"]
    assert (
        "finalizing loop: reclaim [lease_stale, owned, reclaims_left] (reaper): reason=reclaimed, acquires lease, "
        "reclaims+1" in legend
    )
    assert ("running", "finalizing", "exited", ("holds_lease",), "worker") in parsed
    effects = {(src, dst, ev): eff for (src, dst, ev, _g, _a), eff in labels.items()}
    assert effects[("queued", "active", "start")] == "acquires lease, attempt+1"


def test_mermaid_reaper_edges_are_told_apart_and_a_legend_note_explains_them() -> None:
    doc = parse_mermaid(to_mermaid(extract(PipelineLifecycle)))
    actors = Counter(mermaid_label(label)[2] for _s, _d, label in doc.edges)
    assert actors == Counter({"worker": 5, "reaper": 3, "operator override": 3})  # cancel x2, resubmit
    (legend,) = [lines for state, lines in doc.notes if state == "queued"]
    assert any("(reaper)" in line for line in legend) and any("(worker)" in line for line in legend)
    assert any("fsm-diagram ref=fsm.lifecycles:PipelineLifecycle format=mermaid" in c for c in doc.comments)
    supersede = [label for _s, _d, label in doc.edges if label.startswith("supersede")]
    assert supersede == ["supersede [superseded] (reaper)<br/>reason=duplicate, steps.status running-#gt;failed"]


def test_mermaid_escapes_text_that_would_break_a_statement() -> None:
    class Odd(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        end = State(final=True)  # a Mermaid keyword as a state id
        start = worker(queued.to(active))
        finish = worker(active.running.to(active.finalizing))
        close = worker(active.finalizing.to(end, cond="holds_lease"))
        expire = reaper(active.to(end, cond="lease_stale"), reason="stale; #1 <x>")

    text = to_mermaid(extract(Odd))
    assert 'state "end" as state_end' in text
    (line,) = [ln for ln in text.splitlines() if ": expire" in ln]
    assert ";" not in MERMAID_CODE.sub("", line)  # every ';' ends an entity code
    assert "<x>" not in line
    assert mermaid_decode(line.partition(" : ")[2]) == "expire [lease_stale] (reaper)<br/>reason=stale; #1 <x>"


@pytest.mark.parametrize(
    "reason",
    ["#1; retry", "#35;", "a;b#c", "#lt; is not <", "C#; & F#", "x #59; y"],
)
def test_mermaid_escapes_each_character_once_so_the_label_reads_as_given(reason: str) -> None:
    """'#' and ';' are coded in one pass: '#1; retry' is shown as '#1; retry', not as
    '#35;1; retry' (which a '#' coded first, then its ';' coded again, gave)."""
    doc = parse_mermaid(to_mermaid(extract(lifecycle_from_source(reason=reason))))
    (label,) = [label for _s, _d, label in doc.edges if label.startswith("bail")]
    assert mermaid_decode(label) == f"bail [lease_stale] (reaper)<br/>reason={reason}"


def test_mermaid_defuses_a_direction_statement_inside_a_label_or_comment() -> None:
    """Mermaid's lexer takes any line holding 'direction TB' (LR, BT, RL) for a direction
    statement, and the edge on that line is silently lost."""
    text = to_mermaid(extract(lifecycle_from_source(reason="turn direction LR", description="set direction TB")))
    assert not re.search(r"direction\s+(TB|BT|RL|LR)", text, re.IGNORECASE)
    doc = parse_mermaid(text)
    (label,) = [label for _s, _d, label in doc.edges if label.startswith("bail")]
    assert mermaid_decode(label) == "bail [lease_stale] (reaper)<br/>reason=turn direction LR"


# every word Mermaid's lexer reads as a keyword, in other cases too; names an escaped id
# used to take (state_end); non-ASCII names
AWKWARD_NAMES = [
    *("scale", "default", "href", "accTitle", "accDescr", "click", "style", "note", "classDef"),
    *("end", "Scale", "DEFAULT", "direction", "hide", "state_end", "state_x", "état", "漢字"),
]


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_mermaid_gives_every_state_name_an_id_mermaid_reads_as_an_id(name: str) -> None:
    lifecycle = lifecycle_from_source(name)
    doc = parse_mermaid(to_mermaid(extract(lifecycle)))
    assert set(doc.states) == set(lifecycle.states_map)
    assert doc.finals == {name}
    assert Counter((mermaid_label(label)[0], s, d) for s, d, label in doc.edges) == expected_edges(lifecycle)


@pytest.mark.parametrize("name", ["scale", "default", "end"])
def test_mermaid_aliases_an_awkward_initial_state_too(name: str) -> None:
    lifecycle = lifecycle_from_source(initial=name)
    doc = parse_mermaid(to_mermaid(extract(lifecycle)))
    assert doc.initial[None] == name and doc.states[name] is None
    assert ("start", name, "active") in {(mermaid_label(label)[0], s, d) for s, d, label in doc.edges}


def test_mermaid_ids_never_merge_two_states() -> None:
    """``end`` is aliased ``state_end``; a state really named ``state_end`` (and names that
    differ only in their non-ASCII letters) must not become the same Mermaid state."""

    class Collide(Lifecycle):
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        end = State(final=True)
        state_end = State(final=True)
        état = State(final=True)  # noqa: PLC2401
        ètat = State(final=True)  # noqa: PLC2401
        start = worker(queued.to(active))
        finish = worker(active.running.to(active.finalizing))
        ok = worker(active.finalizing.to(end, cond="holds_lease"))
        ko = worker(active.running.to(state_end))
        e1 = worker(active.finalizing.to(état, cond="holds_lease"))
        e2 = worker(active.finalizing.to(ètat, cond="holds_lease"))

    text = to_mermaid(extract(Collide))
    doc = parse_mermaid(text)  # fails on an id standing for two states
    assert len(doc.aliases) == len(Collide.states_map)
    assert set(doc.states) == set(Collide.states_map) and doc.finals == {"end", "state_end", "état", "ètat"}
    edges = {(mermaid_label(label)[0], s, d) for s, d, label in doc.edges}
    assert {("ok", "finalizing", "end"), ("ko", "running", "state_end")} <= edges
    assert {("e1", "finalizing", "état"), ("e2", "finalizing", "ètat")} <= edges
    assert text == to_mermaid(extract(Collide))  # deterministic


MERMAID_DIR = os.environ.get("FSM_TEST_MERMAID_DIR")
"""A folder whose node_modules hold ``mermaid`` and ``jsdom`` (npm install mermaid jsdom):
then Mermaid itself parses the exports.  CI without it relies on :func:`parse_mermaid`."""
MERMAID_PARSE = """
import { createRequire } from 'module';
import { pathToFileURL } from 'url';
import fs from 'fs';
const dir = process.env.FSM_TEST_MERMAID_DIR;
const require = createRequire(dir + '/package.json');
const { JSDOM } = require('jsdom');
const dom = new JSDOM('<!DOCTYPE html><body></body>');
globalThis.window = dom.window; globalThis.document = dom.window.document;
globalThis.DOMParser = dom.window.DOMParser;
const entry = dir + '/node_modules/mermaid/dist/mermaid.core.mjs';
const { default: mermaid } = await import(pathToFileURL(entry).href);
mermaid.initialize({ startOnLoad: false });
let bad = 0;
const count = (doc) => doc.reduce((n, s) => n + (s.stmt === 'relation' && s.description ? 1 : 0)
  + (Array.isArray(s.doc) ? count(s.doc) : 0), 0);
for (const f of process.argv.slice(2)) {
  try {
    const d = await mermaid.mermaidAPI.getDiagramFromText(fs.readFileSync(f, 'utf8'));
    const root = d.db.getRootDocV2 ? d.db.getRootDocV2() : null;
    console.log('OK ' + f + ' ' + (root ? count(root.doc) : -1));
  } catch (e) { bad++; console.log('FAIL ' + f + ': ' + String(e.message || e).split('\\n')[0]); }
}
process.exit(bad ? 1 : 0);
"""


@pytest.mark.skipif(not MERMAID_DIR or shutil.which("node") is None, reason="set FSM_TEST_MERMAID_DIR (and node)")
def test_mermaid_itself_parses_every_export_with_every_edge(tmp_path: Path) -> None:
    lifecycles = [*ALL, *(lifecycle_from_source(n) for n in AWKWARD_NAMES)]
    lifecycles += [lifecycle_from_source(initial="scale"), lifecycle_from_source(reason="#1; direction TB")]
    files = []
    for i, lifecycle in enumerate(lifecycles):
        files.append(tmp_path / f"{i}.mmd")
        files[-1].write_text(to_mermaid(extract(lifecycle)))
    script = tmp_path / "parse.mjs"
    script.write_text(MERMAID_PARSE)
    result = subprocess.run(["node", str(script), *map(str, files)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for lifecycle, line in zip(lifecycles, result.stdout.splitlines(), strict=True):
        edges = int(line.rsplit(" ", 1)[1])
        assert edges in (-1, sum(expected_edges(lifecycle).values())), (lifecycle, line)


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
        actor = next(a for a in ("reaper", "operator override", "worker") if first.endswith(f"({a})"))
        assert attrs["style"] == {"reaper": "dashed", "worker": "solid", "operator override": "bold"}[actor]
        assert attrs["class"] == actor.replace(" ", "-")
    dashed_colors = {a["color"] for _t, _h, a in edges if a["style"] == "dashed"}
    solid_colors = {a["color"] for _t, _h, a in edges if a["style"] == "solid"}
    bold_colors = {a["color"] for _t, _h, a in edges if a["style"] == "bold"}
    assert len(dashed_colors) == len(solid_colors) == len(bold_colors) == 1
    assert len(dashed_colors | solid_colors | bold_colors) == 3
    expires = sorted(plain(a["label"]) for _t, _h, a in edges if plain(a["label"]).startswith("expire"))
    assert expires == [
        "expire [lease_stale, owned, attempts_left] (reaper)\nreason=expired, clears lease",
        "expire [lease_stale, owned, reclaims_exhausted] (reaper)\nreason=expired",
        "expire [lease_stale, owned] (reaper)\nreason=expired",
        "expire [lease_stale, unclaimed] (reaper)\nreason=unclaimed",
        "expire [lease_stale, unclaimed] (reaper)\nreason=unclaimed",
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


def test_dot_draws_an_edge_leaving_and_reentering_a_compound_through_a_point_outside_it() -> None:
    """``active -> active``, ``active -> active.running`` and ``running -> active``: Graphviz
    cannot clip an edge at a cluster its other end is inside ("head is inside tail
    cluster"); each is drawn in two halves through a point beside the cluster."""
    doc = parse_dot(to_dot(extract(Looping)))
    inside = {n: doc.node_cluster.get(n) for n in doc.nodes}
    for tail, head, attrs in doc.edges:
        assert attrs.get("ltail") is None or inside.get(head) != attrs["ltail"], (tail, head, attrs)
        assert attrs.get("lhead") is None or inside.get(tail) != attrs["lhead"], (tail, head, attrs)
    keys = {dot_edge_key(doc, *edge) for edge in state_edges(doc)}
    loops = {("restart", "active", "active"), ("rewind", "active", "running"), ("retry", "running", "active")}
    assert loops <= keys
    vias = sorted(n for n in doc.nodes if n.startswith("__via"))
    assert len(vias) == 3 and all(inside[v] is None and doc.nodes[v]["style"] == "invis" for v in vias)
    halves = [a for _t, _h, a in doc.edges if re.fullmatch(r"edge_\d+_rewind(-in)?", a.get("id", ""))]
    assert [a["style"] for a in halves] == ["dashed", "dashed"]  # a reaper edge stays dashed on both halves


def test_dot_and_svg_text_hold_no_character_xml_refuses() -> None:
    """Control characters (NUL included), U+FFFE/U+FFFF and lone surrogates in a guard's
    description, a reason, an entity id or a stored history reason are drawn as U+FFFD:
    Graphviz copies label text into SVG as is, and the SVG (or the PNG) then failed."""
    nasty = "a\x00b\x01c\x1f\ufffe\uffffd\ud800"
    storable = "a\x02b\x01c\x1f\ufffe\uffffd\x7f"  # every store refuses NUL and lone surrogates (I10)
    lifecycle = lifecycle_from_source(reason=nasty, description=nasty)
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(lifecycle, store, clock=clock)
    entity = f"e{storable}"
    engine.create(entity)
    engine.fire(entity, "start", reason=storable)
    diagram = extract(lifecycle, store=store, entity_id=entity)
    for text in (to_dot(diagram), to_dot(extract(lifecycle)), to_mermaid(diagram)):
        assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]", text)
        assert "\ufffd" in text
        text.encode("utf-8")  # no lone surrogate left
    legend = plain(parse_dot(to_dot(diagram)).nodes["__legend"]["label"])
    assert "a\ufffdb\ufffdc\ufffd\ufffd\ufffdd\ufffd" in legend
    if shutil.which("dot") is not None:
        ET.fromstring(render(diagram, "svg"))
        assert render(diagram, "png").startswith(b"\x89PNG")


@pytest.mark.parametrize("entity", ["deploy--prod", "x-", "-", "a --> b", "<!-- c -->", "é--\n"])
def test_the_svg_provenance_comment_is_valid_xml_whatever_the_entity_id(entity: str) -> None:
    """The header is an XML comment in an SVG, where ``--`` is not allowed."""
    header = Header("fsm.lifecycles:JobLifecycle", "svg", dot_sha256="ab" * 32, entity=entity)
    assert "--" not in header.line and "\n" not in header.line
    svg = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><g id="x"/></svg>\n'
    stamped = stamp_svg(svg, header)
    ET.fromstring(stamped)  # well-formed
    assert read_header(stamped) == header
    # headers written before '-' was encoded still read the same
    assert Header.parse("fsm-diagram ref=a:B format=svg entity=deploy--prod") == Header(
        "a:B", "svg", None, "deploy--prod"
    )


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
