"""``fsm migrate`` and ``fsm show``, and opening a store read-only for any command.

::

    fsm migrate upgrade sqlite:///fsm.db                 # create or upgrade the library's tables
    fsm migrate current postgresql+psycopg://app@db/app  # the revision they are at
    fsm show job-42 --db sqlite:///fsm.db                # the entity, its lease, history, effects
    fsm show req-7 --lifecycle myapp.flows:Approval      # ... and when its timers are due

A command that opens an existing store (``fsm show``, ``fsm diagram --db`` and ``fsm
inspect`` read it, ``fsm reaper`` moves its entities) opens it with ``create=False``: a
mistyped SQLite path or a wrong ``--prefix`` is an error naming what was looked for and the
prefixes that are there, never a new empty database.  Errors go to stderr; exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fsm.engine.held_back import limit_wait
from fsm.errors import ConfigError, FsmError, UnknownEntity
from fsm.records import Snapshot
from stores.base import Store

if TYPE_CHECKING:
    from fsm.diagram.pending import PendingTimer
    from fsm.lifecycle import Lifecycle
from fsm.regions import region_rows

DEFAULT_DB = "sqlite:///fsm.db"
DEFAULT_PREFIX = "fsm_"


class ReadOnlyStoreError(Exception):
    """A store a read-only command could not open; the message says what to check."""


MISSING_TABLES = "no fsm-lifecycles tables with prefix"
"""How a store opened with ``create=False`` begins its message when the prefix has no tables."""


def open_readonly(url: str, prefix: str, prog: str) -> Store:
    """The store at ``url`` opened without creating anything (a file, tables, a migration).

    Every refusal is one message, wrapped once: the store's own (which names the URL),
    and, when the prefix has no tables, the prefixes this database does have and the flag
    that selects one (``fsm demo`` writes ``fsm_demo_*``, a reader defaults to ``fsm_``).
    """
    import stores

    try:
        return stores.open_store(url, table_prefix=prefix, create=False)
    except ConfigError as err:
        message = str(err)
        if message.startswith(MISSING_TABLES):
            message = f"{MISSING_TABLES} {prefix!r} in {stores.safe_url(url)}; {_prefixes_hint(url, prefix, prog)}"
        elif message.startswith("no database file"):
            message += f": check the URL ({prog} opens an existing store)"
        raise ReadOnlyStoreError(message) from err
    except FsmError as err:  # unreachable, corrupt: the message names the database already
        raise ReadOnlyStoreError(str(err)) from err
    except ImportError as err:
        raise ReadOnlyStoreError(f"cannot open {stores.safe_url(url)}: {err}") from err


def table_prefixes(url: str) -> list[str]:
    """The table prefixes of fsm-lifecycles stores in the database at ``url`` (an existing
    database: this connects, and on SQLite would create a missing file): each ``P`` with
    ``P``entities, ``P``history and ``P``alembic_version tables, sorted."""
    import sqlalchemy as sa

    from stores.sql import create_engine

    engine = create_engine(url)
    try:
        names = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    suffix = "alembic_version"
    found = (n.removesuffix(suffix) for n in names if n.endswith(suffix))
    return sorted(p for p in found if f"{p}entities" in names and f"{p}history" in names)


def _prefixes_hint(url: str, prefix: str, prog: str) -> str:
    """Which prefixes the database holds, and how to pick one; a best effort (never raises)."""
    try:
        found = table_prefixes(url)
    except Exception:  # only a hint: the store's own refusal is what matters
        found = None
    if found:
        shown = ", ".join(repr(p) for p in found)
        return f"it holds the tables of prefix {shown}: select them with --prefix {found[0]} ({prog} creates nothing)"
    looked = f"{prefix}entities and {prefix}history"
    if found is None:
        return f"check the URL and --prefix (looked for: {looked}; {prog} creates nothing)"
    return (
        f"nor under any other prefix: check the URL, or create them with `fsm migrate upgrade URL --prefix {prefix}` "
        f"({prog} creates nothing)"
    )


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (an unknown host, a port in use, no
    permission), found before it starts: its own failure would be a log line and exit 3."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        return f"unknown host {host!r} ({err})"
    family, kind, proto, _, address = infos[0]
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as err:
        return f"cannot listen on {host}:{port}: {err.strerror or err}"
    return None


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, at least a microsecond (a smaller
    one is no duration: it rounds to zero)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 1e-6:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, at least 0.000001, not {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number, zero or more (``--list -1`` is refused)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, not {value}")
    return value


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
    show.add_argument(
        "--lifecycle",
        action="append",
        default=[],
        metavar="MODULE:Class",
        help="the entity's lifecycle, to say when its timers are due (repeatable; the built-ins always)",
    )
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
        "definition": snap.definition,
        "deleted": snap.deleted,
        "concurrency_key": snap.concurrency_key,
        "priority": snap.priority,
        "parent_id": snap.parent_id,
        "attempt": snap.attempt,
        "reclaims": snap.reclaims,
        "state_entered_at": _when(snap.state_entered_at),
        "created_at": _when(snap.created_at),
        "updated_at": _when(snap.updated_at),
        "run_after": None if snap.run_after is None else _when(snap.run_after),
        "timer_since": None if snap.timer_since is None else _when(snap.timer_since),
        "lease": None
        if snap.lease_owner is None
        else {"owner": snap.lease_owner, "token": snap.lease_token, "expires_at": _when(snap.lease_expires_at)},
        "lease_token": snap.lease_token,
        "data": snap.data,
        "memory": snap.memory,
    }


SHOWN_LIFECYCLES = ("fsm.lifecycles:PipelineLifecycle", "fsm.lifecycles:JobLifecycle")
"""The lifecycles ``fsm show`` always knows (``--lifecycle`` adds more)."""


def _lifecycles(refs: list[str]) -> dict[str, type[Lifecycle]]:
    """Kind -> lifecycle: the built-ins and each ``--lifecycle`` (a later one wins its kind)."""
    from fsm.diagram.refs import load_lifecycle_here

    found = [load_lifecycle_here(ref) for ref in (*SHOWN_LIFECYCLES, *refs)]
    return {lc.kind: lc for lc in found}


def _timer(timer: PendingTimer, now: datetime) -> dict[str, Any]:
    from fsm.diagram.pending import timestamp

    return {
        "event": timer.event,
        "after": timer.delay,
        "after_seconds": timer.after.total_seconds(),
        "state": timer.state,
        "target": timer.target,
        "due": timestamp(timer.due),
        "overdue": timer.is_due(now),
        "guards": list(timer.guards),
    }


def timer_lines(snap: Snapshot, timers: list[PendingTimer] | None, now: datetime) -> list[str]:
    """``fsm show``'s lines on the timers the entity is waiting out, one each:
    ``timer: timeout due 2026-12-06T10:00:00+00:00 (in 23h 59m)``; ``timers`` is ``None``
    when its lifecycle is not known here (then its clock, if it runs, and how to know more)."""
    if timers is None:
        if snap.timer_since is None or snap.deleted:
            return []
        return [
            f"  timer clock: running since {_when(snap.timer_since)} (lifecycle {snap.kind!r} is not known here: "
            "pass --lifecycle MODULE:Class to see when its timers are due)"
        ]
    return [f"  timer: {t.describe(now)}" for t in timers]


SHOWN_CHILDREN = 20
"""The most children ``fsm show`` lists (``Store.children`` pages through the rest)."""


def child_lines(kids: list[Snapshot]) -> list[str]:
    """``fsm show``'s lines on an entity's children: how many, and each one's state."""
    if not kids:
        return []
    more = len(kids) > SHOWN_CHILDREN
    head = f"  children ({SHOWN_CHILDREN}+ shown first):" if more else f"  children ({len(kids)}):"
    return [head, *(f"    {c.id} ({c.kind}): {c.state}" for c in kids[:SHOWN_CHILDREN])]


