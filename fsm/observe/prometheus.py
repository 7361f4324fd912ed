"""A Prometheus endpoint for this process: OpenTelemetry's Prometheus reader, served by
``prometheus_client``'s own HTTP server (no exposition written here).

::

    from fsm import observe
    server = observe.serve_metrics(9464)        # http://127.0.0.1:9464/metrics
    ...
    server.close()

``fsm reaper --metrics-port 9464`` does this for a reaper; a worker's process calls it
(or passes ``metrics_port`` where its runner takes one).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fsm.errors import ConfigError
from fsm.observe.hooks import Instrumentation, _missing, instrument, uninstrument

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

DEFAULT_HOST = "127.0.0.1"
"""Loopback unless told otherwise: metrics name entities' kinds and owners."""


class MetricsServer:
    """A running endpoint: its ``url``, its registry, and :meth:`close`."""

    def __init__(self, server: Any, thread: threading.Thread, registry: Any, instrumentation: Instrumentation) -> None:
        self._server = server
        self._thread = thread
        self.registry = registry
        self.instrumentation = instrumentation
        host, port = server.server_address[:2]
        self.host: str = host
        self.port: int = port
        self.url = f"http://{host}:{port}/metrics"

    def close(self) -> None:
        """Stop serving (idempotent); the instrumentation stays on."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(
    port: int, host: str = DEFAULT_HOST, *, tracer_provider: TracerProvider | None = None
) -> MetricsServer:
    """Instrument this process with a meter provider read by Prometheus and serve it on
    ``host:port`` (``port`` 0: any free port; see ``.port``).  Raises ``ConfigError`` for a
    bad port or host, or without the ``otel`` extra."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be an integer from 0 to 65535, not {port!r}")
    if not isinstance(host, str) or not host or "\x00" in host:
        raise ConfigError(f"metrics host must be a host name or address, not {host!r}")
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:  # pragma: no cover - the test extra installs them
        raise _missing() from None
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    made = instrument(meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=tracer_provider)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        uninstrument()  # nothing serves what it would record
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {err}") from None
    return MetricsServer(server, thread, registry, made)


__all__ = ["DEFAULT_HOST", "MetricsServer", "serve_metrics"]
