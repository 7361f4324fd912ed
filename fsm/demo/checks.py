"""The invariants (DESIGN section 10) a run can check from the store and the event log.

Each check returns :class:`Finding`\\ s; ``fsm demo`` prints them and exits non-zero when
one is broken, and the process tests assert that none is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from fsm.demo.proc import GATES
from fsm.demo.scenario import JobStory, Timing
from fsm.records import Actor, HistoryRecord

EPSILON = 0.01
"""Seconds of rounding between the store's timestamps and the processes' clocks."""


@dataclass(frozen=True)
class Finding:
    """One invariant on one entity (or on the whole run): held or broken, and why."""

    invariant: str
    subject: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant} {'ok' if self.ok else 'BROKEN'} [{self.subject}]: {self.detail}"


def check_history(entity_id: str, history: list[HistoryRecord], version: int, finals: Iterable[str]) -> list[Finding]:
    """I5 (at most one row enters a final state, and it is the last) and I6 (seq 1..version)."""
    finals = set(finals)
    seqs = [r.seq for r in history]
    found = [
        Finding(
            "I6",
            entity_id,
            seqs == list(range(1, version + 1)),
            f"history seq {seqs[:3]}{'...' if len(seqs) > 3 else ''} for version {version}",
        )
    ]
    entering = [i for i, r in enumerate(history) if r.target in finals]
    absorbing = len(entering) <= 1 and (not entering or entering[0] == len(history) - 1)
    found.append(Finding("I5", entity_id, absorbing, f"{len(entering)} row(s) entering a final state"))
    return found


def check_story(story: JobStory, timing: Timing) -> list[Finding]:
    """I1-I5 for one seeds/002 job, from its history, its ledger and its processes' logs."""
    job = story.name
    found: list[Finding] = []
    reaper_rows = [r for r in story.history if r.actor == Actor.REAPER.value]
    # I1: no expire or reclaim out of finalizing while the lease was fresh
    lapse = story.lapse
    early = [
        r for r in reaper_rows if r.source == "finalizing" and (lapse is None or r.at.timestamp() < lapse - EPSILON)
    ]
    if story.fenced_token is None:
        found.append(
            Finding(
                "I1",
                job,
                not reaper_rows,
                f"the reaper ticked {len(story.ticks)} times and moved the live finalizer {len(reaper_rows)} times",
            )
        )
    else:
        found.append(
            Finding("I1", job, not early, f"{len(reaper_rows)} reaper move(s), {len(early)} before the lease lapsed")
        )
        # I2: a dead (or stopped) holder's entity is reclaimed within TTL + interval
        reclaims = story.rows("reclaim")
        if not reclaims or lapse is None:
            found.append(Finding("I2", job, False, "never reclaimed"))
        else:
            late = reclaims[0].at.timestamp() - lapse
            bound = timing.interval + timing.slack
            found.append(
                Finding(
                    "I2",
                    job,
                    late <= bound,
                    f"reclaimed {max(late, 0):.2f} s after the lease lapsed (bound: interval "
                    f"{timing.interval:g} s + slack {timing.slack:g} s)",
                )
            )
        # I3: nothing the fenced holder wrote after it was fenced survives
        fenced_at = min(t for t, sig, _ in story.marks) if story.marks else story.t_end
        stale = [
            e.key for e in story.effects if e.lease_token == story.fenced_token and _after(e.recorded_at, fenced_at)
        ]
        stale += [
            r.event for r in story.history if r.lease_token == story.fenced_token and r.at.timestamp() > fenced_at
        ]
        accepted = story.of("accepted")
        found.append(
            Finding(
                "I3",
                job,
                not stale and not accepted,
                f"{len(story.of('refused'))} late write(s) refused, {len(stale) + len(accepted)} accepted",
            )
        )
    # I4: one recorded result per gate, never re-executed once recorded
    recorded_at = {e.key: e.recorded_at.timestamp() for e in story.effects if e.recorded_at is not None}
    again = [g for t, g, _, _ in story.executions if g in recorded_at and t > recorded_at[g] + EPSILON]
    one_each = all(story.recorded(g) == 1 for g in GATES)
    runs = len(story.executions)
    bound = len(GATES) + len(story.in_flight)
    found.append(
        Finding(
            "I4",
            job,
            one_each and not again and runs <= bound,
            f"{runs} execution(s) for {len(GATES)} gates (at most {bound}), one result each: {one_each}, "
            f"re-run after being recorded: {len(again)}",
        )
    )
    completes = len(story.rows("complete"))
    found.append(Finding("I5", job, story.state == "completed" and completes == 1, f"completed {completes} time(s)"))
    return found


def _after(when: object, t: float) -> bool:
    return isinstance(when, datetime) and when.timestamp() > t


def broken(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


__all__ = ["Finding", "broken", "check_history", "check_story"]
