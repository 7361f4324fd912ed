"""``fsm demo``: the whole story, with real processes, on the embedded default store.

1. seeds/000, on simulated time: zombie pipelines expired, a duplicate superseded;
2. seeds/002, with real worker processes and a reaper ticking every fraction of a second:
   a live finalizer whose gates outlast its TTL many times over is never touched; a
   finalizer SIGKILLed after its second gate is reclaimed, claimed by a standby worker and
   completed once, gates 1-2 replayed from the ledger; a finalizer SIGSTOPped past its
   TTL is reclaimed and, once SIGCONTed, every write it tries is refused.

It ends with a report (what moved, why, how fast; each gate's executions and recorded
results; the invariants checked), writes the lifecycle diagrams with each job's final
state highlighted and a timeline picture of each job, and exits 1 if an invariant broke
(2 if the store cannot be used).  The demo's tables (``fsm_demo_*``) are reset at each run;
an application's tables in the same database are never touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from fsm.clock import ManualClock, SystemClock
from fsm.demo.checks import Finding, broken, check_history, check_story
from fsm.demo.pipelines import DEMO_PREFIX, open_simulated, pipelines_demo
from fsm.demo.proc import GATES
from fsm.demo.scenario import FULL, QUICK, SCENARIOS, JobStory, ScenarioStuck, Stage, Timing, moved_counts
from fsm.demo.timeline import timeline_svg
from fsm.errors import FsmError
from fsm.lifecycle import Lifecycle
from fsm.lifecycles import JobLifecycle, PipelineLifecycle
from stores.base import Store
from stores.factory import DEFAULT_URL, safe_url

QUICK_ENV = "FSM_DEMO_QUICK"
DEFAULT_OUT = "fsm-demo"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="the story the library grew from, with real processes: zombies, slow, killed and paused finalizers",
        description=(
            "The main job: zombie pipelines, then finalizer processes that are slow, killed (SIGKILL) and "
            "paused (SIGSTOP), with a reaper ticking all along; ends with a report, a lifecycle diagram and a "
            "timeline per job.  Exit 1 if an invariant broke, 2 if the store cannot be used."
        ),
    )
    parser.add_argument("--db", default=DEFAULT_URL, help="SQLite or PostgreSQL URL (default: %(default)s)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="where to write the pictures (default: ./%(default)s/)")
    parser.add_argument(
        "--quick", action="store_true", help=f"shorter TTL and gates (as the test suite runs it; or {QUICK_ENV}=1)"
    )
    parser.set_defaults(func=run)


class Progress:
    """A status line rewritten in place on a terminal; occasional plain lines otherwise."""

    def __init__(self, stream: TextIO, *, every: float = 2.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._shown = False
        self._last = 0.0

    def update(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._last < 0.1:
                return
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[K" + text[:width])
            self._shown = True
        else:
            if now - self._last < self.every:
                return
            self.stream.write(f"  ... {text}\n")
        self._last = now
        self.stream.flush()

    def say(self, text: str = "") -> None:
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = False


SIMULATED = timedelta(minutes=61)
"""How far the zombie pipelines' clock is moved on (their reaper runs at +61 min)."""


