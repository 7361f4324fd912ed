"""Small inline SVG charts (no script, no external file: the page's CSP allows neither).

A chart is a row of bars, one per minute, oldest left, with its axis maximum and the
newest value written out, and each bar's value in a ``<title>`` (the browser's tooltip).
Only numbers and the caller's escaped labels go into the markup.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsm.inspect.timeline import esc

WIDTH, HEIGHT = 300, 70


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def bars(
    title: str,
    values: Sequence[float | None],
    *,
    unit: str = "",
    css: str = "c-transitions",
    name: str = "",
    minute_labels: tuple[str, str] = ("-60 min", "now"),
) -> str:
    """A bar chart of ``values`` (``None``: no data that minute, drawn as a gap)."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    n = max(1, len(values))
    step = WIDTH / n
    rects = []
    for i, v in enumerate(values):
        if v is None or (v <= 0 and not unit):  # a count of 0 draws nothing; a measured 0 s draws a sliver
            continue
        h = max(1.5, (HEIGHT - 12) * v / top)
        rects.append(
            f"<rect x='{i * step:.1f}' y='{HEIGHT - h:.1f}' width='{max(1.0, step - 1):.1f}' height='{h:.1f}'>"
            f"<title>{esc(minute_labels[0])} + {i} min: {esc(_number(v))}{esc(unit)}</title></rect>"
        )
    total = sum(known)
    last = next((v for v in reversed(values) if v is not None), None)
    summary = f"max {_number(top if known else 0)}{unit}"
    if unit:
        summary += f" · latest {_number(last)}{unit}" if last is not None else " · none yet"
    else:
        summary += f" · {_number(total)} in the hour"
    return (
        f"<figure class='chart {esc(css)}' data-chart='{esc(name or css)}' data-total='{_number(total)}'>"
        f"<figcaption>{esc(title)} <span class=muted>{esc(summary)}</span></figcaption>"
        f"<svg viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' role=img "
        f"aria-label='{esc(title)}'><line x1=0 y1='{HEIGHT - 0.5}' x2='{WIDTH}' y2='{HEIGHT - 0.5}' class=axis />"
        f"{''.join(rects)}</svg>"
        f"<div class=axis-labels><span>{esc(minute_labels[0])}</span><span>{esc(minute_labels[1])}</span></div>"
        "</figure>"
    )


__all__ = ["bars"]
