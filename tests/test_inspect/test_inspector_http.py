"""The inspector over HTTP: no input yields a 500, the Host allowlist, the token, and the
security headers on every answer (Starlette's own 404, 405 and 500 included)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from inspect_support import Answer, Served, http, serve_asgi, served_store, stop_serving  # noqa: F401

from fsm import JobLifecycle, PipelineLifecycle
from fsm.inspect.security import HEADERS, Tokens, allowed_hosts, is_loopback

TOKEN = "t0ken-" + "x" * 26


def secured(answer: Answer) -> None:
    for name, value in HEADERS.items():
        assert answer.headers.get(name) == value, (name, answer.status)


def test_a_never_fired_entitys_page_is_shown(served: Served) -> None:
    answer = http(served.base + "/entity?" + urlencode({"id": "job-queued-0"}))
    assert answer.status == 200, answer.body[:300]
    assert "job-queued-0" in answer.body and "queued" in answer.body
    assert http(served.base + "/fragment/entity?" + urlencode({"id": "job-queued-0"})).status == 200


@pytest.mark.parametrize(
    "query",
    [
        "id=a%00b",  # NUL
        "id=" + "x" * 256,  # longer than any id
        "id=",  # none given
        "id=%ED%A0%80",  # a lone surrogate's UTF-8 bytes
    ],
)
def test_a_bad_id_gets_a_400_page_on_every_path(served: Served, query: str) -> None:
    for path in ("/entity", "/fragment/entity", "/diagram.svg"):
        answer = http(f"{served.base}{path}?{query}")
        assert 400 <= answer.status < 500, (path, query, answer.status)
        secured(answer)
        if answer.status == 400:
            assert "Bad request" in answer.body or "id" in answer.body


@pytest.mark.parametrize("name", ["q", "state", "kind"])
def test_a_nul_in_a_filter_gets_a_400_page(served: Served, name: str) -> None:
    for path in ("/", "/fragment/overview"):
        answer = http(f"{served.base}{path}?{name}=a%00b")
        assert answer.status == 400, (path, name, answer.status, answer.body[:200])
        assert f"{name} must not contain NUL" in answer.body
        secured(answer)


def test_other_bad_filters_get_a_400_page_and_an_unknown_id_a_404(served: Served) -> None:
    for query in ("q=" + quote("\U0010ffff"), "q=" + quote("a\U0010ffff"), "data=" + quote("\U0010ffff") + "&value=x"):
        assert http(f"{served.base}/?{query}").status == 200, query  # the highest code point: no range, no 500
    for query in ("limit=abc", "limit=-1", "limit=" + "9" * 40, "q=" + quote("é" * 300)):
        answer = http(f"{served.base}/?{query}")
        assert answer.status == 400, (query, answer.status)
    answer = http(served.base + "/entity?id=no-such-entity")
    assert answer.status == 404 and "No entity with id" in answer.body
    secured(answer)


def test_every_answer_carries_the_security_headers(served: Served) -> None:
    for path in ("/", "/fragment/overview", "/static/inspect.js", "/static/inspect.css", "/entity?id=job-live"):
        answer = http(served.base + path)
        assert answer.status == 200, path
        secured(answer)
    assert "counts as of" in http(served.base + "/").body  # the cache's age, on the page
    missing = http(served.base + "/no/such/page")
    assert missing.status == 404 and "Not found" in missing.body
    secured(missing)
    posted = http(served.base + "/", method="POST", data=b"x")
    assert posted.status == 405 and "read-only" in posted.body
    secured(posted)


def test_a_server_error_carries_the_headers_too(tmp_path: Path) -> None:
    from fsm.inspect.app import create_app
    from stores.sql import SqlStore

    url = f"sqlite:///{tmp_path}/gone.db"
    store = SqlStore(url, table_prefix="fsm_")
    app = create_app(store, [JobLifecycle, PipelineLifecycle])
    with store.engine.begin() as conn:  # the tables vanish under the running page
        import sqlalchemy as sa

        for table in ("fsm_effects", "fsm_history", "fsm_entities"):
            conn.execute(sa.text(f"DROP TABLE {table}"))
    server, thread, base = serve_asgi(app)
    try:
        answer = http(base + "/")
        assert answer.status == 500 and "Internal error" in answer.body
        assert "Traceback" not in answer.body and "sqlite" not in answer.body.lower()
        secured(answer)
    finally:
        stop_serving(server, thread)
        store.close()


def test_a_host_outside_the_allowlist_is_refused(served: Served) -> None:
    port = served.base.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "attacker.localhost.example"):
        answer = http(served.base + "/", headers={"Host": host})
        assert answer.status == 400, host
        assert "job-live" not in answer.body
        secured(answer)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert http(served.base + "/", headers={"Host": host}).status == 200, host


def test_the_allowlist_is_loopback_plus_the_bound_address_and_the_names_given() -> None:
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert allowed_hosts("0.0.0.0", ["Inspect.Example.com"])[-1] == "inspect.example.com"
    assert "0.0.0.0" not in allowed_hosts("0.0.0.0")
    assert allowed_hosts("10.1.2.3")[-1] == "10.1.2.3"
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "example.com")] == [False] * 4


@pytest.fixture(name="guarded", scope="module")
def guarded_app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A page that asks for the token (as when bound to anything but loopback)."""
    from fsm import Engine
    from fsm.inspect.app import create_app
    from stores.sql import SqlStore

    url = f"sqlite:///{tmp_path_factory.mktemp('guarded')}/fsm.db"
    store = SqlStore(url, table_prefix="fsm_")
    Engine(JobLifecycle, store).create("job-secret", data={"api_key": "hunter2"})
    tokens = Tokens(TOKEN)
    server, thread, base = serve_asgi(create_app(store, [JobLifecycle], tokens=tokens))
    yield base, tokens
    stop_serving(server, thread)
    store.close()