def run(args: argparse.Namespace) -> int:
    if not args.verbose:  # the narrative says what moved; -v shows the services' own log lines
        for name in ("fsm.reaper", "fsm.worker", "fsm.keeper"):
            logging.getLogger(name).setLevel(logging.WARNING)
    out = Progress(sys.stdout)
    quick = args.quick or os.environ.get(QUICK_ENV) == "1"
    timing = QUICK if quick else FULL
    if args.db == "memory://":
        error("the demo runs worker processes, which need a shared store: give a SQLite file or a "
              "PostgreSQL URL (the default is sqlite:///fsm.db)")  # fmt: skip
        return 2
    # the zombie pipelines' simulated hour ends now, not an hour ahead: the store's times
    # (and fsm inspect's "updated 3m ago") stay true
    clock = ManualClock(SystemClock().now() - SIMULATED)
    try:
        store = open_simulated(args.db, clock)
    except FsmError as err:  # a bad URL, a missing driver, an unreachable database
        error(str(err))
        return 2
    run_id = secrets.token_hex(3)
    directory = Path(args.out)
    work = directory / f"run-{run_id}"
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        error(f"cannot write to {directory}: {err}")
        store.close()  # type: ignore[attr-defined]
        return 2
    try:
        store = reset_demo_tables(store, args.db, clock)
    except FsmError as err:
        error(str(err))
        return 2
    started = time.monotonic()
    try:
        pipes = pipelines_demo(store, clock, run_id)
        out.say()
        out.say(f"== a live finalizer: worker processes (TTL {timing.ttl:g} s, reaper every {timing.interval:g} s) ==")
        stories: list[JobStory] = []
        with Stage(args.db, DEMO_PREFIX, work, timing, run_id=run_id, progress=out.update, say=out.say) as stage:
            stage.prepare(list(SCENARIOS))
            for name, scenario in SCENARIOS.items():
                out.say(f"-- {name}: {DESCRIPTIONS[name].format(t=timing)}")
                stories.append(scenario(stage))
                out.clear()
            ticks = list(stage.ticks)
            findings = [f for s in stories for f in check_story(s, timing)]
            findings += entity_findings(stage.store, [s.job_id for s in stories], JobLifecycle.table.finals)
        findings += entity_findings(store, pipes, PipelineLifecycle.table.finals)
        written = write_pictures(directory, store, stories, pipes[0], args.db)
    except ScenarioStuck as err:
        out.clear()
        failed(str(err))
        return 1
    except FsmError as err:
        out.clear()
        failed(f"{type(err).__name__}: {err}")
        return 1
    except OSError as err:  # the pictures or the event logs could not be written
        out.clear()
        failed(str(err))
        return 1
    except KeyboardInterrupt:  # the stage has stopped its processes on the way out
        out.clear()
        print("fsm demo: interrupted; its worker processes were stopped", file=sys.stderr)
        return 130
    finally:
        out.clear()
        close = getattr(store, "close", None)
        if close is not None:
            close()
    for line in report(stories, ticks, findings, timing, time.monotonic() - started):
        out.say(line)
    out.say(f"files written to {directory}/:")
    for path in written:
        out.say(f"  {path.name}")
    out.say(f"  (event logs of the processes: {work.name}/; store: {safe_url(args.db)}, tables {DEMO_PREFIX}*)")
    # the next commands a new user types read the demo's tables only with their prefix
    db = "" if args.db == DEFAULT_URL else f" --db {safe_url(args.db)}"
    out.say(f"look closer (the demo's tables need --prefix {DEMO_PREFIX}):")
    if stories:
        out.say(f"  fsm show {stories[0].job_id}{db} --prefix {DEMO_PREFIX}")
    out.say(f"  fsm reaper --once --dry-run{db} --prefix {DEMO_PREFIX}")
    out.say(f"  fsm inspect --db {safe_url(args.db)} --prefix {DEMO_PREFIX}")
    return 1 if broken(findings) else 0


def error(text: str) -> None:
    """The demo cannot run (exit 2): one line on stderr, as every command prints its errors."""
    print(f"fsm demo: error: {text}", file=sys.stderr)


def failed(text: str) -> None:
    """The demo ran and failed (exit 1)."""
    print(f"fsm demo: failed: {text}", file=sys.stderr)


DESCRIPTIONS = {
    "slow": "a live finalizer whose 4 gates take {t.slow_gate:g} s each, against a {t.ttl:g} s TTL",
    "killed": "a finalizer killed with SIGKILL once its second gate is recorded",
    "paused": "a finalizer paused with SIGSTOP inside gate 2, past its TTL, then resumed",
}


def reset_demo_tables(store: Store, url: str, clock: ManualClock) -> Store:
    """The demo's own tables, emptied: each run starts clean, and an entity left behind by
    an interrupted run can never be claimed by this run's workers."""
    from stores.sql import SqlStore
    from stores.sql.migrate import drop_schema

    if not isinstance(store, SqlStore):
        return store
    drop_schema(store.engine, table_prefix=DEMO_PREFIX)
    store.close()
    return open_simulated(url, clock)


def entity_findings(store: Store, ids: list[str], finals: frozenset[str] | set[str]) -> list[Finding]:
    found: list[Finding] = []
    for entity_id in ids:
        snap = store.get(entity_id)
        found += check_history(entity_id, store.history(entity_id), snap.version, finals)
    return found


