"""``fsm schedules``: list, add, pause, resume and delete stored schedules.

::

    fsm schedules add nightly --cron "30 2 * * *" --timezone Europe/Berlin --db URL
    fsm schedules add heartbeat --every 30 --lifecycle etl:EtlRun --db URL
    fsm schedules list --db URL
    fsm schedules pause nightly --db URL

The runs themselves are created by the reaper (``fsm reaper``, or a worker's with
``reap=True``) of the schedule's lifecycle.  Exit codes: 0 done; 2 bad arguments, an
unknown schedule, or a store that cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from fsm.errors import FsmError

ACTIONS = ("list", "add", "pause", "resume", "delete")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "schedules",
        help="list, add, pause, resume or delete schedules (one run per due time)",
        description="Manage stored schedules; the reaper of their lifecycle creates the runs.",
    )
    parser.add_argument("action", choices=ACTIONS, help="what to do")
    parser.add_argument("schedule_id", nargs="?", help="the schedule's id (every action but list)")
    parser.add_argument("--db", default="sqlite:///fsm.db", help="store URL (default: %(default)s)")
    parser.add_argument("--prefix", default="fsm_", help="table prefix of a SQL store (default: %(default)s)")
    parser.add_argument(
        "--lifecycle",
        metavar="MODULE:Class",
        help="the lifecycle whose entities the schedule creates (default: the built-in job)",
    )
    parser.add_argument("--cron", help='add: a cron expression, e.g. "30 2 * * *" (needs the cron extra)')
    parser.add_argument("--every", type=float, metavar="SECONDS", help="add: a fixed interval in seconds")
    parser.add_argument("--timezone", default="UTC", help="add: the cron expression's time zone (default: UTC)")
    parser.add_argument("--data", default=None, metavar="JSON", help="add: each run's data, a JSON object")
    parser.add_argument("--overlap", default="skip", help="add: skip, allow or cancel (default: skip)")
    parser.add_argument("--catch-up", default="latest", help="add: none, latest or all (default: latest)")
    parser.add_argument("--priority", type=int, default=0, help="add: each run's claim priority, -100 to 100")
    parser.add_argument("--replace", action="store_true", help="add: replace a schedule with other settings")
    parser.add_argument("--json", action="store_true", help="list: one JSON object per schedule")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fsm.commands import ReadOnlyStoreError, open_readonly
    from fsm.diagram.refs import load_lifecycle_here
    from fsm.engine import Engine
    from fsm.lifecycles import JobLifecycle
    from fsm.scheduling import Schedule, Schedules

    prog = "fsm schedules"
    if args.action != "list" and not args.schedule_id:
        print(f"{prog}: error: {args.action} needs a schedule id", file=sys.stderr)
        return 2
    try:
        lifecycle = load_lifecycle_here(args.lifecycle) if args.lifecycle else JobLifecycle
        store = open_readonly(args.db, args.prefix, prog)
    except (FsmError, ReadOnlyStoreError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    schedules = Schedules(Engine(lifecycle, store))
    try:
        if args.action == "list":
            for state in schedules.list():
                _print_state(state, as_json=args.json)
            return 0
        if args.action == "add":
            try:
                data = None if args.data is None else json.loads(args.data)
            except ValueError as err:
                raise ValueError(f"--data is not JSON: {err}") from None
            schedule = Schedule(
                args.schedule_id,
                cron=args.cron,
                every=args.every,
                timezone=args.timezone,
                data=data,
                overlap=args.overlap,
                catch_up=args.catch_up,
                priority=args.priority,
            )
            state = schedules.add(schedule, replace=args.replace)
        elif args.action == "pause":
            state = schedules.pause(args.schedule_id)
        elif args.action == "resume":
            state = schedules.resume(args.schedule_id)
        else:
            schedules.delete(args.schedule_id)
            print(f"deleted {args.schedule_id}")
            return 0
        _print_state(state, as_json=False)
        return 0
    except (FsmError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _print_state(state: Any, *, as_json: bool) -> None:
    spec = state.schedule
    if as_json:
        print(
            json.dumps(
                {
                    "id": spec.id,
                    **spec.to_data(),
                    "paused": state.paused,
                    "next_due": _when(state.next_due) if state.next_due else None,
                    "last_run": state.last_run,
                }
            )
        )
        return
    when = f"cron {spec.cron!r} {spec.timezone}" if spec.cron else f"every {spec.every.total_seconds():g}s"
    status = "paused" if state.paused else f"next {_when(state.next_due)}"
    print(
        f"{spec.id}: {when}, overlap {spec.overlap.value}, catch-up {spec.catch_up.value}; {status}; "
        f"last run {state.last_run or '-'}"
    )


__all__ = ["register", "run"]
