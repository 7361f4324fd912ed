"""Property (issue 11): hostile values at every public entry point, on every store.

Each example picks an entry point of the engine or of the store protocol and a value of
one of the hostile classes (lone surrogates and NUL, over-long ids, non-strings, ill-typed
lease fields, overflowing or non-finite TTLs, data that is not JSON or nested too deep),
and asserts:

- the call raises a typed error (an ``FsmError``; ``InvalidArgument`` is also a ``ValueError``);
- the reference entities' rows and histories are unchanged, and nothing was created;
- the store still works afterwards (a fresh entity is created and moved).

``FSM_HOSTILE_EXAMPLES`` raises the example count (the default suite keeps it small).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import Engine, FsmError, JobLifecycle, Lease, LeaseKeeper, ManualClock, RetryPolicy, UnknownEntity
from fsm.limits import MAX_ID_LENGTH, MAX_JSON_DEPTH
from fsm.records import BatchWrite, ClaimRequest, NewEntity, TransitionWrite
from fsm.work import Worker
from stores import Store

EXAMPLES = int(os.environ.get("FSM_HOSTILE_EXAMPLES", "25"))

# -- hostile values ---------------------------------------------------------------------------

short = st.text(alphabet="abc-_", max_size=6)
with_nul = short.map(lambda s: f"{s}\x00{s}")
with_surrogate = st.tuples(short, st.integers(0xD800, 0xDFFF)).map(lambda p: f"{p[0]}{chr(p[1])}")
too_long = st.integers(MAX_ID_LENGTH + 1, MAX_ID_LENGTH + 40).map(lambda n: "k" * n)
non_strings = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(short, min_size=1, max_size=2),
    st.binary(min_size=1, max_size=4),
    st.booleans(),
    st.sets(st.integers(), max_size=2),
)
bad_text = st.one_of(with_nul, with_surrogate, non_strings)
"""Refused as any text (a reason may be long, so not over-long strings)."""
bad_id = st.one_of(bad_text, too_long, st.just(""))
"""Refused as an id, key, owner or event name."""


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"n": value}
    return value


def _cycle() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


class _Opaque:
    pass


bad_json = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sets(st.integers(), min_size=1, max_size=3),
    st.binary(min_size=1, max_size=4),
    st.datetimes(timezones=st.just(UTC)),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.builds(_Opaque),
    st.builds(_cycle),
    st.integers(MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 20).map(_nested),
    with_nul,
    with_surrogate,
    st.dictionaries(st.one_of(with_nul, with_surrogate, st.integers()), st.integers(), min_size=1, max_size=1),
)
"""Refused as entity data (as a value under a key, or anywhere inside)."""
bad_token = st.one_of(
    st.integers(min_value=2**63),
    st.integers(max_value=-1),
    st.booleans(),
    st.text(alphabet="0123456789", min_size=1, max_size=3),
    st.floats(),
)
bad_ttl = st.one_of(
    st.sampled_from([timedelta.max, timedelta(days=999_999_999), timedelta(0), -timedelta(seconds=1)]),
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 10**12, True]),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=1),
)

bad_due = st.one_of(
    st.datetimes(timezones=st.none()),  # naive: whose clock?
    st.sampled_from(
        [
            datetime.max.replace(tzinfo=timezone(-timedelta(hours=5))),  # past the end of time in UTC
            datetime.min.replace(tzinfo=timezone(timedelta(hours=5))),
            -timedelta(seconds=1),
            timedelta.max,
            math.nan,
            0,
            "2026-01-01",
            True,
        ]
    ),
)
"""Refused as a due time (``run_after``)."""
bad_reap = st.one_of(
    st.integers(), st.floats(), st.lists(short, min_size=1, max_size=2), st.binary(min_size=1, max_size=4)
)
"""Refused as ``Worker(reap=...)`` (a bool, a ReaperConfig or its mapping)."""
bad_state = st.one_of(
    st.sampled_from(["bogus", "", "active", "'; DROP TABLE fsm_entities; --", "queued\x00", "QUEUED", "running "]),
    st.none(),
    non_strings,
)
"""Refused as a snapshot's state: no leaf state of the job lifecycle (``active`` is its compound)."""
bad_clock = st.one_of(
    st.none(),
    st.datetimes(),  # naive
    st.dates(),
    st.text(max_size=8),
    st.integers(),
    st.floats(allow_nan=True),
    st.builds(_Opaque),
)
"""What a broken clock's ``now()`` returns instead of an aware datetime (the store's clock)."""

