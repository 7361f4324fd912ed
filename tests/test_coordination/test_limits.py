"""Concurrency and rate limits of claims (:class:`fsm.Limits`), on every store and face.

A slot is a live lease in a leased state (a job's ``running`` and ``finalizing``): it frees
when the entity finishes, fails, is released or parked, or when its lease expires.  Rate
limits count starts (claims that start an entity) in a sliding window; resumes count
against concurrency, never against a rate.  The limits come from the lifecycle, from a
worker's ``limits=`` (which wins), or from ``Engine.claim(limits=)``.  Bad limits are a
``ConfigError`` where they are declared and an ``InvalidArgument`` at a store's door, and
a refused claim changes nothing.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import (
    ConfigError,
    Engine,
    InvalidArgument,
    InvalidData,
    InvalidDefinition,
    JobLifecycle,
    Limits,
    ManualClock,
    Rate,
    Worker,
)
from fsm.engine.work import claim_plan, leased_states
from fsm.records import ClaimLimits, ClaimRequest, HistoryRecord, Snapshot
from stores import MemoryStore, Store
from stores.base import Waits

TTL = JobLifecycle.policy.lease_ttl  # two minutes
MINUTE = timedelta(seconds=60)
WAIT = 30.0


def _ids(snaps: list[Snapshot]) -> list[str]:
    return [s.id for s in snaps]


def _queue(engine: Engine, clock: ManualClock, items: Sequence[tuple[str, str | None]]) -> None:
    """Create the jobs in this order, a second apart (so their due order is the same everywhere)."""
    for entity_id, key in items:
        engine.create(entity_id, concurrency_key=key)
        clock.advance(seconds=1)


def _held(store: Store) -> list[str]:
    """Jobs holding a slot now: a live lease in a leased state."""
    now = store.now()
    leased = set(leased_states(JobLifecycle.table))
    return sorted(
        s.id
        for s in store.entities("job", limit=10_000)
        if s.state in leased and s.lease_expires_at is not None and s.lease_expires_at > now
    )


def _everything(store: Store) -> tuple[list[Snapshot], dict[str, list[HistoryRecord]]]:
    snaps = store.entities("job", limit=10_000)
    return snaps, {s.id: store.history(s.id) for s in snaps}


# -- concurrency per key and in all --------------------------------------------------------


def test_a_per_key_limit_takes_at_most_n_of_each_key(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"{k}{i}", k) for i in range(4) for k in "abc"])  # a0 b0 c0 a1 b1 c1 ...
    limits = Limits(per_key=2)
    taken = jobs.claim(10, limits=limits)
    assert _ids(taken) == ["a0", "b0", "c0", "a1", "b1", "c1"]  # in due order, two of each key
    assert all(s.state == "running" and s.lease is not None for s in taken)
    assert jobs.claim(10, limits=limits) == []  # every key is full
    assert jobs.counts()["queued"] == 6
    assert _ids(jobs.claim(10)) == ["a2", "b2", "c2", "a3", "b3", "c3"]  # without limits: the rest


def test_jobs_without_a_key_are_unlimited_per_key_but_count_to_the_total(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("n0", None), ("n1", None), ("n2", None), ("a0", "a"), ("a1", "a"), ("n3", None)])
    assert _ids(jobs.claim(10, limits=Limits(per_key=1))) == ["n0", "n1", "n2", "a0", "n3"]
    _queue(jobs, clock, [("n4", None), ("n5", None)])
    # five slots held (four keyless, one of "a"): a total of 6 leaves one
    assert _ids(jobs.claim(10, limits=Limits(per_key=1, total=6))) == ["n4"]
    assert _held(any_store) == ["a0", "n0", "n1", "n2", "n3", "n4"]
    assert jobs.claim(10, limits=Limits(total=6)) == []


def test_a_total_limit_caps_the_leases_of_the_lifecycle(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"j{i}", f"k{i % 2}" if i % 3 else None) for i in range(8)])
    limits = Limits(total=3)
    assert _ids(jobs.claim(10, limits=limits)) == ["j0", "j1", "j2"]
    assert jobs.claim(1, limits=limits) == []
    assert _ids(jobs.claim(2, limits=Limits(total=4))) == ["j3"]  # another total counts the same leases
    j0 = jobs.get("j0")
    assert j0.lease is not None
    jobs.fire("j0", "fail", lease=j0.lease)
    assert _ids(jobs.claim(10, limits=Limits(total=4))) == ["j4"]


def test_finishing_failing_or_releasing_a_job_frees_its_slot(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"a{i}", "a") for i in range(6)] + [("b0", "b")])
    limits = Limits(per_key=2)
    first, second, b0 = jobs.claim(10, limits=limits)
    assert (first.id, second.id, b0.id) == ("a0", "a1", "b0")
    assert first.lease is not None and second.lease is not None
    # finalizing still holds the lease: the slot stays taken
    exited = jobs.fire(first, "exited", lease=first.lease)
    assert exited.snapshot.state == "finalizing"
    assert jobs.claim(10, limits=limits) == []
    jobs.fire(exited, "complete", lease=first.lease)  # final: its slot frees
    assert _ids(jobs.claim(10, limits=limits)) == ["a2"]
    jobs.fire(second, "fail", lease=second.lease)
    [a3] = jobs.claim(10, limits=limits)
    assert a3.id == "a3"
    # an operator's release gives the job back to the queue, at its place in the line
    jobs.fire("a2", "release")
    assert _ids(jobs.claim(10, limits=limits)) == ["a2"]
    # a lease given up (release_lease) leaves the job running without an owner: the next
    # claim resumes it first, before any queued job of the key
    assert a3.lease is not None
    jobs.release_lease(a3.lease)
    assert "a3" not in _held(any_store)
    [resumed] = jobs.claim(10, limits=limits)
    assert resumed.id == "a3" and resumed.state == "running" and resumed.lease_token == a3.lease_token + 1
    assert jobs.claim(10, limits=limits) == []
    assert _held(any_store) == ["a2", "a3", "b0"]
    assert jobs.counts()["queued"] == 2


def test_an_expired_lease_frees_its_slot(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("a0", "a"), ("a1", "a"), ("a2", "a")])
    limits = Limits(per_key=1, total=1)
    assert _ids(jobs.claim(5, limits=limits)) == ["a0"]
    clock.advance(TTL)
    assert jobs.claim(5, limits=limits) == []  # live up to its expiry, as its holder's writes see it
    clock.advance(timedelta(microseconds=1))  # the lease expired: the slot is free
    assert _ids(jobs.claim(5, limits=limits)) == ["a1"]
    a0 = jobs.get("a0")
    assert a0.state == "running" and a0.lease_owner is not None  # the dead holder's row, unreaped
    assert jobs.claim(5, limits=limits) == []


def test_a_parked_job_holds_no_slot_and_its_resume_counts_against_concurrency(
    any_store: Store, clock: ManualClock
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("a0", "a"), ("a1", "a"), ("a2", "a")])
    limits = Limits(per_key=1)
    [a0] = jobs.claim(5, limits=limits)
    assert a0.lease is not None
    # a durable sleep parks the job: no owner, due again in a minute
    parked = cast(Waits, any_store).park("a0", owner=a0.lease.owner, token=a0.lease.token, until=clock.now() + MINUTE)
    assert parked.state == "running" and parked.lease_owner is None
    assert _ids(jobs.claim(5, limits=limits)) == ["a1"]  # the parked job's slot is free
    clock.advance(MINUTE + timedelta(seconds=1))  # a0 is due to resume; a1's lease is still live
    assert jobs.claim(5, limits=limits) == []  # the resume waits for its key's slot
    a1 = jobs.get("a1")
    assert a1.lease is not None
    jobs.fire(a1, "fail", lease=a1.lease)
    [resumed] = jobs.claim(5, limits=limits)
    assert resumed.id == "a0" and resumed.state == "running"  # resumed before a2 starts
    assert jobs.claim(5, limits=limits) == []


# -- rate limits ---------------------------------------------------------------------------


def test_a_rate_limit_counts_starts_in_a_sliding_window(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"j{i}", None) for i in range(12)])
    limits = Limits(rate=Rate(3, per=MINUTE))
    t0 = clock.now()
    assert _ids(jobs.claim(2, limits=limits)) == ["j0", "j1"]  # two starts at t0
    clock.advance(seconds=30)
    assert _ids(jobs.claim(10, limits=limits)) == ["j2"]  # the third, at t0 + 30 s
    for snap in jobs.entities(state="running"):  # finishing frees slots, never a rate's starts
        assert snap.lease is not None
        jobs.fire(snap, "fail", lease=snap.lease)
    assert jobs.claim(10, limits=limits) == []
    clock.advance(seconds=29)
    assert jobs.claim(10, limits=limits) == []  # t0 + 59 s: three starts in the window
    clock.set(t0 + MINUTE)  # the starts of t0 leave the window; the one of t0 + 30 s stays
    assert _ids(jobs.claim(10, limits=limits)) == ["j3", "j4"]
    assert jobs.claim(10, limits=limits) == []
    clock.set(t0 + timedelta(seconds=90))
    assert _ids(jobs.claim(10, limits=limits)) == ["j5"]
    assert _ids(jobs.claim(10)) == [f"j{i}" for i in range(6, 12)]  # without limits: the rest


def test_a_key_rate_limits_the_starts_of_each_key(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"{k}{i}", k if k != "n" else None) for i in range(4) for k in "abn"])
    limits = Limits(key_rate=Rate(2, per=MINUTE))
    assert _ids(jobs.claim(20, limits=limits)) == ["a0", "b0", "n0", "a1", "b1", "n1", "n2", "n3"]
    assert jobs.claim(20, limits=limits) == []
    clock.advance(MINUTE)
    assert _ids(jobs.claim(20, limits=Limits(key_rate=Rate(2, per=MINUTE), rate=Rate(3, per=MINUTE)))) == [
        "a2",
        "b2",
        "a3",
    ]


def test_resumes_count_against_concurrency_but_not_against_a_rate(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("j0", "k"), ("j1", "k"), ("j2", "k")])
    limits = Limits(total=2, rate=Rate(1, per=MINUTE), key_rate=Rate(1, per=MINUTE))
    t0 = clock.now()
    [j0] = jobs.claim(5, limits=limits)  # the one start both rates allow
    assert j0.id == "j0" and j0.lease is not None
    clock.set(t0 + timedelta(seconds=30))
    jobs.release_lease(j0.lease)  # running without an owner: a resume
    [resumed] = jobs.claim(5, limits=limits)  # both rates are spent: a resume is no start
    assert resumed.id == "j0" and resumed.lease is not None
    assert jobs.claim(5, limits=limits) == []  # j1 would be a second start
    clock.set(t0 + MINUTE)  # the start of t0 leaves the windows; the resume of t0 + 30 s counted nothing
    assert _ids(jobs.claim(5, limits=limits)) == ["j1"]
    assert jobs.claim(5, limits=limits) == []  # total reached, and both rates spent again
    jobs.release_lease(resumed.lease)
    [again] = jobs.claim(5, limits=limits)  # a resume needs a slot, never a start
    assert again.id == "j0"
    assert jobs.claim(5, limits=Limits(total=2)) == []  # j2: the two slots are held
    assert _held(any_store) == ["j0", "j1"]


def test_a_rate_counts_the_starts_of_claims_that_keep_a_rate(any_store: Store, clock: ManualClock) -> None:
    """Pins what the SQL stores do: a start is recorded for a rate window only by a claim
    whose limits have that rate.  A claim without limits, or with limits but no rate
    (``per_key`` alone), leaves nothing a later rate counts.  The memory store records the
    starts of every limited claim, so there the rate found three starts already in the
    window: the stores disagree (the same root as the unbounded ``_starts`` below)."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [(f"j{i}", "k") for i in range(9)])
    rate = Limits(rate=Rate(3, per=MINUTE), key_rate=Rate(3, per=MINUTE))
    assert _ids(jobs.claim(3)) == ["j0", "j1", "j2"]  # no limits
    assert _ids(jobs.claim(3, limits=Limits(per_key=100, total=100))) == ["j3", "j4", "j5"]  # limits, no rate
    assert _ids(jobs.claim(10, limits=rate)) == ["j6", "j7", "j8"]


