"""``check_store``: what a store holds that a lifecycle definition could not run.

Run before a deploy (``fsm check MODULE:Class --db URL``, or from a test): it reads every
live entity of the lifecycle's kind, in keyset pages, and every schedule of it, and says

- which entities are in a state the definition lacks, and whether a declared migration
  moves them (``to migrate``) or nothing does (``stranded``: no claim, no reaper rule and
  no read would ever touch them again);
- which entities hold data the definition's data model refuses, after the declared data
  migrations they still need;
- which entities a *newer* definition already wrote (this definition's workers leave them);
- which schedules would create runs the data model refuses;
- how many of those entities a worker holds right now (a migration waits for them).

Read-only; the cost is one read of every live row of the kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm.errors import FsmError, InvalidArgument
from fsm.evolution.declare import Split

if TYPE_CHECKING:
    from fsm.lifecycle import Lifecycle
    from stores.base import Store

PAGE = 500
EXAMPLES = 5
"""How many entity ids a report names per finding."""


@dataclass
class Finding:
    """One kind of trouble (or of pending work) and the entities it concerns."""

    what: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, entity_id: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(entity_id)

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "count": self.count, "examples": list(self.examples)}


@dataclass
class CheckReport:
    """What :func:`check_store` found; ``ok`` when nothing would be stranded or refused."""

    kind: str
    version: int
    entities: int = 0
    states: Counter[str] = field(default_factory=Counter)
    problems: dict[str, Finding] = field(default_factory=dict)
    pending: dict[str, Finding] = field(default_factory=dict)
    """Entities a declared migration will move or rewrite (``fsm migrate-rows``)."""
    held: int = 0
    """Of the entities in :attr:`problems` and :attr:`pending`, how many a worker holds now."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, key: str, what: str) -> Finding:
        return self.problems.setdefault(key, Finding(what))

    def todo(self, key: str, what: str) -> Finding:
        return self.pending.setdefault(key, Finding(what))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "ok": self.ok,
            "entities": self.entities,
            "states": dict(sorted(self.states.items())),
            "problems": [f.to_dict() for f in self.problems.values()],
            "pending": [f.to_dict() for f in self.pending.values()],
            "held": self.held,
        }

    def render(self) -> str:
        """The report as the command prints it."""
        states = ", ".join(f"{s} {n}" for s, n in sorted(self.states.items())) or "none"
        lines = [
            f"lifecycle {self.kind!r}, definition version {self.version}: {self.entities} live entities",
            f"  by state: {states}",
        ]
        for title, findings in (("problems", self.problems), ("to migrate (fsm migrate-rows)", self.pending)):
            if not findings:
                continue
            lines.append(f"  {title}:")
            for f in findings.values():
                shown = ", ".join(f.examples) + (", ..." if f.count > len(f.examples) else "")
                lines.append(f"    {f.count} {f.what} (e.g. {shown})" if shown else f"    {f.count} {f.what}")
        if self.held:
            lines.append(f"  {self.held} of them held by a worker now: a migration moves them once released")
        lines.append(
            "ok: nothing would be stranded"
            if self.ok
            else "FAILED: deploying this definition would strand or refuse the entities above"
        )
        return "\n".join(lines)


def check_store(lifecycle: type[Lifecycle], store: Store, *, page: int = PAGE) -> CheckReport:
    """Compare ``lifecycle`` (the definition about to deploy) with what ``store`` holds."""
    from fsm.lifecycle import Lifecycle

    if not (isinstance(lifecycle, type) and issubclass(lifecycle, Lifecycle) and lifecycle.states):
        raise InvalidArgument(f"check_store takes a Lifecycle class, not {lifecycle!r}")
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= 10_000:
        raise InvalidArgument(f"page must be an integer from 1 to 10000, not {page!r}")
    report = CheckReport(lifecycle.kind, lifecycle.version)
    known = frozenset(lifecycle.table.leaves)
    evolution = lifecycle.evolution
    now = store.now()
    after: str | None = None
    while True:
        rows = store.entities(lifecycle.kind, limit=page, after_id=after)
        for row in rows:
            _check_row(lifecycle, row, known, evolution, now, report)
        if len(rows) < page:
            break
        after = rows[-1].id
    _check_schedules(lifecycle, store, report)
    return report


def _check_row(
    lifecycle: type[Lifecycle], row: Any, known: frozenset[str], evolution: Any, now: Any, report: CheckReport
) -> None:
    from fsm.engine.arguments import validate_data

    report.entities += 1
    report.states[row.state] += 1
    held = row.lease_owner is not None and row.lease_expires_at is not None and row.lease_expires_at > now
    concerned = False
    written = row.definition
    if written is not None and written > lifecycle.version:
        report.problem(
            f"newer:{written}",
            f"written by definition version {written}, newer than this one: its workers will not claim them",
        ).add(row.id)
        concerned = True
    if row.state not in known:
        concerned = True
        entry = evolution.by_source.get(row.state)
        if entry is None:
            report.problem(
                f"stranded:{row.state}",
                f"in state {row.state!r}, which this definition lacks and no migration moves: stranded",
            ).add(row.id)
        else:
            move = entry[1]
            target = "a state its split chooses" if isinstance(move, Split) else repr(move.targets[0])
            report.todo(f"move:{row.state}", f"in {row.state!r} to move to {target} ({move.describe()})").add(row.id)
    changes = evolution.data_since(written)
    try:
        data = evolution.migrated_data(row.data, changes)
    except Exception as err:
        report.problem("data-migration", f"whose data migration fails ({type(err).__name__}: {err})").add(row.id)
        concerned = True
    else:
        if changes:
            report.todo("data", f"with data to rewrite ({', '.join(c.describe() for c in changes)})").add(row.id)
            concerned = True
        try:
            validate_data(lifecycle.data_model, lifecycle.kind, data, row.id)
        except FsmError as err:
            report.problem("data", f"with data the data model refuses ({_first_error(err)})").add(row.id)
            concerned = True
    if concerned and held:
        report.held += 1


def _first_error(err: FsmError) -> str:
    errors = getattr(err, "errors", None)
    if errors:
        first = errors[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "data"
        return f"{loc}: {first.get('msg', err)}"
    return str(err)


def _check_schedules(lifecycle: type[Lifecycle], store: Store, report: CheckReport) -> None:
    from fsm.engine.arguments import validate_data
    from fsm.scheduling.service import ACTIVE, PAUSED, SCHEDULE_KIND, schedule_row_id

    prefix = schedule_row_id(lifecycle.kind, "")
    after: str | None = prefix
    while True:
        rows = store.entities(SCHEDULE_KIND, limit=PAGE, after_id=after)
        mine = [r for r in rows if r.id.startswith(prefix)]
        for row in mine:
            if row.state not in (ACTIVE, PAUSED):
                continue
            stored = row.data.get("schedule")
            data = stored.get("data") if isinstance(stored, dict) else None
            try:
                validate_data(lifecycle.data_model, lifecycle.kind, dict(data or {}), row.id)
            except FsmError as err:
                report.problem(
                    "schedule", f"schedules whose runs' data the data model refuses ({_first_error(err)})"
                ).add(row.id)
        if len(rows) < PAGE or len(mine) < len(rows):
            break
        after = rows[-1].id


__all__ = ["CheckReport", "Finding", "check_store"]
