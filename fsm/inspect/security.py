"""What makes the inspector safe to expose: the Host allowlist, the token, the headers.

The page shows entity data and effect results, so it is guarded in three layers, each a
plain ASGI wrapper around the Starlette application (outermost first):

- :class:`SecurityHeaders` adds the security headers (CSP, ``nosniff``, Referrer-Policy,
  no framing, no caching) to *every* response, Starlette's own 404, 405 and 500 included:
  it sits outside Starlette's ``ServerErrorMiddleware``, which writes the 500;
- Starlette's ``TrustedHostMiddleware`` answers 400 to a ``Host`` the allowlist does not
  name (loopback names by default), which defeats DNS rebinding: a hostile page that
  rebinds its own name to 127.0.0.1 still sends its own name as the Host;
- :class:`TokenGate` (only when a token is set; required when binding anything but
  loopback): a request passes with ``Authorization: Bearer <token>`` or with the session
  cookie, which ``GET /login?code=..`` sets from a *one-time* code (the URL the CLI
  prints; a used code is refused).  Anything else gets 401.  The cookie is ``HttpOnly``
  and ``SameSite=Strict``, so another site's page cannot send it along.  The sign-in
  then goes to ``next=`` when it names a page of this inspector (:func:`safe_next`: a path
  on this origin, never another site), else to the overview; the 401 page says how.

Secrets are compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # never sent to another site; a same-origin form keeps its Origin
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-store",
}
"""Set on every response (replacing any the application set)."""
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
"""The Host names allowed by default: this machine only."""
COOKIE = "fsm_inspect_session"
LOGIN_PATH = "/login"
HOME = "/"
MAX_NEXT = 2048
"""Longest ``next=`` followed (characters)."""
NEXT_HINT = (
    " To land on a page after signing in, add <code class=next>&amp;next=</code> and the page's path, "
    "URL-encoded, to that URL (<code>&amp;next=%2Fentity%3Fid%3Djob-1</code> for "
    "<code>/entity?id=job-1</code>)."
)
"""What the 401 page says of ``next=`` (fixed text: the page repeats nothing of the request)."""


def safe_next(value: str) -> str | None:
    """``value`` if the sign-in may send the browser there, else ``None`` (the overview then).

    Only a path of this inspector, with its query: it starts with exactly one ``/`` and
    holds no backslash (browsers read ``/\\host`` as ``//host``), no control character or
    whitespace (they drop a tab or newline inside a URL, so ``/<TAB>/host`` would become
    ``//host``; a CR or LF would split the Location header), and nothing that gives a
    scheme or a host.  Not the sign-in itself (no loop)."""
    from urllib.parse import urlsplit

    if not value or len(value) > MAX_NEXT or not value.startswith("/") or value.startswith("//"):
        return None
    if "\\" in value or any(c.isspace() or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//"):
        return None
    if parts.path == LOGIN_PATH:
        return None
    return value


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the page on this machine (``localhost`` or a loopback IP)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The Host allowlist: loopback names, the bound address itself when it is a specific
    one (not ``0.0.0.0`` or ``::``), and the names the operator added."""
    hosts = [*LOOPBACK_HOSTS]
    name = bind.strip("[]")
    if name not in {"0.0.0.0", "::", ""} and name not in hosts:
        hosts.append(name)
    hosts += [h.lower() for h in extra if h.lower() not in hosts]
    return hosts


class SecurityHeaders:
    """Adds :data:`HEADERS` to every HTTP response of ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]
        self.names = {k.encode("latin-1") for k in HEADERS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in self.names]
                message = {**message, "headers": kept + self.raw}
            await send(message)

        await self.app(scope, receive, send_secured)


@dataclass
class Tokens:
    """The bearer token, the one-time login codes, and the sessions they opened."""

    token: str
    codes: set[str] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_code(self) -> str:
        """A fresh one-time login code (``/login?code=..`` opens one browser session)."""
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes.add(code)
        return code

    def redeem(self, code: str) -> str | None:
        """A new session id for an unused ``code`` (which is used up), else ``None``."""
        with self.lock:
            found = next((c for c in self.codes if hmac.compare_digest(c.encode(), code.encode())), None)
            if found is None:
                return None
            self.codes.discard(found)
            session = secrets.token_urlsafe(32)
            self.sessions.add(session)
            return session

    def bearer_ok(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.token.encode())

    def session_ok(self, value: str) -> bool:
        with self.lock:
            return any(hmac.compare_digest(value.encode(), s.encode()) for s in self.sessions)


def _cookie(headers: Headers) -> str:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no session, not an error
        return ""
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else ""


def authenticated(tokens: Tokens, headers: Headers) -> str | None:
    """How the request proved it holds the token (``"bearer"`` or ``"session"``), or ``None``."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value and tokens.bearer_ok(value.strip()):
        return "bearer"
    session = _cookie(headers)
    if session and tokens.session_ok(session):
        return "session"
    return None


def _refused(status: int, title: str, detail: str) -> HTMLResponse:
    from fsm.inspect.pages import error_page

    return HTMLResponse(error_page(status, title, detail), status_code=status)


class TokenGate:
    """Lets through only requests that hold the token (see the module docstring)."""

    def __init__(self, app: ASGIApp, tokens: Tokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if scope["path"] == LOGIN_PATH:
            await self.login(scope, headers)(scope, receive, send)
            return
        how = authenticated(self.tokens, headers)
        if how is None:
            response = _refused(
                401,
                "Sign-in needed",
                "This inspector needs its token: send <code>Authorization: Bearer TOKEN</code>, or open the "
                "one-time sign-in URL that <code>fsm inspect</code> printed." + NEXT_HINT,
            )
            response.headers["www-authenticate"] = 'Bearer realm="fsm inspect"'
            await response(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["auth"] = how
        state["who"] = "bearer" if how == "bearer" else _cookie(headers)  # what a CSRF token is bound to
        await self.app(scope, receive, send)

    def login(self, scope: Scope, headers: Headers) -> Response:
        if scope["method"] != "GET":
            return _refused(405, "Method not allowed", "Sign in with GET /login?code=..")
        code = QueryParams(scope.get("query_string", b"").decode("latin-1")).get("code", "")
        session = self.tokens.redeem(code) if code else None
        if session is None:
            return _refused(
                403,
                "This sign-in URL is not valid",
                "A sign-in URL works once. Ask for a new one: <code>fsm inspect</code> prints one at start.",
            )
        target = safe_next(QueryParams(scope.get("query_string", b"").decode("latin-1")).get("next", "")) or HOME
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return response


def secure(app: ASGIApp, *, hosts: list[str], tokens: Tokens | None) -> Any:
    """``app`` behind the layers above: headers outermost, then the Host check, then the
    path and query string (:mod:`fsm.inspect.inputs`), then the token."""
    from fsm.inspect.inputs import CleanInputs

    inner: ASGIApp = TokenGate(app, tokens) if tokens is not None else app
    return SecurityHeaders(TrustedHostMiddleware(CleanInputs(inner), allowed_hosts=hosts, www_redirect=False))


__all__ = [
    "CSP",
    "HEADERS",
    "LOOPBACK_HOSTS",
    "SecurityHeaders",
    "TokenGate",
    "Tokens",
    "allowed_hosts",
    "is_loopback",
    "safe_next",
    "secure",
]
