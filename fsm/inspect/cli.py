"""``fsm inspect --db URL``: the read-only inspector page, served on 127.0.0.1.

Needs the ``inspect`` extra (``pip install 'fsm-lifecycles[inspect]'``: Starlette and
uvicorn).  The store is opened without creating anything, and the page has no write action.

Exposure: the Host header must be a loopback name, the bound address, or one given with
``--allowed-host``.  Binding anything but loopback needs a token (``FSM_INSPECT_TOKEN``, or
one made up and printed at start); requests then send ``Authorization: Bearer TOKEN`` or
sign in once with the printed one-time URL, which sets a session cookie (add
``&next=/entity?id=..``, URL-encoded, to land on that page).

Served by uvicorn with bounds on what one client can hold (:mod:`fsm.inspect.serving`): a
request must arrive whole within ``REQUEST_READ_TIMEOUT_S`` seconds of connecting, and at
most ``MAX_CONNECTIONS`` connections are held.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

from fsm.commands import ReadOnlyStoreError, listen_problem, open_readonly, port, positive_seconds
from fsm.errors import ConfigError, FsmError

TOKEN_ENV = "FSM_INSPECT_TOKEN"

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
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients use to reach the page (repeatable; loopback names are always allowed)",
    )
    parser.add_argument(
        "--require-token",
        action="store_true",
        help=f"ask for the token on loopback too (always asked when binding anything else; {TOKEN_ENV} sets it)",
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="let operators fire the lifecycles' declared operator_override transitions from the page "
        "(each recorded, naming the operator; needs the token, asked for even on loopback)",
    )
    parser.set_defaults(func=handle)


def tokens_for(args: argparse.Namespace) -> Any:
    """The token the page asks for, or ``None`` on loopback without ``--require-token``."""
    from fsm.inspect.security import Tokens, is_loopback

    if is_loopback(args.host) and not args.require_token and not getattr(args, "allow_actions", False):
        return None
    token = os.environ.get(TOKEN_ENV, "")
    if token and len(token) < 16:
        raise ConfigError(f"{TOKEN_ENV} must be at least 16 characters")
    return Tokens(token or secrets.token_urlsafe(32))


def build(args: argparse.Namespace, tokens: Any = None) -> Any:
    """The ASGI app for ``args`` (the store opened read-only)."""
    from fsm.diagram.refs import load_lifecycle_here
    from fsm.inspect.app import create_app
    from fsm.inspect.security import allowed_hosts
    from stores.sql import SqlStore

    lifecycles = [load_lifecycle_here(ref) for ref in (*BUILT_INS, *args.lifecycle)]
    if args.db == "memory://":
        raise ConfigError("fsm inspect reads a database: give a sqlite:/// or postgresql:// URL")
    store = open_readonly(args.db, args.prefix, "fsm inspect")  # creates nothing
    assert isinstance(store, SqlStore)
    return create_app(
        store,
        lifecycles,
        refresh_ms=max(200, int(args.refresh * 1000)),
        hosts=allowed_hosts(args.host, args.allowed_host),
        tokens=tokens,
        allow_actions=bool(getattr(args, "allow_actions", False)),
    )


def handle(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("fsm inspect needs the inspect extra: pip install 'fsm-lifecycles[inspect]'", file=sys.stderr)
        return 2

    try:
        tokens = tokens_for(args)
        app = build(args, tokens)
    except (FsmError, ReadOnlyStoreError) as err:  # a lifecycle not found, a store not opened
        print(f"fsm inspect: error: {err}", file=sys.stderr)
        return 2
    problem = listen_problem(args.host, args.port)
    if problem is not None:
        print(f"fsm inspect: error: {problem}", file=sys.stderr)
        return 2
    for line in announce(args, tokens):
        print(line, file=sys.stderr)
    from fsm.inspect import serving
    from fsm.inspect.events import end_streams_on_exit

    # bounded: a request must arrive whole within seconds, and few connections are held
    server = uvicorn.Server(serving.config(app, host=args.host, port=args.port))
    end_streams_on_exit(server, app)  # open /events streams would hold the shutdown forever
    server.run()
    return 0


def announce(args: argparse.Namespace, tokens: Any) -> list[str]:
    """What ``fsm inspect`` says at start: where, the warnings, how to sign in."""
    from stores.factory import safe_url

    reach = "127.0.0.1" if args.host in {"0.0.0.0", "::"} else args.host  # a wildcard is no name to visit
    where = f"[{reach}]" if ":" in reach else reach
    base = f"http://{where}:{args.port}"
    mode = "operator actions allowed" if getattr(args, "allow_actions", False) else "read-only"
    lines = [f"fsm inspect: {safe_url(args.db)} at {base}/ ({mode}; Ctrl-C stops)"]
    if args.host in {"0.0.0.0", "::"}:
        lines.append(
            f"fsm inspect: WARNING: --host {args.host} serves the page on every network interface; "
            "it shows entity data and effect results. Name the hosts clients use with --allowed-host."
        )
    if tokens is not None:
        if not os.environ.get(TOKEN_ENV):
            lines.append(f"fsm inspect: token (set {TOKEN_ENV} to choose it): {tokens.token}")
        other = " (or through a name given with --allowed-host)" if reach != args.host else ""
        lines.append(
            f"fsm inspect: sign in once (this URL works one time){other}: {base}/login?code={tokens.new_code()}"
        )
    return lines


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "TOKEN_ENV", "announce", "build", "register", "tokens_for"]
