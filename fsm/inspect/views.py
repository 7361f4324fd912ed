"""The overview's operator sections: charts, holders, the stored schedules, the reaper's
ticks (idle ones folded) and moves, and the entity page's attempts and diagram fallback.
Every database value goes through :func:`esc`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fsm.diagram.pending import PendingTimer, other_guards
from fsm.inspect.activity import Activity, Holder
from fsm.inspect.cache import Cached
from fsm.inspect.charts import bars
from fsm.inspect.data import SCHEDULES_SHOWN, ReaperTick, ScheduleList, ScheduleRow
from fsm.inspect.timeline import (
    ATTEMPT_HELP,
    ERROR_HELP,
    RUNS_HELP,
    age,
    attempt_numbers,
    clock,
    error_label,
    esc,
    span,
    stamp,
    timer_when,
)
from fsm.records import HistoryRecord
from fsm.timers import format_delay

ROWS_OF_TICKS = 8
"""Rows the ticks table shows (idle ticks folded first)."""
HOLDERS_SHOWN = 50
"""Owners the holders table shows (most held first)."""


def cache_note(cached: Cached[Any], what: str, problem: str | None = None) -> str:
    """ "counts as of 4s ago (took 120 ms)", and why the last recount failed, if it did."""
    age_s = cached.age()
    note = f"{what} as of {span(timedelta(seconds=age_s))} ago · took {cached.took * 1000:.0f} ms"
    trouble = f" <span class=expired>last recount failed: {esc(problem)}</span>" if problem else ""
    return f"<span class=muted data-age='{age_s:.1f}'>{esc(note)}</span>{trouble}"


def recorded(h: HistoryRecord) -> Any:
    """What a history row records of an attempt: its ``error`` column (the worker's handler
    errors: type, message, traceback, attempt), else its data (an error a caller put there)."""
    if isinstance(h.error, dict):
        return {"error": h.error, "attempt": h.error.get("attempt", "")}
    return h.data


def error_of(data: Any) -> str:
    """The error a history row's data records (``error``: text, or ``{type, message}``), or ''."""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    if isinstance(error, dict):
        kind, message = error.get("type") or "", error.get("message") or ""
        return f"{kind}: {message}" if kind and message else str(kind or message)
    return "" if error is None else str(error)


def traceback_of(data: Any) -> str:
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    found = error.get("traceback") if isinstance(error, dict) else data.get("traceback")
    return found if isinstance(found, str) else ""


def failure_of(last: HistoryRecord | None) -> str:
    """What the list shows in its failure column: the last transition's reason and error."""
    if last is None:
        return ""
    parts = [p for p in (last.reason or "", error_of(recorded(last))) if p]
    return " · ".join(parts)


# -- charts ------------------------------------------------------------------------------------


def activity_section(cached: Cached[Activity], ticks: list[ReaperTick]) -> str:
    a = cached.value
    scope = (
        f"the newest {a.sampled:,} entities changed in the hour; more changed"
        if a.capped
        else f"all {a.sampled:,} entities changed in the hour"
    )
    per_tick = [float(_moved(t.summary)) for t in reversed(ticks)]
    charts = [
        bars("Transitions per minute", [float(v) for v in a.transitions], css="c-transitions", name="transitions"),
        bars("Claims per minute", [float(v) for v in a.claims], css="c-claims", name="claims"),
        bars("Claim latency from due, median", a.latency, unit=" s", css="c-latency", name="latency"),
        bars("Reaper moves per minute", [float(v) for v in a.reaper], css="c-reaper", name="reaper"),
    ]
    if per_tick:
        first = ticks[-1].at
        charts.append(
            bars(
                "Reaper: moved per tick",
                per_tick,
                css="c-ticks",
                name="ticks",
                minute_labels=(clock(first, a.now), "latest tick"),
            )
        )
    return (
        f"<section class=activity><h2>Last hour <span class=muted>(from {esc(scope)}) ·</span> "
        f"{cache_note(cached, 'charts')}</h2><div class=charts>{''.join(charts)}</div></section>"
    )


def _moved(summary: dict[str, Any]) -> int:
    moved = summary.get("moved")
    return sum(v for v in moved.values() if isinstance(v, int)) if isinstance(moved, dict) else 0


# -- holders -----------------------------------------------------------------------------------


