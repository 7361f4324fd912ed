"""The inspector's ``/events`` over HTTP: transitions made by other processes arrive as
server-sent events, a reconnect resumes from ``Last-Event-ID`` without loss or repeat, the
stream is bounded, goes through the same security as every page, ends on shutdown, and a
hostile ``Last-Event-ID`` or query value gets a 4xx."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import SqlTarget
from inspect_support import serve_asgi, stop_serving

from fsm import Engine, JobLifecycle, PipelineLifecycle
from fsm.inspect.events import StreamLimits
from fsm.inspect.security import CSP, HEADERS, Tokens
from stores.sql import SqlStore

WAIT = 30.0
"""Seconds a read may block before the test fails (a guard, never a timing claim)."""
TOKEN = "t0ken-" + "y" * 26


@dataclass
class Block:
    """One server-sent event block: its fields (``id``, ``event``, ``data``) and comments."""

    fields: dict[str, str] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)

    @property
    def record(self) -> dict[str, Any]:
        return dict(json.loads(self.fields["data"])["record"])


class EventClient:
    """A raw ``GET /events`` read block by block (what an ``EventSource`` parses)."""

    def __init__(self, base: str, path: str = "/events", headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=WAIT)
        self.conn.request("GET", path, headers={"Accept": "text/event-stream", **(headers or {})})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def block(self) -> Block | None:
        """The next block, or None at the end of the stream."""
        found = Block()
        while True:
            line = self.response.readline()
            if not line:
                return None
            text = line.decode("utf-8").rstrip("\n")
            if text == "":
                if found.fields or found.comments:
                    return found
                continue
            if text.startswith(":"):
                found.comments.append(text[1:].strip())
            else:
                name, _, value = text.partition(":")
                found.fields[name] = value[1:] if value.startswith(" ") else value

    def transitions(self, count: int) -> tuple[list[Block], str]:
        """The next ``count`` transition events, and the last id the stream gave."""
        got: list[Block] = []
        last = ""
        while len(got) < count:
            block = self.block()
            assert block is not None, f"the stream ended after {len(got)} of {count} events"
            last = block.fields.get("id", last)
            if block.fields.get("event") == "transition":
                got.append(block)
        return got, last

    def close(self) -> None:
        self.conn.close()


class Inspector:
    """The inspector over a reader of ``target``'s store, served for real (uvicorn)."""

    def __init__(self, target: SqlTarget, limits: StreamLimits, **options: Any) -> None:
        from fsm.inspect.app import create_app

        self.reader = SqlStore(target.url, table_prefix=target.prefix, create=False)
        self.app = create_app(self.reader, [JobLifecycle, PipelineLifecycle], stream_limits=limits, **options)
        self.server, self.thread, self.base = serve_asgi(self.app)

    def close(self) -> None:
        self.app.streams.close()
        stop_serving(self.server, self.thread)
        self.reader.close()


@pytest.fixture(name="inspector")
def served_inspector(sql_target: SqlTarget) -> Iterator[Inspector]:
    sql_target.store()  # the tables
    served = Inspector(sql_target, StreamLimits(poll=0.05, heartbeat=3600, max_streams=4))
    try:
        yield served
    finally:
        served.close()


