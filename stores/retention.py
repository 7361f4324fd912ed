"""Retention: what the stores remove, and only when told to.

Nothing is ever removed by itself: entities, their history, their effects (results of the
effects ledger) and their renewal logs stay until :meth:`stores.Store.prune` removes
finished entities older than a retention, or :meth:`stores.Store.trim_history` cuts a log
kept as an entity's history (the reaper's tick log) to its last rows.

This module holds the argument checks both share on every store, and the memory store's
implementation (:class:`MemoryRetention`); the SQL store's is
:mod:`stores.sql.retention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fsm.errors import InvalidArgument, UnknownEntity
from fsm.limits import check_id

if TYPE_CHECKING:
    from fsm.records import EffectRecord, HistoryRecord, Snapshot

MAX_PRUNE_BATCH = 10_000
"""The most entities one :meth:`~stores.Store.prune` call removes (one transaction)."""
MAX_STATES = 100


def check_prune(
    kind: Any, states: Any, before: Any, limit: Any, dry_run: Any
) -> tuple[str, tuple[str, ...], datetime, int, bool]:
    """The checked arguments of :meth:`stores.Store.prune`, or ``InvalidArgument``."""
    kind = check_id("kind", kind)
    if isinstance(states, str) or not isinstance(states, Sequence | frozenset | set):
        raise InvalidArgument(f"states must be a sequence of state names, not {states!r:.80}")
    states = tuple(states)
    if not 1 <= len(states) <= MAX_STATES:
        raise InvalidArgument(f"states must name 1 to {MAX_STATES} states, not {len(states)}")
    states = tuple(check_id("state", s) for s in states)
    if not isinstance(before, datetime) or before.tzinfo is None:
        raise InvalidArgument(f"before must be a timezone-aware datetime, not {before!r:.80}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PRUNE_BATCH:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_PRUNE_BATCH}, not {limit!r:.80}")
    if not isinstance(dry_run, bool):
        raise InvalidArgument(f"dry_run must be True or False, not {dry_run!r:.80}")
    return kind, states, before, limit, dry_run


def check_trim(entity_id: Any, keep: Any) -> tuple[str, int]:
    """The checked arguments of :meth:`stores.Store.trim_history`, or ``InvalidArgument``."""
    entity_id = check_id("entity id", entity_id)
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= 2**31:
        raise InvalidArgument(f"keep must be an integer from 1 to 2**31, not {keep!r:.80}")
    return entity_id, keep


class MemoryRetention:
    """:meth:`prune` and :meth:`trim_history` of :class:`stores.MemoryStore` (its lock and
    dictionaries, see there)."""

    _lock: Any
    _rows: dict[str, Snapshot]
    _history: dict[str, list[HistoryRecord]]
    _keys: dict[tuple[str, str], HistoryRecord]
    _effects: dict[str, dict[str, EffectRecord]]
    _by_concurrency_key: dict[tuple[str, str], list[str]]
    _feed: list[tuple[str, HistoryRecord]]

    def _forget_in_feed(self, gone: set[str] | None = None, records: list[HistoryRecord] | None = None) -> None:
        """Mark removed history rows in the memory feed (kind ``""``, skipped by ``feed``):
        positions are indices, so the list keeps its length and every cursor stays valid."""
        feed = getattr(self, "_feed", None)
        if not feed:
            return
        ids = {id(r) for r in records or ()}
        for index, (kind, record) in enumerate(feed):
            if kind and ((gone is not None and record.entity_id in gone) or id(record) in ids):
                feed[index] = ("", record)

    def prune(
        self, kind: str, states: Sequence[str], before: datetime, *, limit: int = 500, dry_run: bool = False
    ) -> list[str]:
        kind, wanted, before, limit, dry_run = check_prune(kind, states, before, limit, dry_run)
        finals = set(wanted)
        with self._lock:
            found = sorted(
                (
                    row
                    for row in self._rows.values()
                    # a held row is live work, whatever states the caller named
                    if row.kind == kind and row.state in finals and row.updated_at < before and row.lease_owner is None
                ),
                key=lambda row: (row.updated_at, row.id),
            )[:limit]
            ids = [row.id for row in found]
            if dry_run:
                return ids
            for row in found:
                del self._rows[row.id]
                for record in self._history.pop(row.id, ()):
                    if record.idempotency_key is not None:
                        self._keys.pop((row.id, record.idempotency_key), None)
                self._effects.pop(row.id, None)
                if row.concurrency_key is not None:
                    siblings = self._by_concurrency_key.get((row.kind, row.concurrency_key), [])
                    if row.id in siblings:
                        siblings.remove(row.id)
                    if not siblings:
                        self._by_concurrency_key.pop((row.kind, row.concurrency_key), None)
            if ids:
                self._forget_in_feed(gone=set(ids))
            return ids

    def trim_history(self, entity_id: str, keep: int) -> int:
        entity_id, keep = check_trim(entity_id, keep)
        with self._lock:
            if entity_id not in self._rows:
                raise UnknownEntity(entity_id)
            log = self._history[entity_id]
            cut = max(0, len(log) - keep)
            for record in log[:cut]:
                if record.idempotency_key is not None:
                    self._keys.pop((entity_id, record.idempotency_key), None)
            if cut:
                self._forget_in_feed(records=log[:cut])
            del log[:cut]
            return cut


__all__ = ["MAX_PRUNE_BATCH", "MemoryRetention", "check_prune", "check_trim"]