def holders_section(now: datetime, cached: Cached[list[Holder]]) -> str:
    holders = cached.value
    note = cache_note(cached, "holders")
    if not holders:
        return (
            f"<section class=holders><h2>Workers holding leases {note}</h2>"
            "<p class=empty>No lease is held right now.</p></section>"
        )
    rows = []
    for h in holders[:HOLDERS_SHOWN]:
        ids = ", ".join(f"<a href='{esc('/entity?' + urlencode({'id': i}))}'>{esc(i)}</a>" for i in h.ids) + (
            f" and {h.held - len(h.ids)} more" if h.held > len(h.ids) else ""
        )
        lapsed = f"<span class=expired>{h.expired} lapsed</span>" if h.expired else ""
        renewal = (
            f"<span title='{esc(stamp(h.last_renewal))}'>{esc(age(now, h.last_renewal))}</span>"
            if h.last_renewal is not None
            else "<span class=muted>none logged</span>"
        )
        link = "/?" + urlencode({"holder": h.owner})
        rows.append(
            f"<tr data-holder='{esc(h.owner)}'><td class=id><a href='{esc(link)}'>{esc(h.owner)}</a></td>"
            f"<td class=n>{h.held}</td><td>{lapsed}</td><td>{renewal}</td>"
            f"<td title='{esc(stamp(h.soonest))}'>{esc(age(now, h.soonest))}</td><td class=id>{ids}</td></tr>"
        )
    hidden = len(holders) - HOLDERS_SHOWN
    more = f"<p class=muted>{hidden} more owners not shown.</p>" if hidden > 0 else ""
    return (
        "<section class=holders><h2>Workers holding leases <span class=muted>owners with a lease, most held "
        f"first</span> {note}</h2><table><tr><th>owner</th><th class=n>holds</th><th></th><th>last renewal</th>"
        f"<th>soonest expiry</th><th>what it holds</th></tr>{''.join(rows)}</table>{more}</section>"
    )


# -- schedules ---------------------------------------------------------------------------------

OVERLAP_HELP = {
    "skip": "a due time passes while the last run is not final: nothing is created for it",
    "allow": "a due time creates its run even while the last run is not final",
    "cancel": "a due time cancels the last run if it is not final, then creates its run",
}
CATCH_UP_HELP = {
    "none": "missed due times are skipped: a due time runs only when the reaper reaches it within the grace",
    "latest": "of the due times missed (every process down), the most recent runs once",
    "all": "every missed due time runs (the most recent 1000 at most)",
}


def _interval(seconds: float) -> str:
    """``30s``, ``1h30m``: a stored number of seconds as diagrams write a delay."""
    if not 0 <= seconds <= 1e9:  # a damaged row (NaN, negative, huge): as stored
        return f"{seconds:g}s"
    return format_delay(timedelta(seconds=seconds))


def _schedule_when(r: ScheduleRow) -> str:
    """ "cron <code>30 2 * * *</code> Europe/Berlin", or "every 30s"."""
    if r.cron is not None:
        return f"cron <code>{esc(r.cron)}</code> <span class=muted>{esc(r.timezone)}</span>"
    if r.every is not None:
        return f"every <code>{esc(_interval(r.every))}</code>"
    return "<span class=muted>unknown</span>"


def _schedule_next(now: datetime, r: ScheduleRow) -> str:
    """The next due time: relative, then absolute; a past one is marked (the reaper's next tick creates it)."""
    if r.paused:
        return "<span class=muted>none while paused</span>"
    if r.next_due is None:
        return "<span class=muted>not set</span>"
    if r.next_due <= now:
        relative = (
            f"<span class='when due overdue' title='the reaper creates its run at its next tick'>"
            f"due {esc(span(now - r.next_due))} ago</span>"
        )
    else:
        relative = f"<span class=when>{esc(age(now, r.next_due))}</span>"
    return f"{relative} <span class=muted>{esc(stamp(r.next_due))}</span>"


def _schedule_last(r: ScheduleRow, runs: dict[str, tuple[str, bool]]) -> str:
    """The last run, linked to its page while it is stored, with its state."""
    if r.last_run is None:
        return "<span class=muted>none yet</span>"
    found = runs.get(r.last_run)
    if found is None:
        return f"<span class=id>{esc(r.last_run)}</span> <span class=muted>(no longer stored)</span>"
    state, deleted = found
    gone = " <span class=expired>deleted</span>" if deleted else ""
    return (
        f"<a class='id last-run' href='{esc('/entity?' + urlencode({'id': r.last_run}))}'>{esc(r.last_run)}</a> "
        f"<span class='state s-{esc(state)}'>{esc(state)}</span>{gone}"
    )


