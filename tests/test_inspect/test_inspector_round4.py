"""Inspector hardening, round 4: half-open requests are bounded (a real ``fsm inspect`` over
real sockets), the one-time sign-in goes on to a page of this inspector only (``next=``),
the claim-latency chart counts from the due time as the ``fsm.claim.latency`` metric does,
and the entity page labels its three "attempt" counts so that they agree."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import postgres_url
from inspect_support import artifacts_dir, chromium, http, inspector, serve_asgi, stop_serving  # noqa: F401
from observe_support import Telemetry, telemetry

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.records import error_record
from stores.sql import SqlStore

__all__ = ["telemetry"]  # the fixture

DEADLINE = 30.0
"""Generous: what the server must do well within it happens in a few seconds."""
TOKEN = "round4-token-" + "y" * 24


# -- 1. half-open requests and too many connections ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _until_closed(socks: list[socket.socket], deadline: float) -> dict[socket.socket, bytes]:
    """What the server sent each socket before closing it (``b"RESET"`` for a reset), for
    the sockets it closed before ``deadline`` (a monotonic time)."""
    said: dict[socket.socket, bytearray] = {s: bytearray() for s in socks}
    closed: dict[socket.socket, bytes] = {}
    while len(closed) < len(socks) and time.monotonic() < deadline:
        open_ = [s for s in socks if s not in closed]
        readable, _, _ = select.select(open_, [], [], 0.2)
        for s in readable:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                closed[s] = bytes(said[s]) or b"RESET"
                continue
            if chunk:
                said[s] += chunk
            else:
                closed[s] = bytes(said[s])
    return closed


@pytest.fixture(name="fsm_inspect")
def a_running_fsm_inspect(tmp_path: Path) -> Iterator[int]:
    """``fsm inspect`` run as an operator runs it (its own process) on a small SQLite store: its port."""
    url = f"sqlite:///{tmp_path}/fsm.db"
    store = SqlStore(url)
    Engine(JobLifecycle, store).create("job-1")
    store.close()
    port = _free_port()
    code = "import sys; from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "inspect", "--db", url, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        for _ in range(400):
            try:
                _connect(port).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.communicate()


def test_fsm_inspect_closes_300_half_open_requests_and_holds_few_connections(fsm_inspect: int) -> None:
    port = fsm_inspect
    partial = [
        b"GET / HT",  # half a request line
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",  # half its headers
        b"",  # nothing at all
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nab",  # a body that never ends
    ]
    socks = []
    try:
        for i in range(300):
            s = _connect(port)
            if partial[i % 4]:
                s.sendall(partial[i % 4])
            socks.append(s)
        closed = _until_closed(socks, time.monotonic() + DEADLINE)
        assert len(closed) == len(socks), f"{len(socks) - len(closed)} half-open connections still held"
        first_lines = [said.split(b"\r\n", 1)[0] for said in closed.values()]
        # the held ones were told they were too slow, the ones past the cap that it is busy
        assert any(line.startswith(b"HTTP/1.1 408") for line in first_lines), set(first_lines)
        assert any(line.startswith(b"HTTP/1.1 503") for line in first_lines), set(first_lines)
    finally:
        for s in socks:
            s.close()
    answer = http(f"http://127.0.0.1:{port}/")  # the page still answers
    assert answer.status == 200 and "job-1" in answer.body


def test_a_stalled_request_on_a_kept_alive_connection_is_closed_and_an_event_stream_is_not(
    tmp_path: Path,
) -> None:
    from fsm.inspect.app import create_app
    from fsm.inspect.events import StreamLimits

    url = f"sqlite:///{tmp_path}/fsm.db"
    store = SqlStore(url)
    Engine(JobLifecycle, store).create("job-1")
    reader = SqlStore(url, create=False)
    app = create_app(reader, [JobLifecycle], stream_limits=StreamLimits(poll=0.2, heartbeat=0.5))
    server, thread, base = serve_asgi(app)
    port = int(base.rsplit(":", 1)[1])
    stream = _connect(port)
    kept = _connect(port)
    try:
        stream.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        assert stream.recv(4096).startswith(b"HTTP/1.1 200")  # its request is in: the response is not timed
        kept.sendall(b"GET /static/inspect.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first:
            first += kept.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        length = int(re.search(rb"content-length: (\d+)", first, re.I).group(1))  # type: ignore[union-attr]
        body = first.split(b"\r\n\r\n", 1)[1]
        while len(body) < length:
            body += kept.recv(65536)
        kept.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # the next request stalls
        closed = _until_closed([kept], time.monotonic() + DEADLINE)
        assert kept in closed, "the stalled request on a kept-alive connection was never closed"
        assert closed[kept].startswith(b"HTTP/1.1 408")
        stream.settimeout(10)
        assert stream.recv(4096), "the event stream was cut"  # heartbeats still come, longer after
    finally:
        stream.close()
        kept.close()
        stop_serving(server, thread)
        reader.close()
        store.close()


# -- 2. the sign-in goes on to next= -----------------------------------------------------------


@pytest.fixture(name="guarded")
def guarded_inspector(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    from fsm.inspect.app import create_app
    from fsm.inspect.security import Tokens

    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    Engine(JobLifecycle, store).create("job/secret 1", data={"api_key": "hunter2"})
    tokens = Tokens(TOKEN)
    server, thread, base = serve_asgi(create_app(store, [JobLifecycle], tokens=tokens))
    try:
        yield base, tokens
    finally:
        stop_serving(server, thread)
        store.close()


HOSTILE_NEXT = [
    "https://evil.example/",
    "http:/evil.example",
    "//evil.example/x",
    "///evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "/\t/evil.example",  # browsers drop a tab: //evil.example
    "/\r\nSet-Cookie: x=1",
    "/\nLocation: https://evil.example",
    "javascript:alert(1)",
    "evil.example/x",
    " /entity",
    "entity?id=x",
    "/login?code=again",  # no loop back into the sign-in
    "/" + "a" * 5000,
]


def test_the_sign_in_goes_on_to_next_when_it_is_a_page_here_and_home_otherwise(guarded: Any) -> None:
    base, tokens = guarded
    page = "/entity?" + urlencode({"id": "job/secret 1"})
    asked = http(base + page)
    assert asked.status == 401 and "<code class=next>&amp;next=</code>" in asked.body  # it says how
    assert "secret" not in asked.body  # and repeats nothing of the request
    for wanted in (page, "/?kind=job&state=queued", "/"):
        answer = http(f"{base}/login?" + urlencode({"code": tokens.new_code(), "next": wanted}))
        assert answer.status == 303, (wanted, answer.status)
        assert answer.headers["Location"] == wanted
        session = answer.headers["Set-Cookie"].split(";", 1)[0]
        landed = http(base + answer.headers["Location"], headers={"Cookie": session})
        assert landed.status == 200
    assert "hunter2" in landed.body or "job/secret 1" in landed.body
    for hostile in HOSTILE_NEXT:
        answer = http(f"{base}/login?" + urlencode({"code": tokens.new_code(), "next": hostile}))
        assert answer.status == 303 and answer.headers["Location"] == "/", (hostile, answer.headers["Location"])
        assert "Set-Cookie" in answer.headers  # signed in all the same, at the overview
    refused = http(f"{base}/login?" + urlencode({"code": "used-or-guessed", "next": page}))
    assert refused.status == 403 and "Location" not in refused.headers


# -- 4. the claim-latency chart counts from the due time --------------------------------------


@pytest.fixture(name="clocked", params=["sqlite", "postgres"])
def clocked_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SqlStore, ManualClock]]:
    """A SQL store on a manual clock (SQLite, or PostgreSQL under a prefix of its own)."""
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
    if request.param == "sqlite":
        store = SqlStore(f"sqlite:///{tmp_path}/fsm.db", clock=clock)
        yield store, clock
        store.close()
        return
    url, prefix = postgres_url(), f"t{uuid.uuid4().hex[:10]}_"
    store = SqlStore(url, table_prefix=prefix, clock=clock)
    try:
        yield store, clock
    finally:
        store.close()
        import sqlalchemy as sa

        from stores.sql.migrate import drop_schema

        engine = sa.create_engine(url)
        drop_schema(engine, table_prefix=prefix)
        engine.dispose()


def _chart(store: SqlStore) -> list[float]:
    """The claim-latency chart's minutes that have a value, oldest first."""
    return [v for v in inspector(store).activity().value.latency if v is not None]


