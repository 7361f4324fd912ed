"""``fsm reaper``: run the reaper against a store from the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from fsm.commands import count
from fsm.diagram.refs import load_lifecycle, load_lifecycle_here
from fsm.errors import FsmError
from fsm.lifecycles import JobLifecycle, PipelineLifecycle
from fsm.reaping.config import DEFAULT_BATCH_SIZE, DEFAULT_INTERVAL, ReapResult
from fsm.reaping.service import Reaper, validated_config
from fsm.reaping.ticklog import TickLog

log = logging.getLogger("fsm.reaper")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "reaper",
        help="fail or reclaim entities whose holder is gone",
        description="Run the reaper: expire what is dead, never what is alive.",
    )
    parser.add_argument("--db", default="sqlite:///fsm.db", help="store URL (default: %(default)s)")
    parser.add_argument("--prefix", default="fsm_", help="table prefix of a SQL store (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="run one tick and exit")
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL.total_seconds(), help="seconds between ticks (default 300)"
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="candidates per page")
    parser.add_argument("--dry-run", action="store_true", help="print what a tick would move; move nothing")
    parser.add_argument(
        "--list",
        type=count,
        default=DEFAULT_LIST,
        metavar="N",
        dest="list_limit",
        help=f"in a dry run, list at most N entities per tick, then count the rest (default {DEFAULT_LIST})",
    )
    parser.add_argument("--leader", action="store_true", help="tick only while holding the leader lease")
    parser.add_argument(
        "--no-tick-log",
        dest="tick_log",
        action="store_false",
        help="do not record each tick's summary in the store (what fsm inspect shows as the reaper's ticks)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on PORT (needs the otel extra; 0 picks a free port)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics endpoint binds (default: %(default)s)",
    )
    parser.add_argument(
        "--lifecycle",
        action="append",
        metavar="MODULE:Class",
        help="lifecycle to reap (repeatable; default: the built-in pipeline and job)",
    )
    parser.set_defaults(func=run)


DEFAULT_LIST = 20
"""Dry-run entities listed per tick; the rest are counted (a big table lists thousands)."""


def _print_tick(tick: int, result: ReapResult, list_limit: int) -> None:
    """One summary line per tick (``tick 3 at 12:00:05Z: moved ...``), after a dry run's
    listing of at most ``list_limit`` entities."""
    shown = result.would_move[: max(list_limit, 0)]
    for kind, entity_id, event, target in shown:
        print(f"would {event} {kind} {entity_id} -> {target}", flush=True)
    if len(result.would_move) > len(shown):
        print(f"... and {len(result.would_move) - len(shown)} more (--list N shows more)", flush=True)
    at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    print(f"tick {tick} at {at}: {result.summary()}", file=sys.stderr if result.errors else sys.stdout, flush=True)


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 ticks ran; 1 ``--once`` and the tick failed (see the log); 2 bad settings
    or a store that cannot be opened (it is opened without creating anything: tables come
    from ``fsm migrate upgrade``, a deploy step)."""
    from fsm.commands import ReadOnlyStoreError, open_readonly
    from stores import safe_url

    try:
        lifecycles = (
            [load_lifecycle_here(s) for s in args.lifecycle] if args.lifecycle else [PipelineLifecycle, JobLifecycle]
        )
        config = validated_config(  # seconds as given: NaN, inf or a century+ is a ConfigError, not a crash
            {"interval": args.interval, "batch_size": args.batch_size, "leader": args.leader}
        )
        store = open_readonly(args.db, args.prefix, "fsm reaper")
        reaper = Reaper(store, lifecycles, config)
        tick_log = TickLog(store) if getattr(args, "tick_log", True) else None
        metrics = _serve_metrics(args)
    except (FsmError, ReadOnlyStoreError, ValueError) as err:  # ValueError: a setting refused below the config
        print(f"fsm reaper: error: {err}", file=sys.stderr)
        return 2
    kinds = ", ".join(lc.kind for lc in lifecycles)
    mode = "dry run" if args.dry_run else "live"
    print(f"reaper {reaper.owner} on {safe_url(args.db)} for {kinds} ({mode})", flush=True)
    if metrics is not None:
        print(f"metrics on {metrics.url}", flush=True)
    ticks = 0
    try:
        if args.once:
            result = reaper.run_once(dry_run=args.dry_run)
            if tick_log is not None:
                tick_log.record(result, reaper.owner)
            _print_tick(1, result, args.list_limit)
            return 1 if result.errors else 0
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop.is_set():
            ticks += 1
            result = reaper.run_once(dry_run=args.dry_run)
            if tick_log is not None:
                tick_log.record(result, reaper.owner)
            _print_tick(ticks, result, args.list_limit)
            stop.wait(reaper.sleep_for())  # the interval, or sooner when a timer falls due
        print("reaper stopped", flush=True)
        return 0
    finally:
        reaper.stop()  # resigns the leader lease, so another reaper leads at its next tick
        if metrics is not None:
            metrics.close()


def _serve_metrics(args: argparse.Namespace) -> Any:
    """The Prometheus endpoint asked for with ``--metrics-port``, or None."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return None
    from fsm.observe import serve_metrics

    return serve_metrics(port, getattr(args, "metrics_host", "127.0.0.1"))


__all__ = ["load_lifecycle", "register", "run"]
