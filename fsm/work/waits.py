"""Durable waits inside a handler: ``job.sleep(duration)`` and ``job.wait_for(name)``.

A wait never holds a worker slot, a thread or a lease while it waits: the entity is
*parked* (its state kept, its lease given back, its due time set: ``Store.park``) and the
handler stops (:class:`~fsm.errors.Parked`).  When the entity is due again a claim resumes
it and the handler runs from the start: every step recorded in the ledger returns its
recorded result without running again (``job.run``), and the sleep and the wait are
recorded steps too (``fsm:step:sleep:N``, ``fsm:step:wait:N``), so the replay passes them.
Steps are numbered in the order the handler reaches them, which is why the code between
recorded steps must be deterministic (the contract of DBOS and Temporal workflows): a
replay must reach the same steps in the same order.

Messages: ``Engine.send(entity_id, name, payload, idempotency_key=...)`` records one
message per key (``fsm:msg:{name}:{key}``) and wakes a parked entity at once.  A wait
takes the oldest message of its name that no earlier wait took, whether it was sent
before the wait began or during it; one sent after a wait timed out stays for the next
wait on that name.  The lost wake-up is closed by ordering: a sender commits the message
and then wakes; a waiter parks and then reads the messages (and wakes itself if one came).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from fsm.errors import FsmError, InvalidArgument, WaitTimedOut
from fsm.limits import MAX_DURATION, check_id
from fsm.records import EFFECT_SUCCEEDED, MESSAGE_KEY_PREFIX, PARKED_KEY, STEP_KEY_PREFIX, EffectRecord, Lease


class Parked(Exception):
    """Raised by ``job.sleep`` and ``job.wait_for`` once the entity is parked: the lease is
    back in the store, the entity is due at ``until``, and the handler must stop.  The
    worker catches it and frees the slot; a later claim runs the handler again, and its
    recorded steps replay.  Never catch it in a handler (let ``except Exception`` re-raise
    it): a handler that goes on has no lease, and its next write is ``Fenced``."""

    def __init__(self, entity_id: str, *, until: object, step: str) -> None:
        self.entity_id = entity_id
        self.until = until
        self.step = step
        super().__init__(f"entity {entity_id!r} parked until {until} ({step})")


FOREVER = timedelta(days=36500)
"""How far a wait without a timeout parks: until a message wakes it."""
SLEEP, WAIT = "sleep", "wait"
MISSING: Any = object()
T = TypeVar("T")


def step_key(kind: str, n: int, state: str) -> str:
    """The ledger key of the ``n``-th step of ``kind`` that the handler of ``state`` reaches
    (``fsm:step:running:sleep:1``): each state's handler numbers its own steps, so a
    finalizer resumed by a new claim never reads the steps of the handler before it."""
    return f"{STEP_KEY_PREFIX}{state}:{kind}:{n}"


def check_duration_arg(name: str, value: object, *, optional: bool = False) -> timedelta | None:
    """A sleep's duration or a wait's timeout: a ``timedelta`` or seconds, 0 to 100 years."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidArgument(f"{name} must be a timedelta or seconds, not {type(value).__name__}")
    if not isinstance(value, timedelta):
        if not math.isfinite(value):
            raise InvalidArgument(f"{name} must be finite, not {value!r}")
        if not 0 <= value <= MAX_DURATION.total_seconds():
            raise InvalidArgument(f"{name} must be from 0 to {MAX_DURATION.days} days, not {value!r}")
        value = timedelta(seconds=value)
    if not timedelta() <= value <= MAX_DURATION:
        raise InvalidArgument(f"{name} must be from 0 to {MAX_DURATION.days} days, not {value}")
    return value


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


