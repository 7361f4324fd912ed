"""The inspector's web application (Starlette): GET routes only, nothing written.

- ``/``: counts by lifecycle and state, the filterable entity table, the stored schedules,
  the reaper's recent ticks; ``/fragment/overview`` is the same without the page around it
  (live updates);
- ``/entity?id=..``: one entity (``/fragment/entity?id=..`` live); ``/diagram.svg?id=..``
  its lifecycle's diagram with the current state highlighted, served as an image (an
  ``<img>`` never runs script, whatever the SVG holds);
- ``/events``: the committed transitions as server-sent events (:mod:`fsm.inspect.events`),
  whoever made them; the pages refetch their fragment when one arrives, and poll when the
  browser cannot keep a stream open.

Every response carries a Content-Security-Policy that allows only this server's script and
style, so even a rendering mistake could not run injected script; the application sits
behind :func:`fsm.inspect.security.secure` (the Host allowlist, the token, the headers on
every response, errors included).  No input yields a 500: a bad id or filter (NUL, lone
surrogates, too long, not a number) gets a 400 page that says what is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from fsm.diagram.pending import PendingTimer, pending_timers
from fsm.engine.watch import PAGE
from fsm.errors import ConfigError, FsmError, InvalidArgument, UnknownEntity
from fsm.inspect import actions, assets, pages, retry, views
from fsm.inspect.data import BadInput, Filters, InspectorData, check_param
from fsm.inspect.events import StreamLimits, Streams, stream
from fsm.inspect.security import CSP, HEADERS, Tokens, allowed_hosts, secure
from fsm.inspect.timeline import esc
from fsm.lifecycle import Lifecycle
from fsm.records import Snapshot
from stores.factory import safe_url
from stores.sql import SqlStore

log = logging.getLogger("fsm.inspect")

DIAGRAM_LAST = 4
"""Transitions listed in the diagram's entity box (the timeline has them all)."""


