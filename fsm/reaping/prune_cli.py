"""``fsm prune``: remove finished entities older than a retention, with what they own.

``fsm prune --older-than 30d [--dry-run]`` removes, for each lifecycle (the built-in
pipeline and job by default), the entities in a final state last updated longer ago than
the retention, with their history, effects and renewal logs (:meth:`fsm.Engine.prune`),
in batches, and prints what it removed.  Entities in any other state are never touched: the
final states come from each lifecycle's table (there is no option to name states).
A dry run prints what would go and changes nothing.  Nothing is ever removed unless pruned.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import timedelta
from typing import Any

from fsm.diagram.refs import load_lifecycle
from fsm.engine import Engine
from fsm.engine.retention import DEFAULT_PRUNE_BATCH, PruneResult, prune_all
from fsm.errors import FsmError
from fsm.lifecycles import JobLifecycle, PipelineLifecycle
from stores.retention import MAX_PRUNE_BATCH

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.ASCII)
DEFAULT_LIST = 50


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or seconds, as a positive timedelta."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 30d, 12h, 90m, 3600)")
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    try:
        age = timedelta(seconds=seconds)
    except OverflowError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from err
    if age <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r}: the retention must be positive")
    return age


def count(text: str) -> int:
    """``--list``: 0 or more."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: list 0 or more ids")
    return value


def batch(text: str) -> int:
    """``--batch-size``: 1 to MAX_PRUNE_BATCH."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from err
    if not 1 <= value <= MAX_PRUNE_BATCH:
        raise argparse.ArgumentTypeError(f"{text!r}: a batch is 1 to {MAX_PRUNE_BATCH} entities")
    return value


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "prune",
        help="remove finished entities older than a retention, with their history and effects",
        description=(
            "Remove entities in a final state last updated longer ago than --older-than, with their "
            "history, effects and renewal logs, in batches. Never touches an entity in another state."
        ),
    )
    parser.add_argument("--db", default="sqlite:///fsm.db", help="store URL (default: %(default)s)")
    parser.add_argument("--prefix", default="fsm_", help="table prefix of a SQL store (default: %(default)s)")
    parser.add_argument(
        "--older-than", type=duration, required=True, metavar="AGE", help="retention: 30d, 12h, 90m, 2w, or seconds"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    parser.add_argument(
        "--batch-size", type=batch, default=DEFAULT_PRUNE_BATCH, help="entities per transaction (default %(default)s)"
    )
    parser.add_argument(
        "--list",
        type=count,
        default=DEFAULT_LIST,
        metavar="N",
        dest="list_limit",
        help=f"list at most N ids per lifecycle, then count the rest (default {DEFAULT_LIST})",
    )
    parser.add_argument(
        "--lifecycle",
        action="append",
        metavar="MODULE:Class",
        help="lifecycle to prune (repeatable; default: the built-in pipeline and job)",
    )
    parser.set_defaults(func=run)


def _print(result: PruneResult, list_limit: int) -> None:
    verb = "would remove" if result.dry_run else "removed"
    shown = result.removed[: max(list_limit, 0)]
    for entity_id in shown:
        print(f"{verb} {result.kind} {entity_id}", flush=True)
    if len(result.removed) > len(shown):
        print(f"... and {len(result.removed) - len(shown)} more (--list N shows more)", flush=True)
    print(result.summary(), flush=True)


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 pruned (or nothing to prune); 1 a batch failed (the batches before it
    stay removed); 2 bad settings or a store that cannot be opened (nothing is created)."""
    from fsm.commands import ReadOnlyStoreError, open_readonly

    try:
        lifecycles = (
            [load_lifecycle(s) for s in args.lifecycle] if args.lifecycle else [PipelineLifecycle, JobLifecycle]
        )
        store = open_readonly(args.db, args.prefix, "fsm prune")
        engines = [Engine(lc, store) for lc in lifecycles]
    except (FsmError, ReadOnlyStoreError) as err:
        print(f"fsm prune: error: {err}", file=sys.stderr)
        return 2
    try:
        if not args.dry_run and len(engines) > 1:  # one run: a partition holds every lifecycle's entities
            try:
                results = prune_all(engines, args.older_than, args.batch_size)
            except FsmError as err:
                code = 2 if err.__class__.__name__ in {"InvalidArgument", "ConfigError"} else 1
                print(f"fsm prune: error: {type(err).__name__}: {err}", file=sys.stderr)
                return code
            for result in results:
                _print(result, args.list_limit)
            return 0
        for engine in engines:
            try:
                result = engine.prune(args.older_than, batch_size=args.batch_size, dry_run=args.dry_run)
            except FsmError as err:
                code = 2 if err.__class__.__name__ in {"InvalidArgument", "ConfigError"} else 1
                print(f"fsm prune: error: {engine.kind}: {type(err).__name__}: {err}", file=sys.stderr)
                return code
            _print(result, args.list_limit)
        return 0
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


__all__ = ["duration", "register", "run"]
