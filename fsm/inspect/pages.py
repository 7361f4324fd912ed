"""The inspector's HTML: every value from the database goes through :func:`esc`.

Entity ids, data, reasons, owners and effect results are attacker-controlled text: they
are only ever rendered escaped (``html.escape`` with quotes), as element text or quoted
attribute values, and URLs carry them percent-encoded.  The pages load one script from
``/static/inspect.js`` (no inline script; the Content-Security-Policy forbids any).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple
from urllib.parse import urlencode

from fsm.diagram.pending import PendingTimer
from fsm.inspect.activity import Activity, Holder
from fsm.inspect.cache import Cached
from fsm.inspect.data import FLAG_CAP, RESERVED_KINDS, Filters, Flags, ReaperTick, RenewalLog, ScheduleList
from fsm.inspect.listing import Listed
from fsm.inspect.timeline import (
    ATTEMPT_HELP,
    RUNS_HELP,
    TIMER_HELP,
    age,
    attempt_numbers,
    esc,
    pretty_json,
    retries_by_state,
    runs,
    span,
    stamp,
    timeline,
    timer_when,
)
from fsm.inspect.views import (
    activity_section,
    attempts_section,
    cache_note,
    failure_of,
    holders_section,
    moves_section,
    schedules_section,
    ticks_section,
)
from fsm.records import EffectRecord, HistoryRecord, Snapshot


def entity_url(entity_id: str) -> str:
    return "/entity?" + urlencode({"id": entity_id})


def page(
    title: str,
    body: str,
    *,
    live: str,
    refresh_ms: int,
    badge: str = "read-only",
    events: str = "",
    settle_ms: int = 0,
) -> str:
    """A whole page; the element ``#live`` is refreshed from ``live`` when the event stream
    ``events`` tells of a transition (and ``settle_ms`` and twice that later, for what a
    cache recounts), or every ``refresh_ms`` where the browser cannot keep the stream open."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)}</title><link rel=stylesheet href=/static/inspect.css></head><body>"
        f"<header><a class=home href=/>fsm inspect</a> <span class=ro>{esc(badge)}</span>"
        "<span id=status class=status>live</span></header>"
        f"<main id=live data-src='{esc(live)}' data-every='{int(refresh_ms)}' "
        f"data-events='{esc(events)}' data-settle='{int(settle_ms)}'>{body}</main>"
        "<script src=/static/inspect.js></script></body></html>"
    )


# -- the overview ------------------------------------------------------------------------------


def counts_section(
    counts: Cached[dict[str, dict[str, int]]],
    leaves: dict[str, list[str]],
    cached_flags: Cached[Flags],
    problem: str | None,
) -> str:
    found, flags = counts.value, cached_flags.value
    note = cache_note(counts, "counts", problem)
    if flags.expired or flags.waiting:
        note += " <span class=muted>·</span> " + cache_note(cached_flags, "flags")
    if not found:
        return f"<section><h2>Counts {note}</h2><p class=empty>No entities in this store yet.</p></section>"
    parts = [f"<section class=counts><h2>Counts by lifecycle and state {note}</h2><div class=cards>"]
    for kind in sorted(found):
        states = leaves.get(kind) or sorted(found[kind])
        extra = [s for s in sorted(found[kind]) if s not in states]
        total = sum(found[kind].values())
        head = f"<h3>{esc(kind)} <span class=total>{total:,} total</span></h3>"
        stuck = flags.expired.get(kind, 0)
        if stuck:
            shown = f"{stuck:,}+" if stuck >= FLAG_CAP else f"{stuck:,}"
            head += (
                f"<p class=alert data-expired='{esc(kind)}' title='their holder stopped renewing; the reaper moves "
                f"them at its next tick'><a href='{esc('/?' + urlencode({'kind': kind, 'expired': '1'}))}'>"
                f"{shown} with an expired lease</a></p>"
            )
        for state, n in sorted(flags.waiting.get(kind, {}).items()):
            shown = f"{n:,}+" if n >= FLAG_CAP else f"{n:,}"
            head += (
                f"<p class=alert data-waiting='{esc(kind)}/{esc(state)}' title='in {esc(state)} with no holder: "
                "reclaimed or released, waiting for a worker to claim and resume it'>"
                f"<a href='{esc('/?' + urlencode({'kind': kind, 'state': state}))}'>{shown} {esc(state)} waiting "
                "for a worker</a></p>"
            )
        parts.append(f"<div class=card data-kind='{esc(kind)}'>{head}<table>")
        for state in [*states, *extra]:
            n = found[kind].get(state, 0)
            url = "/?" + urlencode({"kind": kind, "state": state})
            unknown = " class=unknown title='not a state of the lifecycle'" if state in extra else ""
            parts.append(
                f"<tr{unknown}><td><a href='{esc(url)}'>{esc(state)}</a></td>"
                f"<td class=n data-count='{esc(kind)}/{esc(state)}'>{n}</td></tr>"
            )
        parts.append("</table></div>")
    parts.append("</div></section>")
    return "".join(parts)


