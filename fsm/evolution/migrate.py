"""``migrate_rows``: a lifecycle's declared migrations carried out on a store.

Every live entity of the lifecycle's kind is read in keyset pages (by id).  One that sits
in a state the definition lacks moves where the declared :class:`~fsm.evolution.Renamed`,
:class:`~fsm.evolution.Removed` or :class:`~fsm.evolution.Split` sends it; one whose data
was written under an older version gets the :class:`~fsm.evolution.DataMigration` it still
needs.  Each entity moves by one compare-and-set write at the version it was read at, the
way every transition does: event ``migrate``, actor ``migration``, a history row whose
reason names the migration, and the entity then records this definition's version (so a
worker of the old definition no longer claims it, and a data migration never applies
twice).  A write that lost a race (a worker claimed the entity meanwhile) changes nothing
and is tried again on the next pass.

An entity a worker holds (a fresh lease) is left to its holder and counted as waiting: the
old release's worker finishes or releases it, and a later pass moves it.  Resumable: a
run stopped at any point leaves every entity either moved or as it was, and running it
again moves the rest.  ``dry_run`` reads and reports what would move, and writes nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm.errors import FsmError, InvalidArgument, StaleVersion, UnknownEntity
from fsm.records import TimerMode, TransitionWrite

if TYPE_CHECKING:
    from collections.abc import Callable

    from fsm.lifecycle import Lifecycle
    from fsm.records import Snapshot
    from stores.base import Store

MIGRATE_EVENT = "migrate"
"""The event of every history row a migration writes."""
MIGRATION_ACTOR = "migration"
"""The actor of every history row a migration writes."""
PAGE = 200
EXAMPLES = 5


@dataclass
class MigrationReport:
    """What one :func:`migrate_rows` run did (or, with ``dry_run``, would do)."""

    kind: str
    version: int
    dry_run: bool = False
    examined: int = 0
    moved: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(from state, to state) -> entities moved."""
    rewritten: int = 0
    """Entities whose data a data migration rewrote (moved or not)."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Entities held by a worker (id -> state): left to their holder for a later pass."""
    raced: int = 0
    """Writes that lost to a concurrent writer (tried again on the next pass)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Entities a migration could not move (id -> why): a split's rule or a data migration
    that raised, or data the data model refuses.  Each is left as it was."""
    passes: int = 0

    @property
    def done(self) -> bool:
        """Nothing left to move: no entity waiting for its holder, none to retry, none failed."""
        return not self.waiting and not self.failed and not self.raced

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "dry_run": self.dry_run,
            "examined": self.examined,
            "moved": [{"from": a, "to": b, "count": n} for (a, b), n in sorted(self.moved.items())],
            "rewritten": self.rewritten,
            "waiting": dict(sorted(self.waiting.items())),
            "raced": self.raced,
            "failed": dict(sorted(self.failed.items())),
            "passes": self.passes,
            "done": self.done,
        }

    def render(self) -> str:
        verb = "would move" if self.dry_run else "moved"
        lines = [
            f"lifecycle {self.kind!r} to definition version {self.version}: {self.examined} entities read"
            f" in {self.passes} pass{'es' if self.passes != 1 else ''}"
            + (" (dry run: nothing written)" if self.dry_run else "")
        ]
        for (a, b), n in sorted(self.moved.items()):
            lines.append(f"  {verb} {n} from {a!r} to {b!r}")
        if self.rewritten:
            lines.append(f"  {'would rewrite' if self.dry_run else 'rewrote'} the data of {self.rewritten}")
        if not self.moved and not self.rewritten:
            lines.append("  nothing to move")
        if self.waiting:
            lines.append(
                f"  {len(self.waiting)} held by a worker, left to it: run again once released ({_ids(self.waiting)})"
            )
        if self.raced:
            lines.append(f"  {self.raced} changed by another writer meanwhile: run again")
        for entity_id, why in list(self.failed.items())[:EXAMPLES]:
            lines.append(f"  not moved: {entity_id}: {why}")
        if len(self.failed) > EXAMPLES:
            lines.append(f"  ... and {len(self.failed) - EXAMPLES} more not moved")
        return "\n".join(lines)


def _ids(items: dict[str, str]) -> str:
    shown = list(items)[:EXAMPLES]
    return ", ".join(shown) + (", ..." if len(items) > EXAMPLES else "")


