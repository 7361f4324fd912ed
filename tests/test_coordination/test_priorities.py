"""Claim priorities, on every store and face: higher first, then the longest due; the
default 0 before negatives.  ``create(priority=)`` takes an int from -100 to 100 and
refuses anything else, creating nothing.  The starvation rule (``Limits(starve_after=d)``):
per state, a claim first takes the one entity due the longest when it has been due for
``d`` or more, whatever its priority; without it, priorities are strict.  On SQL, a raised
job created behind 10,000 others is the next one claimed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import SqlTarget

from fsm import Engine, InvalidArgument, JobLifecycle, Limits, ManualClock
from fsm.records import MAX_PRIORITY, MIN_PRIORITY, NewEntity, Snapshot
from stores import Store

STARVE = timedelta(seconds=30)


def _ids(snaps: list[Snapshot]) -> list[str]:
    return [s.id for s in snaps]


def _create(engine: Engine, clock: ManualClock, entity_id: str, priority: int = 0, key: str | None = None) -> None:
    """One job, a second after the previous one (one due order on every store)."""
    engine.create(entity_id, priority=priority, concurrency_key=key)
    clock.advance(seconds=1)


# mixed priorities, in the order they are created (a second apart)
MIXED = [
    ("z0", 0),
    ("n5", -5),
    ("p3a", 3),
    ("z1", 0),
    ("p3b", 3),
    ("n1", -1),
    ("top", MAX_PRIORITY),
    ("bottom", MIN_PRIORITY),
    ("z2", 0),
    ("p5", 5),
    ("n5b", -5),
]
EXPECTED = ["top", "p5", "p3a", "p3b", "z0", "z1", "z2", "n1", "n5", "n5b", "bottom"]


def test_a_raised_job_created_last_is_claimed_first(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for i in range(5):
        _create(jobs, clock, f"low{i}")
    for i in range(3):
        _create(jobs, clock, f"neg{i}", priority=-1 - i)
    _create(jobs, clock, "urgent", priority=1)
    assert jobs.get("urgent").priority == 1
    assert _ids(jobs.claim(1)) == ["urgent"]
    jobs.fire("urgent", "release")  # back to the queue: its priority goes with it
    assert _ids(jobs.claim(1)) == ["urgent"]
    assert _ids(jobs.claim(1)) == ["low0"]
    assert _ids(jobs.claim(10)) == ["low1", "low2", "low3", "low4", "neg0", "neg1", "neg2"]


@pytest.mark.parametrize("size", [1, 4, 20])
def test_claims_take_priority_then_due_order(any_store: Store, clock: ManualClock, size: int) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for entity_id, priority in MIXED:
        _create(jobs, clock, entity_id, priority)
    claimed: list[str] = []
    while batch := jobs.claim(size):
        assert len(batch) == min(size, len(MIXED) - len(claimed))  # a claim takes all it may
        claimed += _ids(batch)
    assert claimed == EXPECTED
    assert {s.id: s.priority for s in jobs.entities(limit=100)} == dict(MIXED)


def test_priorities_keep_their_order_under_limits(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for entity_id, priority in MIXED:
        _create(jobs, clock, entity_id, priority, key="k")
    claimed: list[str] = []
    limits = Limits(per_key=3)
    while batch := jobs.claim(5, limits=limits):
        assert len(batch) == min(3, len(MIXED) - len(claimed))  # three slots of the key
        claimed += _ids(batch)
        for snap in batch:
            assert snap.lease is not None
            jobs.fire(snap, "fail", lease=snap.lease)
    assert claimed == EXPECTED


def test_a_later_due_time_waits_whatever_its_priority(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("later", priority=MAX_PRIORITY, run_after=timedelta(seconds=10))
    jobs.create("now", priority=MIN_PRIORITY)
    assert _ids(jobs.claim(5)) == ["now"]
    clock.advance(seconds=10)
    assert _ids(jobs.claim(5)) == ["later"]


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, False, "1", None, 2**63, 10**100])
def test_a_bad_priority_is_refused_and_nothing_is_created(any_store: Store, clock: ManualClock, priority: Any) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    with pytest.raises(InvalidArgument):
        jobs.create("j1", priority=priority)
    with pytest.raises(InvalidArgument):  # the store checks it too
        any_store.create(NewEntity("j1", "job", "queued", priority=priority))
    with pytest.raises(InvalidArgument):
        any_store.create_many([NewEntity("j2", "job", "queued"), NewEntity("j3", "job", "queued", priority=priority)])
    assert any_store.entities("job") == []


def test_the_bounds_are_priorities(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    assert jobs.create("hi", priority=MAX_PRIORITY).priority == MAX_PRIORITY == 100
    assert jobs.create("lo", priority=MIN_PRIORITY).priority == MIN_PRIORITY == -100
    made = any_store.create_many([NewEntity("m1", "job", "queued", priority=7), NewEntity("m2", "job", "queued")])
    assert [s.priority for s in made] == [7, 0]
    assert {s.id: s.priority for s in jobs.entities()} == {"hi": 100, "lo": -100, "m1": 7, "m2": 0}
    # a claim keeps the priority (it is set at create, never changed)
    assert [(s.id, s.priority) for s in jobs.claim(5)] == [("hi", 100), ("m1", 7), ("m2", 0), ("lo", -100)]


# -- the starvation rule -------------------------------------------------------------------


def _backlog(jobs: Engine, clock: ManualClock) -> None:
    """old0 and old1 at the default priority, then five raised jobs; the clock stops when
    old0 has been due 31 s, old1 30 s (exactly ``STARVE``: starved too)."""
    _create(jobs, clock, "old0")
    _create(jobs, clock, "old1")
    for i in range(5):
        _create(jobs, clock, f"hi{i}", priority=10)
    clock.advance(seconds=24)  # old1 was created 30 s ago
    assert clock.now() - jobs.get("old1").created_at == STARVE


@pytest.mark.parametrize("counted", [False, True], ids=["no limits", "with limits"])
def test_a_starved_job_is_claimed_before_newer_raised_ones(any_store: Store, clock: ManualClock, counted: bool) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _backlog(jobs, clock)
    limits = Limits(starve_after=STARVE, total=100) if counted else Limits(starve_after=STARVE)
    # one starved job per claim per state, then the claim's order (a claim returns its
    # jobs in no promised order: the sets are compared)
    assert sorted(_ids(jobs.claim(3, limits=limits))) == ["hi0", "hi1", "old0"]
    assert sorted(_ids(jobs.claim(3, limits=limits))) == ["hi2", "hi3", "old1"]
    assert _ids(jobs.claim(3, limits=limits)) == ["hi4"]
    assert _ids(jobs.claim(3)) == []


@pytest.mark.parametrize("counted", [False, True], ids=["no limits", "with limits"])
def test_a_starving_claim_still_takes_as_many_as_it_asks(any_store: Store, clock: ManualClock, counted: bool) -> None:
    """The starved job is also the first of its priority: it is taken once, and the claim
    still takes ``limit`` jobs (its pick must not count the starved row twice)."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for i in range(5):
        _create(jobs, clock, f"j{i}")
    clock.advance(seconds=60)
    limits = Limits(starve_after=STARVE, total=100) if counted else Limits(starve_after=STARVE)
    assert _ids(jobs.claim(3, limits=limits)) == ["j0", "j1", "j2"]
    assert _ids(jobs.claim(1, limits=limits)) == ["j3"]
    assert _ids(jobs.claim(3, limits=limits)) == ["j4"]