def test_the_claim_latency_chart_counts_from_the_due_time_as_the_metric_does(
    clocked: tuple[SqlStore, ManualClock], telemetry: Telemetry
) -> None:
    store, clock = clocked
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    jobs.create("delayed", run_after=timedelta(seconds=10))
    clock.advance(timedelta(seconds=10, milliseconds=4))
    [delayed] = jobs.claim(1)  # claimed 4 ms after it was due, 10 s after it was created
    assert delayed.id == "delayed"
    [metric] = telemetry.points("fsm.claim.latency")
    assert metric.sum == pytest.approx(0.004, abs=1e-6)
    assert _chart(store) == [pytest.approx(0.004, abs=1e-6)]

    clock.advance(timedelta(minutes=2))  # the next claims in a minute of their own
    jobs.create("retried")
    [first] = jobs.claim(1)
    assert first.lease is not None
    error = error_record(RuntimeError("flaky"), attempt=1)
    jobs.fire("retried", "retry", lease=first.lease, error=error, run_after=timedelta(seconds=30))
    clock.advance(timedelta(seconds=30, milliseconds=500))
    [again] = jobs.claim(1)  # claimed 0.5 s after its backoff ended, 30.5 s after the retry
    assert again.id == "retried" and again.attempt == 2
    metrics = sorted(p.sum for p in telemetry.points("fsm.claim.latency"))
    assert sum(metrics) == pytest.approx(0.504, abs=1e-6)  # 0.004, then 0 and 0.5
    # the retried job's first start had a due time the retry replaced: only its second is charted
    assert _chart(store) == [pytest.approx(0.004, abs=1e-6), pytest.approx(0.5, abs=1e-6)]


