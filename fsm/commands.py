"""``fsm migrate`` and ``fsm show``, and opening a store read-only for any command.

::

    fsm migrate upgrade sqlite:///fsm.db                 # create or upgrade the library's tables
    fsm migrate current postgresql+psycopg://app@db/app  # the revision they are at
    fsm show job-42 --db sqlite:///fsm.db                # the entity, its lease, history, effects

A command that only reads (``fsm show``, ``fsm reaper``, ``fsm diagram --db``) opens the
store with ``create=False``: a mistyped SQLite path or a wrong ``--prefix`` is an error
naming what was looked for, never a new empty database.  Errors go to stderr; exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from fsm.errors import ConfigError, FsmError, UnknownEntity
from fsm.records import Snapshot
from stores.base import Store

DEFAULT_DB = "sqlite:///fsm.db"
DEFAULT_PREFIX = "fsm_"


class ReadOnlyStoreError(Exception):
    """A store a read-only command could not open; the message says what to check."""


def open_readonly(url: str, prefix: str, prog: str) -> Store:
    """The store at ``url`` opened without creating anything (a file, tables, a migration)."""
    import stores

    try:
        return stores.open_store(url, table_prefix=prefix, create=False)
    except ConfigError as err:
        raise ReadOnlyStoreError(
            f"{err} ({prog} only reads a store and creates nothing; the tables looked for are "
            f"{prefix}entities and {prefix}history)"
        ) from err
    except FsmError as err:
        raise ReadOnlyStoreError(f"cannot open {stores.safe_url(url)}: {err}") from err
    except ImportError as err:
        raise ReadOnlyStoreError(f"cannot open {stores.safe_url(url)}: {err}") from err


def register(sub: Any) -> None:
    """Add ``migrate`` and ``show`` to ``fsm``'s parser."""
    from stores.sql.migrations.__main__ import add_arguments

    migrate = sub.add_parser(
        "migrate",
        help="upgrade, inspect or stamp the library's tables (a deploy step)",
        description=(
            "Migrate the library's tables (the same command as `python -m stores.migrations`): upgrade to the "
            "newest revision (creating them on an empty database), print the current revision, stamp, downgrade."
        ),
    )
    add_arguments(migrate)
    migrate.set_defaults(func=run_migrate)

    show = sub.add_parser(
        "show",
        help="one entity: its state, lease, history and recorded effects",
        description="Print one stored entity: its state and version, its lease, its history and its effects.",
    )
    show.add_argument("entity_id", metavar="ID", help="the entity's id")
    show.add_argument("--db", default=DEFAULT_DB, help="store URL (default: %(default)s); only read")
    show.add_argument("--prefix", default=DEFAULT_PREFIX, help="table prefix of a SQL store (default: %(default)s)")
    show.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    show.set_defaults(func=run_show)


def run_migrate(args: argparse.Namespace) -> int:
    from stores.sql.migrations.__main__ import run

    if not getattr(args, "verbose", False):  # Alembic's INFO lines only with -v
        logging.getLogger("alembic").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="fsm migrate")
    return run(args, parser)


def _when(value: Any) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _entity(snap: Snapshot) -> dict[str, Any]:
    return {
        "id": snap.id,
        "kind": snap.kind,
        "state": snap.state,
        "version": snap.version,
        "deleted": snap.deleted,
        "concurrency_key": snap.concurrency_key,
        "attempt": snap.attempt,
        "reclaims": snap.reclaims,
        "state_entered_at": _when(snap.state_entered_at),
        "created_at": _when(snap.created_at),
        "updated_at": _when(snap.updated_at),
        "run_after": None if snap.run_after is None else _when(snap.run_after),
        "lease": None
        if snap.lease_owner is None
        else {"owner": snap.lease_owner, "token": snap.lease_token, "expires_at": _when(snap.lease_expires_at)},
        "lease_token": snap.lease_token,
        "data": snap.data,
    }


def run_show(args: argparse.Namespace) -> int:
    """Exit codes: 0 shown; 2 a store that cannot be opened, or no such entity."""
    try:
        store = open_readonly(args.db, args.prefix, "fsm show")
    except ReadOnlyStoreError as err:
        print(f"fsm show: error: {err}", file=sys.stderr)
        return 2
    try:
        try:
            snap = store.get(args.entity_id, include_deleted=True)
        except UnknownEntity:
            print(f"fsm show: error: no entity {args.entity_id!r} in this store", file=sys.stderr)
            return 2
        history = store.history(snap.id)
        effects = store.effects(snap.id)
    except FsmError as err:
        print(f"fsm show: error: {err}", file=sys.stderr)
        return 2
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
    if args.json:
        doc = {
            **_entity(snap),
            "history": [{**r._asdict(), "at": _when(r.at)} for r in history],
            "effects": [{**e._asdict(), "recorded_at": _when(e.recorded_at)} for e in effects],
        }
        print(json.dumps(doc, indent=2, sort_keys=False))
        return 0
    out = [
        f"{snap.kind} {snap.id}: {snap.state} (version {snap.version}){' [deleted]' if snap.deleted else ''}",
        f"  entered {_when(snap.state_entered_at)}; created {_when(snap.created_at)}; updated {_when(snap.updated_at)}",
        f"  attempt {snap.attempt}, reclaims {snap.reclaims}"
        + (f", due {_when(snap.run_after)}" if snap.run_after is not None else "")
        + (f", concurrency key {snap.concurrency_key}" if snap.concurrency_key else ""),
        (
            f"  lease: held by {snap.lease_owner}, token {snap.lease_token}, expires {_when(snap.lease_expires_at)}"
            if snap.lease_owner is not None
            else f"  lease: none (token {snap.lease_token})"
        ),
        f"  data: {json.dumps(snap.data, sort_keys=True)}",
        f"history ({len(history)}):",
    ]
    for r in history:
        extra = ", ".join(
            x
            for x in (
                f"reason {r.reason}" if r.reason else "",
                f"token {r.lease_token}" if r.lease_token is not None else "",
                f"owner {r.owner}" if r.owner else "",
                f"key {r.idempotency_key}" if r.idempotency_key else "",
            )
            if x
        )
        out.append(
            f"  v{r.seq} {_when(r.at)} {r.event}: {r.source} -> {r.target} by {r.actor}"
            + (f" ({extra})" if extra else "")
        )
        if r.error:  # a handler's attempt that failed: what it raised, where
            failure = r.error
            out.append(
                f"    error (attempt {failure.get('attempt', '?')}): {failure.get('type')}: {failure.get('message')}"
            )
            lines = str(failure.get("traceback") or "").rstrip().splitlines()
            out.extend(f"      {line}" for line in lines[-3:])
    out.append(f"effects ({len(effects)}):")
    for e in effects:
        out.append(
            f"  {e.key}: {e.status} (token {e.lease_token}, attempts {e.attempts}, {_when(e.recorded_at)}) "
            f"{json.dumps(e.result, sort_keys=True)}"
        )
    print("\n".join(out))
    return 0


__all__ = ["ReadOnlyStoreError", "open_readonly", "register", "run_migrate", "run_show"]
