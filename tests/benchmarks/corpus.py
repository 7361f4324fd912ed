"""On demand: which of python-statemachine's own charts the compiled table runs, refuses, or
gets wrong.

    python tests/benchmarks/corpus.py PATH_TO_A_PYTHON_STATEMACHINE_CHECKOUT [--sequences 40]

The charts are every StateChart/StateMachine class created while running the checkout's
documentation examples (each ``py``/``python`` block of ``docs/**/*.md``, doctest prompts
stripped, a page's blocks in one namespace), its test modules and examples (module level
only: a chart built inside a test function is not seen), and every SCXML, JSON and YAML
chart file under ``tests/`` (loaded with ``statemachine.io.load``).

Each chart is judged with ``allow_event_without_transition = False`` (a StateChart's default
ignores an event without a transition, which the engine refuses, writing nothing: the same
configuration) and ``catch_errors_as_events = False`` (errors come from callbacks, which
are refused), the way a Lifecycle is at class creation (:mod:`fsm.unsupported`,
:func:`fsm.table.compile_table`, :func:`fsm.chains.check_chains`), its guard names answered
by stubs.  A chart it accepts is then run side by side with python-statemachine on random
event sequences (each with one set of guard answers, python-statemachine's guard methods
replaced by the same answers): the same decision and the same configuration after every
step.  A sequence that enters a history state before its compound was ever left, with no
default transition, ends there: python-statemachine enters no state at all (SCXML requires
the default), the engine the compound's initial state.  Prints one line per category and
the totals; ``--list`` prints every chart.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import random
import re
import sys
import textwrap
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from statemachine.exceptions import TransitionNotAllowed as SmNotAllowed
from statemachine.factory import StateMachineMetaclass
from statemachine.spec_parser import replace_operators

from fsm.chains import check_chains
from fsm.errors import InvalidDefinition
from fsm.guards import BUILTIN_GUARDS, Guard, Invalid
from fsm.history import check_history
from fsm.lifecycle import Lifecycle
from fsm.regions import check_parallel, region_states
from fsm.table import compile_table
from fsm.testing.agreement import _chosen, advance, created
from fsm.unsupported import refuse_unsupported

SEEN: list[tuple[str, Any]] = []
_WHERE = ["?"]


def _record() -> None:
    original = StateMachineMetaclass.__init__

    def init(cls: Any, name: str, bases: Any, attrs: Any) -> None:
        original(cls, name, bases, attrs)
        if getattr(cls, "states", None) and not issubclass(cls, Lifecycle):
            SEEN.append((f"{_WHERE[0]}::{name}", cls))

    StateMachineMetaclass.__init__ = init  # type: ignore[method-assign]


def _doc_code(text: str) -> list[str]:
    blocks = []
    for m in re.finditer(r"^```(?:py|python)[^\n]*\n(.*?)^```", text, re.S | re.M):
        body = m.group(1)
        if ">>>" in body:
            lines = []
            for line in body.splitlines():
                stripped = line.lstrip()
                if stripped.startswith(">>> ") or stripped == ">>>" or stripped.startswith("... ") or stripped == "...":
                    lines.append(stripped[4:])
            body = "\n".join(lines)
        blocks.append(textwrap.dedent(body))
    return blocks


def _run_quietly(code: str, namespace: dict[str, Any]) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(compile(code, _WHERE[0], "exec"), namespace)


def collect(repo: Path) -> None:
    _record()
    sys.path.insert(0, str(repo / "tests"))
    sys.path.insert(0, str(repo))
    for page in sorted((repo / "docs").rglob("*.md")):
        if "releases" in page.parts:
            continue
        _WHERE[0] = str(page.relative_to(repo))
        namespace: dict[str, Any] = {"__name__": f"doc_{page.stem}"}
        for block in _doc_code(page.read_text(encoding="utf-8")):
            # an example that needs what this harness lacks: the charts it made still count
            with contextlib.suppress(BaseException):
                _run_quietly(block, namespace)
    for module in sorted((repo / "tests").rglob("*.py")):
        _WHERE[0] = str(module.relative_to(repo))
        with contextlib.suppress(BaseException):
            _run_quietly(module.read_text(encoding="utf-8"), {"__name__": f"t_{module.stem}", "__file__": str(module)})
    from statemachine.io import load

    for chart in sorted((repo / "tests").rglob("*")):
        if chart.suffix not in (".scxml", ".json", ".yaml", ".yml") or not chart.is_file():
            continue
        _WHERE[0] = str(chart.relative_to(repo))
        before = len(SEEN)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                loaded = load(str(chart))
        except BaseException:
            continue
        if len(SEEN) == before and getattr(loaded, "states", None):
            SEEN.append((f"{_WHERE[0]}::{loaded.__name__}", loaded))


def _guard_names(cls: Any) -> tuple[set[str], set[str]]:
    conds: set[str] = set()
    validators: set[str] = set()
    for state in cls.states_map.values():
        for t in state.transitions:
            for spec in t.cond:
                if isinstance(spec.func, str):
                    with contextlib.suppress(SyntaxError):
                        tree = ast.parse(replace_operators(spec.func), mode="eval")
                        conds |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in ("In", "in")}
            for spec in t.validators:
                if isinstance(spec.func, str):
                    validators.add(spec.func)
    return conds - set(BUILTIN_GUARDS), validators


def _bucket(message: str) -> str:
    for key, words in (
        ("callbacks (refused by design)", ("callback", "listeners=")),
        ("parallel states", ("parallel state", "inside a region", "leaves region")),
        ("In(...) naming another region's state", ("names no state",)),
        ("history states", ("history state",)),
        ("error routing / catch_errors_as_events", ("catch_errors_as_events",)),
        ("allow_event_without_transition", ("allow_event_without_transition",)),
        ("guard is a function, not a name", ("guards must be named",)),
        ("guard expression operator", ("guard expression",)),
        ("chain from the initial state", ("the initial state",)),
        ("multi-target transition", ("exactly one target",)),
        ("event named like a framework attribute or guard", ("would replace the framework", "has the name of guard")),
        ("delay", ("delay=",)),
        ("shared state values", ("share the value",)),
        ("validator", ("validator",)),
    ):
        if any(w in message for w in words):
            return f"refused: {key}"
    return "refused: other (" + message.split(": ", 1)[-1][:70] + ")"


def judge(name: str, cls: Any, sequences: int, rng: random.Random) -> tuple[str, str]:
    # a StateChart ignores an event without a transition by default; the engine refuses it
    # (and writes nothing): the same configuration either way, so the chart is judged with
    # python-statemachine refusing it too
    cls.allow_event_without_transition = False
    # likewise error routing: without callbacks (refused) nothing raises inside a transition
    cls.catch_errors_as_events = False
    conds, validators = _guard_names(cls)
    guards: dict[str, Guard] = dict(BUILTIN_GUARDS)
    guards |= {n: Guard(n, lambda ctx: False) for n in conds}
    guards |= {n: Guard(n, lambda ctx: True, validates=True) for n in validators}
    try:
        refuse_unsupported(name, cls, guards, Lifecycle)
        check_parallel(name, cls.states_map.values())
        table = compile_table(name, cls.states_map.values(), guards)
        check_chains(name, table)
        check_history(name, table)
        regions: dict[str, Any] = {}
        for parallel in table.parallel:
            state = next(s for s in cls.states_map.values() if s.id == parallel)
            for region in state.states:
                made = compile_table(f"{name}.{region.id}", region_states(region), guards)
                check_chains(f"{name}.{region.id}", made)
                if made.initial in made.chain_heads:
                    raise InvalidDefinition(f"{name}: region {region.id!r} starts in a state that takes steps")
                regions[region.id] = made
    except InvalidDefinition as err:
        return _bucket(str(err)), str(err)
    except Exception as err:  # the harness's stub cannot stand in: say so
        return "not judged (harness)", f"{type(err).__name__}: {err}"
    return _agree(cls, table, conds | validators, validators, sequences, rng, regions)


def _agree(
    cls: Any,
    table: Any,
    names: set[str],
    validators: set[str],
    sequences: int,
    rng: random.Random,
    regions: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Side by side on random sequences; a chart with a parallel state is run as the engine
    stores it (:mod:`fsm.regions`): the entity's leaf, a leaf per region while inside, a
    region's event taken by its region, the join once every region is final."""
    regions = regions or {}
    owner = {e: r for r, t in regions.items() for e in t.events}
    values: dict[str, bool] = {}

    def answer(name: str) -> Any:
        if name in validators:

            def validate(*_a: Any, **_k: Any) -> None:
                if not values.get(name, False):
                    raise Invalid(name, ValueError(name))

            return validate
        return lambda *_a, **_k: values.get(name, False)

    for name in names:
        with contextlib.suppress(Exception):
            setattr(cls, name, answer(name))
    undefined = 0
    joins = {b.event for b in table.declared if b.source in table.parallel}
    events = [e for e in (*table.events, *owner) if e not in joins]
    sent = [*events, *(f"{e}.x" for e in events if e.isidentifier())]

    def configuration(leaf: str, inside: dict[str, str]) -> set[str]:
        found = set(table.configurations[leaf])
        for region, rleaf in inside.items():
            found |= {region, *regions[region].configurations[rleaf]}
        return found

    def enter(leaf: str) -> dict[str, str]:
        return {r: created(regions[r], values)[0] for r in table.parallel.get(leaf, ())}

    def join(leaf: str, memory: dict[str, str], inside: dict[str, str]) -> tuple[str, dict[str, str], dict[str, str]]:
        while leaf in table.parallel and all(inside[r] in regions[r].finals for r in table.parallel[leaf]):
            event = f"done.state.{leaf}"
            branch = _chosen(table.branches_for(leaf, event), values)
            if branch is None:
                break
            leaf, memory = advance(table, event, leaf, memory, branch, values)
            inside = enter(leaf)
        return leaf, memory, inside

    for _ in range(sequences):
        values.clear()
        values.update({n: rng.random() < 0.6 for n in names})
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                reference = cls()
        except Exception as err:
            return "not judged (python-statemachine needs arguments)", f"{type(err).__name__}: {err}"
        leaf, memory = created(table, values)
        inside = enter(leaf)
        if {s.id for s in reference.configuration} != configuration(leaf, inside):
            return "DISAGREES", f"starts in {sorted(s.id for s in reference.configuration)}, the table in {leaf}"
        for _step in range(8 if not regions else 16):
            if not sent:
                break
            event = rng.choice(sent)
            region = next((r for r, t in regions.items() if t.knows(event)), None) if regions else None
            if region is not None:
                rleaf = inside.get(region)
                rtable = regions[region]
                branch = None if rleaf is None else _chosen(rtable.branches_for(rleaf, event), values)
            else:
                branch = _chosen(table.branches_for(leaf, event), values)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    reference.send(event)
                accepted = True
            except (SmNotAllowed, Invalid):
                accepted = False
            except Exception as err:
                return "not judged (python-statemachine raised)", f"{event}: {type(err).__name__}: {err}"
            if accepted != (branch is not None):
                return "DISAGREES", f"{event!r} from {leaf!r}: python-statemachine accepted={accepted}, table {branch}"
            if branch is not None and region is not None:
                assert rleaf is not None
                inside[region], _ = advance(rtable, event, rleaf, {}, branch, values)
                leaf, memory, inside = join(leaf, memory, inside)
            elif branch is not None:
                if not reference.configuration and branch.restores is not None and branch.restores not in memory:
                    undefined += 1  # a history state with no memory and no default: see the module
                    break
                leaf, memory = advance(table, event, leaf, memory, branch, values)
                inside = enter(leaf)
                leaf, memory, inside = join(leaf, memory, inside)
            active = {s.id for s in reference.configuration}
            if active != configuration(leaf, inside):
                return "DISAGREES", f"after {event!r}: python-statemachine in {sorted(active)}, the table in {leaf}"
            if leaf in table.finals:
                break
    if undefined:
        return "runs and agrees", f"{undefined} sequences ended where python-statemachine enters no state"
    return "runs and agrees", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--sequences", type=int, default=40)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    cwd = os.getcwd()
    collect(args.repo.resolve())
    os.chdir(cwd)
    rng = random.Random(0)
    seen: dict[int, str] = {}
    verdicts: Counter[str] = Counter()
    lines = []
    for name, cls in SEEN:
        if id(cls) in seen:
            continue
        seen[id(cls)] = name
        try:
            verdict, detail = judge(name, cls, args.sequences, rng)
        except Exception:
            verdict, detail = "not judged (harness)", traceback.format_exc(limit=1).splitlines()[-1]
        verdicts[verdict] += 1
        lines.append(f"{verdict:<55} {name}  {detail[:160]}")
    if args.list:
        print("\n".join(sorted(lines)))
    total = sum(verdicts.values())
    print(f"python-statemachine charts seen: {total}")
    for verdict, n in verdicts.most_common():
        print(f"  {n:>4}  {verdict}")


if __name__ == "__main__":
    main()
