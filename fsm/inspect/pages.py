"""The inspector's HTML: every value from the database goes through :func:`esc`.

Entity ids, data, reasons, owners and effect results are attacker-controlled text: they
are only ever rendered escaped (``html.escape`` with quotes), as element text or quoted
attribute values, and URLs carry them percent-encoded.  The pages load one script from
``/static/inspect.js`` (no inline script; the Content-Security-Policy forbids any).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from itertools import groupby
from typing import Any
from urllib.parse import urlencode

from fsm.inspect.data import Filters, ReaperMove, ReaperTick, RenewalLog
from fsm.inspect.timeline import age, esc, pretty_json, span, stamp, timeline
from fsm.records import EffectRecord, HistoryRecord, Snapshot


def entity_url(entity_id: str) -> str:
    return "/entity?" + urlencode({"id": entity_id})


def page(title: str, body: str, *, live: str, refresh_ms: int) -> str:
    """A whole page; the element ``#live`` is refreshed from ``live`` every ``refresh_ms``."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)}</title><link rel=stylesheet href=/static/inspect.css></head><body>"
        "<header><a class=home href=/>fsm inspect</a> <span class=ro>read-only</span>"
        "<span id=status class=status>live</span></header>"
        f"<main id=live data-src='{esc(live)}' data-every='{int(refresh_ms)}'>{body}</main>"
        "<script src=/static/inspect.js></script></body></html>"
    )


# -- the overview ------------------------------------------------------------------------------


def counts_section(counts: dict[str, dict[str, int]], leaves: dict[str, list[str]], expired: dict[str, int]) -> str:
    if not counts:
        return "<section><h2>Counts</h2><p class=empty>No entities in this store yet.</p></section>"
    parts = ["<section><h2>Counts by lifecycle and state</h2><div class=cards>"]
    for kind in sorted(counts):
        states = leaves.get(kind) or sorted(counts[kind])
        extra = [s for s in sorted(counts[kind]) if s not in states]
        total = sum(counts[kind].values())
        head = f"<h3>{esc(kind)} <span class=total>{total} total</span></h3>"
        stuck = expired.get(kind, 0)
        if stuck:
            head += (
                f"<p class=alert data-expired='{esc(kind)}' title='their holder stopped renewing; the reaper moves "
                f"them at its next tick'><a href='{esc('/?' + urlencode({'kind': kind, 'expired': '1'}))}'>"
                f"{stuck} with an expired lease</a></p>"
            )
        parts.append(f"<div class=card data-kind='{esc(kind)}'>{head}<table>")
        for state in [*states, *extra]:
            n = counts[kind].get(state, 0)
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
        f"<label>state <input name=state value='{esc(filters.state)}' size=12></label>"
        f"<label>id or holder contains <input name=q value='{esc(filters.text)}' size=24></label>"
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


def entities_section(now: datetime, snaps: list[Snapshot], filters: Filters, kinds: list[str]) -> str:
    head = (
        "<tr><th>id</th><th>lifecycle</th><th>state</th><th>in state for</th><th>created</th>"
        "<th>lease holder</th><th>lease expiry</th><th>attempt</th><th>reclaims</th></tr>"
    )
    rows = []
    for s in snaps:
        rows.append(
            f"<tr data-id='{esc(s.id)}'><td class=id><a href='{esc(entity_url(s.id))}'>{esc(s.id)}</a></td>"
            f"<td>{esc(s.kind)}</td><td><span class='state s-{esc(s.state)}'>{esc(s.state)}</span></td>"
            f"<td title='{esc(stamp(s.state_entered_at))}'>{esc(span(now - s.state_entered_at))}</td>"
            f"<td title='{esc(stamp(s.created_at))}'>{esc(age(now, s.created_at))}</td>"
            f"{lease_cells(now, s)}<td class=n>{s.attempt}</td><td class=n>{s.reclaims}</td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan=9 class=empty>No entity matches.</td></tr>"
    shown = f"{len(snaps)} shown, most recently updated first" + (
        " (limit reached)" if len(snaps) >= filters.limit else ""
    )
    return (
        f"<section><h2>Entities <span class=muted>{esc(shown)}</span></h2>{filter_form(filters, kinds)}"
        f"<table class=entities>{head}{body}</table></section>"
    )


def _count(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key, 0)
    bad = " bad" if key in {"errors", "bad_rows"} and value else ""
    return f"<td class='n{bad}'>{esc(value)}</td>"


def ticks_section(now: datetime, ticks: list[ReaperTick]) -> str:
    """The reaper's tick log: what each tick did, failures in red."""
    if not ticks:
        return (
            "<section class=ticks><h2>Reaper: recent ticks</h2><p class=empty>No tick recorded. "
            "<code>fsm reaper</code> records each tick; a reaper embedded in an application records "
            "them with <code>TickLog(store).record(result, reaper.owner)</code>.</p></section>"
        )
    head = (
        "<tr><th>when</th><th>reaper</th><th class=n>moved</th><th>what moved</th><th class=n>lost races</th>"
        "<th class=n>refused</th><th class=n>bad rows</th><th class=n>errors</th><th class=n>took</th></tr>"
    )
    rows = []
    for t in ticks:
        s = t.summary
        moved = s.get("moved") if isinstance(s.get("moved"), dict) else {}
        assert isinstance(moved, dict)
        total = sum(v for v in moved.values() if isinstance(v, int))
        what = ", ".join(f"{k} {v}" for k, v in moved.items()) or "nothing"
        if s.get("leading") is False:
            what = "skipped: another reaper leads"
        elif s.get("enabled") is False:
            what = "skipped: disabled"

        rows.append(
            f"<tr data-tick='{t.seq}'><td title='{esc(stamp(t.at))}'>{esc(age(now, t.at))}</td>"
            f"<td class=id>{esc(s.get('owner', ''))}</td><td class=n>{total}</td><td>{esc(what)}</td>"
            f"{_count(s, 'lost_races')}{_count(s, 'refused')}{_count(s, 'bad_rows')}{_count(s, 'errors')}"
            f"<td class=n>{esc(s.get('duration_ms', ''))} ms</td></tr>"
        )
    return (
        "<section class=ticks><h2>Reaper: recent ticks <span class=muted>newest first</span></h2>"
        f"<table>{head}{''.join(rows)}</table></section>"
    )


def reaper_section(now: datetime, moves: list[ReaperMove]) -> str:
    """The reaper's recent work, one row per batch (its moves share one commit time)."""
    if not moves:
        return (
            "<section class=reaper><h2>Reaper: recent moves</h2><p class=empty>The reaper has moved nothing yet "
            "(it records its moves in each entity's history).</p></section>"
        )
    rows = []
    for at, group in groupby(moves, key=lambda m: m.at):
        batch = list(group)
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
        "<section class=reaper><h2>Reaper: recent moves <span class=muted>(grouped by commit)</span></h2>"
        "<table><tr><th>when</th><th>moved</th><th>what</th><th>entities</th></tr>"
        + "".join(rows)
        + "</table></section>"
    )