def write_pictures(directory: Path, store: Store, stories: list[JobStory], zombie: str, url: str) -> list[Path]:
    """A timeline per job, and the lifecycle diagram with each job's (and the zombie
    pipeline's) final state highlighted: SVG through Graphviz, Mermaid when it is missing."""
    from fsm.diagram import GraphvizNotFound, extract, render, to_mermaid

    written: list[Path] = []
    for story in stories:
        path = directory / f"timeline-{story.name}.svg"
        path.write_text(timeline_svg(story), encoding="utf-8")
        written.append(path)
    # the reader's store (real time): the jobs' rows are the same in either store
    subjects: list[tuple[type[Lifecycle], str, str]] = [
        (JobLifecycle, s.job_id, f"lifecycle-job-{s.name}") for s in stories
    ]
    subjects.append((PipelineLifecycle, zombie, "lifecycle-pipeline-zombie"))
    for lifecycle, entity_id, stem in subjects:
        diagram = extract(lifecycle, store=store, entity_id=entity_id)
        try:
            data, suffix = render(diagram, "svg"), ".svg"
        except GraphvizNotFound:
            data, suffix = to_mermaid(diagram).encode("utf-8"), ".mmd"
        path = directory / f"{stem}{suffix}"
        path.write_bytes(data)
        written.append(path)
    return written


def report(
    stories: list[JobStory],
    ticks: list[tuple[float, dict[str, int]]],
    findings: list[Finding],
    timing: Timing,
    took: float,
) -> list[str]:
    """The closing report; ``tests/test_cli.py`` parses its figures."""
    lines = ["", "== report =="]
    lines.append("what moved, why, how fast:")
    for s in stories:
        lines.append(f"  {s.job_id}: {s.state}; history {' -> '.join(r.event for r in s.history)}")
        done = next((r.at.timestamp() for r in s.history if r.event == "complete"), None)
        took_job = f"{done - s.t0:.1f} s" if done is not None else "never"
        if s.fenced_token is None:
            lines.append(
                f"    completed by its own finalizer after {took_job}; the reaper ticked {len(s.ticks)} times "
                f"meanwhile and moved it {sum(1 for r in s.history if r.actor == 'reaper')} times"
            )
            continue
        (signal_t, sig, who) = s.marks[0]
        reclaim = s.rows("reclaim")[0].at.timestamp() if s.rows("reclaim") else None
        lapse = s.lapse
        claims = [e for e in s.of("claimed") if reclaim is not None and e["t"] >= reclaim]
        parts = [f"{sig} to {who} at {signal_t - s.t0:.1f} s"]
        if reclaim is not None and lapse is not None:
            parts.append(
                f"lease lapsed {max(lapse - signal_t, 0):.2f} s later, reclaimed by the reaper "
                f"{max(reclaim - lapse, 0):.2f} s after that (why: lease_stale)"
            )
        if claims and reclaim is not None:
            parts.append(f"claimed by {claims[0]['who']} {claims[0]['t'] - reclaim:.2f} s after the reclaim")
        parts.append(f"completed after {took_job}")
        lines.append("    " + "; ".join(parts))
    lines.append("gates (executions/recorded results):")
    for s in stories:
        cells = "  ".join(f"{g} {s.executed(g)}/{s.recorded(g)}" for g in GATES)
        extra = f"  (in flight at {s.marks[0][1]}: {', '.join(s.in_flight) or 'none'})" if s.marks else ""
        lines.append(f"  {s.name:<7} {cells}{extra}")
    for s in stories:
        refused = s.of("refused")
        if s.name == "paused" or refused:
            whats = ", ".join(str(e.get("what")) for e in refused)
            lines.append(f"late writes of {s.name}: refused {len(refused)} ({whats}), accepted {len(s.of('accepted'))}")
    moved = moved_counts(ticks)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(moved.items())) or "nothing"
    lines.append(f"reaper: {len(ticks)} ticks, moved {shown}")
    verdicts: dict[str, bool] = {}
    for f in findings:
        verdicts[f.invariant] = verdicts.get(f.invariant, True) and f.ok
    lines.append(
        "invariants: "
        + ", ".join(f"{k} {'ok' if ok else 'BROKEN'}" for k, ok in sorted(verdicts.items()))
        + f" ({len(findings)} checks)"
    )
    lines += [f"  {f}" for f in broken(findings)]
    lines.append(f"took {took:.1f} s")
    return lines


__all__ = ["DEFAULT_OUT", "QUICK_ENV", "Progress", "register", "report", "run"]
