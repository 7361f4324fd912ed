"""``fsm inspect --db URL``: the read-only inspector page, served on 127.0.0.1.

Needs the ``inspect`` extra (``pip install 'fsm-lifecycles[inspect]'``: Starlette and
uvicorn).  The store is opened without creating anything, and the page has no write action.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fsm.commands import ReadOnlyStoreError, listen_problem, open_readonly, port, positive_seconds
from fsm.errors import ConfigError, FsmError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
BUILT_INS = ("fsm.lifecycles:JobLifecycle", "fsm.lifecycles:PipelineLifecycle")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="serve a read-only live web page of a store's lifecycles, leases and reaper",
        description=(
            "Serve a read-only web page of a store: counts by lifecycle and state, entities with their "
            "leases, one entity's diagram, timeline and effects, the reaper's recent ticks. Updates live."
        ),
    )
    parser.add_argument("--db", required=True, help="the store's URL (sqlite:///fsm.db, postgresql+psycopg://...)")
    parser.add_argument("--prefix", default="fsm_", help="the store's table prefix (default fsm_)")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)"
    )
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--lifecycle",
        action="append",
        default=[],
        metavar="MODULE:Class",
        help="a lifecycle of the store, for its diagram and state order (repeatable; the built-ins always)",
    )
    parser.add_argument(
        "--refresh", type=positive_seconds, default=2.0, help="seconds between live updates (default 2)"
    )
    parser.set_defaults(func=handle)


def build(args: argparse.Namespace) -> Any:
    """The Starlette app for ``args`` (the store opened read-only)."""
    from fsm.diagram.refs import load_lifecycle_here
    from fsm.inspect.app import create_app
    from stores.sql import SqlStore

    lifecycles = [load_lifecycle_here(ref) for ref in (*BUILT_INS, *args.lifecycle)]
    if args.db == "memory://":
        raise ConfigError("fsm inspect reads a database: give a sqlite:/// or postgresql:// URL")
    store = open_readonly(args.db, args.prefix, "fsm inspect")  # creates nothing
    assert isinstance(store, SqlStore)
    return create_app(store, lifecycles, refresh_ms=max(200, int(args.refresh * 1000)))


def handle(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("fsm inspect needs the inspect extra: pip install 'fsm-lifecycles[inspect]'", file=sys.stderr)
        return 2
    from stores.factory import safe_url

    try:
        app = build(args)
    except (FsmError, ReadOnlyStoreError) as err:  # a lifecycle not found, a store not opened
        print(f"fsm inspect: error: {err}", file=sys.stderr)
        return 2
    problem = listen_problem(args.host, args.port)
    if problem is not None:
        print(f"fsm inspect: error: {problem}", file=sys.stderr)
        return 2
    print(
        f"fsm inspect: {safe_url(args.db)} at http://{args.host}:{args.port}/ (read-only; Ctrl-C stops)",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "build", "register"]
