"""The inspector's first look at every request: its path and query string must be UTF-8
text without NUL, and not huge; otherwise a 400 page, before any route or sign-in runs.

Starlette decodes a percent-escape that is not UTF-8 (``%ED%A0%80``, a lone surrogate's
bytes; ``%FF``; an overlong ``%C0%80``) into U+FFFD replacement characters, so a route
would search for, or record, text nobody sent.  Checking the raw bytes here refuses them
the same way on every route, a parameter the route reads or not, and a NUL besides (which
PostgreSQL refuses as a bound parameter).  The form of an action is checked by
:func:`fsm.inspect.actions.parse_form`, strictly too.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

MAX_QUERY = 65_536
"""Longest query string read (bytes): room for the longest parameter a route takes (a data
search value of 10,000 characters, percent-encoded); uvicorn's own request-line limit is
lower still."""


def text_problem(raw: bytes, what: str) -> str | None:
    """Why ``raw`` (percent-encoded) is not UTF-8 text without NUL, or ``None``."""
    try:
        text = unquote_to_bytes(raw).decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return f"the {what} is not UTF-8 text (a lone surrogate or a byte that is not UTF-8)"
    if "\x00" in text:
        return f"the {what} must not contain NUL"
    return None


def query_problem(raw: bytes) -> str | None:
    """Why a raw query string cannot be read, or ``None``."""
    if len(raw) > MAX_QUERY:
        return f"the query string is longer than {MAX_QUERY} bytes"
    try:
        pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        return "the query string is not UTF-8 text (a lone surrogate or a byte that is not UTF-8)"
    except ValueError as err:  # pragma: no cover - parse_qsl's own limits
        return f"the query string cannot be read: {err}"
    for name, value in pairs:
        if "\x00" in name or "\x00" in value:
            return f"{name.replace(chr(0), '?')[:40] or 'a parameter'} must not contain NUL"
    return None


class CleanInputs:
    """Answers 400 for a request whose path or query string :func:`query_problem` refuses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
            problem = text_problem(raw_path, "path") or query_problem(scope.get("query_string", b""))
            if problem is not None:
                from starlette.responses import HTMLResponse

                from fsm.inspect.pages import error_page
                from fsm.inspect.timeline import esc

                response = HTMLResponse(error_page(400, "Bad request", esc(problem)), status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["MAX_QUERY", "CleanInputs", "query_problem", "text_problem"]
