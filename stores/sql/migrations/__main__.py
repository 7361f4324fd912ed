"""``python -m stores.migrations {upgrade,downgrade,current,stamp} URL``: migrate the library's tables."""

from __future__ import annotations

import argparse
import sys

from fsm.errors import FsmError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the migrations command (``python -m stores.migrations`` and ``fsm migrate``)."""
    parser.add_argument("action", metavar="command", choices=["upgrade", "downgrade", "current", "stamp"])
    parser.add_argument("url", help="SQLAlchemy URL, e.g. sqlite:///fsm.db or postgresql+psycopg://user@host/db")
    parser.add_argument(
        "revision", nargs="?", default=None, help="target revision (default: head; downgrade: required)"
    )
    parser.add_argument("--prefix", default="fsm_", help="table prefix (default: fsm_)")
    parser.add_argument("--schema", default=None, help="PostgreSQL schema of the tables")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stores.migrations", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the parsed command; the exit code (0 done, 1 refused or failed)."""
    import re

    from alembic.util.exc import CommandError
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from stores.factory import safe_url
    from stores.sql import migrate as sql_migrate

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,30}", args.prefix):
        parser.error(f"--prefix {args.prefix!r} must be an identifier of at most 31 characters")
    if args.url.startswith("sqlite:///") and args.action != "upgrade":
        import os

        path = args.url.removeprefix("sqlite:///")
        if path != ":memory:" and not os.path.exists(path):
            print(f"error: no database file at {path!r} (nothing was created)", file=sys.stderr)
            return 1
    try:
        if args.action == "stamp" and not _tables_exist(args.url, args.prefix, args.schema):
            print("error: stamp marks existing tables as migrated; there are none here (run upgrade)", file=sys.stderr)
            return 1
        if args.action == "current":
            print(sql_migrate.current_revision(args.url, table_prefix=args.prefix, schema=args.schema) or "(none)")
        elif args.action == "upgrade":
            sql_migrate.upgrade(
                args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head"
            )
        elif args.action == "stamp":
            sql_migrate.stamp(args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head")
        else:
            if args.revision is None:
                parser.error("downgrade needs a revision (e.g. base)")
            sql_migrate.downgrade(args.url, args.revision, table_prefix=args.prefix, schema=args.schema)
    except FsmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ArgumentError, CommandError, DBAPIError, ModuleNotFoundError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"error: {safe_url(args.url)}: {first}", file=sys.stderr)
        return 1
    if args.action != "current":
        print(f"{args.action}: done ({safe_url(args.url)}, prefix {args.prefix})")
    return 0


def _tables_exist(url: str, prefix: str, schema: str | None) -> bool:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        return sa.inspect(engine).has_table(f"{prefix}entities", schema=schema)
    finally:
        engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
