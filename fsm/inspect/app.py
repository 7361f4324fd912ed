"""The inspector's web application (Starlette): GET routes only, nothing written.

- ``/``: counts by lifecycle and state, the filterable entity table, the reaper's recent
  ticks; ``/fragment/overview`` is the same without the page around it (live updates);
- ``/entity?id=..``: one entity (``/fragment/entity?id=..`` live); ``/diagram.svg?id=..``
  its lifecycle's diagram with the current state highlighted, served as an image (an
  ``<img>`` never runs script, whatever the SVG holds).

Every response carries a Content-Security-Policy that allows only this server's script and
style, so even a rendering mistake could not run injected script.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from fsm.errors import FsmError, UnknownEntity
from fsm.inspect import assets, pages
from fsm.inspect.data import Filters, InspectorData
from fsm.lifecycle import Lifecycle
from stores.factory import safe_url
from stores.sql import SqlStore

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
DIAGRAM_LAST = 4
"""Transitions listed in the diagram's entity box (the timeline has them all)."""
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_app(store: SqlStore, lifecycles: list[type[Lifecycle]], *, refresh_ms: int = 2000) -> Starlette:
    """The inspector over ``store``; ``lifecycles`` give the diagrams and the state order."""
    data = InspectorData(store)
    by_kind = {lc.kind: lc for lc in lifecycles}
    leaves = {kind: list(lc.table.leaves) for kind, lc in by_kind.items()}
    database = safe_url(str(store.engine.url))

    def html(text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status, headers=HEADERS)

    def overview_fragment(request: Request) -> str:
        filters = Filters.of(request.query_params)
        return pages.overview(
            data.now(),
            data.counts(),
            leaves,
            data.entities(filters),
            filters,
            data.reaper_moves(),
            database,
            data.expired_leases(),
            data.reaper_ticks(),
        )

    def live_url(path: str, request: Request) -> str:
        query = request.url.query
        return path + ("?" + query if query else "")

    def index(request: Request) -> Response:
        body = overview_fragment(request)
        return html(
            pages.page("fsm inspect", body, live=live_url("/fragment/overview", request), refresh_ms=refresh_ms)
        )

    def overview(request: Request) -> Response:
        return html(overview_fragment(request))

    def entity_fragment(entity_id: str) -> tuple[str, int]:
        try:
            for _ in range(3):  # two reads: a transition committing between them would tear the page
                snap = data.entity(entity_id)
                history = data.history(entity_id)
                if (history[-1].seq if history else 0) == snap.version:
                    break
        except UnknownEntity:
            return pages.not_found(entity_id), 404
        effects, progress = data.effects(entity_id)
        renewals = data.renewals(entity_id)
        body = pages.entity_page(
            data.now(), snap, history, effects, progress, renewals, has_diagram=snap.kind in by_kind
        )
        return body, 200

    def entity(request: Request) -> Response:
        entity_id = request.query_params.get("id", "")
        body, status = entity_fragment(entity_id)
        live = live_url("/fragment/entity", request)
        return html(pages.page(f"{entity_id} · fsm inspect", body, live=live, refresh_ms=refresh_ms), status)

    def entity_live(request: Request) -> Response:
        body, status = entity_fragment(request.query_params.get("id", ""))
        return html(body, status)

    def diagram(request: Request) -> Response:
        from fsm.diagram.export import render
        from fsm.diagram.extract import extract

        entity_id = request.query_params.get("id", "")
        try:
            snap = data.entity(entity_id)
            lifecycle = by_kind.get(snap.kind)
            if lifecycle is None or snap.deleted:
                return Response("no diagram", status_code=404, headers=HEADERS, media_type="text/plain")
            svg = render(extract(lifecycle, store=store, entity_id=entity_id, last=DIAGRAM_LAST), "svg")
        except FsmError as err:
            return Response(f"no diagram: {err}", status_code=404, headers=HEADERS, media_type="text/plain")
        return Response(svg, headers=HEADERS, media_type="image/svg+xml")

    def script(request: Request) -> Response:
        return Response(assets.SCRIPT, headers=HEADERS, media_type="text/javascript")

    def style(request: Request) -> Response:
        return Response(assets.STYLE, headers=HEADERS, media_type="text/css")

    routes: list[Any] = [
        Route("/", index),
        Route("/fragment/overview", overview),
        Route("/entity", entity),
        Route("/fragment/entity", entity_live),
        Route("/diagram.svg", diagram),
        Route("/static/inspect.js", script),
        Route("/static/inspect.css", style),
    ]
    return Starlette(routes=routes)


__all__ = ["CSP", "create_app"]
