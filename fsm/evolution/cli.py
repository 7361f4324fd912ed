"""``fsm check`` and ``fsm migrate-rows``: a changed lifecycle against a store, before and during a deploy.

::

    fsm check myapp.flows:Build --db postgresql+psycopg://app@db/app   # exit 1: entities would be stranded
    fsm migrate-rows myapp.flows:Build --db ... --dry-run               # what the declared migrations would move
    fsm migrate-rows myapp.flows:Build --db ... --wait 600              # move them, waiting for held ones

Exit codes: ``fsm check`` 0 when nothing would be stranded or refused, 1 when something
would, 2 when the store or the lifecycle cannot be opened; ``fsm migrate-rows`` 0 when
every entity the migrations cover was moved (or, with ``--dry-run``, could be), 1 when some
are still held or could not be moved (run it again), 2 as above.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fsm.commands import DEFAULT_DB, DEFAULT_PREFIX, ReadOnlyStoreError, open_readonly
from fsm.errors import FsmError


def register(sub: Any) -> None:
    """Add ``check`` and ``migrate-rows`` to ``fsm``'s parser."""
    check = sub.add_parser(
        "check",
        help="compare a changed lifecycle with a store before deploying it",
        description=(
            "Compare a lifecycle definition (the one about to deploy) with what a store holds: entities in "
            "states the definition lacks and whether a declared migration moves them, data its data model "
            "refuses, entities a newer definition wrote, schedules whose runs it would refuse. Exit 1 when "
            "deploying it would strand or refuse entities."
        ),
    )
    _common(check)
    check.set_defaults(func=run_check)
    rows = sub.add_parser(
        "migrate-rows",
        help="move a store's entities as a lifecycle's declared migrations say",
        description=(
            "Carry out a lifecycle's declared migrations (Renamed, Removed, Split, DataMigration): each entity "
            "in an old state, or with data of an older version, moves by one fenced write with a history row "
            "naming the migration, and then records the new definition version. Entities held by a worker "
            "are left to it; run again (or pass --wait) to move them once released. Resumable."
        ),
    )
    _common(rows)
    rows.add_argument("--dry-run", action="store_true", help="report what would move; write nothing")
    rows.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep making passes while entities are held or changing, up to SECONDS (default: one pass)",
    )
    rows.set_defaults(func=run_migrate_rows)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lifecycle", metavar="MODULE:Class", help="the lifecycle definition, e.g. myapp.flows:Build")
    parser.add_argument("--db", default=DEFAULT_DB, help="store URL (default: %(default)s)")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="table prefix of a SQL store (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run_check(args: argparse.Namespace) -> int:
    from fsm.evolution.check import check_store

    return _run(args, "fsm check", check_store)


def run_migrate_rows(args: argparse.Namespace) -> int:
    from fsm.evolution.migrate import migrate_rows

    wait = args.wait
    if not 0 <= wait <= 86_400:  # NaN fails too
        print(f"fsm migrate-rows: error: --wait takes 0 to 86400 seconds, not {wait}", file=sys.stderr)
        return 2
    return _run(args, "fsm migrate-rows", lambda lc, store: migrate_rows(lc, store, dry_run=args.dry_run, wait=wait))


def _run(args: argparse.Namespace, prog: str, action: Any) -> int:
    from fsm.diagram.refs import load_lifecycle_here

    try:
        lifecycle = load_lifecycle_here(args.lifecycle)
    except FsmError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        store = open_readonly(args.db, args.prefix, prog)
    except ReadOnlyStoreError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        report = action(lifecycle, store)
    except FsmError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.render())
    good = report.ok if hasattr(report, "ok") else report.done
    return 0 if good else 1


__all__ = ["register", "run_check", "run_migrate_rows"]