# -- the entry points --------------------------------------------------------------------------


class World:
    """A store with two reference entities: ``q`` queued, ``f`` running under a lease."""

    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.jobs = Engine(JobLifecycle, store, clock=clock, owner="worker-1")
        self.q = f"q-{uuid.uuid4().hex[:8]}"
        self.f = f"f-{uuid.uuid4().hex[:8]}"
        self.jobs.create(self.q, data={"keep": [1, "two", None]})
        self.jobs.create(self.f)
        lease = self.jobs.fire(self.f, "start").lease
        assert lease is not None
        self.lease: Lease = self.jobs.renew_lease(lease)  # so f's renewal log has an entry to keep
        self.fresh = f"n-{uuid.uuid4().hex[:8]}"  # what a refused create must not have created

    def with_clock(self, value: Any, call: Callable[[], object]) -> object:
        """``call()`` while the store's clock returns ``value``."""
        self.clock.now = lambda: value  # type: ignore[method-assign]
        try:
            return call()
        finally:
            del self.clock.now

    def state(self) -> Any:
        store = self.store
        return [(store.get(e), store.history(e), store.effects(e), store.renewals(e)) for e in (self.q, self.f)]


Call = Callable[[World, Any], object]

ENTRY_POINTS: list[tuple[str, st.SearchStrategy[Any], Call]] = [
    ("Engine(owner)", bad_id, lambda w, v: Engine(JobLifecycle, w.store, owner=v)),
    ("create(id)", bad_id, lambda w, v: w.jobs.create(v)),
    ("create(data)", bad_json, lambda w, v: w.jobs.create(w.fresh, data={"v": v})),
    ("create(data=non-mapping)", non_strings, lambda w, v: w.jobs.create(w.fresh, data=v)),
    ("create(concurrency_key)", bad_id, lambda w, v: w.jobs.create(w.fresh, concurrency_key=v)),
    ("create(columns)", bad_json, lambda w, v: w.jobs.create(w.fresh, columns={"c": v})),
    ("create(run_after)", bad_due, lambda w, v: w.jobs.create(w.fresh, run_after=v)),
    (
        "store.create(run_after)",
        bad_due,
        lambda w, v: w.store.create(NewEntity(id=w.fresh, kind="job", state="queued", run_after=v)),
    ),
    ("fire(run_after)", bad_due, lambda w, v: w.jobs.fire(w.f, "retry", lease=w.lease, run_after=v)),
    ("fire(error)", bad_json, lambda w, v: w.jobs.fire(w.f, "retry", lease=w.lease, error={"v": v})),
    ("fire(error=non-mapping)", non_strings, lambda w, v: w.jobs.fire(w.f, "retry", lease=w.lease, error=v)),
    (
        "store.apply(run_after)",
        bad_due,
        lambda w, v: w.store.apply(TransitionWrite(w.q, "start", "queued", "running", "worker", 0, run_after=v)),
    ),
    (
        "store.apply(error)",
        bad_json,
        lambda w, v: w.store.apply(TransitionWrite(w.q, "start", "queued", "running", "worker", 0, error={"v": v})),
    ),
    ("Policy.replace(lease_ttl)", bad_ttl, lambda w, v: JobLifecycle.policy.replace(lease_ttl=v)),
    ("Policy.replace(max_wait)", bad_ttl, lambda w, v: JobLifecycle.policy.replace(max_wait=v)),
    ("RetryPolicy.replace(initial_interval)", bad_ttl, lambda w, v: RetryPolicy().replace(initial_interval=v)),
    ("RetryPolicy.replace(max_attempts)", bad_token, lambda w, v: RetryPolicy().replace(max_attempts=v)),
    ("Worker(reap)", bad_reap, lambda w, v: Worker(w.jobs, {"running": lambda job: None}, reap=v)),
    ("create_many(ids)", bad_id, lambda w, v: w.jobs.create_many([{}, {}], ids=[w.fresh, v])),
    ("create_many(data)", bad_json, lambda w, v: w.jobs.create_many([{}, {"v": v}], ids=[w.fresh, w.fresh + "b"])),
    ("create_many(data=non-list)", non_strings, lambda w, v: w.jobs.create_many(v)),
    ("create_many(data=[non-mapping])", non_strings, lambda w, v: w.jobs.create_many([{}, v], ids=[w.fresh, "z"])),
    (
        "create_many(concurrency_keys)",
        bad_id,
        lambda w, v: w.jobs.create_many([{}, {}], ids=[w.fresh, w.fresh + "b"], concurrency_keys=[None, v]),
    ),
    (
        "store.create_many(id)",
        bad_id,
        lambda w, v: w.store.create_many(
            [NewEntity(id=w.fresh, kind="job", state="queued"), NewEntity(id=v, kind="job", state="queued")]
        ),
    ),
    (
        "store.create_many(data)",
        bad_json,
        lambda w, v: w.store.create_many(
            [
                NewEntity(id=w.fresh, kind="job", state="queued"),
                NewEntity(id=w.fresh + "b", kind="job", state="queued", data={"v": v}),
            ]
        ),
    ),
    ("store.create_many(batch)", non_strings, lambda w, v: w.store.create_many(v)),
    ("renew_leases(token)", bad_token, lambda w, v: w.jobs.renew_leases([w.lease._replace(token=v)])),
    ("renew_leases(owner)", bad_id, lambda w, v: w.jobs.renew_leases([w.lease._replace(owner=v)])),
    ("renew_leases(list)", non_strings, lambda w, v: w.jobs.renew_leases(v)),
    (
        "store.renew_leases(ttl)",
        bad_ttl,
        lambda w, v: w.store.renew_leases([w.lease], ttl=v),
    ),
    (
        "store.renew_leases(budgets)",
        bad_ttl,
        lambda w, v: w.store.renew_leases([w.lease], ttl=timedelta(minutes=1), budgets=(("running", v),)),
    ),
    ("store.renew_leases(leases)", non_strings, lambda w, v: w.store.renew_leases(v, ttl=timedelta(minutes=1))),
    (
        "store.apply_many(event)",
        bad_id,
        lambda w, v: w.store.apply_many([TransitionWrite(w.q, v, "queued", "running", "worker", 0)]),
    ),
    ("store.apply_many(writes)", non_strings, lambda w, v: w.store.apply_many(v)),
    ("fire_many(items)", non_strings, lambda w, v: w.jobs.fire_many(v)),
    ("get(id)", bad_id, lambda w, v: w.jobs.get(v)),
    ("history(id)", bad_id, lambda w, v: w.jobs.history(v)),
    ("fire(id)", bad_id, lambda w, v: w.jobs.fire(v, "start")),
    ("fire(event)", bad_id, lambda w, v: w.jobs.fire(w.q, v)),
    ("fire(idempotency_key)", bad_id, lambda w, v: w.jobs.fire(w.q, "start", idempotency_key=v)),
    ("fire(reason)", bad_text, lambda w, v: w.jobs.fire(w.q, "start", reason=v)),
    ("fire(data)", bad_json, lambda w, v: w.jobs.fire(w.q, "start", data={"v": v})),
    ("fire(data=non-mapping)", non_strings, lambda w, v: w.jobs.fire(w.q, "start", data=v)),
    ("fire(owner)", bad_id, lambda w, v: w.jobs.fire(w.q, "start", owner=v)),
    ("fire(actor)", bad_id, lambda w, v: w.jobs.fire(w.q, "start", actor=v)),
    ("fire(lease.token)", bad_token, lambda w, v: w.jobs.fire(w.f, "exited", lease=w.lease._replace(token=v))),
    ("fire(lease.owner)", bad_id, lambda w, v: w.jobs.fire(w.f, "exited", lease=w.lease._replace(owner=v))),
    ("fire(lease.entity_id)", bad_id, lambda w, v: w.jobs.fire(w.f, "exited", lease=w.lease._replace(entity_id=v))),
    (
        "fire(lease.expires_at)",
        non_strings,
        lambda w, v: w.jobs.fire(w.f, "exited", lease=w.lease._replace(expires_at=v)),
    ),
    ("fire(lease)", non_strings, lambda w, v: w.jobs.fire(w.f, "exited", lease=v)),
    ("acquire_lease(ttl)", bad_ttl, lambda w, v: w.jobs.acquire_lease(w.q, ttl=v)),
    ("acquire_lease(owner)", bad_id, lambda w, v: w.jobs.acquire_lease(w.q, owner=v)),
    ("renew_lease(ttl)", bad_ttl, lambda w, v: w.jobs.renew_lease(w.lease, ttl=v)),
    ("renew_lease(token)", bad_token, lambda w, v: w.jobs.renew_lease(w.lease._replace(token=v))),
    ("renew_lease(expires_at)", non_strings, lambda w, v: w.jobs.renew_lease(w.lease._replace(expires_at=v))),
    ("release_lease(owner)", bad_id, lambda w, v: w.jobs.release_lease(w.lease._replace(owner=v))),
    ("renewals(id)", bad_id, lambda w, v: w.jobs.renewals(v)),
    ("store.get", bad_id, lambda w, v: w.store.get(v)),
    ("store.history", bad_id, lambda w, v: w.store.history(v)),
    ("store.find_transition", bad_id, lambda w, v: w.store.find_transition(w.q, v)),
    ("store.has_newer_sibling", bad_id, lambda w, v: w.store.has_newer_sibling(v)),
    ("store.soft_delete", bad_id, lambda w, v: w.store.soft_delete(v)),
    ("store.create(id)", bad_id, lambda w, v: w.store.create(NewEntity(id=v, kind="job", state="queued"))),
    ("store.create(kind)", bad_id, lambda w, v: w.store.create(NewEntity(id=w.fresh, kind=v, state="queued"))),
    (
        "store.create(data)",
        bad_json,
        lambda w, v: w.store.create(NewEntity(id=w.fresh, kind="job", state="queued", data={"v": v})),
    ),
    (
        "store.apply(event)",
        bad_id,
        lambda w, v: w.store.apply(TransitionWrite(w.q, v, "queued", "running", "worker", 0)),
    ),
    (
        "store.apply(reason)",
        bad_text,
        lambda w, v: w.store.apply(TransitionWrite(w.q, "start", "queued", "running", "worker", 0, reason=v)),
    ),
    (
        "store.apply(expect_version)",
        bad_token,
        lambda w, v: w.store.apply(TransitionWrite(w.q, "start", "queued", "running", "worker", v)),
    ),
    (
        "store.apply(data)",
        bad_json,
        lambda w, v: w.store.apply(TransitionWrite(w.q, "start", "queued", "running", "worker", 0, data={"v": v})),
    ),
    (
        "store.acquire_lease(ttl)",
        bad_ttl,
        lambda w, v: w.store.acquire_lease(w.q, owner="o", ttl=v, budget=None, expect_version=0),
    ),
    (
        "store.renew_lease(token)",
        bad_token,
        lambda w, v: w.store.renew_lease(w.f, owner="worker-1", token=v, ttl=timedelta(minutes=1), budget=None),
    ),
    (
        "store.renew_lease(budget)",
        bad_ttl,
        lambda w, v: w.store.renew_lease(w.f, owner="worker-1", token=1, ttl=timedelta(minutes=1), budget=v),
    ),
    ("store.release_lease(owner)", bad_id, lambda w, v: w.store.release_lease(w.f, owner=v, token=w.lease.token)),
    (
        "store.renew_lease(owner)",
        bad_id,
        lambda w, v: w.store.renew_lease(w.f, owner=v, token=w.lease.token, ttl=timedelta(minutes=1), budget=None),
    ),
    ("store.renewals", bad_id, lambda w, v: w.store.renewals(v)),
    ("store.candidates(kind)", bad_id, lambda w, v: w.store.candidates(v, "running", (), limit=10)),
    ("store.candidates(limit)", bad_token, lambda w, v: w.store.candidates("job", "running", (), limit=v)),
    (
        "store.apply_batch(ids)",
        bad_id,
        lambda w, v: w.store.apply_batch(BatchWrite((w.f, v), "job", "expire", "running", "failed", "reaper")),
    ),
    (
        "store.move_candidates(limit)",
        bad_token,
        lambda w, v: w.store.move_candidates(BatchWrite((), "job", "expire", "running", "failed", "reaper"), limit=v),
    ),
    (
        "store.move_candidates_brief(kind)",
        bad_id,
        lambda w, v: w.store.move_candidates_brief(BatchWrite((), v, "expire", "running", "failed", "reaper"), limit=9),
    ),
    (
        "store.move_candidates_brief(limit)",
        bad_token,
        lambda w, v: w.store.move_candidates_brief(
            BatchWrite((), "job", "expire", "running", "failed", "reaper"), limit=v
        ),
    ),
    # durable work: the ledger, claiming, listing, the keeper
    ("run(key)", bad_id, lambda w, v: w.jobs.run(w.f, v, lambda key: 1, w.lease)),
    ("run(result)", bad_json, lambda w, v: w.jobs.run(w.f, "gate", lambda key: {"v": v}, w.lease)),
    ("run(lease.token)", bad_token, lambda w, v: w.jobs.run(w.f, "gate", lambda key: 1, w.lease._replace(token=v))),
    ("run(lease.owner)", bad_id, lambda w, v: w.jobs.run(w.f, "gate", lambda key: 1, w.lease._replace(owner=v))),
    ("claim(limit)", bad_token, lambda w, v: w.jobs.claim(v)),
    ("claim(owner)", bad_id, lambda w, v: w.jobs.claim(owner=v)),
    ("entities(state)", bad_id, lambda w, v: w.jobs.entities(state=v)),
    ("entities(after_id)", bad_id, lambda w, v: w.jobs.entities(after_id=v)),
    ("keep(period)", bad_ttl, lambda w, v: LeaseKeeper(w.jobs, w.lease, period=v)),
    ("record_progress", bad_json, lambda w, v: w.jobs.record_progress(w.lease, {"v": v})),
    ("store.effect", bad_id, lambda w, v: w.store.effect(w.f, v)),
    ("store.effects", bad_id, lambda w, v: w.store.effects(v)),
    (
        "store.record_effect(owner)",
        bad_id,
        lambda w, v: w.store.record_effect(w.f, "k", owner=v, token=w.lease.token, status="succeeded", result=1),
    ),
    (
        "store.record_effect(result)",
        bad_json,
        lambda w, v: w.store.record_effect(
            w.f, "k", owner=w.lease.owner, token=w.lease.token, status="succeeded", result={"v": v}
        ),
    ),
    (
        "store.record_effect(token)",
        bad_token,
        lambda w, v: w.store.record_effect(w.f, "k", owner=w.lease.owner, token=v, status="succeeded", result=1),
    ),
    (
        "store.claim(kind)",
        bad_id,
        lambda w, v: w.store.claim(ClaimRequest(kind=v, owner="o", limit=1, ttl=timedelta(minutes=1))),
    ),
    ("store.claim(ttl)", bad_ttl, lambda w, v: w.store.claim(ClaimRequest(kind="job", owner="o", limit=1, ttl=v))),
    ("store.entities(kind)", bad_id, lambda w, v: w.store.entities(v)),
    ("store.entities(limit)", bad_token, lambda w, v: w.store.entities("job", limit=v)),
    ("store.count_states", bad_id, lambda w, v: w.store.count_states(v)),
    ("store.feed(after)", bad_id, lambda w, v: w.store.feed(v)),
    ("store.feed(kind)", bad_id, lambda w, v: w.store.feed(kind=v)),
    ("store.feed(limit)", bad_token, lambda w, v: w.store.feed(limit=v)),
    ("engine.watch(after)", bad_id, lambda w, v: w.jobs.watch(v)),
    # a snapshot the caller holds, in a state the lifecycle does not have (issue 18)
    ("configuration(state)", bad_state, lambda w, v: w.jobs.configuration(w.store.get(w.q)._replace(state=v))),
    ("configuration(entity)", non_strings, lambda w, v: w.jobs.configuration(v)),
    ("allowed_events(state)", bad_state, lambda w, v: w.jobs.allowed_events(w.store.get(w.f)._replace(state=v))),
    ("fire(snapshot.state)", bad_state, lambda w, v: w.jobs.fire(w.store.get(w.q)._replace(state=v), "exited")),
    # the store's clock returning no aware datetime: refused before anything is written
    ("clock: create", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.create(w.fresh))),
    ("clock: fire", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.fire(w.q, "start"))),
    ("clock: renew_lease", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.renew_lease(w.lease))),
    ("clock: run", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.run(w.f, "gate", lambda key: 1, w.lease))),
    ("clock: claim", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.claim(1))),
    ("clock: soft_delete", bad_clock, lambda w, v: w.with_clock(v, lambda: w.store.soft_delete(w.q))),
    ("prune(older_than)", bad_ttl, lambda w, v: w.jobs.prune(v)),
    ("prune(batch_size)", bad_token, lambda w, v: w.jobs.prune(60.0, batch_size=v)),
    ("store.prune(kind)", bad_id, lambda w, v: w.store.prune(v, ("completed",), w.clock.now())),
    ("store.prune(states)", bad_id, lambda w, v: w.store.prune("job", ("completed", v), w.clock.now())),
    ("store.prune(before)", non_strings, lambda w, v: w.store.prune("job", ("completed",), v)),
    ("store.prune(limit)", bad_token, lambda w, v: w.store.prune("job", ("completed",), w.clock.now(), limit=v)),
    ("store.trim_history(id)", bad_id, lambda w, v: w.store.trim_history(v, 5)),
    ("store.trim_history(keep)", bad_token, lambda w, v: w.store.trim_history(w.f, v)),
    ("clock: prune", bad_clock, lambda w, v: w.with_clock(v, lambda: w.jobs.prune(60.0))),
]


