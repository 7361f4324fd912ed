"""``python -m stores.migrations COMMAND URL``: migrate the library's tables.

``COMMAND``: ``upgrade``, ``current``, ``stamp``, ``downgrade``, ``partition-history``
(the same as ``fsm migrate``)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable

from fsm.errors import FsmError

COMMANDS = {
    "upgrade": "create the tables, or upgrade them, to REVISION (default: head, the newest)",
    "current": "print the revision the tables are at ('(none)' when there are none)",
    "stamp": "mark tables created by other means as at REVISION, without running it",
    "downgrade": "migrate down to REVISION (required; 'base' drops the tables)",
    "partition-history": (
        "PostgreSQL: turn the history into a table partitioned by time (--interval-days, default 7), so that "
        "retention drops whole partitions; a maintenance step: it copies the table under an exclusive lock"
    ),
}
"""The migrations command's commands, as its ``--help`` lists them."""

EXAMPLES = """commands:
  upgrade    {upgrade}
  current    {current}
  stamp      {stamp}
  downgrade  {downgrade}
  partition-history
             {partition-history}

examples:
  %(prog)s upgrade sqlite:///fsm.db
  %(prog)s current postgresql+psycopg://app@db/app --prefix fsm_
  %(prog)s downgrade sqlite:///fsm.db base
  %(prog)s partition-history postgresql+psycopg://app@db/app --interval-days 7""".format(**COMMANDS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the migrations command (``python -m stores.migrations`` and ``fsm migrate``)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the command list as written
    if parser.description:  # raw from here on: wrapped once, as argparse would have
        parser.description = textwrap.fill(parser.description, 78)
    parser.epilog = EXAMPLES
    parser.add_argument(
        "action", metavar="COMMAND", choices=list(COMMANDS), help=f"one of: {', '.join(COMMANDS)} (see below)"
    )
    parser.add_argument("url", help="SQLAlchemy URL, e.g. sqlite:///fsm.db or postgresql+psycopg://user@host/db")
    parser.add_argument(
        "revision", nargs="?", default=None, help="target revision (default: head; downgrade: required)"
    )
    parser.add_argument("--prefix", default="fsm_", help="table prefix (default: fsm_)")
    parser.add_argument("--schema", default=None, help="PostgreSQL schema of the tables")
    parser.add_argument(
        "--interval-days",
        type=float,
        default=7.0,
        metavar="DAYS",
        help="partition-history: the time each partition covers (default: 7 days)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stores.migrations", description="Migrate the library's tables (Alembic)."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the parsed command; the exit code: 0 done, 2 refused (a bad URL or revision, no
    database file, an unreachable database, no tables to stamp), as every ``fsm`` command.

    Errors are one line on stderr, ``PROG: error: ...`` (``PROG`` is the parser's), and
    name the database with its password hidden, never the driver's exception class.
    """
    import re

    from sqlalchemy.exc import ArgumentError

    from stores.factory import safe_url
    from stores.sql import migrate as sql_migrate

    def refuse(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,30}", args.prefix):
        parser.error(f"--prefix {args.prefix!r} must be an identifier of at most 31 characters")
    if args.action == "downgrade" and args.revision is None:
        parser.error("downgrade needs a revision (e.g. base)")
    if args.url.startswith("sqlite:///") and args.action != "upgrade":
        import os

        path = args.url.removeprefix("sqlite:///")
        if path != ":memory:" and not os.path.exists(path):
            return refuse(f"no database file at {path!r} (nothing was created)")
    try:
        if args.action == "stamp" and not _tables_exist(args.url, args.prefix, args.schema):
            return refuse("stamp marks existing tables as migrated; there are none here (run upgrade)")
        if args.action == "current":
            print(sql_migrate.current_revision(args.url, table_prefix=args.prefix, schema=args.schema) or "(none)")
        elif args.action == "upgrade":
            sql_migrate.upgrade(
                args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head"
            )
        elif args.action == "stamp":
            sql_migrate.stamp(args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head")
        elif args.action == "partition-history":
            return _partition(args, refuse)
        else:
            sql_migrate.downgrade(args.url, args.revision, table_prefix=args.prefix, schema=args.schema)
    except FsmError as err:  # StoreUnavailable, ConfigError: the message names the database
        return refuse(str(err))
    except (ArgumentError, ModuleNotFoundError) as err:  # a URL SQLAlchemy cannot parse, no driver
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return refuse(f"cannot open {safe_url(args.url)}: {first}")
    if args.action != "current":
        print(f"{args.action}: done ({safe_url(args.url)}, prefix {args.prefix})")
    return 0


def _partition(args: argparse.Namespace, refuse: Callable[[str], int]) -> int:
    """``partition-history``: the conversion (:func:`stores.sql.partitions.partition_history`)."""
    from datetime import timedelta

    from stores.factory import safe_url
    from stores.sql.partitions import partition_history

    days = args.interval_days
    if not 1 / 24 <= days <= 366:  # NaN fails too
        return refuse(f"--interval-days takes 1/24 to 366 days, not {days}")
    done = partition_history(args.url, table_prefix=args.prefix, schema=args.schema, interval=timedelta(days=days))
    state = "partitioned" if done else "already partitioned (the partitions ahead checked)"
    print(f"partition-history: {state} ({safe_url(args.url)}, prefix {args.prefix})")
    return 0


def _tables_exist(url: str, prefix: str, schema: str | None) -> bool:
    import sqlalchemy as sa

    from stores.sql.connections import create_engine, reaching

    engine = create_engine(url)
    try:
        with reaching(engine.url, "read the tables of"):
            return sa.inspect(engine).has_table(f"{prefix}entities", schema=schema)
    finally:
        engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
