"""One entity's timeline, newest first: transitions, the reaper's moves, recorded effects, the
holder's progress, and its lease renewals; above them, the timers it is waiting out, at
their due time (:mod:`fsm.diagram.pending`), the one part of the timeline still to come.

A long job renews every third of its TTL, so the renewals are folded: consecutive renewals of
one lease (same owner and token, nothing else in between) are one line, "renewed 14 times by
worker-a, 10:01:02-10:05:40 UTC, about every 20s, lease until 10:06:10".  Any other event
ends the run, so the timeline stays in time order.  Every value from the database goes
through :func:`esc` (owners, keys, reasons are attacker-controlled text).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fsm.diagram.pending import PendingTimer, duration
from fsm.records import EffectRecord, HistoryRecord, LeaseRenewal


def esc(value: object) -> str:
    """``value`` as HTML text (quotes escaped too: safe in quoted attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def span(delta: timedelta) -> str:
    """A short human length of time: ``45s``, ``3m 05s``, ``2h 10m``, ``3d 4h`` (``0s`` under
    a second: the page's ages are to the second); :func:`fsm.diagram.pending.duration`'s."""
    return duration(delta) if abs(delta) >= timedelta(seconds=1) else "0s"


def age(now: datetime, then: datetime | None) -> str:
    """How long ago ``then`` was (``in 40s`` when it is later than ``now``)."""
    if then is None:
        return ""
    delta = now - then
    return f"in {span(delta)}" if delta < timedelta() else f"{span(delta)} ago"


def stamp(when: datetime | None) -> str:
    return "" if when is None else when.strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(when: datetime, now: datetime) -> str:
    """A time of day, with the date when it is not today's (UTC)."""
    return when.strftime("%H:%M:%S" if when.date() == now.date() else "%Y-%m-%d %H:%M:%S")


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@dataclass
class RenewalRun:
    """Consecutive renewals of one lease, folded into one line."""

    owner: str
    token: int
    renewals: list[LeaseRenewal] = field(default_factory=list)

    @property
    def first(self) -> datetime:
        return self.renewals[0].at

    @property
    def last(self) -> datetime:
        return self.renewals[-1].at


Event = HistoryRecord | EffectRecord | LeaseRenewal | RenewalRun
"""A timeline line; an ``EffectRecord`` keyed ``fsm:progress`` is the holder's progress."""

# -- the three counts called "attempt" ---------------------------------------------------------
#
# The records hold three numbers an operator reads as attempts, and they count different things:
#
# - ``Snapshot.attempt``: the entity's starts, one per claim that takes it out of the queue (a
#   transition declared with ``counts_attempt``); a finalizer resumed after a retry or a
#   reclaim keeps its attempt.  ``Policy.max_attempts`` bounds it (the reaper's requeues);
# - the ``attempt`` of a handler error (``fsm.records.error_record``, in a history row's
#   ``error``): the n-th error of the handler *of that state*, counted per state from the
#   ``retry`` transitions out of it (the worker's :class:`~fsm.policy.RetryPolicy` bounds it);
# - ``EffectRecord.attempts``: how many times that one effect ran and recorded its outcome (a
#   failed effect runs again on the next try; a succeeded one is replayed, never run again).
#
# The page names them apart: "attempt N" is always the first (a history row's attempt is the
# entity's attempt when the row was written), "error N in STATE" the second, "ran N times"
# the third.

RETRY_EVENT = "retry"
"""The event the worker fires when its RetryPolicy retries a handler error (fsm.work)."""
ATTEMPT_HELP = (
    "attempt: the entity's attempt counter, one per claim that started it from the queue "
    "(a finalizer resumed after a retry or a reclaim keeps its attempt)"
)
ERROR_HELP = (
    "error N in STATE: the N-th handler error in that state, which the worker's RetryPolicy "
    "counts per state (it retries while N < its max_attempts)"
)
RUNS_HELP = (
    "runs: how many times that effect ran and recorded its outcome "
    "(a failed effect runs again on the next try; a succeeded one is replayed, never run again)"
)


def attempt_numbers(history: list[HistoryRecord], starts: frozenset[str], current: int | None = None) -> dict[int, int]:
    """The entity's attempt when each history row (by ``seq``) was written: the starts
    (``starts``: the events that count an attempt) up to and including it.  With the
    entity's ``current`` attempt, older rows the store no longer keeps are made up for, so
    the newest row's number is the entity's.  Empty without ``starts`` (unknown lifecycle)."""
    if not starts:
        return {}
    seen, numbers = 0, {}
    for h in history:
        seen += h.event in starts
        numbers[h.seq] = seen
    missing = current - seen if current is not None and current > seen else 0
    return {seq: n + missing for seq, n in numbers.items()}


def retries_by_state(history: list[HistoryRecord]) -> dict[str, int]:
    """How many times the worker retried a handler error out of each state."""
    found: dict[str, int] = {}
    for h in history:
        if h.event == RETRY_EVENT:
            found[h.source] = found.get(h.source, 0) + 1
    return found


def error_label(h: HistoryRecord) -> str:
    """ "error 2 in finalizing" for a row recording a handler error, else ''."""
    if not isinstance(h.error, dict):
        return ""
    n = h.error.get("attempt")
    return f"error {n} in {h.source}" if isinstance(n, int) and not isinstance(n, bool) else f"error in {h.source}"


def runs(n: int) -> str:
    return f"ran {n} time" + ("" if n == 1 else "s")


def events(
    history: list[HistoryRecord],
    effects: list[EffectRecord],
    progress: EffectRecord | None,
    renewals: list[LeaseRenewal],
) -> list[Event]:
    """Every line of the timeline, oldest first, renewals folded into runs."""
    timed: list[tuple[datetime, int, int, Event]] = [(h.at, 0, h.seq, h) for h in history]
    timed += [(r.at, 1, i, r) for i, r in enumerate(renewals)]
    timed += [(e.recorded_at, 2, i, e) for i, e in enumerate(effects) if e.recorded_at is not None]
    if progress is not None and progress.recorded_at is not None:
        timed.append((progress.recorded_at, 3, 0, progress))
    timed.sort(key=lambda item: item[:3])
    lines: list[Event] = []
    for _, _, _, event in timed:
        if isinstance(event, LeaseRenewal) and not event.acquired:
            last = lines[-1] if lines else None
            if isinstance(last, RenewalRun) and (last.owner, last.token) == (event.owner, event.token):
                last.renewals.append(event)
                continue
            lines.append(RenewalRun(event.owner, event.token, [event]))
            continue
        lines.append(event)
    return lines


def _when(now: datetime, at: datetime) -> str:
    return f"<span class=when title='{esc(stamp(at))}'>{esc(age(now, at))}</span>"


def _line(now: datetime, event: Event, after: Event | None = None, numbers: dict[int, int] | None = None) -> str:
    """One line; ``after`` is the next event in time (a reaper move after a run of renewals
    that ran out says why the reaper moved: the holder stopped renewing); ``numbers`` the
    entity's attempt at each history row (:func:`attempt_numbers`)."""
    if isinstance(event, HistoryRecord):
        h = event
        kind = "reaper" if h.actor == "reaper" else "transition"
        facts = [f"by {h.actor}", f"token {h.lease_token}"]
        if h.owner:
            facts.append(f"owner: {h.owner}")
        if h.reason:
            facts.append(f"reason: {h.reason}")
        if h.idempotency_key:
            facts.append(f"key: {h.idempotency_key}")
        data = f"<pre>{esc(pretty_json(h.data))}</pre>" if h.data else ""
        if isinstance(h.error, dict):  # a handler's failed try (fsm.records.error_record)
            attempt = (numbers or {}).get(h.seq)
            which = (f"attempt {attempt}, " if attempt else "") + error_label(h)
            failure = f"{which}: {h.error.get('type')}: {h.error.get('message')}"
            data += f"<p class=error title='{esc(ATTEMPT_HELP)}; {esc(ERROR_HELP)}'>{esc(failure)}</p>"
        return (
            f"<li class='ev {kind}' data-seq='{h.seq}'>{_when(now, h.at)}<span class=tag>"
            f"{'reaper move' if kind == 'reaper' else 'transition'}</span> "
            f"<b>#{h.seq} {esc(f'{h.event}: {h.source} → {h.target}')}</b> "
            f"<span class=muted>{esc(', '.join(facts))}</span>{data}</li>"
        )
    if isinstance(event, RenewalRun):
        run, last = event, event.renewals[-1]
        n = len(run.renewals)
        until = f"lease until {clock(last.expires_at, now)}"
        if isinstance(after, HistoryRecord) and after.actor == "reaper" and last.expires_at <= after.at:
            until = f"then no renewal: the lease lapsed at {clock(last.expires_at, now)}"
        if n == 1:
            what = f"renewed by {run.owner}"
            detail = f"token {run.token}, at {clock(last.at, now)} UTC, {until}"
        else:
            every = span((run.last - run.first) / (n - 1))
            what = f"renewed {n} times by {run.owner}"
            detail = (
                f"token {run.token}, {clock(run.first, now)} - {clock(run.last, now)} UTC, about every {every}, {until}"
            )
        return (
            f"<li class='ev renewal' data-renewals='{n}' data-owner='{esc(run.owner)}'>{_when(now, last.at)}"
            f"<span class=tag>lease renewal</span> <b>{esc(what)}</b> <span class=muted>{esc(detail)}</span></li>"
        )
    if isinstance(event, LeaseRenewal):  # a lease taken outside a transition
        r = event
        detail = f"token {r.token}, at {clock(r.at, now)} UTC, lease until {clock(r.expires_at, now)}"
        return (
            f"<li class='ev renewal acquired' data-owner='{esc(r.owner)}'>{_when(now, r.at)}"
            f"<span class=tag>lease taken</span> <b>{esc(f'{r.owner} took the lease')}</b> "
            f"<span class=muted>{esc(detail)}</span></li>"
        )
    e = event
    assert e.recorded_at is not None
    if e.status == "progress":
        return (
            f"<li class='ev progress'>{_when(now, e.recorded_at)}<span class=tag>progress</span> "
            f"<b>latest progress reported by the holder</b> <span class=muted>token {e.lease_token}</span>"
            f"<pre>{esc(pretty_json(e.result))}</pre></li>"
        )
    return (
        f"<li class='ev effect {esc(e.status)}'>{_when(now, e.recorded_at)}<span class=tag>effect</span> "
        f"<b>{esc(e.key)}</b> <span class=muted title='{esc(RUNS_HELP)}'>"
        f"{esc(f'{e.status}, token {e.lease_token}, {runs(e.attempts)}')}</span></li>"
    )


TIMER_HELP = (
    "a timed transition: the reaper fires it once the entity has been in the timed state this long "
    "(and the transition's other guards hold), unless another transition leaves that state first"
)


def timer_when(now: datetime, timer: PendingTimer) -> str:
    """ "in 23h 59m" (or "overdue by 5m 02s", marked), the due time as its tooltip."""
    overdue = " overdue" if timer.is_due(now) else ""
    return f"<span class='when due{overdue}' title='{esc(stamp(timer.due))}'>{esc(timer.until(now))}</span>"


def timer_line(now: datetime, timer: PendingTimer) -> str:
    """A pending timer's line, at the top of the timeline: what fires, when, and what else it needs."""
    facts = [f"after {timer.delay} in {timer.state}", "by reaper"]
    if timer.reason:
        facts.append(f"reason: {timer.reason}")
    if timer.guards:
        facts.append(f"also needs {', '.join(timer.guards)}")
    overdue = " overdue" if timer.is_due(now) else ""
    return (
        f"<li class='ev timer{overdue}' data-timer='{esc(timer.event)}' data-due='{esc(timer.due.isoformat())}' "
        f"title='{esc(TIMER_HELP)}'>{timer_when(now, timer)}<span class=tag>timer{overdue or ' due'}</span> "
        f"<b>{esc(f'{timer.event}: {timer.state} → {timer.target}')}</b> "
        f"<span class=muted>{esc(', '.join(facts))} · due {esc(stamp(timer.due))}</span></li>"
    )


def timeline(
    now: datetime,
    history: list[HistoryRecord],
    effects: list[EffectRecord],
    progress: EffectRecord | None,
    renewals: list[LeaseRenewal],
    numbers: dict[int, int] | None = None,
    timers: Sequence[PendingTimer] = (),
) -> str:
    """The timeline as an ordered list, newest first; ``numbers``: the entity's attempt at
    each history row (:func:`attempt_numbers`), said beside a handler error; ``timers``:
    the ones it is waiting out, on top (the latest due first: the list runs back in time)."""
    lines = events(history, effects, progress, renewals)
    later: list[Event | None] = [*lines[1:], None] if lines else []  # an entity never fired has no line
    body = "".join(_line(now, e, after, numbers) for e, after in reversed(list(zip(lines, later, strict=True))))
    body = body or "<li class=empty>Nothing recorded yet.</li>"
    ahead = "".join(timer_line(now, t) for t in sorted(timers, key=lambda t: t.due, reverse=True))
    return f"<ol class=timeline>{ahead}{body}</ol>"


__all__ = [
    "ATTEMPT_HELP",
    "ERROR_HELP",
    "RETRY_EVENT",
    "RUNS_HELP",
    "TIMER_HELP",
    "RenewalRun",
    "age",
    "attempt_numbers",
    "clock",
    "error_label",
    "esc",
    "events",
    "retries_by_state",
    "runs",
    "span",
    "stamp",
    "timeline",
    "timer_line",
    "timer_when",
]
