"""How ``fsm inspect`` serves its page: uvicorn, with bounds on what one client can hold.

uvicorn (0.55 and before) has no timeout for *reading* a request: its keep-alive timer runs
only between two requests and the first byte of the next one cancels it, and nothing is
armed when a connection opens.  A client that connects and sends nothing, or part of a
request line or of its headers, and then goes quiet, holds its connection for ever; three
hundred such clients hold three hundred (a "slowloris").  So the inspector's server:

- gives a client :data:`REQUEST_READ_TIMEOUT_S` seconds to send a whole request (line,
  headers and body), counted from when it connected or, on a kept-alive connection, from
  the first byte of its next request; a client still sending then gets ``408`` and the
  connection is closed (one that sent nothing is closed without an answer).  The response
  is not timed: an ``/events`` stream, or a page the store is slow to answer, runs as
  long as it needs once its request is in;
- holds at most :data:`MAX_CONNECTIONS` connections: one more is answered ``503`` at once
  and closed (after :data:`LINGER_S`, its bytes dropped), and uvicorn's own
  ``limit_concurrency`` answers ``503`` to a request made while that many connections or
  requests are open;
- closes an idle kept-alive connection after :data:`KEEP_ALIVE_S` seconds (uvicorn's
  ``timeout_keep_alive``), caps a request's head at :data:`MAX_HEAD_BYTES` (h11's
  ``max_incomplete_event_size``: a longer one is a ``400``), and serves no WebSocket.

The timer lives in :class:`BoundedH11Protocol`, uvicorn's h11 protocol with one timer per
connection (uvicorn offers no setting for it); the page is always served by that protocol,
httptools installed or not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_READ_TIMEOUT_S = 5.0
"""Seconds a client has to send a whole request (see the module docstring)."""
MAX_CONNECTIONS = 64
"""Connections held at once (twice the default ``/events`` streams, :class:`fsm.inspect.events.StreamLimits`)."""
KEEP_ALIVE_S = 5
"""Seconds an idle kept-alive connection stays open between two requests."""
MAX_HEAD_BYTES = 16 * 1024
"""Longest request line and headers read (bytes)."""
LINGER_S = 1.0
"""Seconds a refused connection is kept, half-closed, reading and dropping what the client
sends, before it is closed: closed at once with the client's bytes unread, the kernel would
reset it and the client would lose the ``503``."""

_ANSWERS = {
    408: b"Request Timeout",
    503: b"Service Unavailable",
}


def _answer(status: int, text: str) -> bytes:
    body = text.encode("ascii")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, _ANSWERS[status], len(body), body)
    )


TIMED_OUT = _answer(408, "The request was not sent in time.\n")
BUSY = _answer(503, "Too many connections are open; try again shortly.\n")


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-read deadline and a connection cap (see the
    module docstring).  uvicorn makes one per connection."""

    read_timeout: float = REQUEST_READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_deadline: asyncio.TimerHandle | None = None
        self.refused = False
        self.started = False
        """Whether a byte of the request being read has arrived (a 408 then, else a plain close)."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # counted until closed, a second later
            self.refused = True
            transport.write(BUSY)
            if transport.can_write_eof():
                transport.write_eof()
            self.read_deadline = self.loop.call_later(LINGER_S, transport.close)
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # answered already: read and dropped until it closes
        if self.read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on a kept-alive connection: its clock starts now
        self.started = self.started or bool(data)
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the whole request is in (or the connection is done)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self.read_deadline = self.loop.call_later(self.read_timeout, self._timed_out)

    def _disarm(self) -> None:
        self.started = False
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None

    def _timed_out(self) -> None:
        self.read_deadline = None
        if self.transport.is_closing():
            return
        if self.started and self.conn.our_state is h11.IDLE:  # part of a request, no answer begun: say why
            self.transport.write(TIMED_OUT)
        # a connection that sent nothing is closed without a word, as an idle kept-alive one
        # is: a browser whose request crossed the close sends it again on a new connection
        self.transport.close()  # a request still being read sees http.disconnect


def config(app: Any, *, host: str, port: int, log_level: str = "warning") -> Any:
    """The ``uvicorn.Config`` that serves ``app`` with the bounds above."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=BoundedH11Protocol,
        ws="none",
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=KEEP_ALIVE_S,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )


__all__ = [
    "KEEP_ALIVE_S",
    "LINGER_S",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "REQUEST_READ_TIMEOUT_S",
    "BoundedH11Protocol",
    "config",
]
