"""Transition coverage: which branches of a lifecycle a test suite fired, which never.

Fed by the ``transitioned`` signal while a suite runs (``with coverage.recording():``)
and/or by reading stores' history afterwards (``coverage.add_history(store)``), which also
sees the transitions a claim or a reaper batch made.  A history row is matched to the
declared branches with the same event, source, target and actor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import signals
from fsm.lifecycle import Lifecycle
from fsm.records import HistoryRecord
from fsm.table import Branch
from stores.base import Store


def branch_name(branch: Branch) -> str:
    """``reclaim: finalizing -> finalizing [lease_stale, reclaims_left] (reaper)``"""
    guards = f" [{', '.join(branch.guard_names)}]" if branch.guards else ""
    return f"{branch.event}: {branch.source} -> {branch.target_name}{guards} ({branch.actor.value})"


@dataclass(frozen=True)
class CoverageReport:
    """Fired and missed branches of one lifecycle, with how often each fired."""

    lifecycle: str
    fired: dict[str, int]
    missed: list[str]

    @property
    def complete(self) -> bool:
        return not self.missed

    def format(self) -> str:
        total = len(self.fired) + len(self.missed)
        lines = [f"{self.lifecycle}: {len(self.fired)}/{total} transitions fired"]
        lines += [f"  fired {n:>5}  {name}" for name, n in self.fired.items()]
        lines += [f"  NEVER FIRED  {name}" for name in self.missed]
        return "\n".join(lines)


class TransitionCoverage:
    """Counts the branches of some lifecycles that fired."""

    def __init__(self, *lifecycles: type[Lifecycle]) -> None:
        self.lifecycles = {lc.kind: lc for lc in lifecycles}
        self.counts: dict[str, Counter[str]] = {kind: Counter() for kind in self.lifecycles}

    def add(self, kind: str, event: str, source: str, target: str, actor: str) -> None:
        lifecycle = self.lifecycles.get(kind)
        if lifecycle is None:
            return
        for branch in lifecycle.table.branches_for(source, event):
            if target in branch.targets and branch.actor.value == actor:
                self.counts[kind][branch_name(branch)] += 1

    def add_records(self, kind: str, records: Iterable[HistoryRecord]) -> None:
        for r in records:
            self.add(kind, r.event, r.source, r.target, r.actor)

    def add_history(self, store: Store) -> None:
        """Read every entity of the covered kinds from ``store`` and count its history."""
        for kind in self.lifecycles:
            after: str | None = None
            while True:
                page = store.entities(kind, limit=500, after_id=after)
                for snap in page:
                    self.add_records(kind, store.history(snap.id))
                if len(page) < 500:
                    break
                after = page[-1].id

    def _receive(self, sender: Any, payload: Any = None) -> None:
        record = payload.record
        self.add(payload.kind, record.event, record.source, record.target, record.actor)

    @contextmanager
    def recording(self) -> Iterator[TransitionCoverage]:
        """Count every ``transitioned`` signal sent inside the block."""
        signals.transitioned.connect(self._receive, weak=False)
        try:
            yield self
        finally:
            signals.transitioned.disconnect(self._receive)

    def report(self, lifecycle: type[Lifecycle]) -> CoverageReport:
        counts = self.counts[lifecycle.kind]
        names = list(dict.fromkeys(branch_name(b) for b in lifecycle.table.declared))
        return CoverageReport(
            lifecycle=lifecycle.__name__,
            fired={n: counts[n] for n in names if counts[n]},
            missed=[n for n in names if not counts[n]],
        )

    def format(self) -> str:
        return "\n".join(self.report(lc).format() for lc in self.lifecycles.values())


__all__ = ["CoverageReport", "TransitionCoverage", "branch_name"]
