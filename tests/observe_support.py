"""Test support for fsm.observe: instrumentation read through the OpenTelemetry SDK's in-memory exporter and reader."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fsm import observe


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self, prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]

    def points(self, name: str) -> list[Any]:
        """Every data point of metric ``name`` as exported now."""
        data = self.reader.get_metrics_data()
        found = []
        for rm in data.resource_metrics if data is not None else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        found += list(metric.data.data_points)
        return found

    def value(self, name: str, **attrs: Any) -> float:
        """The sum of a counter's points (or a histogram's counts) whose attributes match."""
        total = 0.0
        for point in self.points(name):
            if all(point.attributes.get(k.replace("__", ".")) == v for k, v in attrs.items()):
                total += point.count if hasattr(point, "bucket_counts") else point.value
        return total


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    observe.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        yield Telemetry(spans, reader)
    finally:
        observe.uninstrument()
