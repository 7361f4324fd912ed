"""The ``fsm`` command line.

Subcommands register themselves here; each one's handler returns the exit code.

- ``fsm demo``: the main job, replaying the seeds' scenarios on a store (SQLite by default);
- ``fsm reaper``: run the reaper once or on a schedule;
- ``fsm prune``: remove finished entities older than a retention;
- ``fsm diagram``: export a lifecycle as Mermaid, DOT, SVG or PNG;
- ``fsm inspect``: a read-only live web page of a store.
- ``fsm migrate``: upgrade (or inspect) the library's tables, as a deploy step;
- ``fsm show ID``: one entity, its lease, its history and its effects;
- ``fsm check`` and ``fsm migrate-rows``: a changed lifecycle against a store, before and
  during a deploy.

Every subcommand prints what it did on stdout and its errors on stderr; ``-v`` (DEBUG
logs) and ``-q`` (warnings and errors only) are accepted before or after the subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from fsm._version import __version__
from fsm.errors import FsmError

Handler = Callable[[argparse.Namespace], int]

SUBCOMMANDS = (
    "fsm.demo",
    "fsm.diagram.cli",
    "fsm.reaping.cli",
    "fsm.reaping.prune_cli",
    "fsm.scheduling.cli",
    "fsm.commands",
    "fsm.evolution.cli",
    "fsm.inspect.cli",
)
"""Modules exposing ``register(subparsers)``; a module not built yet is skipped."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsm", description="Explicit lifecycles that a reaper cannot break (fsm-lifecycles)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _log_options(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and name.startswith(err.name):
                continue
            raise
        module.register(sub)
    for child in sub.choices.values():  # `fsm reaper -v` as well as `fsm -v reaper`
        _log_options(child, argparse.SUPPRESS)
    return parser


def _log_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """``-v``/``-q``; a subcommand's default is SUPPRESS, so it never undoes the top level's."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log at DEBUG level")
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="print warnings and errors only")


def _version() -> str:
    """The one version (``fsm/_version.py``, which the distribution's metadata is built from)."""
    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-v and -q contradict each other")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler: Handler | None = getattr(args, "func", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except FsmError as err:  # a store problem a subcommand did not expect: one clean line, never a traceback
        print(f"fsm {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `fsm demo | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the user's wish, not a crash to show
        print(f"fsm {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug (ours, or in a user's lifecycle module): one line; the stack with -v
        if args.verbose:
            traceback.print_exc()
        print(
            f"fsm {args.command}: unexpected error: {type(err).__name__}: {err}"
            + ("" if args.verbose else " (run with -v for the traceback)"),
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
