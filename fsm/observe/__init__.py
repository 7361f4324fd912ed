"""Observability: OpenTelemetry spans and metrics, a Prometheus endpoint, the log names.

Optional: ``pip install 'fsm-lifecycles[otel]'``.  Nothing here runs until switched on::

    from fsm import observe
    observe.instrument()                  # OpenTelemetry's global tracer and meter providers
    observe.serve_metrics(9464)           # or: a Prometheus endpoint for this process

Spans: ``fire {kind}.{event}``, ``claim {kind}`` (consumer), ``run {kind}`` (one effect),
``keeper renew {kind}`` (one keeper round), ``reaper tick``.  Metrics and attribute names
are in :mod:`fsm.observe.attributes`.  Logs need nothing switched on: see :data:`LOGGERS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm.observe.hooks import Instrumentation, active, instrument, uninstrument
    from fsm.observe.prometheus import MetricsServer, serve_metrics

LOGGERS = {
    "fsm.engine": "INFO per claimed entity and per late write the fence refused (fire, effect, renew, release)",
    "fsm.worker": "INFO per handler whose event fired or that will retry; WARNING when a holder learns it was "
    "fenced or a handler returned no outcome; ERROR with the stack when a handler raised",
    "fsm.keeper": "WARNING when a keeper finds its lease lost or gives it up; INFO per failed renewal it retries",
    "fsm.reaper": "INFO per entity moved (expire, reclaim, supersede...); ERROR per bad row or failed tick",
    "fsm.signals": "ERROR when a signal receiver raised (what it reports stands)",
}
"""Logger name -> what it tells.  Lines carry ``entity``, ``kind``, ``owner`` and ``token``
(and ``state``, ``event``, ``outcome`` where they apply) as ``extra`` fields."""

_LAZY = {
    "Instrumentation": "fsm.observe.hooks",
    "instrument": "fsm.observe.hooks",
    "uninstrument": "fsm.observe.hooks",
    "active": "fsm.observe.hooks",
    "MetricsServer": "fsm.observe.prometheus",
    "serve_metrics": "fsm.observe.prometheus",
}


def __getattr__(name: str) -> Any:
    # the engine, the reaper and the keeper load only when observability is asked for
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm.observe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["LOGGERS", "Instrumentation", "MetricsServer", "active", "instrument", "serve_metrics", "uninstrument"]
