"""Hardening, round 4: small escapes of bad input, each now a typed error that changes nothing (I10).

1. ``watch`` checks every argument (``after``, ``from_start``, ``poll``, ``timeout``,
   ``stop``) when it is called, on both faces, before an iterator is handed back: a
   ``stop`` that is not an event of the caller's face, a non-bool ``from_start`` or an
   infinite ``timeout`` is ``InvalidArgument``, never a raw ``AttributeError`` on the first
   ``next`` or a watch that cannot be stopped.
2. The policies' numbers are strict: ``RetryPolicy(backoff_coefficient="2")`` is refused,
   not converted (a str or bool is never a number; NaN and infinities never pass), and so
   are exception-type collections pydantic would convert without checking their names and
   state-name keys that are not strings.  ``replace`` says so with a ``ConfigError``
   naming every problem, and so do the constructors (the library's error, not pydantic's).
3. Pruning: only the engine knows which states are final (stores sit below lifecycles), so
   :meth:`fsm.Engine.prune` (and ``fsm prune``, which calls it) hands the store its
   lifecycle's final states and nothing else; the store checks the shape of ``states``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from conftest import SqlTarget
from pydantic import ValidationError

from fsm import ConfigError, Engine, InvalidArgument, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.policy import Policy, RetryPolicy
from fsm.reaping import ReaperConfig, ReapPolicy
from stores import Store

# -- 1. watch --------------------------------------------------------------------------------


def _world(store: Store, ids: list[str]) -> object:
    # the rows and their history; not the feed: PostgreSQL's feed holds entries back while
    # an older transaction of another test on the shared server is still open
    return [(store.get(i), store.history(i)) for i in ids]


def _engine_with_history(store: Store, clock: ManualClock) -> tuple[Engine, list[str]]:
    jobs = Engine(JobLifecycle, store, clock=clock)
    jobs.create("w1")
    jobs.create("w2")
    jobs.fire("w1", "start")
    return jobs, ["w1", "w2"]


BAD_SYNC_STOPS: dict[str, object] = {"str": "x", "int": 5, "object": object(), "bool": True}


@pytest.mark.parametrize("stop", list(BAD_SYNC_STOPS.values()), ids=list(BAD_SYNC_STOPS))
def test_watch_refuses_a_stop_that_is_not_an_event_when_called(
    any_store: Store, clock: ManualClock, stop: object
) -> None:
    jobs, ids = _engine_with_history(any_store, clock)
    before = _world(any_store, ids)
    with pytest.raises(InvalidArgument, match=r"stop must be a threading\.Event"):
        jobs.watch(from_start=True, poll=0.01, timeout=0, stop=stop)  # type: ignore[arg-type]  # no next() needed
    assert _world(any_store, ids) == before


def test_the_sync_watch_refuses_an_asyncio_event_it_could_never_wait_on(any_store: Store, clock: ManualClock) -> None:
    jobs, ids = _engine_with_history(any_store, clock)
    before = _world(any_store, ids)
    with pytest.raises(InvalidArgument, match=r"stop must be a threading\.Event"):
        jobs.watch(from_start=True, poll=0.01, timeout=0, stop=asyncio.Event())  # type: ignore[arg-type]
    assert _world(any_store, ids) == before


@pytest.mark.parametrize("from_start", ["yes", 1, None, "false"], ids=repr)
def test_watch_refuses_a_from_start_that_is_not_a_bool(
    any_store: Store, clock: ManualClock, from_start: object
) -> None:
    """Needs ``Engine.watch`` to pass ``from_start`` and ``stop`` to ``watch_args``."""
    jobs, ids = _engine_with_history(any_store, clock)
    before = _world(any_store, ids)
    with pytest.raises(InvalidArgument, match="from_start must be True or False"):
        jobs.watch(from_start=from_start, poll=0.01, timeout=0)  # type: ignore[arg-type]
    assert _world(any_store, ids) == before


@pytest.mark.parametrize("timeout", [math.inf, -math.inf], ids=repr)
def test_watch_refuses_an_infinite_timeout_none_means_no_timeout(
    any_store: Store, clock: ManualClock, timeout: float
) -> None:
    jobs, ids = _engine_with_history(any_store, clock)
    before = _world(any_store, ids)
    with pytest.raises(InvalidArgument, match="timeout must be a finite"):
        jobs.watch(from_start=True, timeout=timeout)
    assert _world(any_store, ids) == before


def test_watch_still_takes_good_arguments_and_stops_on_its_event(any_store: Store, clock: ManualClock) -> None:
    jobs, _ = _engine_with_history(any_store, clock)
    stop = threading.Event()
    feed = jobs.watch(from_start=True, poll=0.01, timeout=5, stop=stop)
    first = next(feed)
    assert (first.kind, first.record.entity_id, first.record.event) == ("job", "w1", "start")
    stop.set()
    assert list(feed) == []  # stopped: the iteration ends


ASYNC_BAD: list[tuple[dict[str, Any], str]] = [
    ({"stop": "x"}, r"stop must be an asyncio\.Event"),
    ({"stop": 5}, r"stop must be an asyncio\.Event"),
    ({"stop": threading.Event()}, r"stop must be an asyncio\.Event"),
    ({"from_start": "yes"}, "from_start must be True or False"),
    ({"poll": "1"}, "poll must be"),
    ({"poll": math.inf}, "poll must be"),
    ({"timeout": math.inf}, "timeout must be a finite"),
    ({"timeout": "10"}, "timeout must be"),
    ({"after": 5}, "after must be"),
]


async def _check_async_watch_refusals(store: Any) -> None:
    from fsm.aio import AsyncEngine

    engine = AsyncEngine(JobLifecycle, store)
    await engine.create("a1")
    await engine.fire("a1", "start")
    before = await engine.history("a1"), await engine.get("a1")
    for kwargs, message in ASYNC_BAD:
        # the call itself refuses: no iterator is handed back, nothing is awaited
        with pytest.raises(InvalidArgument, match=message):
            engine.watch(**kwargs)
    assert (await engine.history("a1"), await engine.get("a1")) == before
    # good arguments still make a working watch
    stop = asyncio.Event()
    feed = engine.watch(from_start=True, poll=0.01, timeout=5, stop=stop)
    first = await anext(feed)
    assert (first.record.entity_id, first.kind) == ("a1", "job")
    stop.set()
    async for _ in feed:
        pass


def test_the_async_watch_checks_every_argument_when_called_on_the_memory_store() -> None:
    from stores.aio import AsyncMemoryStore

    asyncio.run(_check_async_watch_refusals(AsyncMemoryStore()))


def test_the_async_watch_checks_every_argument_when_called_on_sql(sql_target: SqlTarget) -> None:
    from stores.aio import AsyncSqlStore

    async def main() -> None:
        store = AsyncSqlStore(sql_target.url, table_prefix=sql_target.prefix)
        try:
            await _check_async_watch_refusals(store)
        finally:
            await store.close()

    asyncio.run(main())


# -- 2. policies -----------------------------------------------------------------------------

LAX_RETRY_VALUES: list[tuple[str, object]] = [
    ("backoff_coefficient", "2"),
    ("backoff_coefficient", "2.0"),
    ("backoff_coefficient", True),
    ("backoff_coefficient", math.nan),
    ("backoff_coefficient", math.inf),
    ("backoff_coefficient", "inf"),
    ("jitter", "0.1"),
    ("jitter", False),
    ("jitter", True),
    ("jitter", math.nan),
    ("jitter", "nan"),
    ("max_attempts", "3"),
    ("max_attempts", True),
    ("retry_on", {""}),  # a set skipped the name checks
    ("non_retryable", frozenset({"\x00"})),
    ("retry_on", {"OSError": 1}),
]


def test_retry_policy_numbers_are_strict_and_finite() -> None:
    accepted = []
    for field, value in LAX_RETRY_VALUES:
        try:
            RetryPolicy(**{field: value})  # type: ignore[arg-type]
        except ConfigError:  # the library's typed error, naming the field
            continue
        accepted.append((field, value))
    assert accepted == []


def test_retry_policy_replace_refuses_strings_for_numbers_with_a_config_error_naming_each() -> None:
    policy = RetryPolicy(jitter=0.0)
    with pytest.raises(ConfigError) as info:
        policy.replace(backoff_coefficient="2", jitter="0.1")
    assert sorted(p.split(":")[0] for p in info.value.problems) == ["backoff_coefficient", "jitter"]
    assert policy.jitter == 0.0 and policy.backoff_coefficient == 2.0  # the policy itself is unchanged
    for field, value in LAX_RETRY_VALUES:
        with pytest.raises(ConfigError, match=field):
            policy.replace(**{field: value})


LAX_POLICY_CHANGES: list[dict[str, Any]] = [
    {"default_retry": {"backoff_coefficient": "2"}},
    {"default_retry": {"jitter": True}},
    {"retry": {"running": {"jitter": "0.1"}}},
    {"retry": {b"running": RetryPolicy()}},
    {"renewal_budget": {b"running": timedelta(hours=1)}},
    {"max_reclaims": "2"},
    {"max_attempts": 3.0},
    {"lease_ttl": True},
    {"max_wait": math.inf},
]


@pytest.mark.parametrize("lifecycle", [JobLifecycle, PipelineLifecycle], ids=lambda lc: lc.__name__)
def test_policy_fields_are_as_strict_as_retry_policy(lifecycle: Any) -> None:
    policy: Policy = lifecycle.policy
    accepted = []
    for changes in LAX_POLICY_CHANGES:
        try:
            policy.replace(**changes)
        except ConfigError:
            continue
        accepted.append(changes)
    assert accepted == []
    assert lifecycle.policy == policy
    # what is right still passes: ints for floats, numbers of seconds for durations
    assert policy.replace(default_retry=RetryPolicy(backoff_coefficient=3, jitter=0)).default_retry == RetryPolicy(
        backoff_coefficient=3.0, jitter=0.0
    )


# -- 3. prune --------------------------------------------------------------------------------


class _Recording:
    """A store whose ``prune`` records the states it was asked for."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.asked: list[tuple[str, ...]] = []

    def prune(self, kind: str, states: Any, before: datetime, **options: Any) -> list[str]:
        self.asked.append(tuple(states))
        return self._store.prune(kind, states, before, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("lifecycle", [JobLifecycle, PipelineLifecycle], ids=lambda lc: lc.__name__)
def test_engine_prune_asks_the_store_for_its_final_states_only(
    any_store: Store, clock: ManualClock, lifecycle: Any
) -> None:
    """The store cannot know which states are final; the engine is the level that does and
    never passes a caller's list on: every prune call names exactly the table's finals."""
    recording = _Recording(any_store)
    engine = Engine(lifecycle, recording, clock=clock)
    live = engine.create().id
    clock.advance(seconds=86400)
    engine.prune(1.0, dry_run=True)
    engine.prune(1.0, batch_size=1)
    finals = tuple(sorted(engine.table.finals))
    assert recording.asked and all(asked == finals for asked in recording.asked)
    assert engine.get(live).state == engine.table.initial  # old, but not final: kept


BAD_STATES: dict[str, Callable[[], object]] = {
    "a string": lambda: "completed",
    "bytes": lambda: b"completed",
    "a number": lambda: 5,
    "None": lambda: None,
    "a mapping": lambda: {"completed": 1},
    "an iterator": lambda: iter(["completed"]),
    "an empty name": lambda: ["completed", ""],
    "no names": lambda: [],
    "a non-string name": lambda: ["completed", 3],
}


@pytest.mark.parametrize("bad", list(BAD_STATES))
def test_store_prune_checks_the_shape_of_states_and_removes_nothing(
    any_store: Store, clock: ManualClock, bad: str
) -> None:
    """The store's own check (``stores.retention.check_prune``): a collection of 1 to 100
    non-empty state names; which of them are final is the caller's business."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    done = jobs.create().id
    assert jobs.fire(done, "cancel").snapshot.state == "failed"  # old and final: would go
    clock.advance(seconds=86400)
    before = (any_store.get(done, include_deleted=True), any_store.history(done))
    with pytest.raises(InvalidArgument, match="state"):
        any_store.prune("job", BAD_STATES[bad](), any_store.now())  # type: ignore[arg-type]
    assert (any_store.get(done, include_deleted=True), any_store.history(done)) == before


def test_store_prune_never_removes_a_held_row_whatever_states_it_is_given(any_store: Store, clock: ManualClock) -> None:
    """The store cannot tell a final state from another; a direct caller that names
    ``running`` still cannot delete live work: a held row is never pruned."""
    from datetime import timedelta

    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("held")
    jobs.create("waiting")
    [held] = jobs.claim(1)
    assert held.id == "held"
    clock.advance(timedelta(days=2))
    later = any_store.now() + timedelta(days=1)  # SQL stores read the server's clock
    assert any_store.prune("job", ["running"], later, dry_run=True) == []
    assert any_store.prune("job", ["running"], later) == []
    assert jobs.get("held").state == "running" and len(jobs.history("held")) == 1


@pytest.mark.parametrize(
    "build",
    [
        lambda: RetryPolicy(backoff_coefficient="2", jitter="0.1"),  # type: ignore[arg-type]
        lambda: Policy(lease_ttl="soon"),  # type: ignore[arg-type]
        lambda: Policy(retry={"running": {"jitter": "x"}}),  # type: ignore[dict-item]
        lambda: ReaperConfig(interval=-1),  # type: ignore[arg-type]
        lambda: ReapPolicy(max_active="long"),  # type: ignore[arg-type]
    ],
)
def test_configuration_models_built_directly_raise_the_librarys_config_error(build: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        build()
    assert not isinstance(caught.value, ValidationError) and caught.value.problems