@st.composite
def attacks(draw: st.DrawFn) -> tuple[str, Any, Call]:
    name, values, call = draw(st.sampled_from(ENTRY_POINTS))
    return name, draw(values), call


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(attack=attacks())
def test_hostile_values_get_typed_errors_and_change_nothing(
    any_store: Store, clock: ManualClock, attack: tuple[str, Any, Call]
) -> None:
    name, value, call = attack
    world = World(any_store, clock)
    before = world.state()
    with pytest.raises(FsmError) as caught:
        call(world, value)
    assert not isinstance(caught.value, AssertionError), name
    assert world.state() == before, f"{name} with {value!r} changed a row"
    with pytest.raises(UnknownEntity):
        any_store.get(world.fresh)
    # and the store still works
    probe = f"ok-{uuid.uuid4().hex[:8]}"
    world.jobs.create(probe, data={"at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(), "d": str(Decimal("1.5"))})
    assert world.jobs.fire(probe, "start").state == "running"


def test_every_entry_point_refuses_its_whole_class_once(any_store: Store, clock: ManualClock) -> None:
    """A deterministic pass: one example of each entry point, so a new entry point is always tried."""
    canonical = {
        id(bad_id): "k" * (MAX_ID_LENGTH + 1),
        id(bad_text): "a\x00b",
        id(bad_json): math.nan,
        id(bad_token): 2**64,
        id(bad_ttl): timedelta.max,
        id(non_strings): 42,
        id(bad_due): datetime(2026, 1, 1),
        id(bad_reap): 42,
        id(bad_state): "bogus",
        id(bad_clock): None,
    }
    world = World(any_store, clock)
    for name, values, call in ENTRY_POINTS:
        value = canonical[id(values)]
        before = world.state()
        with pytest.raises(FsmError):
            call(world, value)
        assert world.state() == before, name


@given(value=st.one_of(bad_id, bad_text, bad_json, non_strings, st.just(None)))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_within_refuses_what_is_not_a_connection_with_a_typed_error(any_store: Store, value: Any) -> None:
    """``Engine.within`` (the caller's transaction) on every store: a value that is not a
    SQLAlchemy Connection or Session, or a store without SQL (memory), is a ``ConfigError``;
    the row is unchanged and the store still commits on its own afterwards."""
    from fsm import ConfigError

    jobs = Engine(JobLifecycle, any_store)
    job = jobs.create()
    with pytest.raises(ConfigError), jobs.within(value):
        jobs.fire(job.id, "start")
    assert jobs.get(job.id).state == "queued" and jobs.history(job.id) == []
    assert jobs.fire(job.id, "start").state == "running"


# -- the inspector's HTTP inputs (issue 21): every route and parameter ------------------------
#
# Each route of ``fsm inspect --allow-actions`` (behind the token), each query parameter it
# reads (and one it does not), each hostile value: a 4xx page or an ordinary answer, never a
# 500, always with the security headers, and the store unchanged; the action's form fields
# the same way.  On SQLite and PostgreSQL.

INSPECTOR_TOKEN = "a-hostile-tests-bearer-token-0123456789"
LIST_PARAMS = ("kind", "state", "q", "holder", "limit", "expired", "data", "value", "after_t", "after_id")
INSPECTOR_ROUTES: dict[str, tuple[str, ...]] = {
    "/": LIST_PARAMS,
    "/fragment/overview": LIST_PARAMS,
    "/entity": ("id",),
    "/fragment/entity": ("id",),
    "/diagram.svg": ("id", "v"),
    "/static/inspect.js": (),
    "/static/inspect.css": (),
    "/login": ("code",),
    "/events": ("id", "kind", "after"),
}
STREAMS = {"/events"}
"""Routes that stream once their input is good: only inputs they refuse are sent to them."""
REFUSED_AS_TEXT = {
    "nul": "a%00b",
    "lone surrogate": "%ED%A0%80",  # U+D800's UTF-8 bytes
    "low surrogate": "x%ED%BF%BFx",
    "surrogate pair halves": "%ED%A0%BD%ED%B8%80",
    "not utf-8": "%FF%FE",
    "overlong nul": "%C0%80",
    "beyond unicode": "%F4%90%80%80",
}
"""Refused on every route, in any parameter (a 400 before the route runs)."""
ODD_VALUES = {
    "huge": "x" * 12_000,
    "nan": "NaN",
    "minus infinity": "-Infinity",
    "float": "1.5e3",
    "negative": "-1",
    "fullwidth digit": "%EF%BC%91",
    "html": "%3Cscript%3Ealert(1)%3C/script%3E",
    "json": "%7B%22a%22%3A%5B1%5D%7D",
    "highest code point": "%F4%8F%BF%BF",
}
"""Typed wrong, too big, or odd: a 4xx where the route reads them as a number or a time,
or past their length, and never a 500 anywhere."""
NUMBERS_AND_TIMES = {"limit", "after_t"}


@pytest.fixture(name="inspector", params=["sqlite", "postgres"], scope="module")
def served_inspector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from conftest import postgres_url
    from inspect_support import serve_asgi, stop_serving

    from fsm import PipelineLifecycle
    from fsm.inspect.app import create_app
    from fsm.inspect.security import Tokens
    from stores.sql import SqlStore
    from stores.sql.migrate import drop_schema

    if request.param == "sqlite":
        url, prefix = f"sqlite:///{tmp_path_factory.mktemp('hostile-http')}/fsm.db", "fsm_"
    else:
        url, prefix = postgres_url(), f"t{uuid.uuid4().hex[:10]}_"
    store = SqlStore(url, table_prefix=prefix)
    jobs = Engine(JobLifecycle, store, owner="worker-1")
    jobs.create("h-queued", data={"task": "build"})
    jobs.create("h-running")
    [held] = jobs.claim(1)
    assert held.id in {"h-queued", "h-running"}
    jobs.create("h-failed")
    jobs.fire("h-failed", "cancel", reason="operator seed")
    ids = ["h-queued", "h-running", "h-failed", "h-failed~retry1", "h-queued~retry1"]
    app = create_app(store, [JobLifecycle, PipelineLifecycle], tokens=Tokens(INSPECTOR_TOKEN), allow_actions=True)
    server, thread, base = serve_asgi(app)

    def state() -> Any:
        rows = []
        for entity_id in ids:
            try:
                rows.append((store.get(entity_id, include_deleted=True), store.history(entity_id)))
            except UnknownEntity:
                rows.append(None)
        return rows, store.counts() if hasattr(store, "counts") else None

    try:
        yield base, state, jobs
    finally:
        stop_serving(server, thread)
        if request.param == "postgres":
            drop_schema(store.engine, table_prefix=prefix)
        store.close()


def _get(base: str, path_and_query: str, headers: dict[str, str] | None = None) -> Any:
    from inspect_support import http

    return http(base + path_and_query, headers={"Authorization": f"Bearer {INSPECTOR_TOKEN}", **(headers or {})})


def _secured(answer: Any, what: str) -> None:
    from fsm.inspect.security import HEADERS

    assert answer.status < 500, (what, answer.status, answer.body[:300])
    for name, value in HEADERS.items():
        assert answer.headers.get(name) == value, (what, name, answer.status)


def test_every_inspector_route_and_parameter_refuses_text_that_is_not_text(inspector: Any) -> None:
    base, state, _ = inspector
    before = state()
    for path, params in INSPECTOR_ROUTES.items():
        for name in (*params, "unknown", "id"):
            for label, value in REFUSED_AS_TEXT.items():
                for query in (f"{name}={value}", f"{name}=ok&{name}={value}", f"{value}=1"):
                    answer = _get(base, f"{path}?{query}")
                    _secured(answer, (path, query))
                    assert answer.status == 400, (path, label, query, answer.status)
    for label, value in REFUSED_AS_TEXT.items():  # in the path itself
        answer = _get(base, f"/entity{value}")
        _secured(answer, label)
        assert 400 <= answer.status < 500, (label, answer.status)
    assert state() == before


def test_every_inspector_route_answers_odd_values_without_a_500(inspector: Any) -> None:
    base, state, _ = inspector
    before = state()
    for path, params in INSPECTOR_ROUTES.items():
        for name in (*params, "unknown"):
            for label, value in ODD_VALUES.items():
                if path in STREAMS and (label != "huge" or name not in params):
                    continue  # a good request opens a stream that stays open
                extra = "&data=task" if name == "value" else ""
                answer = _get(base, f"{path}?{name}={value}{extra}")
                _secured(answer, (path, name, label))
                if name in NUMBERS_AND_TIMES and path in {"/", "/fragment/overview"}:
                    assert answer.status == 400, (path, name, label, answer.status)
                if label == "huge" and name in params and name not in {"v", "expired"}:
                    assert 400 <= answer.status < 500, (path, name, label, answer.status)
    for query in ("after_t=2026-13-45T00:00:00%2B00:00", "after_t=2026-01-01T00:00:00", "limit=0x10", "limit=%20"):
        answer = _get(base, f"/?{query}")
        _secured(answer, query)
        assert answer.status == 400, (query, answer.status)
    assert state() == before


def _post(base: str, body: bytes, content_type: str = "application/x-www-form-urlencoded") -> Any:
    from inspect_support import http

    headers = {"Authorization": f"Bearer {INSPECTOR_TOKEN}", "Content-Type": content_type}
    return http(base + "/action", method="POST", data=body, headers=headers)


def test_the_action_forms_hostile_fields_are_refused_and_change_nothing(inspector: Any) -> None:
    from urllib.parse import urlencode

    from fsm.inspect.actions import RETRY, csrf_token

    base, state, jobs = inspector
    csrf = csrf_token(INSPECTOR_TOKEN, "bearer")

    def form(entity_id: str, event: str, **changes: str) -> dict[str, str]:
        found = {"id": entity_id, "event": event, "version": str(jobs.get(entity_id).version), "csrf": csrf}
        found.update(operator="alice", note="")
        found.update(changes)
        return found

    before = state()
    for entity_id, event in (("h-queued", "cancel"), ("h-failed", RETRY)):
        good = urlencode(form(entity_id, event))
        for name in ("id", "event", "version", "csrf", "operator", "note"):
            bad_values = [*REFUSED_AS_TEXT.values(), "x" * 600, "NaN", "-1", "1.5e3", "%EF%BC%91", ""]
            for value in bad_values:
                fine = value in {"NaN", "-1", "1.5e3", "%EF%BC%91"} or (value == "" and name == "note")
                if name in {"note", "operator"} and fine:
                    continue  # fine names and notes (an operator may be called NaN); nothing else is
                body = f"{good}&{name}={value}".replace(f"{name}=", f"{name}_=", 1)  # the hostile one counts
                answer = _post(base, body.encode())
                _secured(answer, (entity_id, name, value[:20]))
                assert 400 <= answer.status < 500, (entity_id, name, value[:20], answer.status, answer.body[:300])
        for body in (b"\xff\xfe", b"id=%00", b"=" * 100, b"a" * 20_000, good.encode() + b"&x=" + b"y" * 20_000):
            answer = _post(base, body)
            _secured(answer, body[:20])
            assert 400 <= answer.status < 500, (body[:20], answer.status)
        for content_type in ("text/plain", "multipart/form-data; boundary=x", "application/json", "form"):
            answer = _post(base, good.encode(), content_type)
            _secured(answer, content_type)
            assert answer.status == 415, (content_type, answer.status)
    assert state() == before