# -- the key read off the data -------------------------------------------------------------


class PerCustomer(JobLifecycle):
    """A job whose concurrency key is its ``customer`` field: one at a time per customer."""

    limits = Limits(key="customer", per_key=1)


def test_limits_key_reads_the_concurrency_key_off_the_data(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(PerCustomer, any_store, clock=clock)

    def create(entity_id: str, data: dict[str, Any] | None = None, key: str | None = None) -> str | None:
        snap = jobs.create(entity_id, data=data, concurrency_key=key)
        clock.advance(seconds=1)  # one due order on every store
        return snap.concurrency_key

    assert create("s1", {"customer": "acme"}) == "acme"
    assert create("s2", {"customer": "acme"}) == "acme"
    assert create("i1", {"customer": 7}) == "7"
    assert create("i2", {"customer": 7}) == "7"
    assert create("none", {"customer": None}) is None
    assert create("absent") is None
    assert create("given", {"customer": "acme"}, "other") == "other"
    many = jobs.create_many([{"customer": "zed"}, {"customer": 7}, {}], ids=["m1", "m2", "m3"])
    assert [s.concurrency_key for s in many] == ["zed", "7", None]
    assert jobs.get("s1").concurrency_key == "acme"  # as stored
    # the lifecycle's limits: one at a time per customer
    assert sorted(_ids(jobs.claim(20))) == ["absent", "given", "i1", "m1", "m3", "none", "s1"]
    assert jobs.claim(20) == []


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (True, InvalidArgument),
        (1.5, InvalidArgument),
        (["acme"], InvalidArgument),
        ({"id": 1}, InvalidArgument),
        ("k" * 10_000, InvalidArgument),  # too long for a concurrency key
        ("", InvalidArgument),
        ("x\x00y", InvalidData),  # no JSON a store keeps: the data is refused first
    ],
)
def test_a_key_field_of_another_type_is_refused_and_nothing_is_created(
    any_store: Store, clock: ManualClock, value: Any, error: type[Exception]
) -> None:
    jobs = Engine(PerCustomer, any_store, clock=clock)
    with pytest.raises(error):
        jobs.create("j1", data={"customer": value})
    with pytest.raises(error):
        jobs.create_many([{"customer": "fine"}, {"customer": value}], ids=["j2", "j3"])
    assert any_store.entities("job") == []