def schedules_section(now: datetime, listed: ScheduleList) -> str:
    """The stored schedules, by lifecycle and id: when each runs, its overlap and catch-up
    policies, active or paused, its next due time, its last run.  Nothing when the store
    has no schedule."""
    if listed.problem is not None:
        return (
            "<section class=schedules><h2>Schedules</h2>"
            f"<p class=problem><span class=expired>{esc(listed.problem)}</span></p></section>"
        )
    if not listed.rows:
        return ""
    paused = sum(1 for r in listed.rows if r.paused)
    head = (
        "<tr><th>lifecycle</th><th>schedule</th><th>when</th><th>overlap</th><th>catch-up</th><th>status</th>"
        "<th>next due</th><th>last run</th><th></th></tr>"
    )
    rows = []
    for r in listed.rows:
        status = "paused" if r.paused else "active"
        grace = f"; grace {_interval(r.grace)}" if r.grace is not None else ""
        problem = f" <span class=expired title='{esc(r.problem)}'>damaged row</span>" if r.problem else ""
        runs_url = "/?" + urlencode({"kind": r.kind, "q": f"{r.schedule_id}@"})
        row_url = "/entity?" + urlencode({"id": r.row_id})
        rows.append(
            f"<tr data-schedule='{esc(r.kind)}/{esc(r.schedule_id)}' data-status='{status}'>"
            f"<td>{esc(r.kind)}</td><td class=id>{esc(r.schedule_id)}{problem}</td>"
            f"<td class=schedule-when>{_schedule_when(r)}</td>"
            f"<td title='{esc(OVERLAP_HELP.get(r.overlap, ''))}'>{esc(r.overlap)}</td>"
            f"<td title='{esc(CATCH_UP_HELP.get(r.catch_up, '') + grace)}'>{esc(r.catch_up)}</td>"
            f"<td><span class='state sched-{status}'>{status}</span></td>"
            f"<td class=next-due>{_schedule_next(now, r)}</td><td>{_schedule_last(r, listed.runs)}</td>"
            f"<td class=links><a class=runs href='{esc(runs_url)}' title='the entities it created'>runs</a> "
            f"<a class=history href='{esc(row_url)}' title='what each step of the schedule did'>history</a></td></tr>"
        )
    more = (
        f"<p class=muted>The first {SCHEDULES_SHOWN} active and {SCHEDULES_SHOWN} paused schedules are listed.</p>"
        if listed.more
        else ""
    )
    said = f"{len(listed.rows) - paused} active, {paused} paused · the reaper creates each run: {{id}}@{{due time}}"
    return (
        f"<section class=schedules><h2>Schedules <span class=muted>{esc(said)}</span></h2>"
        f"<table>{head}{''.join(rows)}</table>{more}</section>"
    )


# -- the reaper --------------------------------------------------------------------------------


def _scheduled(summary: dict[str, Any]) -> str:
    """ "scheduled job 2": the runs the tick's schedules created, when its log records them."""
    found = summary.get("scheduled")
    if not isinstance(found, dict) or not any(found.values()):
        return ""
    return "scheduled " + ", ".join(f"{k} {v}" for k, v in sorted(found.items()) if v)


def _idle(summary: dict[str, Any]) -> bool:
    keys = ("lost_races", "refused", "bad_rows", "errors")
    quiet = _moved(summary) == 0 and not any(summary.get(k) for k in keys) and not _scheduled(summary)
    return quiet and summary.get("leading") is not False


def _count(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key, 0)
    bad = " bad" if key in {"errors", "bad_rows"} and value else ""
    return f"<td class='n{bad}'>{esc(value)}</td>"


