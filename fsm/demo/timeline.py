"""A timeline picture of one job (SVG, written by hand): the picture a reviewer of seeds/002 wants.

One lane for the job's state (from its history), one per worker process (its lease from
claim to end, each renewal a tick, each gate a bar: executed, replayed from the ledger,
or refused; the signals it received), one for the reaper (every tick a dot, every move a
red triangle).  Every text is escaped: job ids and worker names come from outside.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from fsm.demo.proc import GATES
from fsm.demo.scenario import JobStory

WIDTH = 1100
LEFT = 170
RIGHT = 30
LANE = 46
TOP = 80

STATE_FILL = {
    "queued": "#d9d9d9",
    "running": "#9ecae1",
    "finalizing": "#fdd49e",
    "completed": "#a1d99b",
    "failed": "#fc9272",
}
GATE_FILL = dict(zip(GATES, ("#6baed6", "#9e9ac8", "#74c476", "#fd8d3c"), strict=True))


def _text(x: float, y: float, text: str, *, size: int = 11, anchor: str = "start", fill: str = "#222") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor={quoteattr(anchor)} '
        f"fill={quoteattr(fill)}>{escape(text)}</text>"
    )


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def timeline_svg(story: JobStory) -> str:
    """The job's timeline as an SVG document."""
    start = story.t0
    end = max(story.t_end, start + 0.5)
    span = end - start
    scale = (WIDTH - LEFT - RIGHT) / span

    def x(t: float) -> float:
        return LEFT + (min(max(t, start), end) - start) * scale

    workers = list(story.workers)
    lanes = ["state", *workers, "reaper"]
    height = TOP + LANE * len(lanes) + 60
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        _text(10, 22, f"{story.title}: {story.job_id}", size=15),
        _text(
            10,
            42,
            f"final state {story.state}; {len(story.history)} transitions; "
            f"{len(story.executions)} gate executions, {len(story.effects)} recorded results; "
            f"{len(story.ticks)} reaper ticks",
            size=11,
            fill="#555",
        ),
    ]
    lane_y = {name: TOP + i * LANE for i, name in enumerate(lanes)}
    for name, y in lane_y.items():
        label = name if name in ("state", "reaper") else f"{name} (pid {story.workers[name]})"
        out.append(f'<line x1="{LEFT}" y1="{y + LANE - 4}" x2="{WIDTH - RIGHT}" y2="{y + LANE - 4}" stroke="#eee"/>')
        out.append(_text(10, y + LANE / 2 + 4, label))
    # time axis
    axis_y = TOP + LANE * len(lanes) + 6
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#888"/>')
    step = max(0.5, round(span / 10 * 2) / 2)
    t = 0.0
    while t <= span + 1e-9:
        out.append(
            f'<line x1="{x(start + t):.1f}" y1="{axis_y}" x2="{x(start + t):.1f}" y2="{axis_y + 5}" stroke="#888"/>'
        )
        out.append(_text(x(start + t), axis_y + 18, f"{t:g} s", size=10, anchor="middle", fill="#555"))
        t += step
    # state lane, and a line across every lane at each transition
    y = lane_y["state"]
    changes = [(start, "queued")] + [(r.at.timestamp(), r.target) for r in story.history]
    for i, (since, state) in enumerate(changes):
        until = changes[i + 1][0] if i + 1 < len(changes) else end
        fill = STATE_FILL.get(state, "#eee")
        out.append(
            f'<rect x="{x(since):.1f}" y="{y + 8}" width="{max(x(until) - x(since), 1):.1f}" height="{LANE - 16}" '
            f'fill="{fill}">{_title(state)}</rect>'
        )
        if x(until) - x(since) > 60:
            out.append(_text(x(since) + 4, y + LANE / 2 + 4, state, size=10))
    last_label = -1000.0
    row = 0
    for r in story.history:
        rx = x(r.at.timestamp())
        colour = "#d62728" if r.actor == "reaper" else "#333"
        row = row + 1 if rx - last_label < 90 else 0  # labels too close to the previous one step up
        last_label = rx
        out.append(
            f'<line x1="{rx:.1f}" y1="{TOP - 6}" x2="{rx:.1f}" y2="{axis_y}" stroke="{colour}" '
            f'stroke-dasharray="3,3" stroke-width="1">{_title(f"v{r.seq} {r.event} by {r.actor}")}</line>'
        )
        near_end = rx > WIDTH - RIGHT - 90  # a label at the right edge reads leftwards, not off the picture
        out.append(
            _text(
                rx - 2 if near_end else rx + 2,
                TOP - 8 - 11 * (row % 2),
                f"{r.event} (t{r.lease_token})",
                size=10,
                anchor="end" if near_end else "start",
                fill=colour,
            )
        )
    # worker lanes
    for name in workers:
        y = lane_y[name]
        mine = [e for e in story.events if e["who"] == name]
        claims = [e for e in mine if e["ev"] == "claimed"]
        for claim in claims:
            token = claim.get("token")
            stops = [e["t"] for e in mine if e["t"] >= claim["t"] and (e["ev"] in ("fired", "exit", "insisted"))] + [
                t for t, sig, who in story.marks if who == name and sig == "SIGKILL" and t >= claim["t"]
            ]
            until = min(stops) if stops else end
            out.append(
                f'<rect x="{x(claim["t"]):.1f}" y="{y + LANE - 12}" width="{max(x(until) - x(claim["t"]), 1):.1f}" '
                f'height="5" fill="#bbb">{_title(f"lease token {token}")}</rect>'
            )
        for e in mine:
            ex = x(e["t"])
            if e["ev"] == "renewed":
                out.append(
                    f'<line x1="{ex:.1f}" y1="{y + LANE - 16}" x2="{ex:.1f}" y2="{y + LANE - 5}" stroke="#2ca02c">'
                    f"{_title('renewal, token ' + str(e.get('token')))}</line>"
                )
            elif e["ev"] == "gate-start":
                gate = str(e.get("gate"))
                ends = [
                    f["t"]
                    for f in mine
                    if f["t"] >= e["t"] and f.get("gate") == gate and f["ev"] in ("gate-done", "refused")
                ] + [t for t, sig, who in story.marks if who == name and sig == "SIGKILL" and t >= e["t"]]
                until = min(ends) if ends else end
                out.append(
                    f'<rect x="{ex:.1f}" y="{y + 6}" width="{max(x(until) - ex, 2):.1f}" height="18" '
                    f'fill="{GATE_FILL.get(gate, "#999")}" opacity="0.85">{_title(f"{gate} executed")}</rect>'
                )
                if x(until) - ex > 50:
                    out.append(_text(ex + 3, y + 19, gate, size=10, fill="white"))
            elif e["ev"] == "gate-replayed":
                gate = str(e.get("gate"))
                out.append(
                    f'<circle cx="{ex:.1f}" cy="{y + 15}" r="5" fill="white" stroke="{GATE_FILL.get(gate, "#999")}" '
                    f'stroke-width="2">{_title(f"{gate} replayed from the ledger (not run)")}</circle>'
                )
            elif e["ev"] in ("refused", "accepted"):
                colour = "#d62728" if e["ev"] == "refused" else "#000"
                what = f"{e.get('what')} {e['ev']}: {e.get('error', '')}"
                out.append(
                    f'<text x="{ex:.1f}" y="{y + 38}" font-size="13" text-anchor="middle" fill="{colour}">'
                    f"{_title(what)}\u2715</text>"
                )
        refused = [e for e in mine if e["ev"] == "refused"]
        if refused:
            label = f"{len(refused)} late write(s) refused"
            out.append(_text(x(refused[0]["t"]) + 10, y + 12, label, size=10, fill="#d62728"))
        for t, sig, who in story.marks:
            if who == name:
                out.append(
                    f'<line x1="{x(t):.1f}" y1="{y + 2}" x2="{x(t):.1f}" y2="{y + LANE - 2}" stroke="#000" '
                    f'stroke-width="2"/>'
                )
                out.append(_text(x(t) + 3, y + 36, sig, size=10, fill="#000"))
    # reaper lane
    y = lane_y["reaper"]
    for t, _moved in story.ticks:
        out.append(f'<circle cx="{x(t):.1f}" cy="{y + LANE / 2}" r="1.8" fill="#999"/>')
    for r in story.history:
        if r.actor == "reaper":
            rx, ry = x(r.at.timestamp()), y + LANE / 2
            out.append(
                f'<polygon points="{rx - 6:.1f},{ry + 6:.1f} {rx + 6:.1f},{ry + 6:.1f} {rx:.1f},{ry - 7:.1f}" '
                f'fill="#d62728">{_title(f"{r.event} ({r.reason})")}</polygon>'
            )
    # legend
    ly = height - 14
    legend = [
        ("#2ca02c", "renewal"),
        ("#6baed6", "gate executed"),
        ("white", "gate replayed"),
        ("#d62728", "write refused / reaper move"),
        ("#999", "reaper tick"),
    ]
    lx = LEFT
    for colour, label in legend:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}" stroke="#666"/>')
        out.append(_text(lx + 14, ly, label, size=10, fill="#555"))
        lx += 30 + 7 * len(label)
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["timeline_svg"]