# -- where the limits come from ------------------------------------------------------------


class OneAtATime(JobLifecycle):
    limits = Limits(total=1)


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(what)


def test_the_lifecycles_limits_apply_and_a_workers_own_limits_win(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(OneAtATime, any_store, clock=clock)
    _queue(engine, clock, [(f"j{i}", None) for i in range(6)])
    go = threading.Event()

    def agent(job: Any) -> str:
        go.wait(WAIT)
        return "exited"

    handlers: dict[str, Any] = {"running": agent, "finalizing": lambda job: "complete"}
    plain = Worker(engine, handlers, concurrency=5, poll_interval=timedelta(milliseconds=10))
    own = Worker(engine, handlers, concurrency=5, poll_interval=timedelta(milliseconds=10), limits=Limits(total=3))
    assert own.limits == Limits(total=3) and plain.limits is None
    try:
        assert plain.run_once() == 1  # the lifecycle's total
        assert plain.run_once() == 0
        assert own.run_once() == 2  # its own total counts the same leases: three in all
        assert own.run_once() == 0
        assert engine.claim(5) == []  # the engine keeps the lifecycle's limits too
        assert _ids(engine.claim(5, limits=Limits(total=4))) == ["j3"]  # and a claim's own
        assert _held(any_store) == ["j0", "j1", "j2", "j3"]
    finally:
        go.set()
        _until(lambda: plain.running == 0 and own.running == 0, "the handlers never finished")
        plain.stop()
        own.stop()
    assert [engine.get(f"j{i}").state for i in range(3)] == ["completed"] * 3


def test_the_async_worker_keeps_its_own_limits() -> None:
    from fsm import AsyncEngine
    from fsm.aio import AsyncWorker
    from stores.aio import AsyncMemoryStore

    async def scenario() -> None:
        engine = AsyncEngine(OneAtATime, AsyncMemoryStore())
        for i in range(4):
            await engine.create(f"j{i}")
        go = asyncio.Event()

        async def agent(job: Any) -> str:
            await go.wait()
            return "exited"

        async def finish(job: Any) -> str:
            return "complete"

        handlers: dict[str, Any] = {"running": agent, "finalizing": finish}
        worker = AsyncWorker(engine, handlers, concurrency=4, limits=Limits(total=2))
        assert await worker.run_once() == 2
        assert await worker.run_once() == 0
        go.set()
        await worker.stop()
        with pytest.raises(ConfigError):
            AsyncWorker(engine, handlers, limits=ClaimLimits(leased=("running",), total=1))  # type: ignore[arg-type]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "limits", [{"total": 1}, "total=1", 1, ClaimLimits(leased=("running",), total=1), Rate(1, per=60)]
)
def test_a_claim_with_limits_of_another_type_is_refused_and_takes_nothing(
    any_store: Store, clock: ManualClock, limits: Any
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("j0", "k"), ("j1", None)])
    before = _everything(any_store)
    with pytest.raises(InvalidArgument):
        jobs.claim(5, limits=limits)
    assert _everything(any_store) == before
    with pytest.raises(ConfigError):
        Worker(jobs, {"running": lambda job: "exited"}, limits=limits)