# -- 5. the three "attempt" counts, labelled so that they agree -------------------------------

RETRIED = "job-retried-twice"


def _retried_twice(store: SqlStore) -> None:
    """A job whose running handler failed once (retried: attempt 2), then whose finalizing
    gate failed twice (retried twice in finalizing, still attempt 2) and then passed: the
    gate ran 3 times.  Errors numbered as the worker numbers them (fsm.work.loop)."""
    jobs = Engine(JobLifecycle, store, owner="worker-1")
    jobs.create(RETRIED, data={"task": "deploy"})
    [snap] = jobs.claim(1)
    assert snap.lease is not None and snap.attempt == 1
    jobs.fire(RETRIED, "retry", lease=snap.lease, error=error_record(OSError("disk full"), attempt=1))
    [snap] = jobs.claim(1)
    assert snap.lease is not None and snap.attempt == 2
    jobs.fire(RETRIED, "exited", lease=snap.lease, data={"exit_code": 0})
    for n in (1, 2):
        lease = jobs.get(RETRIED).lease
        assert lease is not None

        def gate(key: str, n: int = n) -> dict[str, str]:
            raise RuntimeError(f"merge-gate: flaky test, try {n}")

        with pytest.raises(RuntimeError) as raised:
            jobs.run(RETRIED, "merge-gate", gate, lease)
        jobs.fire(RETRIED, "retry", lease=lease, error=error_record(raised.value, attempt=n))
        [snap] = jobs.claim(1)  # the finalizer resumed: no new attempt
        assert snap.id == RETRIED and snap.state == "finalizing" and snap.attempt == 2
    lease = jobs.get(RETRIED).lease
    assert lease is not None
    jobs.run(RETRIED, "merge-gate", lambda key: {"status": "passed"}, lease)
    jobs.fire(RETRIED, "complete", lease=lease)
    [gate_record] = store.effects(RETRIED)
    assert gate_record.attempts == 3 and store.get(RETRIED).attempt == 2