def region_lines(lifecycle: type[Lifecycle] | None, snap: Snapshot, rows: dict[str, Snapshot | None]) -> list[str]:
    """``fsm show``'s line on an entity resting in a parallel state: each region's state, as
    its own row holds it (``rows``: :func:`fsm.regions.region_rows`), its path from the
    region down."""
    regions = {} if lifecycle is None else lifecycle.regions.get(snap.state, {})
    if not regions:
        return []
    parts: list[str] = []
    for region, cls in regions.items():
        row = rows.get(region)
        where = (
            "no row"
            if row is None
            else " > ".join(cls.table.configurations.get(row.state, (row.state,)))
            + (f" (held by {row.lease_owner})" if row.lease_owner else "")
        )
        parts.append(f"{region}: {where}")
    return [f"  regions of {snap.state}: {'; '.join(parts)}"]


def run_show(args: argparse.Namespace) -> int:
    """Exit codes: 0 shown; 2 a store that cannot be opened, a lifecycle that cannot be
    loaded, or no such entity."""
    from fsm.diagram.pending import pending_timers

    try:
        lifecycles = _lifecycles(getattr(args, "lifecycle", []))
    except FsmError as err:
        print(f"fsm show: error: {err}", file=sys.stderr)
        return 2
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
        now = store.now()
        kids = store.children(snap.id, limit=SHOWN_CHILDREN + 1)
        lifecycle = lifecycles.get(snap.kind)
        held_back = None if lifecycle is None else limit_wait(lifecycle, snap, store)
        regions = {} if lifecycle is None else region_rows(store, snap.id, lifecycle.regions.get(snap.state, {}))
    except FsmError as err:
        print(f"fsm show: error: {err}", file=sys.stderr)
        return 2
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
    timers = None if lifecycle is None else pending_timers(lifecycle.table, snap)
    if args.json:
        doc = {
            **_entity(snap),
            "waiting_for": held_back,
            "children": [{"id": c.id, "kind": c.kind, "state": c.state} for c in kids[:SHOWN_CHILDREN]],
            "more_children": len(kids) > SHOWN_CHILDREN,
            "timers": None if timers is None else [_timer(t, now) for t in timers],
            "history": [{**r._asdict(), "at": _when(r.at)} for r in history],
            "effects": [{**e._asdict(), "recorded_at": _when(e.recorded_at)} for e in effects],
        }
        print(json.dumps(doc, indent=2, sort_keys=False))
        return 0
    out = [
        f"{snap.kind} {snap.id}: {snap.state} (version {snap.version}"
        + (f", definition {snap.definition}" if snap.definition is not None else "")
        + f"){' [deleted]' if snap.deleted else ''}",
        f"  entered {_when(snap.state_entered_at)}; created {_when(snap.created_at)}; updated {_when(snap.updated_at)}",
        f"  attempt {snap.attempt}, reclaims {snap.reclaims}"
        + (f", due {_when(snap.run_after)}" if snap.run_after is not None else "")
        + (f", concurrency key {snap.concurrency_key}" if snap.concurrency_key else ""),
        (
            f"  lease: held by {snap.lease_owner}, token {snap.lease_token}, expires {_when(snap.lease_expires_at)}"
            if snap.lease_owner is not None
            else f"  lease: none (token {snap.lease_token})"
        ),
        *timer_lines(snap, timers, now),
        *([f"  {held_back}"] if held_back else []),
        *([f"  priority {snap.priority}"] if snap.priority else []),
        *([f"  parent: {snap.parent_id}"] if snap.parent_id is not None else []),
        *region_lines(lifecycle, snap, regions),
        *child_lines(kids),
        f"  data: {json.dumps(snap.data, sort_keys=True)}",
        *(
            [f"  history memory: {', '.join(f'{c} was left in {leaf}' for c, leaf in sorted(snap.memory.items()))}"]
            if snap.memory
            else []
        ),
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


__all__ = ["ReadOnlyStoreError", "open_readonly", "register", "run_migrate", "run_show", "timer_lines"]