def filter_form(filters: Filters, kinds: Iterable[str]) -> str:
    options = "".join(
        f"<option value='{esc(k)}'{' selected' if k == filters.kind else ''}>{esc(k)}</option>" for k in kinds
    )
    return (
        "<form class=filters method=get action=/>"
        f"<label>lifecycle <select name=kind><option value=''>all</option>{options}</select></label>"
        f"<label>state <input name=state value='{esc(filters.state)}' size=10></label>"
        f"<label>id starts with <input name=q value='{esc(filters.text)}' size=16></label>"
        f"<label>holder <input name=holder value='{esc(filters.holder)}' size=16></label>"
        f"<label>data field <input name=data value='{esc(filters.data_path)}' size=10 placeholder='task'></label>"
        f"<label>= <input name=value value='{esc(filters.data_value)}' size=12></label>"
        f"<label>rows <input name=limit value='{filters.limit}' size=4></label>"
        f"<label><input type=checkbox name=expired value=1{' checked' if filters.expired else ''}> "
        "expired leases only</label>"
        "<button type=submit>Filter</button> <a href=/>clear</a></form>"
    )


def lease_cells(now: datetime, snap: Snapshot) -> str:
    if snap.lease_owner is None:
        return f"<td class=muted title='fencing token {snap.lease_token}'>none</td><td></td>"
    exp = snap.lease_expires_at
    expired = exp is not None and exp < now
    cls = "expired" if expired else "held"
    when = (
        f"expired {age(now, exp)}, reaper due"
        if expired
        else f"expires {age(now, exp)}"
        if exp is not None
        else "no expiry"
    )
    return (
        f"<td class={cls}>{esc(snap.lease_owner)} <span class=muted>#{snap.lease_token}</span></td>"
        f"<td class={cls} title='{esc(stamp(exp))}'>{esc(when)}</td>"
    )


ORDERS = {
    "updated": "most recently updated first",
    "id": "by id",
    "expiry": "soonest lease expiry first",
}


