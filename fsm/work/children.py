"""Children and fan-in: a handler starts child entities and waits for them, durably.

``job.start_child(key, data=..., lifecycle=...)`` creates the child once per ``key``: its
id is the parent's id and the key (``build-7/test``), so a replay, or a second worker
after the first died between the create and the ledger row, finds it instead of starting
another; the ledger row ``fsm:step:@child:{key}`` records the child's id, lifecycle and final
states under the parent's lease.

``job.wait_children()`` is a durable wait (:mod:`fsm.work.waits`): while a child started
before it is not final, the parent is *parked* (no lease, no slot, no thread) and the
handler stops; the child's worker wakes the parent when the child ends, and the parent
also looks again every ``poll`` (a child failed by the reaper or an operator wakes no
one).  When every child is final the step records each child's final state and data (its
result) and returns them, in the order the children were started; a replay returns the
recorded outcome.  ``on_failure="fail"`` (the default): the first child found in a
failed state ends the wait with :class:`~fsm.errors.ChildFailed`, which is never retried
(the parent fails at once); ``"wait"``: every child is waited for and the results say
which failed.

Cancelling a parent (``engine.cancel(parent_id)``) cancels its live children, each by its
own lifecycle's ``cancel`` (so never a live finalizer: a lifecycle's cancel does not leave
one, and such a child is left to finish).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NamedTuple

from fsm.engine.cascade import children_of
from fsm.errors import ChildFailed, EntityExists, FsmError, InvalidArgument
from fsm.ids import joined_id
from fsm.limits import check_id
from fsm.records import STEP_KEY_PREFIX, EffectRecord, Snapshot
from fsm.work.waits import Steps

log = logging.getLogger("fsm.work")

CHILD_KEY_PREFIX = f"{STEP_KEY_PREFIX}@child:"
"""The ledger key of a started child: ``fsm:step:@child:{key}`` (a step row: no state name holds ``@``)."""
CHILDREN = "children"
"""The step kind of a wait for children (``fsm:step:{state}:children:{n}``)."""
MAX_CHILD_KEY = 160
DEFAULT_POLL = timedelta(seconds=10)
"""How often a parked parent looks at its children when no child's end woke it."""
FAILED_STATES = ("failed",)
"""The final states a wait counts as a child's failure by default."""


class ChildResult(NamedTuple):
    """A child as ``wait_children`` found it final: its final state and data (its result)."""

    id: str
    kind: str
    state: str
    data: dict[str, Any]
    failed: bool

    @classmethod
    def of(cls, value: Any) -> ChildResult:
        return cls(value["id"], value["kind"], value["state"], dict(value["data"]), bool(value["failed"]))

    def dump(self) -> dict[str, Any]:
        return self._asdict()


def check_child_key(key: object) -> str:
    """A child's key: an id of at most 160 characters."""
    text = check_id("child key", key)
    if len(text) > MAX_CHILD_KEY:
        raise InvalidArgument(f"a child key has at most {MAX_CHILD_KEY} characters, not {len(text)}")
    return text


def check_child_data(data: object) -> dict[str, Any] | None:
    """A child's ``data``: a mapping (copied) or ``None``, as ``Engine.create`` takes it."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"a child's data must be a mapping, not {type(data).__name__}")
    return dict(data)


def child_id(parent_id: str, key: str) -> str:
    """The child's id: ``{parent}/{key}``, or, when that is too long, a prefix of it and a
    digest of the whole (the same for every replay)."""
    return joined_id(parent_id, key)


def start_child(
    steps: Steps,
    parent: Snapshot,
    engine: Any,
    key: str,
    data: dict[str, Any] | None,
    priority: int,
    concurrency_key: str | None,
) -> Snapshot:
    """Create the child of ``key`` once (see the module doc); ``engine`` is the child's
    lifecycle's sync engine on the parent's store."""
    record_key = CHILD_KEY_PREFIX + key
    store = steps.store
    recorded = store.effect(parent.id, record_key)
    if recorded is not None:  # a replay: the child as it is now (soft-deleted ones too)
        found: Snapshot = store.get(recorded.result["id"], include_deleted=True)
        return found
    cid = child_id(parent.id, key)
    try:
        snap: Snapshot = engine.create(
            cid, data=data, parent=parent.id, priority=priority, concurrency_key=concurrency_key
        )
    except EntityExists:
        snap = store.get(cid, include_deleted=True)  # whatever its lifecycle
        if snap.parent_id != parent.id or snap.kind != engine.kind:
            raise  # an entity of someone else's holds the id
    # numbered in start order: the ledger's times may tie (a coarse clock), the number not
    order = len(started(store, parent.id)) + 1
    steps._record(record_key, {"id": cid, "kind": engine.kind, "finals": sorted(engine.table.finals), "n": order})
    return snap


def started(store: Any, parent_id: str) -> list[EffectRecord]:
    """The parent's started children as recorded, in the order they were started."""
    found = [e for e in store.effects(parent_id) if e.key.startswith(CHILD_KEY_PREFIX)]
    found.sort(key=lambda e: (int(e.result.get("n", 0)), e.recorded_at.timestamp() if e.recorded_at else 0.0, e.key))
    return found