def ticks_section(now: datetime, ticks: list[ReaperTick]) -> str:
    """The reaper's tick log, newest first: runs of idle ticks (nothing moved, nothing went
    wrong) folded into one line, so a quiet reaper takes one row, failures in red."""
    if not ticks:
        return (
            "<section class=ticks><h2>Reaper: recent ticks</h2><p class=empty>No tick recorded. "
            "<code>fsm reaper</code> records each tick; a reaper embedded in an application records "
            "them with <code>TickLog(store).record(result, reaper.owner)</code>.</p></section>"
        )
    groups: list[list[ReaperTick]] = []
    for t in ticks:
        if groups and _idle(t.summary) and _idle(groups[-1][-1].summary):
            groups[-1].append(t)
        else:
            groups.append([t])
    head = (
        "<tr><th>when</th><th>reaper</th><th class=n>moved</th><th>what moved</th><th class=n>lost races</th>"
        "<th class=n>refused</th><th class=n>bad rows</th><th class=n>errors</th><th class=n>took</th></tr>"
    )
    rows = []
    for group in groups[:ROWS_OF_TICKS]:
        t = group[0]
        s = t.summary
        if len(group) > 1:
            owners = sorted({str(g.summary.get("owner", "")) for g in group})
            rows.append(
                f"<tr class=idle data-idle-ticks='{len(group)}'><td title='{esc(stamp(t.at))}'>{esc(age(now, t.at))}"
                f"</td><td class=id>{esc(', '.join(owners))}</td><td class=n>0</td><td colspan=6 class=muted>"
                f"{len(group)} idle ticks, {esc(clock(group[-1].at, now))} - {esc(clock(t.at, now))}: nothing to move"
                "</td></tr>"
            )
            continue
        moved = s.get("moved") if isinstance(s.get("moved"), dict) else {}
        assert isinstance(moved, dict)
        what = ", ".join(f"{k} {v}" for k, v in moved.items()) or "nothing"
        if _scheduled(s):
            what += "; " + _scheduled(s)
        if s.get("leading") is False:
            what = "skipped: another reaper leads"
        elif s.get("enabled") is False:
            what = "skipped: disabled"
        rows.append(
            f"<tr data-tick='{t.seq}'><td title='{esc(stamp(t.at))}'>{esc(age(now, t.at))}</td>"
            f"<td class=id>{esc(s.get('owner', ''))}</td><td class=n>{_moved(s)}</td><td>{esc(what)}</td>"
            f"{_count(s, 'lost_races')}{_count(s, 'refused')}{_count(s, 'bad_rows')}{_count(s, 'errors')}"
            f"<td class=n>{esc(s.get('duration_ms', ''))} ms</td></tr>"
        )
    more = len(groups) - ROWS_OF_TICKS
    tail = f"<p class=muted>{more} older rows not shown.</p>" if more > 0 else ""
    return (
        "<section class=ticks><h2>Reaper: recent ticks <span class=muted>newest first, idle ticks folded</span></h2>"
        f"<table>{head}{''.join(rows)}</table>{tail}</section>"
    )


def moves_section(now: datetime, activity: Activity) -> str:
    """The reaper's moves of the last hour (from the sample), one row per commit."""
    moves = activity.moves
    if not moves:
        return (
            "<section class=reaper><h2>Reaper: recent moves</h2><p class=empty>The reaper moved nothing in the "
            "last hour (it records its moves in each entity's history).</p></section>"
        )
    rows = []
    batches: dict[datetime, list[Any]] = {}
    for m in moves:
        batches.setdefault(m.at, []).append(m)
    for at, batch in list(batches.items())[:20]:
        summary: dict[str, int] = {}
        for m in batch:
            label = f"{m.kind} {m.event} {m.source}→{m.target}" + (f" ({m.reason})" if m.reason else "")
            summary[label] = summary.get(label, 0) + 1
        what = "; ".join(f"{n} x {label}" for label, n in summary.items())
        ids = ", ".join(m.entity_id for m in batch[:5]) + (f" and {len(batch) - 5} more" if len(batch) > 5 else "")
        rows.append(
            f"<tr><td title='{esc(stamp(at))}'>{esc(age(now, at))}</td><td class=n>{len(batch)}</td>"
            f"<td>{esc(what)}</td><td class=id>{esc(ids)}</td></tr>"
        )
    return (
        "<section class=reaper><h2>Reaper: recent moves <span class=muted>(the last hour, grouped by commit)"
        "</span></h2><table><tr><th>when</th><th>moved</th><th>what</th><th>entities</th></tr>"
        + "".join(rows)
        + "</table></section>"
    )


# -- one entity --------------------------------------------------------------------------------


