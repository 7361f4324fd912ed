"""Spans and metrics for the engine, the worker's claims, the ledger, the keeper and the
reaper, switched on with :func:`instrument` and off with :func:`uninstrument`.

Shaped as OpenTelemetry's instrumentation packages are: nothing of this runs, and nothing
of OpenTelemetry is imported, until :func:`instrument` is called.  It then wraps a few
methods *on their classes* (``Engine.fire``, ``Engine.fire_many``, ``Engine.claim``,
``Engine.run``, ``KeeperCore.renew``, ``LeaseKeepers.run_once``, ``Reaper.run_once``)
and connects receivers to four signals (``lease_renewed``, ``lease_lost``,
``write_refused``, ``handled``: a handler's duration, a retry counted in ``fsm.retries``);
:func:`uninstrument` puts the methods back and
disconnects.  An uninstrumented process runs the engine's own functions, unchanged: the
hot path pays nothing.  Both faces are covered: the async engine runs the sync engine's
methods (in a greenlet, in the calling task's context, so spans nest under the caller's).

Counting transitions without the ``transitioned`` signal is deliberate: a receiver there
would make every fire build its pydantic payload and would turn the reaper off its brief
path (it moves pages without snapshots only while nobody listens).  So a fire counts its
own result, a claim counts the starts it made, and a reaper tick counts its moves from its
:class:`~fsm.reaping.ReapResult`; a fire inside a reaper tick is counted by the tick.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import signals
from fsm.engine import Engine
from fsm.engine.work import EngineWork, claim_plan
from fsm.errors import ConfigError, Fenced
from fsm.observe import attributes as a
from fsm.reaping import Reaper
from fsm.records import Actor, Snapshot
from fsm.work.keeper import KeeperCore
from fsm.work.keepers import LeaseKeepers
from fsm.work.report import RETRY

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

    from fsm.observe.metrics import Instruments

SCOPE = "fsm-lifecycles"
"""The instrumentation scope's name (tracer and meter)."""

_in_tick: contextvars.ContextVar[bool] = contextvars.ContextVar("fsm_observe_in_tick", default=False)
_lock = threading.Lock()
_state: dict[str, Instrumentation] = {}
"""``"active"``: the instrumentation switched on in this process."""


def _missing() -> ConfigError:
    return ConfigError(
        "fsm.observe needs OpenTelemetry: pip install 'fsm-lifecycles[otel]' "
        "(opentelemetry-api, opentelemetry-sdk, opentelemetry-exporter-prometheus, prometheus-client)"
    )