def test_a_lifecycle_declaring_limits_of_another_type_is_refused_as_a_definition_error() -> None:
    """``limits = {...}`` on a lifecycle is a definition error (as a bad ``Limits(...)``
    is a ``ConfigError``), found before any claim or create, not an ``AttributeError``
    raised from deep inside the first create."""
    with pytest.raises((ConfigError, InvalidDefinition)):

        class Loose(JobLifecycle):
            limits = {"per_key": 2}  # type: ignore[assignment]

        jobs = Engine(Loose, MemoryStore())
        jobs.create("j1")
        jobs.claim(1)


# -- Limits and Rate refuse bad values -----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"per_key": 0},
        {"per_key": -1},
        {"total": -1},
        {"total": 0},
        {"per_key": 1_000_001},
        {"per_key": "2"},
        {"per_key": True},
        {"total": 2.0},
        {"total": None, "per_key": math.nan},
        {"key": "not an identifier"},
        {"key": ""},
        {"key": "a-b"},
        {"key": "x" * 65},
        {"key": 3},
        {"starve_after": -1},
        {"starve_after": 0},
        {"starve_after": math.nan},
        {"starve_after": math.inf},
        {"starve_after": "30s"},
        {"starve_after": timedelta(days=365 * 200)},
        {"rate": (3, 60)},
        {"rate": 3},
        {"key_rate": {"count": 3, "per": 60, "burst": 1}},
        {"burst": 3},
    ],
)
def test_bad_limits_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Limits(**kwargs)