def _look(store: Any, parent_id: str, failed: frozenset[str]) -> tuple[list[ChildResult], int]:
    """The children final so far (in start order) and how many are not."""
    live = children_of(store, parent_id)
    done: list[ChildResult] = []
    pending = 0
    for record in started(store, parent_id):
        info = record.result
        snap = live.get(info["id"])
        if snap is None:  # deleted (or pruned): it will never end, count it as failed
            done.append(ChildResult(info["id"], info["kind"], "deleted", {}, True))
        elif snap.state in info["finals"]:
            done.append(ChildResult(snap.id, snap.kind, snap.state, snap.data, snap.state in failed))
        else:
            pending += 1
    return done, pending


def _settled(done: list[ChildResult], pending: int, on_failure: str) -> bool:
    return pending == 0 or (on_failure == "fail" and any(c.failed for c in done))


def wait_children(steps: Steps, failed: frozenset[str], on_failure: str, poll: timedelta) -> list[ChildResult]:
    """The results of every child started so far, once final (see the module doc)."""
    key = steps._next(CHILDREN)
    store = steps.store
    record = store.effect(steps.entity_id, key)
    if record is None:
        done, pending = _look(store, steps.entity_id, failed)
        if not _settled(done, pending, on_failure):
            parked = steps._park(steps.engine.clock.now() + poll, key)
            try:  # a child that ended between the look and the park woke nobody: look again
                if _settled(*_look(store, steps.entity_id, failed), on_failure):
                    store.wake(steps.entity_id)
            except FsmError as err:
                log.warning("could not look again at the children of %s: %s", steps.entity_id, err)
            raise parked
        failure = next((c for c in done if c.failed), None) if on_failure == "fail" else None
        outcome = {"failed": failure.dump()} if failure is not None else {"children": [c.dump() for c in done]}
        record = steps._record(key, outcome)
    steps._done(CHILDREN, None)
    if "failed" in record.result:
        raise ChildFailed(steps.entity_id, child=ChildResult.of(record.result["failed"]))
    return [ChildResult.of(c) for c in record.result["children"]]


def check_wait_args(failed: object, on_failure: object) -> tuple[frozenset[str], str]:
    """``wait_children``'s ``failed`` states and ``on_failure`` policy."""
    if on_failure not in ("fail", "wait"):
        raise InvalidArgument(f"on_failure must be 'fail' or 'wait', not {str(on_failure)[:40]!r}")
    if isinstance(failed, str) or not isinstance(failed, tuple | list | set | frozenset):
        raise InvalidArgument(f"failed must be a collection of state names, not {type(failed).__name__}")
    return frozenset(check_id("failed state", s) for s in failed), str(on_failure)


def child_engine(parent: Any, lifecycle: Any) -> Any:
    """The sync engine a child is created with: the parent's own (``None``), an engine on
    the parent's store, or one made for a lifecycle class on the parent's store (kept)."""
    if lifecycle is None:
        return parent
    from fsm.engine import Engine  # the engine imports fsm.work's records, not this module
    from fsm.lifecycle import Lifecycle

    if isinstance(lifecycle, Engine):
        if _store_of(lifecycle) is not _store_of(parent):
            raise InvalidArgument("a child's engine must use the parent's store (the children index is per store)")
        if lifecycle.store is parent.store:
            return lifecycle
        lifecycle = lifecycle.lifecycle  # the same store behind another bridge: an engine on the parent's
    sync = getattr(lifecycle, "sync", None)  # an AsyncEngine: its sync twin
    if isinstance(sync, Engine):
        return child_engine(parent, sync)
    if not (isinstance(lifecycle, type) and issubclass(lifecycle, Lifecycle)):
        raise InvalidArgument(f"lifecycle must be a Lifecycle class or an Engine, not {type(lifecycle).__name__}")
    made: dict[type[Any], Any] = parent.__dict__.setdefault("_child_engines", {})
    engine = made.get(lifecycle)
    if engine is None:
        engine = made[lifecycle] = Engine(lifecycle, parent.store, clock=parent.clock)
    return engine


def _store_of(engine: Any) -> Any:
    """The store behind an engine's (an async store's sync bridge: the async store)."""
    store = engine.store
    face = getattr(store, "face", None)
    return store if face is None else face


def wake_parent(engine: Any, snapshot: Snapshot) -> None:
    """A child that ended wakes its parked parent (best effort: the parent's ``poll`` looks
    again anyway)."""
    parent = snapshot.parent_id
    if parent is None or snapshot.state not in engine.table.finals:
        return
    try:
        engine.store.wake(parent)
    except FsmError as err:
        log.warning("could not wake %s, the parent of %s: %s", parent, snapshot.id, err)


__all__ = [
    "CHILDREN",
    "CHILD_KEY_PREFIX",
    "DEFAULT_POLL",
    "FAILED_STATES",
    "ChildResult",
    "check_child_data",
    "check_child_key",
    "check_wait_args",
    "child_engine",
    "child_id",
    "children_of",
    "start_child",
    "started",
    "wait_children",
    "wake_parent",
]