def test_without_starve_after_priorities_are_strict(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _backlog(jobs, clock)
    clock.advance(timedelta(hours=1))
    assert _ids(jobs.claim(3)) == ["hi0", "hi1", "hi2"]
    assert _ids(jobs.claim(3, limits=Limits(total=100))) == ["hi3", "hi4", "old0"]


def test_a_job_due_less_than_starve_after_keeps_its_place(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _create(jobs, clock, "old")
    _create(jobs, clock, "hi", priority=1)
    clock.advance(STARVE - timedelta(seconds=3))  # "old" due 29 s
    limits = Limits(starve_after=STARVE)
    assert _ids(jobs.claim(1, limits=limits)) == ["hi"]
    assert _ids(jobs.claim(1, limits=limits)) == ["old"]


def test_each_state_has_its_own_starved_job(any_store: Store, clock: ManualClock) -> None:
    """Resumes (running, no owner) and starts (queued) each lead with their starved job:
    one claim takes ``r_old`` and ``q_old``, though ``q_hi`` is raised."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    t0 = clock.now()
    _create(jobs, clock, "r_old")
    clock.advance(seconds=40)
    _create(jobs, clock, "r_hi", priority=10)
    for snap in jobs.claim(2):
        assert snap.lease is not None
        jobs.release_lease(snap.lease)  # both wait, running, for a new holder
    jobs.create("q_old", run_after=t0)  # due as long as r_old
    _create(jobs, clock, "q_hi", priority=10)
    assert {s.id: s.lease_owner for s in jobs.entities()} == dict.fromkeys(["q_hi", "q_old", "r_hi", "r_old"])
    assert sorted(_ids(jobs.claim(3, limits=Limits(starve_after=STARVE)))) == ["q_old", "r_hi", "r_old"]
    assert _ids(jobs.claim(3)) == ["q_hi"]


class Patient(JobLifecycle):
    limits = Limits(starve_after=STARVE)


def test_the_lifecycles_starve_after_applies_and_a_claims_limits_replace_it(
    any_store: Store, clock: ManualClock
) -> None:
    jobs = Engine(Patient, any_store, clock=clock)
    _backlog(jobs, clock)
    assert _ids(jobs.claim(2, limits=Limits(total=10))) == ["hi0", "hi1"]  # no starve_after: strict
    assert sorted(_ids(jobs.claim(2))) == ["hi2", "old0"]  # the lifecycle's own


def test_the_starvation_rule_picks_per_state_and_resumes_stay_first(any_store: Store, clock: ManualClock) -> None:
    """A resume (work under way) is taken before any start, as without the rule; the
    starved queued job leads the starts.  Per state: the SQL stores rank each state's pick
    with its starved row first, resumes first; the memory store put every starved row
    before the whole claim (it took ``old`` before the resume)."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _create(jobs, clock, "old")
    clock.advance(seconds=98)
    _create(jobs, clock, "resumed", priority=10)
    [taken] = jobs.claim(1)
    assert taken.id == "resumed" and taken.lease is not None
    jobs.release_lease(taken.lease)  # running, no owner, due since its create: 20 s below
    _create(jobs, clock, "hi", priority=10)
    clock.advance(seconds=19)
    limits = Limits(starve_after=STARVE)
    assert _ids(jobs.claim(1, limits=limits)) == ["resumed"]
    assert _ids(jobs.claim(1, limits=limits)) == ["old"]
    assert _ids(jobs.claim(1, limits=limits)) == ["hi"]


def test_a_starved_job_of_a_full_key_yields_to_the_oldest_it_may_take(any_store: Store, clock: ManualClock) -> None:
    """``old_a`` is due the longest but its key is full: the starvation rule goes to the
    oldest job the claim may take (``old_b``), as the SQL stores' pick steps over full keys
    first.  The memory store judged the starved row before the gate, so when the gate
    refused it, no starved job went first and the raised ``hi`` was taken."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    _create(jobs, clock, "held", key="a")
    [held] = jobs.claim(1)
    assert held.id == "held"
    _create(jobs, clock, "old_a", key="a")
    _create(jobs, clock, "old_b", key="b")
    clock.advance(seconds=40)
    _create(jobs, clock, "hi", priority=10, key="c")
    limits = Limits(per_key=1, starve_after=STARVE)
    assert _ids(jobs.claim(1, limits=limits)) == ["old_b"]
    assert _ids(jobs.claim(5, limits=limits)) == ["hi"]


# -- a deep backlog (SQL) ------------------------------------------------------------------

BACKLOG = 10_000
CHUNK = 2_500


def test_a_raised_job_behind_ten_thousand_is_claimed_next(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock)
    for start in range(0, BACKLOG, CHUNK):
        jobs.create_many([None] * CHUNK, ids=[f"b{i:05d}" for i in range(start, start + CHUNK)])
        clock.advance(seconds=1)
    store.create_many([NewEntity(f"neg{i}", "job", "queued", priority=-1) for i in range(100)])
    clock.advance(seconds=1)
    jobs.create("urgent", priority=1)
    jobs.create("urgent2", priority=2)
    assert _ids(jobs.claim(1)) == ["urgent2"]
    assert _ids(jobs.claim(1, limits=Limits(per_key=1))) == ["urgent"]
    jobs.create("urgent3", priority=3)
    clock.advance(seconds=60)
    taken = {s.id: s for s in jobs.claim(2, limits=Limits(starve_after=STARVE))}
    assert "urgent3" in taken and len(taken) == 2
    [starved] = [s for s in taken.values() if s.id != "urgent3"]
    assert starved.id < f"b{CHUNK:05d}" and starved.priority == 0  # of the first chunk, due the longest
    assert jobs.counts()["queued"] == BACKLOG + 100 - 1