@pytest.mark.parametrize("rate", [{"count": 3}, {"per": 60}, {}])
def test_a_rate_read_from_a_mapping_without_its_fields_is_a_config_error(rate: dict[str, Any]) -> None:
    """Limits read from configuration (``Limits(rate={"count": 3, "per": 60})`` is
    accepted) must refuse a rate missing a field with ``ConfigError``, as every other bad
    value; ``Rate``'s own ``__init__(count, per)`` turns it into a ``TypeError`` instead."""
    with pytest.raises(ConfigError):
        Limits(key_rate=cast(Any, rate))
    with pytest.raises(ConfigError):
        Rate.model_validate(rate)


@pytest.mark.parametrize(
    ("count", "per"),
    [
        (0, 1),
        (-1, 1),
        (True, 1),
        ("3", 1),
        (1.0, 1),
        (1_000_001, 1),
        (3, 0),
        (3, -1),
        (3, math.nan),
        (3, -math.inf),
        (3, timedelta(0)),
        (3, timedelta(seconds=-1)),
        (3, "60"),
        (3, None),
        (3, True),
    ],
)
def test_bad_rates_are_config_errors(count: Any, per: Any) -> None:
    with pytest.raises(ConfigError):
        Rate(count, per=per)


def test_good_limits_are_kept_as_given() -> None:
    limits = Limits(per_key=2, total=10, key="customer", rate=Rate(5, per=60), key_rate=Rate(1, per=1.5))
    assert limits.rate == Rate(5, per=MINUTE) and limits.key_rate is not None
    assert limits.key_rate.per == timedelta(seconds=1.5)
    claim = limits.for_claim(["running", "finalizing"])
    assert claim == ClaimLimits(("finalizing", "running"), 2, 10, (5, MINUTE), (1, timedelta(seconds=1.5)))
    assert Limits(starve_after=cast(Any, 30)).for_claim(["running"]) is None  # nothing to count
    assert Limits(key="customer").counts is False
    with pytest.raises(ConfigError):
        limits.replace(total=0)
    with pytest.raises((ConfigError, TypeError, ValueError)):
        limits.total = 3  # type: ignore[misc]  # frozen


# -- a store refuses a malformed claim and changes nothing ---------------------------------

_STARTS, _RESUMES = claim_plan(JobLifecycle.table)
_LEASED = ("finalizing", "running")


