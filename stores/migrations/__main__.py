"""``python -m stores.migrations {upgrade,downgrade,current,stamp} URL``: migrate the library's tables."""

from __future__ import annotations

import argparse
import sys

from fsm.errors import FsmError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stores.migrations", description=__doc__)
    parser.add_argument("command", choices=["upgrade", "downgrade", "current", "stamp"])
    parser.add_argument("url", help="SQLAlchemy URL, e.g. sqlite:///fsm.db or postgresql+psycopg://user@host/db")
    parser.add_argument(
        "revision", nargs="?", default=None, help="target revision (default: head; downgrade: required)"
    )
    parser.add_argument("--prefix", default="fsm_", help="table prefix (default: fsm_)")
    parser.add_argument("--schema", default=None, help="PostgreSQL schema of the tables")
    args = parser.parse_args(argv)

    from stores import sql_migrate

    try:
        if args.command == "current":
            print(sql_migrate.current_revision(args.url, table_prefix=args.prefix, schema=args.schema) or "(none)")
        elif args.command == "upgrade":
            sql_migrate.upgrade(
                args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head"
            )
        elif args.command == "stamp":
            sql_migrate.stamp(args.url, table_prefix=args.prefix, schema=args.schema, revision=args.revision or "head")
        else:
            if args.revision is None:
                parser.error("downgrade needs a revision (e.g. base)")
            sql_migrate.downgrade(args.url, args.revision, table_prefix=args.prefix, schema=args.schema)
    except FsmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
