"""Spans of fsm.observe, read through the SDK's InMemorySpanExporter."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from observe_support import Telemetry, telemetry
from opentelemetry.trace import SpanKind, StatusCode

from fsm import Engine, Fenced, JobLifecycle, ManualClock
from fsm.reaping import Reaper
from fsm.work.keeper import KeeperCore
from stores import MemoryStore

__all__ = ["telemetry"]


def test_fire_claim_run_keeper_and_tick_each_make_a_span_with_kind_event_entity_owner_and_token(
    telemetry: Telemetry,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w1")
    engine.create("j1")
    (snap,) = engine.claim()
    lease = snap.lease
    assert lease is not None
    KeeperCore(engine, lease).renew()
    engine.run("j1", "gate", lambda key: 1, lease)
    engine.fire("j1", "exited", lease=lease)
    Reaper(store, [JobLifecycle], clock=clock).run_once()

    (claim,) = telemetry.finished("claim job")
    assert claim.kind is SpanKind.CONSUMER
    assert claim.attributes is not None
    assert claim.attributes["messaging.system"] == "fsm"
    assert claim.attributes["messaging.operation.type"] == "receive"
    assert claim.attributes["messaging.destination.name"] == "job"
    assert claim.attributes["messaging.message.id"] == "j1"
    assert claim.attributes["messaging.batch.message_count"] == 1
    assert claim.attributes["fsm.lease.owner"] == "w1" and claim.attributes["fsm.lease.token"] == 1

    (renew,) = telemetry.finished("keeper renew job")
    assert renew.attributes == {
        "fsm.kind": "job",
        "fsm.entity.id": "j1",
        "fsm.lease.owner": "w1",
        "fsm.lease.token": 1,
        "fsm.outcome": "renewed",
    }
    (run,) = telemetry.finished("run job")
    assert run.attributes is not None
    assert run.attributes["fsm.effect.key"] == "gate" and run.attributes["fsm.outcome"] == "ok"
    assert run.attributes["fsm.lease.token"] == 1

    (fire,) = telemetry.finished("fire job.exited")
    assert fire.attributes is not None
    assert fire.attributes["fsm.entity.id"] == "j1"
    assert fire.attributes["fsm.event"] == "exited"
    assert fire.attributes["fsm.actor"] == "worker"
    assert fire.attributes["fsm.lease.owner"] == "w1"
    assert (fire.attributes["fsm.state.source"], fire.attributes["fsm.state.target"]) == ("running", "finalizing")

    (tick,) = telemetry.finished("reaper tick")
    assert tick.attributes is not None
    assert tick.attributes["fsm.reaper.moved"] == 0 and tick.attributes["fsm.kind"] == "job"


def test_a_refused_late_fire_ends_its_span_with_an_error_status(telemetry: Telemetry) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock)
    engine.create("j1")
    (snap,) = engine.claim()
    assert snap.lease is not None
    engine.fire("j1", "exited", lease=snap.lease)
    clock.advance(timedelta(minutes=3))
    Reaper(store, [JobLifecycle], clock=clock).run_once()  # reclaims: token 2
    with pytest.raises(Fenced):
        engine.fire("j1", "complete", lease=snap.lease)
    (span,) = telemetry.finished("fire job.complete")
    assert span.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in span.events)


def test_the_async_engine_fires_inside_the_callers_span(telemetry: Telemetry) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from fsm.aio import AsyncEngine
    from stores.aio import AsyncMemoryStore

    tracer = TracerProvider().get_tracer("test")

    async def main() -> int:
        engine = AsyncEngine(JobLifecycle, AsyncMemoryStore())
        await engine.create("j1")
        with tracer.start_as_current_span("request") as parent:
            [snap] = await engine.claim()
            assert snap.lease is not None
            await engine.fire("j1", "exited", lease=snap.lease)
            return parent.get_span_context().trace_id

    trace_id = asyncio.run(main())
    for name in ("claim job", "fire job.exited"):
        (span,) = telemetry.finished(name)
        assert span.context is not None and span.context.trace_id == trace_id
        assert span.parent is not None