def _request(**changes: Any) -> ClaimRequest:
    fields: dict[str, Any] = {
        "kind": "job",
        "owner": "w1",
        "limit": 5,
        "ttl": TTL,
        "starts": _STARTS,
        "resumes": _RESUMES,
        "limits": ClaimLimits(_LEASED, per_key=1),
    }
    return ClaimRequest(**{**fields, **changes})


def _limits(**fields: Any) -> ClaimLimits:
    return ClaimLimits(**{"leased": _LEASED, "per_key": 1, **fields})


HOSTILE_CLAIMS: dict[str, Callable[[], ClaimRequest]] = {
    "no leased states": lambda: _request(limits=_limits(leased=())),
    "leased as a list": lambda: _request(limits=_limits(leased=["running"])),
    "leased as a string": lambda: _request(limits=_limits(leased="running")),
    "NUL in a leased state": lambda: _request(limits=_limits(leased=("running\x00",))),
    "a lone surrogate in a leased state": lambda: _request(limits=_limits(leased=("run\ud800",))),
    "an empty leased state": lambda: _request(limits=_limits(leased=("",))),
    "a leased state that is no string": lambda: _request(limits=_limits(leased=(1,))),
    "65 leased states": lambda: _request(limits=_limits(leased=tuple(f"s{i}" for i in range(65)))),
    "a huge leased state": lambda: _request(limits=_limits(leased=("s" * 100_000,))),
    "per_key 0": lambda: _request(limits=_limits(per_key=0)),
    "per_key huge": lambda: _request(limits=_limits(per_key=10**30)),
    "per_key bool": lambda: _request(limits=_limits(per_key=True)),
    "per_key float": lambda: _request(limits=_limits(per_key=2.0)),
    "total negative": lambda: _request(limits=_limits(total=-1)),
    "total huge": lambda: _request(limits=_limits(total=2**63)),
    "rate count 0": lambda: _request(limits=_limits(rate=(0, MINUTE))),
    "rate count huge": lambda: _request(limits=_limits(rate=(10**12, MINUTE))),
    "rate without a period": lambda: _request(limits=_limits(rate=(3,))),
    "rate as a list": lambda: _request(limits=_limits(rate=[3, MINUTE])),
    "rate period NaN": lambda: _request(limits=_limits(rate=(3, math.nan))),
    "rate period infinite": lambda: _request(limits=_limits(rate=(3, math.inf))),
    "rate period zero": lambda: _request(limits=_limits(rate=(3, timedelta(0)))),
    "key_rate period negative": lambda: _request(limits=_limits(key_rate=(3, timedelta(seconds=-1)))),
    "key_rate period NaN": lambda: _request(limits=_limits(key_rate=(3, math.nan))),
    "key_rate period huge": lambda: _request(limits=_limits(key_rate=(3, timedelta(days=999_999)))),
    "limits of another type": lambda: _request(limits={"per_key": 1}),
    "Limits instead of ClaimLimits": lambda: _request(limits=Limits(per_key=1)),
    "starve_after NaN": lambda: _request(starve_after=math.nan),
    "starve_after negative": lambda: _request(starve_after=timedelta(seconds=-30)),
    "starve_after zero": lambda: _request(starve_after=timedelta(0)),
    "starve_after huge": lambda: _request(starve_after=timedelta(days=999_999)),
    "starve_after a string": lambda: _request(starve_after="30s"),
    "limit huge": lambda: _request(limit=10**9),
}