class Steps:
    """The durable steps of one handler run over a sync engine: numbered as reached."""

    def __init__(self, engine: Any, entity_id: str, lease: Callable[[], Lease], state: Callable[[], str]) -> None:
        self.engine = engine
        self.store = engine.store
        self.entity_id = entity_id
        self.state = state
        self.lease = lease
        self.counts: dict[tuple[str, str], int] = {}
        self.unfinished: dict[tuple[str, str], str] = {}
        """A step that raised before it finished (a store outage): the handler's retry of
        the same call is the same step, not the next one."""

    def _next(self, kind: str) -> str:
        state = self.state()
        again = self.unfinished.get((state, kind))
        if again is not None:
            return again
        n = self.counts[(state, kind)] = self.counts.get((state, kind), 0) + 1
        key = self.unfinished[(state, kind)] = step_key(kind, n, state)
        return key

    def _done(self, kind: str, value: T) -> T:
        """``value``, the outcome of the step of ``kind`` under way: the next call is the next step."""
        self.unfinished.pop((self.state(), kind), None)
        return value

    def count(self, kind: str) -> int:
        """How many steps of ``kind`` the current state's handler has reached."""
        return self.counts.get((self.state(), kind), 0)

    def _record(self, key: str, result: Any) -> EffectRecord:
        lease = self.lease()
        record: EffectRecord = self.store.record_effect(
            self.entity_id, key, owner=lease.owner, token=lease.token, status=EFFECT_SUCCEEDED, result=result
        )[0]
        return record  # the first result recorded for the key wins: a replay reads it back

    def _park(self, until: datetime, key: str) -> Parked:
        lease = self.lease()
        self.store.record_effect(  # the mark a message's wake-up looks for (this token's park)
            self.entity_id,
            PARKED_KEY,
            owner=lease.owner,
            token=lease.token,
            status=EFFECT_SUCCEEDED,
            result={"until": until.isoformat(), "step": key},
            replace=(EFFECT_SUCCEEDED,),
        )
        self.store.park(self.entity_id, owner=lease.owner, token=lease.token, until=until)
        return Parked(self.entity_id, until=until, step=key)

    def sleep(self, duration: timedelta) -> None:
        """Return once ``duration`` has passed since this step was first reached; until
        then park the entity and raise :class:`Parked`."""
        key = self._next(SLEEP)
        now = self.engine.clock.now()
        record = self.store.effect(self.entity_id, key)
        if record is None:
            record = self._record(key, {"until": (now + duration).isoformat()})
        until = _time(record.result["until"])
        if now >= until:
            self._done(SLEEP, None)
            return
        raise self._park(until, key)

    def wait_for(self, name: str, timeout: timedelta | None) -> tuple[bool, Any]:
        """``(True, payload)`` of the oldest message ``name`` no earlier wait took, or
        ``(False, None)`` once ``timeout`` passed since this step was first reached; until
        then park the entity and raise :class:`Parked` (a message wakes it at once)."""
        key = self._next(WAIT)
        record = self.store.effect(self.entity_id, key)
        if record is not None:
            if record.result.get("name", name) != name:  # the handler reached another wait here
                raise ReplayMismatch(self.entity_id, step=key, recorded=record.result["name"], now=name)
            return self._done(WAIT, _outcome(record))
        now = self.engine.clock.now()
        deadline = self.store.effect(self.entity_id, key + ":until")
        if deadline is None:
            until = now + (FOREVER if timeout is None else timeout)
            deadline = self._record(key + ":until", {"until": until.isoformat(), "name": name})
        until = _time(deadline.result["until"])
        message = self._message(name)
        if message is not None:
            taken = {"message": message.key, "payload": message.result["payload"], "name": name}
            return self._done(WAIT, _outcome(self._record(key, taken)))
        if now >= until:
            return self._done(WAIT, _outcome(self._record(key, {"timed_out": True, "name": name})))
        parked = self._park(until, key)
        if self._message(name) is not None:  # sent between the read above and the park
            self.store.wake(self.entity_id)
        raise parked

    def _message(self, name: str) -> EffectRecord | None:
        """The oldest message ``name`` that no wait step has taken."""
        effects = self.store.effects(self.entity_id)
        taken = {
            e.result.get("message")
            for e in effects
            if e.key.startswith(STEP_KEY_PREFIX) and f":{WAIT}:" in e.key and isinstance(e.result, dict)
        }
        prefix = f"{MESSAGE_KEY_PREFIX}{name}:"
        waiting = [e for e in effects if e.key.startswith(prefix) and e.key not in taken]
        waiting.sort(key=lambda e: (e.recorded_at.timestamp() if e.recorded_at else 0.0, e.key))
        return waiting[0] if waiting else None


class ReplayMismatch(FsmError):
    """A replayed handler reached a recorded step with another meaning (a wait for another
    message name): the code between recorded steps is not deterministic."""

    def __init__(self, entity_id: str, *, step: str, recorded: str, now: str) -> None:
        self.entity_id = entity_id
        self.step = step
        super().__init__(
            f"entity {entity_id!r}: step {step} recorded a wait for {recorded!r}, the replay waits for {now!r}: "
            "the handler's code between recorded steps must be deterministic"
        )


def steps_of(job: Any, engine: Any) -> Steps:
    """The durable steps of ``job`` (either face's), made at its first sleep or wait over
    the sync ``engine``; they are numbered per state as the job's handlers reach them."""
    steps: Steps | None = getattr(job, "_steps", None)
    if steps is None:
        steps = job._steps = Steps(engine, job.id, job.held.check, lambda: job.snapshot.state)
    return steps


def wait_result(job: Any, steps: Steps, found: bool, payload: Any, default: Any, name: str) -> Any:
    """What ``job.wait_for`` returns: the message's payload, else ``default`` when given,
    else :class:`~fsm.errors.WaitTimedOut`."""
    if found:
        return payload
    if default is not MISSING:
        return default
    raise WaitTimedOut(job.id, name=name, step=f"wait {steps.count(WAIT)} of {job.state}")


def _outcome(record: EffectRecord) -> tuple[bool, Any]:
    result = record.result
    if result.get("timed_out"):
        return False, None
    return True, result.get("payload")


def check_message_name(name: object) -> str:
    """A message name: a short id without ``:``."""
    text = check_id("message name", name)
    if ":" in text or len(text) > 64:
        raise InvalidArgument(f"a message name has at most 64 characters and no ':', not {text!r}")
    return text


__all__ = [
    "FOREVER",
    "MISSING",
    "Parked",
    "ReplayMismatch",
    "Steps",
    "check_duration_arg",
    "check_message_name",
    "step_key",
    "steps_of",
    "wait_result",
]
