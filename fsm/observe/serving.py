"""A worker's Prometheus endpoint: ``Worker(engine, handlers, metrics_port=9464)``, and
the same for :class:`~fsm.aio.AsyncWorker`.

One endpoint per process, as Prometheus scrapes processes: the workers of one process that
ask for an endpoint share it (the same port, or ``0`` for "whichever this process serves
already, else any free port"), and it closes, and the instrumentation it switched on goes
off, when the last of them stops.  A worker's ``metrics`` attribute is the
:class:`~fsm.observe.MetricsServer` (its ``url``), or ``None`` without ``metrics_port``.

Nothing here imports OpenTelemetry, the engine or the worker until a port is given: the
workers import this module, and it must not import them back.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fsm.errors import ConfigError

if TYPE_CHECKING:
    from fsm.observe.prometheus import MetricsServer

_lock = threading.Lock()
_shared: dict[str, Any] = {}
"""``"server"``: the endpoint the workers of this process share; ``"users"``: how many."""


def worker_metrics(port: int | None, host: str | None = None) -> MetricsServer | None:
    """The endpoint a worker asked for (``None`` for ``port`` ``None``): this process's
    shared one, started on the first call.  ``ConfigError`` for a bad port or host, a port
    in use, a port other than the one this process serves, or without the ``otel`` extra."""
    if port is None:
        return None
    from fsm.observe.prometheus import DEFAULT_HOST, serve_metrics

    with _lock:
        server: MetricsServer | None = _shared.get("server")
        if server is not None:
            if isinstance(port, bool) or port not in (0, server.port):
                raise ConfigError(
                    f"this process serves its metrics on {server.url} already (one endpoint per process): "
                    f"give its port, {server.port}, or 0, not {port!r}"
                )
            _shared["users"] += 1
            return server
        server = serve_metrics(port, DEFAULT_HOST if host is None else host)
        _shared.update(server=server, users=1)
        return server


def release_worker_metrics(server: MetricsServer | None) -> MetricsServer | None:
    """A worker stops using ``server`` (``None``: nothing); the last one closes it and
    switches its instrumentation off.  Returns ``None``, for ``self.metrics = ...``, so a
    second stop releases nothing twice."""
    if server is None:
        return None
    closing: MetricsServer = server
    with _lock:
        if _shared.get("server") is not closing:
            return None
        _shared["users"] -= 1
        if _shared["users"] > 0:
            return None
        _shared.clear()
    closing.close()  # the last user's: it was the one shared
    from fsm.observe.hooks import active, uninstrument

    if active() is closing.instrumentation:
        uninstrument()
    return None


__all__ = ["release_worker_metrics", "worker_metrics"]