def elsewhere(target: SqlTarget, *steps: str) -> None:
    """Run ``steps`` (``create:ID``, ``start:ID``, ``finish:ID``) in another process, as a
    worker there would."""
    code = (
        "import sys; from fsm import Engine, PipelineLifecycle; from stores.sql import SqlStore\n"
        "store = SqlStore(sys.argv[1], table_prefix=sys.argv[2], create=False)\n"
        "engine = Engine(PipelineLifecycle, store, owner='worker-elsewhere')\n"
        "for step in sys.argv[3:]:\n"
        "    what, _, entity = step.partition(':')\n"
        "    engine.create(entity) if what == 'create' else engine.fire(entity, what)\n"
        "store.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code, target.url, target.prefix, *steps],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr


def story(blocks: list[Block]) -> list[tuple[str, str, int]]:
    return [(b.record["entity_id"], b.record["event"], b.record["seq"]) for b in blocks]


def test_transitions_of_another_process_arrive_and_a_reconnect_resumes_without_loss_or_repeat(
    sql_target: SqlTarget, inspector: Inspector
) -> None:
    first = EventClient(inspector.base)
    assert first.status == 200 and first.response.headers["content-type"].startswith("text/event-stream")
    hello = first.block()
    assert hello is not None and hello.fields["id"] and hello.fields["retry"].isdigit()  # where it starts
    elsewhere(sql_target, "create:p0", "create:p1", "start:p0", "start:p1", "finish:p0")
    (one,), _ = first.transitions(1)
    first.close()  # the browser lost the connection after one event
    assert one.fields["id"] == json.loads(one.fields["data"])["position"]
    assert story([one]) == [("p0", "start", 1)]
    again = EventClient(inspector.base, headers={"Last-Event-ID": one.fields["id"]})
    rest, _ = again.transitions(2)
    again.close()
    assert story(rest) == [("p1", "start", 1), ("p0", "finish", 2)]  # nothing lost, nothing twice
    truth = [(e.record.entity_id, e.record.event, e.record.seq) for e in inspector.reader.feed(one.fields["id"])]
    assert story(rest) == truth
    # ?after= resumes the same way, for clients that cannot set the header
    query = EventClient(inspector.base, "/events?" + urlencode({"after": one.fields["id"]}))
    assert story(query.transitions(2)[0]) == truth
    query.close()


def test_one_entitys_stream_tells_only_its_transitions_and_moves_its_id_past_the_others(
    sql_target: SqlTarget, inspector: Inspector
) -> None:
    client = EventClient(inspector.base, "/events?" + urlencode({"id": "mine"}))
    assert client.block() is not None
    elsewhere(sql_target, "create:mine", "create:other", "start:other", "start:mine", "finish:other")
    (mine,), last = client.transitions(1)
    assert story([mine]) == [("mine", "start", 1)]
    while (block := client.block()) is not None and "event" not in block.fields:
        last = block.fields["id"]  # the id moves on past "other"'s finish, with no event
        if [e.record.entity_id for e in inspector.reader.feed(last)] == []:
            break
    client.close()
    assert inspector.reader.feed(last) == []  # a resume from here reads nothing again


@pytest.mark.parametrize(
    ("header", "query"),
    [
        ("zz", ""),  # not a position of this store
        ("s-1", ""),
        ("s" + "9" * 30, ""),
        ("p1.2", ""),
        ("s1\u00e9", ""),  # latin-1 on the wire
        ("s" + "1" * 3000, ""),  # too long
        ("", "after=zz"),
        ("", "after=s1%00"),
        ("", "after=%ED%A0%80"),  # a lone surrogate, percent-encoded
        ("", "id=a%00b"),
        ("", "id=" + "x" * 256),
        ("", "kind=%00"),
        ("", "kind=" + "k" * 300),
    ],
)
def test_a_hostile_last_event_id_or_query_gets_a_4xx_with_the_security_headers(
    inspector: Inspector, header: str, query: str
) -> None:
    headers = {"Last-Event-ID": header} if header else {}
    client = EventClient(inspector.base, "/events" + ("?" + query if query else ""), headers)
    try:
        assert 400 <= client.status < 500, (header[:40], query[:40], client.status)
        for name, value in HEADERS.items():
            assert client.response.headers.get(name) == value, name
        client.response.read()
    finally:
        client.close()
    assert inspector.app.streams.opened() == 0


def test_head_answers_the_headers_without_holding_a_stream(inspector: Inspector) -> None:
    parts = urlsplit(inspector.base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=WAIT)
    conn.request("HEAD", "/events")
    answer = conn.getresponse()
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/event-stream")
    conn.close()
    assert inspector.app.streams.opened() == 0


def test_a_nul_in_last_event_id_is_refused(inspector: Inspector) -> None:
    parts = urlsplit(inspector.base)
    with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=WAIT) as raw:
        raw.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: s1\x00\r\nConnection: close\r\n\r\n")
        answer = raw.recv(200)
    assert answer.startswith(b"HTTP/1.1 4"), answer


def test_the_stream_has_the_pages_security(sql_target: SqlTarget) -> None:
    sql_target.store()
    served = Inspector(sql_target, StreamLimits(poll=0.05), tokens=Tokens(TOKEN))
    try:
        evil = EventClient(served.base, headers={"Host": "evil.example"})
        assert evil.status == 400 and "event-stream" not in evil.response.headers.get("content-type", "")
        evil.close()
        anonymous = EventClient(served.base)
        assert anonymous.status == 401
        anonymous.close()
        signed = EventClient(served.base, headers={"Authorization": f"Bearer {TOKEN}"})
        assert signed.status == 200 and signed.response.headers["content-security-policy"] == CSP
        assert "connect-src 'self'" in CSP  # what lets the page's EventSource connect
        assert signed.block() is not None
        signed.close()
    finally:
        served.close()


def test_streams_are_bounded_beat_when_idle_end_after_their_age_and_at_close(sql_target: SqlTarget) -> None:
    sql_target.store()
    served = Inspector(sql_target, StreamLimits(poll=0.05, heartbeat=0.05, max_streams=2, max_age=3600))
    try:
        a, b = EventClient(served.base), EventClient(served.base)
        assert a.status == b.status == 200
        full = EventClient(served.base)
        assert full.status == 503 and full.response.headers["retry-after"]  # the page polls instead
        full.close()
        assert a.block() is not None
        beat = a.block()
        assert beat is not None and beat.comments == ["keep-alive"]  # an idle stream stays open
        b.close()
        wait_until(lambda: served.app.streams.opened() == 1)  # a closed client frees its place
        c = EventClient(served.base)
        assert c.status == 200
        served.app.streams.close()  # shutdown: every open stream ends
        for client in (a, c):
            while client.block() is not None:
                pass
            client.close()
        wait_until(lambda: served.app.streams.opened() == 0)
        assert EventClient(served.base).status == 503  # and no new one starts
    finally:
        served.close()
    aged = Inspector(sql_target, StreamLimits(poll=0.05, heartbeat=3600, max_age=0.2))
    try:
        client = EventClient(aged.base)
        blocks = []
        while (block := client.block()) is not None:
            blocks.append(block)
        client.close()  # ended by itself: the browser resumes from its Last-Event-ID
        assert blocks and blocks[0].fields["id"]
    finally:
        aged.close()


def wait_until(condition: Any) -> None:
    done = threading.Event()
    for _ in range(int(WAIT / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError("the condition never held")


def test_fsm_inspect_stops_on_sigterm_with_a_stream_open(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/fsm.db"
    store = SqlStore(url)
    Engine(PipelineLifecycle, store).create("p0")
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys; from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "inspect", "--db", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        client = None
        for _ in range(500):
            try:
                client = EventClient(f"http://127.0.0.1:{port}")
                break
            except OSError:
                threading.Event().wait(0.05)
        assert client is not None and client.status == 200
        assert client.block() is not None
        proc.send_signal(signal.SIGTERM)
        while client.block() is not None:  # the server ends the stream, not the client
            pass
        client.close()
        assert proc.wait(WAIT) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