def create_app(
    store: SqlStore,
    lifecycles: list[type[Lifecycle]],
    *,
    refresh_ms: int = 2000,
    hosts: list[str] | None = None,
    tokens: Tokens | None = None,
    count_every: float = 5.0,
    allow_actions: bool = False,
    stream_limits: StreamLimits | None = None,
) -> Any:
    """The inspector over ``store`` (an ASGI application); ``lifecycles`` give the diagrams
    and the state order.  ``hosts`` is the Host allowlist (default: loopback names only);
    with ``tokens`` every request must hold the token (:mod:`fsm.inspect.security`).
    ``count_every``: the least seconds between two recounts of the store (:mod:`fsm.inspect.cache`).
    ``allow_actions`` adds the operator actions (:mod:`fsm.inspect.actions`); it needs ``tokens``.
    ``stream_limits`` paces and bounds ``/events`` (:class:`fsm.inspect.events.StreamLimits`);
    the returned app's ``streams.close()`` ends every open stream (at shutdown)."""
    if allow_actions and tokens is None:
        raise ConfigError("operator actions need the token: give tokens (fsm inspect --allow-actions asks for it)")
    from fsm.engine.work import claim_plan

    by_kind = {lc.kind: lc for lc in lifecycles}
    leaves = {kind: list(lc.table.leaves) for kind, lc in by_kind.items()}
    plans = {kind: claim_plan(lc.table) for kind, lc in by_kind.items()}
    data = InspectorData(
        store,
        leaves,
        resumes={kind: list(resumes) for kind, (_, resumes) in plans.items()},
        claim_events={kind: {start.event for start in starts} for kind, (starts, _) in plans.items()},
        finals={kind: lc.table.finals for kind, lc in by_kind.items()},
        count_every=count_every,
    )
    attempt_starts = {k: frozenset(s.event for s in starts if s.bump_attempt) for k, (starts, _) in plans.items()}
    database = safe_url(str(store.engine.url))
    streams = Streams(stream_limits or StreamLimits())
    settle_ms = int(count_every * 1000) + 250  # the counts cache's least age, and a margin
    badge = "operator actions on" if allow_actions else "read-only"

    def html(text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status)

    def overview_fragment(request: Request) -> str:
        filters = Filters.of(request.query_params)
        listed = data.entities(filters)
        return pages.overview(
            data.now(),
            data.counts(),
            data.counts_cache.problem,
            leaves,
            listed,
            filters,
            data.last_failures(listed.rows),
            database,
            data.flags(),
            data.reaper_ticks(),
            data.activity(),
            data.holders(),
            data.schedules(),
        )

    def live_url(path: str, request: Request) -> str:
        query = request.url.query
        return path + ("?" + query if query else "")

    def index(request: Request) -> Response:
        body = overview_fragment(request)
        return html(
            pages.page(
                "fsm inspect",
                body,
                live=live_url("/fragment/overview", request),
                refresh_ms=refresh_ms,
                badge=badge,
                events="/events",
                settle_ms=settle_ms,
            )
        )

    def overview(request: Request) -> Response:
        return html(overview_fragment(request))

    def entity_id_of(request: Request) -> str:
        entity_id = check_param("id", request.query_params.get("id", ""))
        if not entity_id:
            raise BadInput("give an entity id: /entity?id=..")
        return entity_id

    def csrf_of(request: Request) -> str:
        assert tokens is not None
        return actions.csrf_token(tokens.token, str(request.scope.get("state", {}).get("who", "")))

    def entity_fragment(entity_id: str, request: Request) -> tuple[str, int]:
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
        starts = attempt_starts.get(snap.kind, frozenset())
        lifecycle = by_kind.get(snap.kind)
        timers = None if lifecycle is None else pending_timers(lifecycle.table, snap)
        now = data.now()
        family = pages.Family(
            data.children(entity_id, pages.SHOWN_CHILDREN + 1),
            None if lifecycle is None else data.limit_wait(lifecycle, snap),
        )
        body = pages.entity_page(
            now,
            snap,
            history,
            effects,
            progress,
            renewals,
            diagram_of(snap, timers or [], now),
            starts,
            timers,
            family,
        )
        body = pages.with_retry_links(body, *retry.links(snap, history, lifecycle, data.history))  # ops: retries
        if allow_actions and lifecycle is not None:
            marker = "<section><h2>Timeline"
            forms = actions.actions_section(snap, actions.actions_for(lifecycle, snap), csrf_of(request))
            body = body.replace(marker, forms + marker, 1)
        return body, 200

    def diagram_of(snap: Snapshot, timers: list[PendingTimer], now: datetime) -> str:
        from fsm.diagram.graphviz_render import INSTALL_HINT, GraphvizNotFound, find_dot

        lifecycle = by_kind.get(snap.kind)
        if lifecycle is None:
            return pages.NO_LIFECYCLE
        try:
            find_dot()
        except GraphvizNotFound as err:
            return views.transition_table(lifecycle, snap.state, f"{err.wanted}. {INSTALL_HINT}", timers, now)
        return pages.diagram_image(snap)

    def entity(request: Request) -> Response:
        entity_id = entity_id_of(request)
        body, status = entity_fragment(entity_id, request)
        live = live_url("/fragment/entity", request)
        title = f"{entity_id} · fsm inspect"
        events = "/events?" + urlencode({"id": entity_id})
        page = pages.page(title, body, live=live, refresh_ms=refresh_ms, badge=badge, events=events)  # no cache
        return html(page, status)

    def entity_live(request: Request) -> Response:
        body, status = entity_fragment(entity_id_of(request), request)
        return html(body, status)

    def diagram(request: Request) -> Response:
        from fsm.diagram.export import render
        from fsm.diagram.extract import extract

        entity_id = entity_id_of(request)
        try:
            snap = data.entity(entity_id)
            lifecycle = by_kind.get(snap.kind)
            if lifecycle is None or snap.deleted:
                return Response("no diagram", status_code=404, media_type="text/plain")
            svg = render(extract(lifecycle, store=store, entity_id=entity_id, last=DIAGRAM_LAST), "svg")
        except FsmError as err:
            return Response(f"no diagram: {err}", status_code=404, media_type="text/plain")
        return Response(svg, media_type="image/svg+xml")

    async def events(request: Request) -> Response:
        params = request.query_params
        entity_id = check_param("id", params.get("id", "")) or None
        kind = check_param("kind", params.get("kind", "")) or None
        after = check_param("Last-Event-ID", request.headers.get("last-event-id", ""), limit=2400)
        after = after or check_param("after", params.get("after", ""), limit=2400)
        try:
            if after or kind:  # the store's own checks: a position it never gave is a 400
                await run_in_threadpool(store.feed, after or None, kind=kind, limit=1)
            start = after or await run_in_threadpool(store.feed_head)
        except InvalidArgument:
            raise
        except FsmError as err:  # an unreachable store: the page polls and says so
            return html(pages.error_page(503, "Store unavailable", esc(str(err))), 503)
        if request.method == "HEAD":  # the headers only: no stream to hold open
            return Response(media_type="text/event-stream")
        stop = asyncio.Event()
        key = streams.enter(stop)
        if key is None:
            busy = html(pages.error_page(503, "Busy", "Too many live streams are open; the page polls instead."), 503)
            busy.headers["retry-after"] = "30"
            return busy

        async def read(position: str | None) -> Any:
            return await run_in_threadpool(store.feed, position, kind=kind, limit=PAGE)

        body = stream(
            read,
            start,
            entity_id=entity_id,
            limits=streams.limits,
            stop=stop,
            subscribe=getattr(store, "feed_wakeup", None),
        )
        return EventStream(body, on_close=lambda: streams.leave(key))

    def script(request: Request) -> Response:
        return Response(assets.SCRIPT, media_type="text/javascript")

    def style(request: Request) -> Response:
        return Response(assets.STYLE, media_type="text/css")

    async def action(request: Request) -> Response:
        if not actions.same_origin(request.headers.get("origin"), request.headers.get("host")):
            return html(pages.error_page(403, "Refused", "The form came from another site."), 403)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            return html(pages.error_page(415, "Refused", "Send the action as a form."), 415)
        try:
            form = actions.parse_form(await request.body())
            snap = await run_in_threadpool(
                actions.fire_action, form, lifecycles=by_kind, store=store, expected_csrf=csrf_of(request)
            )
        except actions.Refused as err:
            return html(pages.error_page(err.status, "Action refused", esc(str(err))), err.status)
        return RedirectResponse(actions.entity_location(snap.id), status_code=303)

    async def bad_input(request: Request, exc: Exception) -> Response:
        return html(pages.error_page(400, "Bad request", esc(str(exc))), 400)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {404: "Not found", 405: "Method not allowed"}
        detail = "This page is read-only: it answers GET only." if exc.status_code == 405 else esc(exc.detail)
        title = titles.get(exc.status_code, "Error")
        response = html(pages.error_page(exc.status_code, title, detail), exc.status_code)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        return html(pages.error_page(500, "Internal error", "The inspector failed on this request."), 500)

    routes: list[Any] = [
        Route("/", index),
        Route("/fragment/overview", overview),
        Route("/entity", entity),
        Route("/fragment/entity", entity_live),
        Route("/diagram.svg", diagram),
        Route("/events", events),
        Route("/static/inspect.js", script),
        Route("/static/inspect.css", style),
    ]
    if allow_actions:
        routes.append(Route(actions.ACTION_PATH, action, methods=["POST"]))
    handlers: dict[Any, Any] = {
        BadInput: bad_input,
        InvalidArgument: bad_input,
        HTTPException: http_error,
        500: server_error,
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the one whole-index count, before the first visit rather than during it
        try:
            await run_in_threadpool(data.counts_cache.refresh)
        except Exception as err:  # an unreachable or broken store: the pages say so, the server runs
            log.warning("fsm inspect: the first count failed: %s", err)
        yield

    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    outer = secure(app, hosts=hosts if hosts is not None else allowed_hosts("127.0.0.1"), tokens=tokens)
    outer.streams = streams
    return outer


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that calls ``on_close`` however it ends (finished,
    client gone, cancelled before its first byte)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], *, on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"x-accel-buffering": "no"})  # no proxy buffering
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


__all__ = ["CSP", "HEADERS", "EventStream", "create_app"]
