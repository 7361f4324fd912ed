"""``fsm diagram``: export a lifecycle, check exported diagrams, rewrite a directory.

::

    fsm diagram fsm.lifecycles:JobLifecycle                      # Mermaid on stdout
    fsm diagram fsm.lifecycles:JobLifecycle --format dot         # DOT on stdout
    fsm diagram myapp.flows:Deploy --out deploy.svg              # format from the suffix
    fsm diagram fsm.lifecycles:JobLifecycle --db sqlite:///fsm.db --id job-42 --format svg --out job-42.svg
    fsm diagram fsm.lifecycles:JobLifecycle --db sqlite:///demo.db --prefix demo_ --id job-1
    fsm diagram --check diagrams                                 # exit 1 naming each stale file
    fsm diagram --check diagrams README.md                       # also the README's Mermaid blocks
    fsm diagram --write diagrams                                 # (re)export the built-ins
    fsm diagram --write docs/diagrams myapp.flows:Deploy         # (re)export your own

Exit codes: 0 done (or all fresh), 1 ``--check`` found a stale or broken file, 2 bad usage
or input (unknown lifecycle or entity, a store that cannot be read, Graphviz missing for
SVG/PNG: ``--write`` then writes the text formats and names each image it skipped...).

``--db`` only reads: the store is opened with ``create=False``, so a mistyped SQLite path or
a database without the library's tables is an error, never a new database.  ``MODULE`` is
imported with the current directory first on ``sys.path``, as ``python -m`` does.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import Any

from fsm.diagram.check import Status, check
from fsm.diagram.export import FORMATS, TEXT_FORMATS, format_for_path, render, write_dir
from fsm.diagram.extract import DEFAULT_LAST, extract
from fsm.diagram.model import Diagram
from fsm.diagram.refs import BUILTINS, cwd_on_path, load_lifecycle_here
from fsm.errors import FsmError
from fsm.lifecycle import Lifecycle

PROG = "fsm diagram"
DEFAULT_PREFIX = "fsm_"


class UsageError(Exception):
    """Options that do not go together."""


def register(subparsers: Any) -> None:
    """Add the ``diagram`` subcommand to ``fsm``'s parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diagram",
        help="export a lifecycle as Mermaid, DOT, SVG or PNG; check or rewrite exported diagrams",
        description=(
            "Export a lifecycle (MODULE:Class) as a state diagram: the compound states, every guarded "
            "transition branch with its event, guards and actor, reaper transitions drawn apart. With "
            "--db and --id, one stored entity's current state is highlighted and its last transitions listed."
        ),
        epilog=(
            "examples: fsm diagram fsm.lifecycles:JobLifecycle --format svg --out job.svg | "
            "fsm diagram --check diagrams | fsm diagram --write diagrams.  "
            "SVG and PNG need Graphviz's `dot` (apt-get install graphviz / brew install graphviz)."
        ),
    )
    parser.add_argument(
        "refs",
        nargs="*",
        metavar="MODULE:Class",
        help="the lifecycle to export (with --write: the lifecycles to write, default: the built-ins)",
    )
    parser.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="output format (default: from the --out suffix, else mermaid)",
    )
    parser.add_argument("--out", "-o", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--db", metavar="URL", help="store URL of an entity to overlay (e.g. sqlite:///fsm.db)")
    parser.add_argument("--id", dest="entity_id", metavar="ENTITY", help="the entity to overlay (needs --db)")
    parser.add_argument(
        "--prefix",
        metavar="PREFIX",
        help=f"with --db: table prefix of a SQL store (default {DEFAULT_PREFIX}); the store is only read",
    )
    parser.add_argument(
        "--last",
        type=int,
        default=DEFAULT_LAST,
        metavar="N",
        help=f"how many of the entity's transitions to list (default {DEFAULT_LAST})",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        nargs="+",
        metavar="PATH",
        help=(
            "exit 1 when an exported diagram no longer matches its lifecycle, naming the file; PATH is a "
            "directory of exports, or a Markdown file whose ```mermaid blocks carry an fsm-diagram header"
        ),
    )
    mode.add_argument(
        "--write",
        metavar="DIR",
        help=(
            "(re)export MODULE:Class ... (default: the built-in lifecycles) into DIR as <kind>.mmd, .dot and "
            ".svg; refused when two lifecycles share a kind or a kind is no plain file name; without Graphviz "
            "the .svg files are skipped, named, and the exit code is 2"
        ),
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --write: rewrite files that are already fresh, and replace files exported from another lifecycle",
    )
    parser.set_defaults(func=handle)


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> int:
    missing = [p for p in args.check if not Path(p).exists()]
    if missing:  # bad input, not a stale file: exit 2 as documented
        raise UsageError(f"--check: no such file or directory: {', '.join(missing)}")
    report = check(args.check)
    for finding in report.findings:
        line = f"{finding.status.value:<5}  {finding.where}"
        if finding.status is Status.FRESH:
            print(line)
            continue
        print(f"{line}: {finding.message}")
        if finding.detail:
            print(finding.detail)
    for problem in report.problems:
        print(f"{PROG} --check: {problem}", file=sys.stderr)
    fresh, stale, broken = (report.count(s) for s in (Status.FRESH, Status.STALE, Status.ERROR))
    targets = " ".join(str(t) for t in report.targets)
    print(f"{fresh} fresh, {stale} stale, {broken} broken in {targets}")
    if report.ok:
        return 0
    if stale or broken:
        print(
            f"{PROG} --check: out of date; regenerate each file as shown above "
            "(the built-ins: fsm diagram --write diagrams)",
            file=sys.stderr,
        )
    return 1


def _write(args: argparse.Namespace) -> int:
    refs = tuple(args.refs) or BUILTINS
    results = write_dir(args.write, refs, force=args.force)
    for result in results:
        print(f"{result.status:<5}  {result.path}")
    skipped = [r for r in results if r.status == "skipped"]
    if skipped:
        names = ", ".join(str(r.path) for r in skipped)
        _fail(f"not written (drawing them needs Graphviz): {names}; the other files were written. {skipped[0].note}")
        return 2
    return 0


def _database_errors() -> tuple[type[BaseException], ...]:
    """What a driver raises reading a file that is no database (or a broken one)."""
    errors: list[type[BaseException]] = [sqlite3.DatabaseError]
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # pragma: no cover - the memory store needs no SQLAlchemy
        pass
    else:
        errors.append(SQLAlchemyError)
    return tuple(errors)


def _entity_diagram(lifecycle: type[Lifecycle], args: argparse.Namespace) -> Diagram:
    """The lifecycle with the stored entity ``--id`` overlaid, the store only read."""
    import stores  # the store layer only when an entity is asked for
    from fsm.commands import ReadOnlyStoreError, open_readonly

    url, prefix = args.db, args.prefix or DEFAULT_PREFIX
    try:
        store = open_readonly(url, prefix, "fsm diagram --db")  # the one opener: one message everywhere
    except ReadOnlyStoreError as err:
        raise UsageError(str(err)) from err
    except _database_errors() as err:
        raise UsageError(f"cannot read {stores.safe_url(url)}: {err} (is it an fsm-lifecycles store?)") from err
    try:
        return extract(lifecycle, store=store, entity_id=args.entity_id, last=args.last)
    except _database_errors() as err:
        raise UsageError(f"cannot read {stores.safe_url(url)}: {err}") from err
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            try:
                close()
            except _database_errors():
                pass


def _export(args: argparse.Namespace) -> int:
    if len(args.refs) != 1:
        raise UsageError("name exactly one lifecycle as MODULE:Class (or use --check PATH... / --write DIR)")
    if (args.db is None) != (args.entity_id is None):
        raise UsageError("--db and --id go together: the store and the entity to highlight")
    if args.prefix is not None and args.db is None:
        raise UsageError("--prefix goes with --db (the table prefix of that store)")
    if args.last < 0:
        raise UsageError("--last must be >= 0")
    implied = format_for_path(args.out) if args.out else None
    if args.out and implied is None and not args.format:
        raise UsageError(
            f"cannot tell a format from --out {args.out}: name it .mmd, .dot, .svg or .png, or pass --format"
        )
    if args.format and implied and args.format != implied:
        raise UsageError(f"--format {args.format} does not match --out {args.out} (a {implied} file name)")
    fmt = args.format or implied or "mermaid"
    lifecycle = load_lifecycle_here(args.refs[0])
    diagram = _entity_diagram(lifecycle, args) if args.db is not None else extract(lifecycle)
    data = render(diagram, fmt)
    if args.out:
        Path(args.out).write_bytes(data)
        print(f"wrote  {args.out}", file=sys.stderr)
    elif fmt in TEXT_FORMATS:
        sys.stdout.write(data.decode("utf-8"))
        sys.stdout.flush()
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def handle(args: argparse.Namespace) -> int:
    """Run ``fsm diagram``; the exit code."""
    cwd_on_path()  # MODULE:Class found in the current directory, as with python -m
    try:
        if args.check is not None:
            if args.refs or args.out or args.db or args.entity_id or args.format or args.prefix:
                raise UsageError("--check PATH... takes no lifecycle, --format, --out, --db, --id or --prefix")
            return _check(args)
        if args.write is not None:
            if args.out or args.db or args.entity_id or args.format or args.prefix:
                raise UsageError("--write DIR takes lifecycles only (no --format, --out, --db, --id or --prefix)")
            return _write(args)
        return _export(args)
    except (UsageError, FsmError, ValueError, OSError) as err:
        return _fail(str(err))


__all__ = ["handle", "register"]