def migrate_rows(
    lifecycle: type[Lifecycle],
    store: Store,
    *,
    dry_run: bool = False,
    page: int = PAGE,
    wait: float = 0.0,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> MigrationReport:
    """Carry out ``lifecycle``'s declared migrations on ``store``.

    ``wait``: seconds to keep making passes while entities are held by a worker or lost a
    race (0: one pass); ``poll``: seconds between passes.  Returns what was done; an entity
    that could not be moved is reported, never half-moved.
    """
    from fsm.lifecycle import Lifecycle

    if not (isinstance(lifecycle, type) and issubclass(lifecycle, Lifecycle) and lifecycle.states):
        raise InvalidArgument(f"migrate_rows takes a Lifecycle class, not {lifecycle!r}")
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= 10_000:
        raise InvalidArgument(f"page must be an integer from 1 to 10000, not {page!r}")
    for name, value in (("wait", wait), ("poll", poll)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 86_400:
            raise InvalidArgument(f"{name} must be a number of seconds from 0 to 86400, not {value!r}")
    report = MigrationReport(lifecycle.kind, lifecycle.version, dry_run=dry_run)
    deadline = time.monotonic() + wait
    while True:
        report.passes += 1
        report.waiting.clear()
        report.raced = 0
        report.failed.clear()
        _one_pass(lifecycle, store, report, page)
        if dry_run or report.done or time.monotonic() + poll > deadline:
            return report
        sleep(poll)


def _one_pass(lifecycle: type[Lifecycle], store: Store, report: MigrationReport, page: int) -> None:
    known = frozenset(lifecycle.table.leaves)
    after: str | None = None
    while True:
        rows = store.entities(lifecycle.kind, limit=page, after_id=after)
        now = store.now()
        for row in rows:
            report.examined += 1
            _migrate_one(lifecycle, store, row, now, known, report)
        if len(rows) < page:
            return
        after = rows[-1].id


def _migrate_one(
    lifecycle: type[Lifecycle], store: Store, row: Snapshot, now: Any, known: frozenset[str], report: MigrationReport
) -> None:
    from fsm.engine.arguments import validate_data

    evolution = lifecycle.evolution
    changes = evolution.data_since(row.definition)
    memory = _migrated_memory(lifecycle, row, known)
    if row.state in known and not changes and memory is None:
        return
    try:
        target, moves = evolution.resolve(row.state, row.data, known)
    except KeyError:
        return  # stranded: no migration moves it (fsm check reports it)
    except Exception as err:
        report.failed[row.id] = f"the split of {row.state!r} raised {type(err).__name__}: {err}"
        return
    data: dict[str, Any] | None = None
    if changes:
        try:
            new = evolution.migrated_data(row.data, changes)
            data = validate_data(lifecycle.data_model, lifecycle.kind, new, row.id)
        except FsmError as err:
            report.failed[row.id] = f"its migrated data is refused: {err}"
            return
        except Exception as err:
            report.failed[row.id] = f"its data migration raised {type(err).__name__}: {err}"
            return
    if row.lease_owner is not None and row.lease_expires_at is not None and row.lease_expires_at > now:
        report.waiting[row.id] = row.state
        return
    if report.dry_run:
        _count(report, row.state, target, data is not None)
        return
    steps = [m.describe() for m in moves] + [c.describe() for c in changes]
    write = TransitionWrite(
        row.id,
        MIGRATE_EVENT,
        row.state,
        target,
        MIGRATION_ACTOR,
        row.version,
        data=data,
        data_patch=None if data is None else _patch(row.data, data),
        reason=f"migrated to definition version {lifecycle.version}: {'; '.join(steps)}"[:1000],
        timer=_timer(lifecycle, row, target),
        definition=lifecycle.version,
        memory=memory,
    )
    try:
        store.apply(write)
    except (StaleVersion, UnknownEntity):
        report.raced += 1
        return
    _count(report, row.state, target, data is not None or memory is not None)


def _migrated_memory(lifecycle: type[Lifecycle], row: Snapshot, known: frozenset[str]) -> dict[str, str] | None:
    """The row's history memory as this definition holds it (a renamed or split leaf moved as
    the row's state would be; an entry it cannot hold dropped: its history state then takes
    its default), or ``None`` when it needs no change."""
    if not row.memory:
        return None
    remembered = lifecycle.table.remembered
    kept: dict[str, str] = {}
    for compound, left in row.memory.items():
        under = remembered.get(compound)
        if under is None:
            continue
        leaf = left
        if leaf not in under:
            try:
                leaf, _ = lifecycle.evolution.resolve(left, row.data, known)
            except Exception:  # removed, or a split that cannot decide: the history's default applies
                continue
        if leaf in under:
            kept[compound] = leaf
    return None if kept == row.memory else kept


def _count(report: MigrationReport, source: str, target: str, rewrote: bool) -> None:
    if source != target:
        report.moved[(source, target)] += 1
    if rewrote:
        report.rewritten += 1


def _timer(lifecycle: type[Lifecycle], row: Snapshot, target: str) -> TimerMode:
    """A timed target starts its clock now; a row leaving every timed state stops its own."""
    if row.state == target:
        return TimerMode.KEEP
    if lifecycle.table.timed.get(target) is not None:
        return TimerMode.ARM
    return TimerMode.CLEAR if row.timer_since is not None else TimerMode.KEEP


def _patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What the migration changed, as the history row records a handler's data: the
    fields it set (removed fields as ``None``)."""
    patch = {k: v for k, v in new.items() if old.get(k, _MISSING) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


_MISSING = object()

__all__ = ["MIGRATE_EVENT", "MIGRATION_ACTOR", "MigrationReport", "migrate_rows"]
