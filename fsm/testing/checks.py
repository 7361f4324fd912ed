"""The invariants the kit checks after every step, usable on their own (the fault suite
runs them over a whole database at the end).

Each check returns a list of problems (empty: it holds), worded to name the invariant,
the entity and what was found, so a failing hypothesis run reads as a bug report.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsm.evolution.migrate import MIGRATE_EVENT
from fsm.lifecycle import Lifecycle
from fsm.records import EFFECT_SUCCEEDED, EffectRecord, HistoryRecord, Snapshot
from fsm.regions import restart_reason


def history_problems(lifecycle: type[Lifecycle], snap: Snapshot, history: list[HistoryRecord]) -> list[str]:
    """I6 (seq runs 1..version) and I5 (final states absorb; at most one row enters one)."""
    problems: list[str] = []
    finals = lifecycle.table.finals
    seqs = [r.seq for r in history]
    if seqs != list(range(1, snap.version + 1)):
        problems.append(f"I6: history of {snap.id} has seq {seqs}, expected 1..{snap.version}")
    # a region's row starts a new visit each time its entity enters the parallel state again
    # (fsm.regions): final states absorb within a visit
    visit = history
    region_of = lifecycle.region_of
    if region_of is not None:
        restarts = [r.seq for r in history if r.reason == restart_reason(region_of[1])]
        if restarts:
            visit = [r for r in history if r.seq >= restarts[-1]]
    # a lifecycle migration's row relabels the entity (a renamed state, rewritten data): it
    # enters nothing, and may follow a final state's row
    entering = [r for r in visit if r.target in finals and r.event != MIGRATE_EVENT]
    if len(entering) > 1:
        problems.append(f"I5: {snap.id} entered a final state {len(entering)} times: {[r.seq for r in entering]}")
    after = [r for r in visit if entering and r.seq > entering[0].seq]
    if any(r.event != MIGRATE_EVENT for r in after):
        problems.append(f"I5: {snap.id} left final state {entering[0].target!r} (seq {entering[0].seq})")
    if entering and snap.state not in finals:
        problems.append(f"I5: {snap.id} is in {snap.state!r} after entering {entering[0].target!r}")
    previous = lifecycle.table.initial
    for record in history:
        if record.source != previous:
            problems.append(f"I6: {snap.id} seq {record.seq} starts from {record.source!r}, not {previous!r}")
        previous = record.target
    if history and history[-1].target != snap.state:
        problems.append(f"I6: {snap.id} is in {snap.state!r} but its last history row entered {history[-1].target!r}")
    return problems


_RESTORED: dict[tuple[type[Lifecycle], str], frozenset[str]] = {}


def restore_problems(lifecycle: type[Lifecycle], snap: Snapshot) -> list[str]:
    """A restore round trip: the StateChart rebuilt from the stored leaf is in the full
    configuration the table gives for it (``active`` + ``finalizing``).  Building a
    StateChart costs milliseconds and depends on the leaf only: each (class, leaf) is
    restored once per process."""
    expected = set(lifecycle.table.configurations[snap.state])
    found = _RESTORED.get((lifecycle, snap.state))
    if found is None:
        machine = lifecycle.restore(snap.state)
        found = frozenset(s.id for s in machine.configuration)
        if snap.state in lifecycle.table.parallel:
            # the chart enters its regions too; they are rows of their own (fsm.regions): the
            # entity's row stands for the parallel state and what holds it
            held = {s for configuration in lifecycle.table.configurations.values() for s in configuration}
            found = frozenset(found & held)
        _RESTORED[(lifecycle, snap.state)] = found
    if found != expected:
        return [f"restore: {snap.id} in {snap.state!r} restored to {sorted(found)}, expected {sorted(expected)}"]
    return []


def effect_problems(entity_id: str, effects: Iterable[EffectRecord]) -> list[str]:
    """I4: each effect key has at most one recorded result."""
    seen: dict[str, int] = {}
    for record in effects:
        seen[record.key] = seen.get(record.key, 0) + 1
    return [f"I4: effect {key!r} of {entity_id} has {n} recorded results" for key, n in seen.items() if n > 1]


def acknowledged_problems(entity_id: str, acks: Iterable[tuple[int, str]], history: list[HistoryRecord]) -> list[str]:
    """Every fire the caller saw succeed (``(seq, event)``) is in history (I8 across restarts)."""
    by_seq = {r.seq: r for r in history}
    return [
        f"I8: acknowledged {event!r} (seq {seq}) of {entity_id} is not in history"
        for seq, event in acks
        if seq not in by_seq or by_seq[seq].event != event
    ]


def succeeded(record: EffectRecord | None) -> bool:
    return record is not None and record.status == EFFECT_SUCCEEDED


__all__ = ["acknowledged_problems", "effect_problems", "history_problems", "restore_problems", "succeeded"]