class Instrumentation:
    """What :func:`instrument` switched on: its tracer, its instruments, the originals it
    replaced.  One is active per process at a time."""

    def __init__(self, tracer: Tracer, instruments: Instruments) -> None:
        self.tracer = tracer
        self.instruments = instruments
        self._originals: list[tuple[type, str, Any]] = []
        self._receivers: list[tuple[Any, Callable[..., None]]] = []
        self._starts: dict[tuple[type, str], dict[str, str]] = {}

    # -- switching ------------------------------------------------------------------------

    def _patch(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        self._originals.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def _install(self) -> None:
        self._patch(Engine, "fire", self._wrap_fire)
        self._patch(Engine, "fire_many", self._wrap_fire_many)
        self._patch(EngineWork, "claim", self._wrap_claim)
        self._patch(EngineWork, "run", self._wrap_run)
        if "renew" in KeeperCore.__dict__:
            self._patch(KeeperCore, "renew", self._wrap_renew)
        self._patch(LeaseKeepers, "run_once", self._wrap_keepers_round)
        self._patch(Reaper, "run_once", self._wrap_tick)
        for signal, receiver in (
            (signals.lease_renewed, self._on_renewed),
            (signals.lease_lost, self._on_lost),
            (signals.write_refused, self._on_refused),
            (signals.handled, self._on_handled),
        ):
            signal.connect(receiver, weak=False)
            self._receivers.append((signal, receiver))

    def _remove(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()

    # -- fire -----------------------------------------------------------------------------

    def _wrap_fire(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tracer, transitions = self.tracer, self.instruments.transitions

        def fire(engine: Engine, entity: Any, event: str, *args: Any, **kwargs: Any) -> Any:
            lease = kwargs.get("lease")
            actor = kwargs.get("actor", Actor.WORKER)
            actor_name = actor.value if isinstance(actor, Actor) else str(actor)
            entity_id = entity if isinstance(entity, str) else getattr(entity, "id", None)
            if entity_id is None:
                snap = getattr(entity, "snapshot", None)
                entity_id = getattr(snap, "id", None)
            attrs: dict[str, Any] = {a.KIND: engine.kind, a.EVENT: str(event), a.ACTOR: actor_name}
            if isinstance(entity_id, str):
                attrs[a.ENTITY] = entity_id
            if lease is not None:
                attrs[a.OWNER] = lease.owner
                attrs[a.TOKEN] = lease.token
            with tracer.start_as_current_span(f"fire {engine.kind}.{event}", attributes=attrs) as span:
                result = original(engine, entity, event, *args, **kwargs)
                record, snap = result.record, result.snapshot
                span.set_attributes(
                    {
                        a.SOURCE: record.source,
                        a.TARGET: record.target,
                        a.VERSION: snap.version,
                        a.TOKEN: snap.lease_token,
                        a.REPLAYED: result.replayed,
                    }
                )
                if not result.replayed and not _in_tick.get():
                    transitions.add(1, {a.KIND: engine.kind, a.EVENT: record.event, a.ACTOR: record.actor})
                return result

        return fire

    def _wrap_fire_many(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A batch of fires (the worker's batch completer): one span, each committed
        transition counted as :meth:`Engine.fire` counts its own."""
        tracer, transitions = self.tracer, self.instruments.transitions

        def fire_many(engine: Engine, items: Any, *args: Any, **kwargs: Any) -> Any:
            attrs: dict[str, Any] = {a.KIND: engine.kind, a.MESSAGING_BATCH_COUNT: len(items)}
            with tracer.start_as_current_span(f"fire_many {engine.kind}", attributes=attrs):
                results = original(engine, items, *args, **kwargs)
                if not _in_tick.get():
                    for result in results:
                        record = getattr(result, "record", None)
                        if record is not None and not result.replayed:
                            transitions.add(1, {a.KIND: engine.kind, a.EVENT: record.event, a.ACTOR: record.actor})
                return results

        return fire_many

    # -- claim ----------------------------------------------------------------------------

    def _starts_of(self, engine: EngineWork) -> dict[str, str]:
        """Start target -> start event of the engine's lifecycle (read off its table once)."""
        key = (engine.lifecycle, engine.kind)
        found = self._starts.get(key)
        if found is None:
            starts = claim_plan(engine.table)[0]
            found = {s.target: s.event for s in starts}
            self._starts[key] = found
        return found

    def _wrap_claim(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tracer, ins = self.tracer, self.instruments

        def claim(
            engine: EngineWork,
            limit: int = 1,
            *,
            owner: str | None = None,
            into: Collection[str] | None = None,
            limits: Any = None,
        ) -> list[Snapshot]:
            who = engine.owner if owner is None else owner
            attrs: dict[str, Any] = {
                a.MESSAGING_SYSTEM: a.SYSTEM,
                a.MESSAGING_OPERATION_TYPE: "receive",
                a.MESSAGING_OPERATION_NAME: "claim",
                a.MESSAGING_DESTINATION: engine.kind,
                a.KIND: engine.kind,
                a.OWNER: str(who),
            }
            from opentelemetry.trace import SpanKind

            with tracer.start_as_current_span(f"claim {engine.kind}", kind=SpanKind.CONSUMER, attributes=attrs) as span:
                claimed: list[Snapshot] = original(engine, limit, owner=owner, into=into, limits=limits)
                span.set_attribute(a.MESSAGING_BATCH_COUNT, len(claimed))
                if len(claimed) == 1:
                    span.set_attribute(a.MESSAGING_MESSAGE_ID, claimed[0].id)
                    span.set_attribute(a.TOKEN, claimed[0].lease_token)
                if not claimed:
                    return claimed
                base = {a.MESSAGING_SYSTEM: a.SYSTEM, a.MESSAGING_DESTINATION: engine.kind}
                ins.claimed.add(len(claimed), base)
                starts = self._starts_of(engine)
                ttl = engine.policy.lease_ttl
                for snap in claimed:
                    event = starts.get(snap.state) if _just_started(snap, ttl) else None
                    if event is not None:
                        ins.transitions.add(1, {a.KIND: engine.kind, a.EVENT: event, a.ACTOR: Actor.WORKER.value})
                    waited = claim_latency(snap, started=event is not None, ttl=ttl)
                    if waited is not None:
                        ins.claim_latency.record(waited, {a.KIND: engine.kind, a.STATE: snap.state})
                return claimed

        return claim

    # -- effects --------------------------------------------------------------------------

    def _wrap_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tracer, duration = self.tracer, self.instruments.effect_duration

        def run(engine: EngineWork, entity_id: str, key: str, fn: Any, lease: Any, **kwargs: Any) -> Any:
            attrs: dict[str, Any] = {a.KIND: engine.kind, a.ENTITY: str(entity_id), a.EFFECT_KEY: str(key)}
            owner, token = getattr(lease, "owner", None), getattr(lease, "token", None)
            if isinstance(owner, str) and isinstance(token, int):
                attrs[a.OWNER], attrs[a.TOKEN] = owner, token
            outcome = "ok"
            started = _now()
            with tracer.start_as_current_span(f"run {engine.kind}", attributes=attrs) as span:
                try:
                    return original(engine, entity_id, key, fn, lease, **kwargs)
                except Fenced as err:
                    outcome = "fenced"
                    span.set_attribute(a.ERROR_TYPE, type(err).__name__)
                    raise
                except Exception as err:
                    outcome = "error"
                    span.set_attribute(a.ERROR_TYPE, type(err).__name__)
                    raise
                finally:
                    span.set_attribute(a.OUTCOME, outcome)
                    duration.record(_now() - started, {a.KIND: engine.kind, a.OUTCOME: outcome})

        return run

    # -- the keeper -----------------------------------------------------------------------

    def _wrap_keepers_round(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """One round of the worker's one keeper: a span with how many leases it renewed."""
        tracer = self.tracer

        def run_once(keepers: LeaseKeepers, *args: Any, **kwargs: Any) -> Any:
            attrs: dict[str, Any] = {a.KIND: keepers.engine.kind}
            with tracer.start_as_current_span(f"keeper renew {keepers.engine.kind}", attributes=attrs) as span:
                results = original(keepers, *args, **kwargs)
                span.set_attribute(a.MESSAGING_BATCH_COUNT, len(results))
                return results

        return run_once

    def _wrap_renew(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self.tracer

        def renew(core: KeeperCore, *args: Any, **kwargs: Any) -> Any:
            lease = core.held.lease
            attrs: dict[str, Any] = {
                a.KIND: core.engine.kind,
                a.ENTITY: lease.entity_id,
                a.OWNER: lease.owner,
                a.TOKEN: lease.token,
            }
            with tracer.start_as_current_span(f"keeper renew {core.engine.kind}", attributes=attrs) as span:
                result = original(core, *args, **kwargs)
                outcome = "renewed" if result.renewed else "lost" if result.lost else "retry"
                span.set_attribute(a.OUTCOME, outcome)
                return result

        return renew

    # -- the reaper -----------------------------------------------------------------------

    def _wrap_tick(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tracer, ins = self.tracer, self.instruments

        def run_once(reaper: Reaper, *args: Any, **kwargs: Any) -> Any:
            kinds = ",".join(e.kind for e in reaper.engines)
            attrs = {a.OWNER: reaper.owner, a.KIND: kinds, a.ACTOR: Actor.REAPER.value}
            token = _in_tick.set(True)
            try:
                with tracer.start_as_current_span("reaper tick", attributes=attrs) as span:
                    result = original(reaper, *args, **kwargs)
                    span.set_attributes(
                        {
                            "fsm.reaper.moved": result.total_moved,
                            "fsm.reaper.lost_races": result.lost_races,
                            "fsm.reaper.bad_rows": result.bad_rows,
                            "fsm.reaper.errors": result.errors,
                            "fsm.reaper.dry_run": result.dry_run,
                            "fsm.reaper.leading": result.leading,
                        }
                    )
            finally:
                _in_tick.reset(token)
            if not result.dry_run:
                for name, count in result.moved.items():
                    kind, _, event = name.rpartition(".")
                    labels = {a.KIND: kind, a.EVENT: event, a.ACTOR: Actor.REAPER.value}
                    ins.reaper_moves.add(count, {a.KIND: kind, a.EVENT: event})
                    ins.transitions.add(count, labels)
            ins.reaper_lost_races.add(result.lost_races)
            ins.reaper_bad_rows.add(result.bad_rows)
            ins.reaper_tick_duration.record(result.duration_s, {a.OUTCOME: "error" if result.errors else "ok"})
            return result

        return run_once

    # -- signals --------------------------------------------------------------------------

    def _on_renewed(self, sender: str, payload: Any) -> None:
        self.instruments.renewals.add(1, {a.KIND: str(sender)})

    def _on_lost(self, sender: str, payload: Any) -> None:
        self.instruments.lapses.add(1, {a.KIND: str(sender)})

    def _on_refused(self, sender: str, payload: Any) -> None:
        self.instruments.refused.add(1, {a.KIND: payload.kind, a.OPERATION: payload.operation})

    def _on_handled(self, sender: str, payload: Any) -> None:
        attrs: dict[str, Any] = {
            a.MESSAGING_SYSTEM: a.SYSTEM,
            a.MESSAGING_OPERATION_TYPE: "process",
            a.MESSAGING_DESTINATION: payload.kind,
            a.STATE: payload.state,
            a.OUTCOME: payload.outcome,
        }
        error_type = None if payload.error is None else payload.error.split(":", 1)[0]
        if error_type is not None:
            attrs[a.ERROR_TYPE] = error_type
        self.instruments.process_duration.record(payload.duration_s, attrs)
        if payload.outcome == RETRY:
            retried: dict[str, Any] = {a.KIND: payload.kind, a.STATE: payload.state}
            if error_type is not None:
                retried[a.ERROR_TYPE] = error_type
            self.instruments.retries.add(1, retried)


def _just_started(snap: Snapshot, ttl: timedelta) -> bool:
    """Whether a claimed snapshot was started by its claim (not resumed): a start's
    transition sets ``updated_at`` and grants the lease in one write (expiry = now + TTL,
    never capped: a budget is at least the TTL), a resume grants the lease only."""
    if snap.lease_expires_at is None:
        return False
    return abs((snap.lease_expires_at - ttl - snap.updated_at).total_seconds()) < _SAME_WRITE_S


_SAME_WRITE_S = 0.5
"""Tolerance for "one write" on stores whose ``now`` is read per expression."""


def claim_latency(snap: Snapshot, *, started: bool, ttl: timedelta) -> float | None:
    """Seconds from ``snap``'s due time to its claim, or ``None`` when it cannot be known.

    Due: the row's ``run_after`` when it has one (a retried start: when its backoff
    ended; a requeued one keeps its place in line, so its first due time); else, for a
    start, its creation on a first attempt (a requeued entity's queueing time is gone
    once it is claimed); else,
    for a resume (a reclaimed finalizer), the time it entered its state.  Claimed: the
    start's commit (``updated_at``), or for a resume the lease's grant (expiry less TTL).
    Both on the store's clock."""
    due: datetime | None = getattr(snap, "run_after", None)
    if due is not None and not started:
        # a reclaim or a release keeps the row's place in line (its run_after): a resumed
        # entity became claimable again when it entered the state it waits in
        due = max(due, snap.state_entered_at)
    if started:
        claimed_at = snap.updated_at
        if due is None and snap.attempt <= 1:
            due = snap.created_at
    else:
        if snap.lease_expires_at is None:
            return None
        claimed_at = snap.lease_expires_at - ttl
        if due is None:
            due = snap.state_entered_at
    if due is None:
        return None
    return max(0.0, (claimed_at - due).total_seconds())


def _now() -> float:
    import time

    return time.perf_counter()


def instrument(
    *, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> Instrumentation:
    """Switch spans and metrics on for this process (OpenTelemetry's global providers
    unless given).  A second call replaces the first's instrumentation.  Raises
    ``ConfigError`` when the ``otel`` extra is not installed."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:  # pragma: no cover - the test extra installs it
        raise _missing() from None
    from fsm.observe.metrics import Instruments

    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SCOPE)
    meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE)
    made = Instrumentation(tracer, Instruments(meter))
    with _lock:
        previous = _state.pop("active", None)
        if previous is not None:
            previous._remove()
        made._install()
        _state["active"] = made
    return made


def uninstrument() -> None:
    """Put the engine's methods back and disconnect the receivers; a no-op when off."""
    with _lock:
        previous = _state.pop("active", None)
        if previous is not None:
            previous._remove()


def active() -> Instrumentation | None:
    """The instrumentation switched on in this process, if any."""
    return _state.get("active")


__all__ = ["SCOPE", "Instrumentation", "active", "claim_latency", "instrument", "uninstrument"]
