"""Retention for the engine: :meth:`fsm.Engine.prune` removes its lifecycle's finished entities.

The store removes (:meth:`stores.Store.prune`); the engine knows which states are final
(its compiled table) and what "older than" means on the store's clock, and walks the
batches.  Each batch is one transaction of the store; a batch that fails raises, and the
batches before it stay removed (each one is whole).

Which states may be pruned is decided here, the one level that knows: the store sits below
the lifecycles and cannot tell a final state from another (:meth:`stores.Store.prune` removes
the states it is given, after checking only their shape: 1 to 100 non-empty names).  So
:func:`prune` takes no states from its caller; it always passes its compiled table's final
states, and ``fsm prune`` (:mod:`fsm.reaping.prune_cli`) goes through it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from fsm.errors import InvalidArgument
from stores.retention import MAX_PRUNE_BATCH

DEFAULT_PRUNE_BATCH = 500


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :meth:`fsm.Engine.prune` removed (or, in a dry run, would remove)."""

    kind: str
    before: datetime
    """The cut-off: entities last updated before it (store clock)."""
    removed: list[str] = field(default_factory=list)
    """Their ids, oldest first (in a dry run: the first ``MAX_PRUNE_BATCH`` that would go)."""
    dry_run: bool = False
    batches: int = 0
    more: bool = False
    """A dry run found more than it lists."""
    regions: tuple[PruneResult, ...] = ()
    """For a lifecycle with parallel states: what the same cut removed of its regions' rows
    (:mod:`fsm.regions`), one result per region's lifecycle."""

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        more = " or more" if self.more else ""
        rows = sum(len(r.removed) for r in self.regions)
        rows_more = " or more" if any(r.more for r in self.regions) else ""
        regions = f"; and {rows}{rows_more} of their regions' rows" if self.regions else ""
        return (
            f"{self.kind}: {verb} {len(self.removed)}{more} final entities last updated before "
            f"{self.before.isoformat()} (with their history, effects and renewals){regions}"
        )


def check_older_than(older_than: Any) -> timedelta:
    """``older_than`` as a positive timedelta (seconds taken too), or ``InvalidArgument``."""
    if isinstance(older_than, bool) or not isinstance(older_than, timedelta | int | float):
        raise InvalidArgument(f"older_than must be a timedelta (or seconds), not {older_than!r:.80}")
    age: timedelta
    if isinstance(older_than, timedelta):
        age = older_than
    else:
        if not math.isfinite(older_than):
            raise InvalidArgument(f"older_than must be finite, not {older_than!r}")
        try:
            age = timedelta(seconds=older_than)
        except OverflowError as err:
            raise InvalidArgument(f"older_than is out of range: {older_than!r:.80}") from err
    if age <= timedelta(0):
        raise InvalidArgument(f"older_than must be positive, not {age}")
    return age


def prune(engine: Any, older_than: Any, batch_size: Any, dry_run: Any) -> PruneResult:
    """:meth:`fsm.Engine.prune`; a lifecycle with parallel states prunes its regions' final
    rows with the same cut (an entity's region rows ended before it did, so they go with it;
    a region row gone before its entity's join counts as ended: :func:`fsm.regions.all_final`)."""
    result = _prune(engine, older_than, batch_size, dry_run)
    regions = [engine.region(r) for found in engine.table.parallel.values() for r in found]
    if not regions:
        return result
    return replace(result, regions=tuple(_prune(r, older_than, batch_size, dry_run) for r in regions))


def _prune(engine: Any, older_than: Any, batch_size: Any, dry_run: Any) -> PruneResult:
    age = check_older_than(older_than)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_PRUNE_BATCH:
        raise InvalidArgument(f"batch_size must be an integer from 1 to {MAX_PRUNE_BATCH}, not {batch_size!r:.80}")
    if not isinstance(dry_run, bool):
        raise InvalidArgument(f"dry_run must be True or False, not {dry_run!r:.80}")
    finals = tuple(sorted(engine.table.finals))
    if not finals:
        return PruneResult(engine.kind, engine.store.now(), dry_run=dry_run)
    try:
        before = engine.store.now() - age
    except OverflowError as err:
        raise InvalidArgument(f"older_than reaches before year 1: {age}") from err
    if dry_run:
        ids = engine.store.prune(engine.kind, finals, before, limit=MAX_PRUNE_BATCH, dry_run=True)
        return PruneResult(engine.kind, before, ids, True, 1, len(ids) == MAX_PRUNE_BATCH)
    removed = _partitions(engine.store, {engine.kind: finals}, before).get(engine.kind, [])
    return _batches(engine, finals, before, batch_size, removed)


def _partitions(store: Any, rules: dict[str, tuple[str, ...]], before: datetime) -> dict[str, list[str]]:
    """A store with a partitioned history drops the partitions whose entities all go
    (:mod:`stores.sql.partitions`); the ids it removed, by kind."""
    drop = getattr(store, "prune_partitions", None)
    found: dict[str, list[str]] = {}
    if drop is None or not rules:
        return found
    for kind, entity_id in drop(rules, before):
        found.setdefault(kind, []).append(entity_id)
    return found


def _batches(
    engine: Any, finals: tuple[str, ...], before: datetime, batch_size: int, removed: list[str]
) -> PruneResult:
    batches = 0
    while True:
        ids = engine.store.prune(engine.kind, finals, before, limit=batch_size)
        batches += 1
        removed += ids
        if len(ids) < batch_size:
            return PruneResult(engine.kind, before, removed, False, batches)


def prune_all(engines: Sequence[Any], older_than: Any, batch_size: Any) -> list[PruneResult]:
    """``fsm prune`` over several lifecycles of one store: one cut for all, and partitions
    (a partitioned history holds every lifecycle's entities) dropped for all of them at
    once before each lifecycle's batches; then as :func:`prune`, lifecycle by lifecycle.
    A dry run, or a single lifecycle, is :func:`prune` itself."""
    # each region of a parallel state is a lifecycle of its own: pruned with its lifecycle
    engines = [*engines, *(e.region(r) for e in engines for found in e.table.parallel.values() for r in found)]
    if len(engines) < 2:
        return [_prune(engine, older_than, batch_size, False) for engine in engines]
    age = check_older_than(older_than)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_PRUNE_BATCH:
        raise InvalidArgument(f"batch_size must be an integer from 1 to {MAX_PRUNE_BATCH}, not {batch_size!r:.80}")
    store = engines[0].store
    try:
        before = store.now() - age
    except OverflowError as err:
        raise InvalidArgument(f"older_than reaches before year 1: {age}") from err
    rules = {e.kind: tuple(sorted(e.table.finals)) for e in engines if e.table.finals}
    dropped = _partitions(store, rules, before)
    results = []
    for engine in engines:
        finals = rules.get(engine.kind)
        if not finals:
            results.append(PruneResult(engine.kind, before))
            continue
        results.append(_batches(engine, finals, before, batch_size, dropped.get(engine.kind, [])))
    return results


__all__ = ["DEFAULT_PRUNE_BATCH", "PruneResult", "check_older_than", "prune", "prune_all"]