def entities_section(
    now: datetime, listed: Listed, filters: Filters, kinds: list[str], last: dict[str, HistoryRecord]
) -> str:
    head = (
        "<tr><th>id</th><th>lifecycle</th><th>state</th><th>in state for</th><th>created</th>"
        f"<th>lease holder</th><th>lease expiry</th><th title='{esc(ATTEMPT_HELP)}'>attempt</th><th>reclaims</th>"
        "<th>failure reason</th></tr>"
    )
    rows = []
    for s in listed.rows:
        failure = failure_of(last.get(s.id)) if s.state == "failed" or s.attempt > 1 else ""
        rows.append(
            f"<tr data-id='{esc(s.id)}'><td class=id><a href='{esc(entity_url(s.id))}'>{esc(s.id)}</a></td>"
            f"<td>{esc(s.kind)}</td><td><span class='state s-{esc(s.state)}'>{esc(s.state)}</span></td>"
            f"<td title='{esc(stamp(s.state_entered_at))}'>{esc(span(now - s.state_entered_at))}</td>"
            f"<td title='{esc(stamp(s.created_at))}'>{esc(age(now, s.created_at))}</td>"
            f"{lease_cells(now, s)}<td class=n>{s.attempt}</td><td class=n>{s.reclaims}</td>"
            f"<td class=failure>{esc(failure)}</td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=10 class=empty>No entity matches.</td></tr>"
    shown = f"{len(listed.rows)} shown, {ORDERS[listed.order]}"
    if listed.searched_to == "all":
        shown += "; the data search looked at every row"
    elif listed.searched_to:
        when = datetime.fromisoformat(listed.searched_to)
        shown += f"; the data search looked at the rows updated since {stamp(when)} (next page: older ones)"
    if filters.after is not None:
        shown += " (a later page)"
    pager = []
    if filters.after is not None:
        pager.append(f"<a class=first href='{esc('/?' + urlencode(filters.query()))}'>← first page</a>")
    if listed.more is not None:
        at, entity_id = listed.more
        nxt = filters.query(after_t=at, after_id=entity_id)
        pager.append(f"<a class=next rel=next href='{esc('/?' + urlencode(nxt))}'>next page →</a>")
    elif listed.order == "expiry" and len(listed.rows) >= filters.limit:
        pager.append("<span class=muted>(the first rows only: narrow by lifecycle or state)</span>")
    return (
        f"<section class=list><h2>Entities <span class=muted>{esc(shown)}</span></h2>{filter_form(filters, kinds)}"
        f"<table class=entities>{head}{body}</table><p class=pager>{' '.join(pager)}</p></section>"
    )


def overview(
    now: datetime,
    counts: Cached[dict[str, dict[str, int]]],
    counts_problem: str | None,
    leaves: dict[str, list[str]],
    listed: Listed,
    filters: Filters,
    last: dict[str, HistoryRecord],
    database: str,
    flags: Cached[Flags],
    ticks: list[ReaperTick],
    activity: Cached[Activity],
    holders: Cached[list[Holder]],
    schedules: ScheduleList | None = None,
) -> str:
    kinds = sorted(set(counts.value) | set(leaves))
    return (
        f"<p class=meta>Store <code>{esc(database)}</code> · database time {esc(stamp(now))}</p>"
        + counts_section(counts, leaves, flags, counts_problem)
        + entities_section(now, listed, filters, kinds, last)
        + (schedules_section(now, schedules) if schedules is not None else "")
        + ticks_section(now, ticks)
        + activity_section(activity, ticks)
        + holders_section(now, holders)
        + moves_section(now, activity.value)
    )


# -- one entity --------------------------------------------------------------------------------


def last_renewal(now: datetime, renewals: RenewalLog) -> str:
    """When the lease was last renewed (or taken outside a transition), and by whom."""
    if renewals.problem is not None:
        return f"<span class=expired>unreadable log: {esc(renewals.problem)}</span>"
    if not renewals.entries:
        return "<span class=muted>none logged</span>"
    last = renewals.entries[-1]
    return (
        f"<span title='{esc(stamp(last.at))}'>{esc(age(now, last.at))}</span> by {esc(last.owner)} "
        f"<span class=muted>#{last.token}</span>"
    )


def diagram_image(snap: Snapshot) -> str:
    """The lifecycle's diagram (an ``<img>``: never runs script), full width, opening full size."""
    svg = "/diagram.svg?" + urlencode({"id": snap.id, "v": snap.version})
    return (
        f"<a href='{esc(svg)}' target=_blank rel=noopener title='open the diagram full size'>"
        f"<img class=diagram alt='diagram of {esc(snap.kind)} with {esc(snap.state)} highlighted' "
        f"src='{esc(svg)}'></a>"
    )


RESERVED_ROW = (
    "No diagram: this row is the library's own bookkeeping (a stored schedule, the reaper's leader lease or "
    "tick log), not an entity of a lifecycle; its timeline is what each of its steps did."
)
NO_LIFECYCLE = "<p class=empty>No diagram: this lifecycle was not given to fsm inspect (--lifecycle MODULE:Class).</p>"


def entity_page(
    now: datetime,
    snap: Snapshot,
    history: list[HistoryRecord],
    effects: list[EffectRecord],
    progress: EffectRecord | None,
    renewals: RenewalLog,
    diagram: str,
    starts: frozenset[str] = frozenset(),
    timers: Sequence[PendingTimer] | None = (),
    family: Family | None = None,
) -> str:
    """One entity; ``diagram`` is the markup of its diagram section (image, fallback, or why
    none); ``starts`` the events that begin an attempt; ``timers`` the ones it is waiting out
    (:func:`fsm.diagram.pending.pending_timers`), ``None`` when its lifecycle is not known
    here (then only its clock, if it runs, is said); ``family`` its children and the limit
    that holds it back, if any."""
    deleted = " <span class=expired>deleted</span>" if snap.deleted else ""
    reserved = snap.kind in RESERVED_KINDS  # the library's own row: no lifecycle, no attempts
    if reserved:
        diagram = f"<p class=empty>{esc(RESERVED_ROW)}</p>"
    entered = snap.state_entered_at
    waiting = ""
    if snap.lease_owner is None and snap.reclaims and snap.state not in {"completed", "failed", "queued"}:
        waiting = " <span class=alert>waiting for a worker</span>"
    if family is not None and family.held_back:
        waiting += f" <span class=alert data-limit>{esc(family.held_back)}</span>"
    facts = [
        ("lifecycle", esc(snap.kind)),
        ("state", f"<span class='state s-{esc(snap.state)}'>{esc(snap.state)}</span>{deleted}{waiting}"),
        ("in state for", f"<span title='{esc(stamp(entered))}'>{esc(span(now - entered))}</span>"),
        *timer_facts(now, snap, timers),
        ("version", str(snap.version)),
        ("attempt", attempt_fact(snap, history)),
        ("reclaims", str(snap.reclaims)),
        ("created", f"{esc(age(now, snap.created_at))} <span class=muted>{esc(stamp(snap.created_at))}</span>"),
        ("updated", f"{esc(age(now, snap.updated_at))} <span class=muted>{esc(stamp(snap.updated_at))}</span>"),
        ("concurrency key", esc(snap.concurrency_key or "")),
        *([("priority", str(snap.priority))] if snap.priority else []),
        *(
            # a history state restores from it: where each compound was last left
            [
                (
                    "history memory",
                    "<br>".join(f"{esc(c)} was left in {esc(leaf)}" for c, leaf in sorted(snap.memory.items())),
                )
            ]
            if snap.memory
            else []
        ),
        *family_facts(snap, family),
        ("last renewal", last_renewal(now, renewals)),
    ]
    titles = {"attempt": f" title='{esc(ATTEMPT_HELP)}'", "timers": f" title='{esc(TIMER_HELP)}'"}
    lease = "<table class=facts>" + "".join(f"<tr><th{titles.get(k, '')}>{k}</th><td>{v}</td></tr>" for k, v in facts)
    lease += f"<tr><th>lease</th>{lease_cells(now, snap)}</tr></table>"
    effect_rows = "".join(
        f"<tr><td>{esc(e.key)}</td><td class='{esc(e.status)}'>{esc(e.status)}</td><td class=n>{e.lease_token}</td>"
        f"<td class=n title='{esc(runs(e.attempts))}'>{e.attempts}</td><td>{esc(stamp(e.recorded_at))}</td>"
        f"<td><pre>{esc(pretty_json(e.result))}</pre></td></tr>"
        for e in effects
    )
    numbers = attempt_numbers(history, starts, snap.attempt)
    effect_table = (
        f"<table><tr><th>key</th><th>status</th><th>token</th><th class=n title='{esc(RUNS_HELP)}'>runs</th>"
        "<th>recorded</th><th>result</th></tr>" + effect_rows + "</table>"
        if effects
        else "<p class=empty>No effect recorded.</p>"
    )
    return (
        f"<p class=meta><a href=/>← all entities</a> · database time {esc(stamp(now))}</p>"
        f"<h1 class=id>{esc(snap.id)}</h1>"
        f"<div class=split><section><h2>Now</h2>{lease}</section><section><h2>Data</h2>"
        f"<pre class=data>{esc(pretty_json(snap.data))}</pre></section></div>"
        f"{'' if reserved else attempts_section(now, history, starts, snap.attempt)}"
        f"<section><h2>Timeline <span class=muted>newest first{esc(renewals.note())}</span></h2>"
        f"{timeline(now, history, effects, progress, renewals.entries, numbers, timers or ())}"
        "</section>"
        f"<section class=diagram-box><h2>Diagram</h2>{diagram}</section>"
        f"<section><h2>Recorded effects</h2>{effect_table}</section>"
    )


SHOWN_CHILDREN = 50
"""The most children an entity's page lists."""


class Family(NamedTuple):
    """An entity's children (its first ones, by id) and the limit that holds it back."""

    children: list[Snapshot]
    held_back: str | None = None


def family_facts(snap: Snapshot, family: Family | None) -> list[tuple[str, str]]:
    """The facts table's ``parent`` and ``children`` rows, each a link to the entity."""
    facts: list[tuple[str, str]] = []
    if snap.parent_id is not None:
        facts.append(("parent", f"<a href='{esc(entity_url(snap.parent_id))}' data-parent>{esc(snap.parent_id)}</a>"))
    if family is not None and family.children:
        kids = family.children[:SHOWN_CHILDREN]
        links = "".join(
            f"<div data-child><a href='{esc(entity_url(c.id))}'>{esc(c.id)}</a> "
            f"<span class='state s-{esc(c.state)}'>{esc(c.state)}</span></div>"
            for c in kids
        )
        more = f"<div class=muted>first {SHOWN_CHILDREN} shown</div>" if len(family.children) > SHOWN_CHILDREN else ""
        facts.append((f"children ({len(kids)}{'+' if more else ''})", links + more))
    return facts


def timer_facts(now: datetime, snap: Snapshot, timers: Sequence[PendingTimer] | None) -> list[tuple[str, str]]:
    """The facts table's ``timers`` row: each pending timer and when it is due; nothing when
    there is none; when the lifecycle is not known here, since when its clock runs."""
    if timers is None:
        if snap.timer_since is None or snap.deleted:
            return []
        since = snap.timer_since
        return [
            (
                "timers",
                f"<span class=muted>clock running for <span title='{esc(stamp(since))}'>{esc(span(now - since))}"
                "</span> (the lifecycle was not given to fsm inspect: --lifecycle MODULE:Class)</span>",
            )
        ]
    if not timers:
        return []
    said = []
    for t in timers:
        detail = f"after {t.delay} in {t.state}" + (f", also needs {', '.join(t.guards)}" if t.guards else "")
        overdue = " overdue" if t.is_due(now) else ""
        said.append(
            f"<div class='timer{overdue}' data-timer='{esc(t.event)}'><b>{esc(t.event)}</b> "
            f"{'' if overdue else 'due '}{timer_when(now, t)} · {esc(stamp(t.due))} "
            f"<span class=muted>({esc(detail)})</span></div>"
        )
    return [("timers", "".join(said))]


def attempt_fact(snap: Snapshot, history: list[HistoryRecord]) -> str:
    """The entity's attempt, and the handler errors the worker retried (per state), which
    a finalizer's retries do not add to the attempt: "1 (2 retries: 2 in finalizing)"."""
    retried = retries_by_state(history)
    if not retried:
        return f"<span class=attempt>{snap.attempt}</span>"
    total = sum(retried.values())
    where = ", ".join(f"{n} in {state}" for state, n in retried.items())
    noun = "retry" if total == 1 else "retries"
    said = f"({total} {noun}: {where})"
    return f"<span class=attempt>{snap.attempt}</span> <span class='muted retries'>{esc(said)}</span>"


def with_retry_links(body: str, retry_of: str | None, retried_as: str | None) -> str:
    """``body`` (an entity page) with its retry links under the id (:mod:`fsm.inspect.retry`):
    "retry of X" on a retry, "retried as Y" on a failed entity that was retried."""
    parts = []
    if retry_of is not None:
        parts.append(f"retry of <a class=retry-of href='{esc(entity_url(retry_of))}'>{esc(retry_of)}</a>")
    if retried_as is not None:
        parts.append(f"retried as <a class=retried-as href='{esc(entity_url(retried_as))}'>{esc(retried_as)}</a>")
    if not parts:
        return body
    return body.replace("</h1>", f"</h1><p class='meta retry-links'>{' · '.join(parts)}</p>", 1)


def error_page(status: int, title: str, detail_html: str) -> str:
    """A whole error page (``detail_html`` is trusted markup: callers escape what they put in it)."""
    body = (
        f"<p class=meta><a href=/>← all entities</a></p><h1>{status} · {esc(title)}</h1>"
        f"<p class=problem data-status='{status}'>{detail_html}</p>"
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{status} {esc(title)} · fsm inspect</title><link rel=stylesheet href=/static/inspect.css></head>"
        f"<body><header><a class=home href=/>fsm inspect</a></header><main>{body}</main></body></html>"
    )


def not_found(entity_id: str) -> str:
    return (
        f"<p class=meta><a href=/>← all entities</a></p><p class=empty>No entity with id <b>{esc(entity_id)}</b>.</p>"
    )


__all__ = [
    "NO_LIFECYCLE",
    "RESERVED_ROW",
    "SHOWN_CHILDREN",
    "Family",
    "age",
    "attempt_fact",
    "diagram_image",
    "entity_page",
    "error_page",
    "esc",
    "family_facts",
    "not_found",
    "overview",
    "page",
    "timer_facts",
    "with_retry_links",
]