def attempts_section(
    now: datetime, history: list[HistoryRecord], starts: frozenset[str] = frozenset(), current: int | None = None
) -> str:
    """Each attempt's error: every transition that records an error or a reason, newest
    first, with the entity's attempt then (its starts ``starts`` so far, made up to the
    entity's ``current`` attempt when older history is gone) and, for a handler error, which
    error of its state it was (its ``error_record`` attempt: "error 2 in finalizing").  A
    legend says what each number counts (:mod:`fsm.inspect.timeline`)."""
    numbers = attempt_numbers(history, starts, current)
    failed = [h for h in history if error_of(recorded(h)) or (h.reason and h.target != h.source)]
    if not failed:
        return "<section class=attempts><h2>Errors by attempt</h2><p class=empty>No error recorded.</p></section>"
    rows = []
    for h in reversed(failed):
        found = recorded(h)
        data = found if isinstance(found, dict) else {}
        attempt = numbers.get(h.seq, "")
        trace = traceback_of(data)
        detail = f"<details><summary>traceback</summary><pre>{esc(trace)}</pre></details>" if trace else ""
        rows.append(
            f"<tr data-attempt-seq='{h.seq}'><td title='{esc(stamp(h.at))}'>{esc(age(now, h.at))}</td>"
            f"<td class=n>{esc(attempt)}</td><td class=of-state>{esc(error_label(h))}</td>"
            f"<td>#{h.seq} {esc(f'{h.event}: {h.source} → {h.target}')}</td>"
            f"<td>{esc(h.actor)}</td><td>{esc(h.reason or '')}</td>"
            f"<td class=error>{esc(error_of(data))}{detail}</td></tr>"
        )
    unknown = "" if numbers else " (unknown here: this lifecycle was not given to fsm inspect)"
    return (
        "<section class=attempts><h2>Errors by attempt <span class=muted>newest first</span></h2><table>"
        f"<tr><th>when</th><th class=n title='{esc(ATTEMPT_HELP)}'>attempt</th>"
        f"<th title='{esc(ERROR_HELP)}'>handler error</th><th>transition</th><th>by</th><th>reason</th>"
        f"<th>error</th></tr>{''.join(rows)}</table>"
        f"<p class=legend>{esc(ATTEMPT_HELP + unknown)}; {esc(ERROR_HELP)}; an effect's {esc(RUNS_HELP)}.</p>"
        "</section>"
    )


def transition_table(
    lifecycle: Any,
    state: str,
    problem: str,
    timers: Sequence[PendingTimer] = (),
    now: datetime | None = None,
) -> str:
    """The diagram's fallback without Graphviz: the lifecycle's transitions as a table, the
    rows out of the current state (or one of its parents) marked, and how to get the picture.
    A timed transition reads ``timeout after 24h`` (its generated guard is not listed); the
    row of a timer the entity is waiting out (``timers``) says when it is due."""
    table = lifecycle.table
    active = set(table.configurations.get(state, (state,)))
    waiting = {(t.event, t.state, t.target, t.after): t for t in timers}
    rows = []
    for b in table.declared:
        here = b.source in active or b.declared_on in active
        guards = ", ".join(other_guards(b))
        event = esc(b.event)
        if b.after is not None:
            event += f" <span class=timer>after {esc(format_delay(b.after))}</span>"
            timer = waiting.get((b.event, b.declared_on, b.declared_target, b.after)) if b.source == state else None
            if timer is not None and now is not None:
                event += f" <span class=timer-due>due {timer_when(now, timer)}</span>"
        rows.append(
            f"<tr class='{'current' if here else ''}' data-from='{esc(b.source)}'><td>{event}</td>"
            f"<td>{esc(b.source)}</td><td>{esc(b.target)}</td><td>{esc(b.actor_name)}</td><td>{esc(guards)}</td></tr>"
        )
    return (
        f"<div class=diagram-fallback><p class=meta>Current state: <span class='state s-{esc(state)}'>{esc(state)}"
        f"</span>; its transitions are marked.</p><table class=transitions><tr><th>event</th><th>from</th><th>to</th>"
        f"<th>by</th><th>guards</th></tr>{''.join(rows)}</table>"
        f"<p class=hint>No picture: {esc(problem)}</p></div>"
    )


__all__ = [
    "activity_section",
    "attempts_section",
    "cache_note",
    "error_of",
    "failure_of",
    "holders_section",
    "moves_section",
    "recorded",
    "schedules_section",
    "ticks_section",
    "transition_table",
]