def _text(markup: str) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_an_entitys_attempt_its_errors_and_its_effects_runs_are_labelled_so_they_agree(tmp_path: Path) -> None:
    from fsm.inspect.app import create_app

    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    _retried_twice(store)
    server, thread, base = serve_asgi(create_app(store, [JobLifecycle, PipelineLifecycle]))
    try:
        body = http(base + "/entity?" + urlencode({"id": RETRIED})).body
    finally:
        stop_serving(server, thread)
        store.close()
    facts = dict(re.findall(r"<tr><th[^>]*>([^<]+)</th><td>(.*?)</td></tr>", body))
    assert _text(facts["attempt"]) == "2 (3 retries: 1 in running, 2 in finalizing)"
    rows = re.findall(r"<tr data-attempt-seq='\d+'>(.*?)</tr>", body, re.S)
    cells = [[_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[1:3]] for row in rows]
    assert cells == [  # newest first: the entity's attempt, and which error of its state
        ["2", "error 2 in finalizing"],
        ["2", "error 1 in finalizing"],
        ["1", "error 1 in running"],
    ]
    legend = _text(re.search(r"<p class=legend>(.*?)</p>", body).group(1))  # type: ignore[union-attr]
    assert "one per claim that started it" in legend and "the N-th handler error in that state" in legend
    assert "how many times that effect ran" in legend
    timeline = _text(re.search(r"<ol class=timeline>(.*?)</ol>", body, re.S).group(1))  # type: ignore[union-attr]
    assert "attempt 2, error 2 in finalizing: RuntimeError: merge-gate: flaky test, try 2" in timeline
    assert "attempt 1, error 1 in running: OSError: disk full" in timeline
    assert "succeeded, token" in timeline and "ran 3 times" in timeline
    assert "<th class=n title='runs: how many times that effect ran" in body  # the effects table's column


def _whole_page(browser: Any, path: Path) -> None:
    """The whole page as a PNG (Chromium's capture beyond the window, as the README's screenshots)."""
    import base64

    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    options = {"format": "png", "captureBeyondViewport": True, "clip": clip}
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", options)
    path.write_bytes(base64.b64decode(shot["data"]))


@pytest.mark.browser
def test_the_browser_signs_in_straight_to_the_retried_entitys_page(
    browser: Any, tmp_path: Path, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    from fsm.inspect.app import create_app
    from fsm.inspect.security import Tokens

    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db")
    _retried_twice(store)
    tokens = Tokens(TOKEN)
    server, thread, base = serve_asgi(create_app(store, [JobLifecycle, PipelineLifecycle], tokens=tokens))
    try:
        page = "/entity?" + urlencode({"id": RETRIED})
        browser.get(f"{base}/login?" + urlencode({"code": tokens.new_code(), "next": page}))
        for _ in range(200):
            if browser.find_elements(By.CSS_SELECTOR, "section.attempts tr[data-attempt-seq]"):
                break
            time.sleep(0.05)
        assert browser.current_url == base + page
        attempt = browser.find_element(By.CSS_SELECTOR, "table.facts span.attempt").text
        assert attempt == "2"
        rows = browser.find_elements(By.CSS_SELECTOR, "section.attempts tr[data-attempt-seq]")
        labels = [r.find_element(By.CSS_SELECTOR, "td.of-state").text for r in rows]
        assert labels == ["error 2 in finalizing", "error 1 in finalizing", "error 1 in running"]
        _whole_page(browser, artifacts / "round4-entity-attempts.png")
    finally:
        browser.get("about:blank")
        stop_serving(server, thread)
        store.close()