def overview(
    now: datetime,
    counts: dict[str, dict[str, int]],
    leaves: dict[str, list[str]],
    snaps: list[Snapshot],
    filters: Filters,
    moves: list[ReaperMove],
    database: str,
    expired: dict[str, int],
    ticks: list[ReaperTick],
) -> str:
    kinds = sorted(set(counts) | set(leaves))
    return (
        f"<p class=meta>Store <code>{esc(database)}</code> · database time {esc(stamp(now))}</p>"
        + counts_section(counts, leaves, expired)
        + ticks_section(now, ticks)
        + entities_section(now, snaps, filters, kinds)
        + reaper_section(now, moves)
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


def entity_page(
    now: datetime,
    snap: Snapshot,
    history: list[HistoryRecord],
    effects: list[EffectRecord],
    progress: EffectRecord | None,
    renewals: RenewalLog,
    has_diagram: bool,
) -> str:
    deleted = " <span class=expired>deleted</span>" if snap.deleted else ""
    entered = snap.state_entered_at
    facts = [
        ("lifecycle", esc(snap.kind)),
        ("state", f"<span class='state s-{esc(snap.state)}'>{esc(snap.state)}</span>{deleted}"),
        ("in state for", f"<span title='{esc(stamp(entered))}'>{esc(span(now - entered))}</span>"),
        ("version", str(snap.version)),
        ("attempt", str(snap.attempt)),
        ("reclaims", str(snap.reclaims)),
        ("created", f"{esc(age(now, snap.created_at))} <span class=muted>{esc(stamp(snap.created_at))}</span>"),
        ("updated", f"{esc(age(now, snap.updated_at))} <span class=muted>{esc(stamp(snap.updated_at))}</span>"),
        ("concurrency key", esc(snap.concurrency_key or "")),
        ("last renewal", last_renewal(now, renewals)),
    ]
    lease = "<table class=facts>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    lease += f"<tr><th>lease</th>{lease_cells(now, snap)}</tr></table>"
    svg = "/diagram.svg?" + urlencode({"id": snap.id, "v": snap.version})
    diagram = (
        f"<a href='{esc(svg)}' target=_blank rel=noopener title='open the diagram full size'>"
        f"<img class=diagram alt='diagram of {esc(snap.kind)} with {esc(snap.state)} highlighted' "
        f"src='{esc(svg)}'></a>"
        if has_diagram
        else "<p class=empty>No diagram: this lifecycle was not given to fsm inspect (--lifecycle MODULE:Class).</p>"
    )
    effect_rows = "".join(
        f"<tr><td>{esc(e.key)}</td><td class='{esc(e.status)}'>{esc(e.status)}</td><td class=n>{e.lease_token}</td>"
        f"<td class=n>{e.attempts}</td><td>{esc(stamp(e.recorded_at))}</td>"
        f"<td><pre>{esc(pretty_json(e.result))}</pre></td></tr>"
        for e in effects
    )
    effect_table = (
        "<table><tr><th>key</th><th>status</th><th>token</th><th>attempts</th><th>recorded</th><th>result</th></tr>"
        + effect_rows
        + "</table>"
        if effects
        else "<p class=empty>No effect recorded.</p>"
    )
    return (
        f"<p class=meta><a href=/>← all entities</a> · database time {esc(stamp(now))}</p>"
        f"<h1 class=id>{esc(snap.id)}</h1>"
        f"<div class=split><section><h2>Now</h2>{lease}<h2>Data</h2><pre class=data>{esc(pretty_json(snap.data))}</pre>"
        f"</section><section><h2>Diagram</h2>{diagram}</section></div>"
        f"<section><h2>Timeline <span class=muted>newest first{esc(renewals.note())}</span></h2>"
        f"{timeline(now, history, effects, progress, renewals.entries)}"
        f"</section><section><h2>Recorded effects</h2>{effect_table}</section>"
    )


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


__all__ = ["age", "entity_page", "error_page", "esc", "not_found", "overview", "page"]