def test_without_the_token_every_path_answers_401(guarded: Any) -> None:
    base, _ = guarded
    for path in ("/", "/entity?id=job-secret", "/fragment/overview", "/diagram.svg?id=job-secret", "/nope"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Cookie": "x=1"}):
            answer = http(base + path, headers=headers)
            assert answer.status == 401, (path, headers)
            assert "hunter2" not in answer.body and "job-secret" not in answer.body
            secured(answer)
    assert http(base + "/", headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    assert "job-secret" in http(base + "/", headers={"Authorization": f"bearer {TOKEN}"}).body


def test_a_one_time_url_sets_a_session_cookie_and_works_once(guarded: Any) -> None:
    base, tokens = guarded
    code = tokens.new_code()
    first = http(f"{base}/login?code={code}")
    assert first.status == 303 and first.headers["Location"] == "/"
    cookie = first.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    secured(first)
    session = cookie.split(";", 1)[0]
    page = http(base + "/", headers={"Cookie": session})
    assert page.status == 200 and "job-secret" in page.body
    again = http(f"{base}/login?code={code}")
    assert again.status == 403 and "works once" in again.body
    assert "Set-Cookie" not in again.headers
    assert http(f"{base}/login?code=guess").status == 403
    assert http(f"{base}/login").status == 403
    assert http(f"{base}/login?code={tokens.new_code()}", method="POST", data=b"").status == 405
    forged = http(base + "/", headers={"Cookie": session[:-2] + "xx"})
    assert forged.status == 401


def _args(*argv: str) -> argparse.Namespace:
    from fsm.cli import build_parser

    return build_parser().parse_args(["inspect", "--db", "sqlite:///x.db", *argv])


def test_binding_anything_but_loopback_needs_a_token_and_0000_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsm.inspect.cli import TOKEN_ENV, announce, tokens_for

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    local = _args()
    assert tokens_for(local) is None
    assert not any("WARNING" in line for line in announce(local, None))
    assert tokens_for(_args("--require-token")) is not None

    exposed = _args("--host", "0.0.0.0")
    tokens = tokens_for(exposed)
    assert tokens is not None and len(tokens.token) >= 32
    said = "\n".join(announce(exposed, tokens))
    assert "WARNING: --host 0.0.0.0" in said
    assert f"token (set {TOKEN_ENV} to choose it): {tokens.token}" in said
    [code] = tokens.codes
    assert f"http://127.0.0.1:8765/login?code={code}" in said  # a URL to visit, not 0.0.0.0; it works once
    assert tokens.redeem(code) is not None and tokens.redeem(code) is None

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    chosen = tokens_for(_args("--host", "10.0.0.5"))
    assert chosen is not None and chosen.token == TOKEN
    assert TOKEN not in "\n".join(announce(_args("--host", "10.0.0.5"), chosen))  # not echoed
    monkeypatch.setenv(TOKEN_ENV, "short")
    from fsm.errors import ConfigError

    with pytest.raises(ConfigError):
        tokens_for(exposed)


def test_no_filter_yields_a_500(served: Served) -> None:
    """Random filters (seeded): quotes, wildcards, NUL, control and high code points, long and
    empty values, timestamps good and bad; every answer is a page or a 400, never a 500."""
    import random

    rng = random.Random(21)
    pieces = ["", "a", "job-", "'", '"', "%", "_", "\\", "\x00", "\x01", "é", "\U0010ffff", "<b>", "1", "true",
              "a.b", ".", "task", "2026-01-01T00:00:00+00:00", "2026-01-01", "-1", "999999", "x" * 300]  # fmt: skip
    names = ["kind", "state", "q", "holder", "data", "value", "limit", "expired", "after_t", "after_id", "id"]
    for _ in range(120):
        query = {name: "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3))) for name in rng.sample(names, 3)}
        for path in ("/", "/fragment/overview"):
            answer = http(f"{served.base}{path}?{urlencode(query)}")
            assert answer.status in {200, 400}, (query, answer.status, answer.body[:200])