def test_a_store_refuses_a_malformed_limited_claim_and_changes_nothing(any_store: Store, clock: ManualClock) -> None:
    """Every case of :data:`HOSTILE_CLAIMS` against one store (a store per case would
    cost a schema each): each is an ``InvalidArgument``, and nothing changed."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("j0", "k"), ("j1", "k"), ("j2", None)])
    [held] = jobs.claim(1)
    before = _everything(any_store)
    wrong: list[str] = []
    for case, make in HOSTILE_CLAIMS.items():
        try:
            taken = any_store.claim(make())
        except InvalidArgument:
            continue
        except Exception as err:
            wrong.append(f"{case}: {type(err).__name__}: {str(err)[:120]}")
        else:
            wrong.append(f"{case}: accepted, took {_ids(taken)}")
    assert not wrong, "\n".join(wrong)
    assert _everything(any_store) == before
    assert held.lease is not None and jobs.get("j0").lease == held.lease
    assert _ids(any_store.claim(_request(limits=_limits(per_key=1)))) == ["j2"]  # the store still works


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"starve_after": 30}, id="starve_after in seconds"),
        pytest.param({"limits": _limits(per_key=None, rate=(3, 60))}, id="rate period in seconds"),
        pytest.param({"limits": _limits(per_key=None, key_rate=(3, 60.0))}, id="key_rate period in seconds"),
    ],
)
def test_a_store_refuses_a_period_given_in_seconds_as_it_refuses_a_ttl_in_seconds(
    any_store: Store, clock: ManualClock, changes: dict[str, Any]
) -> None:
    """A store takes its durations as ``timedelta`` (``ttl=60`` is refused with
    ``InvalidArgument``).  A starve_after or a rate period of plain seconds passes
    ``check_claim_request`` (``check_duration`` accepts numbers) and then meets
    ``datetime - int`` inside the claim: a ``TypeError``, not a typed refusal."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _queue(jobs, clock, [("j0", "k"), ("j1", "k"), ("j2", None)])
    with pytest.raises(InvalidArgument):
        any_store.claim(_request(ttl=60))
    before = _everything(any_store)
    with pytest.raises(InvalidArgument):
        for _ in range(3):  # the memory store meets the period at its second claim
            any_store.claim(_request(**changes))
            clock.advance(seconds=1)
    assert _everything(any_store) == before


# -- concurrent claimers never overfill a key ----------------------------------------------


def test_concurrent_limited_claims_never_take_more_than_a_keys_slots(sql_target: SqlTarget) -> None:
    """Eight claimers, each with its own store (its own connection), claim at once, five
    rounds: no key ever holds more than its two slots, the total never passes six, and a
    claim after them fills the slots left, no more."""
    stores = [sql_target.store() for _ in range(8)]
    engines = [Engine(JobLifecycle, s) for s in stores]
    limits = Limits(per_key=2, total=6)
    for rnd in range(5):
        engines[0].create_many(
            [None] * 40, ids=[f"r{rnd}-{i}" for i in range(40)], concurrency_keys=[f"k{i % 4}" for i in range(40)]
        )
        barrier = threading.Barrier(len(engines))
        taken: list[Snapshot] = []
        errors: list[BaseException] = []

        def claim(
            engine: Engine,
            barrier: threading.Barrier = barrier,
            taken: list[Snapshot] = taken,
            errors: list[BaseException] = errors,
        ) -> None:
            barrier.wait()
            try:
                taken.extend(engine.claim(10, limits=limits))
            except BaseException as err:  # pragma: no cover - reported below
                errors.append(err)

        threads = [threading.Thread(target=claim, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert not errors, errors
        held = [s for s in engines[0].entities(limit=1000) if s.state == "running"]
        per_key: dict[str | None, int] = {}
        for s in held:
            per_key[s.concurrency_key] = per_key.get(s.concurrency_key, 0) + 1
        assert len(taken) == len(held) <= 6 and max(per_key.values()) <= 2, (rnd, per_key)
        assert len({s.id for s in taken}) == len(taken)
        more = engines[0].claim(10, limits=limits)
        assert len(held) + len(more) == 6, (rnd, len(held), len(more))
        for s in [*held, *more]:  # every job of the round fails: the next round starts empty
            assert s.lease is not None
            engines[0].fire(s.id, "fail", lease=s.lease)
        for s in engines[0].entities(state="queued", limit=1000):
            engines[0].fire(s.id, "cancel")


# -- the memory store forgets the starts no window counts ----------------------------------


def test_the_memory_store_keeps_no_starts_that_no_rate_counts() -> None:
    """A limited claim records its starts for the rate windows; the memory store forgets
    them only for a rate it is asked about, so with ``per_key`` alone (no rate at all) or
    ``rate`` alone (no ``key_rate``) every start is kept forever: a long-running memory
    store grows by a timestamp per start and a deque per key."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock)
    for limits in (Limits(per_key=1), Limits(rate=Rate(5, per=MINUTE))):
        for i in range(50):
            snap = jobs.create(concurrency_key=f"k{i}")
            [taken] = jobs.claim(1, limits=limits)
            assert taken.id == snap.id and taken.lease is not None
            jobs.fire(taken, "fail", lease=taken.lease)
            clock.advance(timedelta(hours=1))
    kept = sum(len(times) for times in store._starts.values())
    assert kept <= 5, f"{kept} starts kept in {len(store._starts)} windows"
