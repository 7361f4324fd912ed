"""Children and fan-in (:mod:`fsm.work.children`): ``job.start_child`` creates a child once per
key, ``job.wait_children`` parks the parent (no lease, no slot) until every child is final and
returns their results in start order, ``on_failure`` fails the parent at once (never retried)
or waits for all, ``poll`` sees a child no worker woke the parent for, and ``Engine.cancel``
cascades to the live children.  On every store face with a manual clock; the asyncio worker's
twins on the async stores with real time."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces
from conftest import frozen

from fsm import AsyncEngine, Engine, EntityExists, InvalidArgument, JobLifecycle, ManualClock
from fsm.aio import AsyncJob, AsyncWorker
from fsm.errors import ChildFailed, InvalidData
from fsm.policy import NO_RETRY, RetryPolicy
from fsm.records import Snapshot
from fsm.work import ChildResult, Job, Worker
from fsm.work.children import CHILD_KEY_PREFIX, FAILED_STATES
from stores import MemoryStore, Store

QUICK: dict[str, Any] = {"poll_interval": timedelta(milliseconds=10), "grace": timedelta(seconds=5)}
POLL = timedelta(seconds=30)
"""The parents' poll: long on the manual clock, so only a wake (or an advance) resumes them."""


class ChildTask(JobLifecycle):
    """Another lifecycle with JobLifecycle's rows: a child of another kind."""

    kind = "childtask"


class BrittleTask(JobLifecycle):
    """A child whose handler's first error fails it (reason ``error``): no retry."""

    kind = "brittletask"
    policy = JobLifecycle.policy.replace(default_retry=NO_RETRY)


class TwinA(JobLifecycle):
    """Two imported lifecycles claim the kind ``twintask``: the cascade cannot choose one."""

    kind = "twintask"


class TwinB(JobLifecycle):
    kind = "twintask"


# -- helpers -----------------------------------------------------------------------------------


def _turn(worker: Worker) -> None:
    """Claim what is due and let every handler it started finish (or park); patient, as a
    loaded machine (the whole suite in parallel) runs handlers late."""
    for _ in range(3000):
        worker.run_once()
        if worker.running == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError("handlers still running")


def _once(worker: Worker) -> None:
    """One claim (of up to the free slots), and wait until its handlers finish or park."""
    worker.run_once()
    for _ in range(3000):
        if worker.running == 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError("handlers still running")


def drive(workers: list[Worker], done: Callable[[], bool], turns: int = 60) -> None:
    """Turn the workers until ``done`` (no clock advance: only wakes make a parked parent due)."""
    for _ in range(turns):
        for worker in workers:
            _turn(worker)
        if done():
            return
    raise AssertionError(f"not done after {turns} turns")


def child_rows(store: Store, parent_id: str) -> list[str]:
    """The ledger keys of the parent's started children."""
    return sorted(e.key for e in store.effects(parent_id) if e.key.startswith(CHILD_KEY_PREFIX))


def children_ids(store: Store, parent_id: str) -> list[str]:
    return [s.id for s in store.children(parent_id, limit=10_000)]


def all_ids(store: Store, *kinds: str) -> list[str]:
    return sorted(s.id for kind in kinds for s in store.entities(kind, limit=1000))


def child_running(job: Job) -> str | tuple[str, dict[str, Any]]:
    """A child's agent: fails when its data says so, else exits with its ``n``."""
    if job.data.get("fail"):
        return "fail"
    return "exited", {"exit_code": job.data.get("n", 0)}


def complete(job: Job) -> str:
    return "complete"


def final(engine: Engine, entity_id: str) -> Callable[[], bool]:
    return lambda: engine.get(entity_id).state in engine.table.finals


def result_rows(results: list[ChildResult]) -> list[tuple[str, str, str, Any, bool]]:
    return [(r.id, r.kind, r.state, r.data.get("exit_code"), r.failed) for r in results]


# -- fan-in ------------------------------------------------------------------------------------


def test_wait_children_returns_final_states_and_data_in_start_order(any_store: Store, clock: ManualClock) -> None:
    """The keys are started in an order that is neither alphabetical nor by id (``c-10``
    before ``c-2``); every record lands at the same instant of the manual clock, so only
    the start order itself can give the answer's order."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    keys = ["zeta", "alpha", "c-10", "c-2", "mid"]
    got: list[list[ChildResult]] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.snapshot.parent_id is not None:
            return child_running(job)
        for n, key in enumerate(keys):
            job.start_child(key, data={"n": n})
        got.append(job.wait_children(poll=POLL))
        return "exited", {"exit_code": len(got[-1])}

    engine.create("parent")
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=4, **QUICK) as worker:
        drive([worker], final(engine, "parent"))
    assert engine.get("parent").state == "completed"
    # once, or again if a loaded machine let the manual clock pass the parent's lease while
    # it finished (a replay): every run got the recorded answer
    results = got[-1]
    assert all(run == results for run in got)
    assert result_rows(results) == [(f"parent/{k}", "job", "completed", n, False) for n, k in enumerate(keys)]
    assert [r.data["n"] for r in results] == list(range(len(keys)))
    assert children_ids(any_store, "parent") == sorted(f"parent/{k}" for k in keys)
    assert all(any_store.get(f"parent/{k}").parent_id == "parent" for k in keys)
    assert engine.get("parent").data["exit_code"] == len(keys)


def test_a_replayed_parent_starts_no_child_twice(any_store: Store, clock: ManualClock) -> None:
    """The parent's handler runs again each time it is resumed (each poll, the wake at the
    end): every start_child returns the child recorded the first time; three children,
    three ledger rows, one ``start`` each."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)
    runs: list[list[str]] = []
    got: list[list[ChildResult]] = []

    def parent(job: Job) -> str:
        runs.append([job.start_child(k, data={"n": n}, lifecycle=ChildTask).id for n, k in enumerate("bca")])
        got.append(job.wait_children(poll=POLL))
        return "exited"

    jobs.create("p")
    with (
        Worker(jobs, {"running": parent, "finalizing": complete}, **QUICK) as parents,
        Worker(tasks, {"running": child_running, "finalizing": complete}, **QUICK) as kids,
    ):
        _turn(parents)  # starts the children, parks
        snap = jobs.get("p")
        assert (snap.state, snap.lease_owner, snap.run_after) == ("running", None, clock.now() + POLL)
        for _ in range(2):  # two polls: the handler runs again, the children still queued
            clock.advance(POLL)
            _turn(parents)
            assert jobs.get("p").lease_owner is None and got == []
        assert all_ids(any_store, "childtask") == ["p/a", "p/b", "p/c"]
        assert [s.state for s in tasks.entities()] == ["queued"] * 3
        _turn(kids)  # the children end; the last one's end wakes the parent
        _turn(parents)
    assert len(runs) == 4 and all(r == ["p/b", "p/c", "p/a"] for r in runs), runs
    (results,) = got
    assert sorted(r.id for r in results) == ["p/a", "p/b", "p/c"]  # (their order: the first test's)
    assert all_ids(any_store, "childtask") == ["p/a", "p/b", "p/c"]
    assert all_ids(any_store, "job") == ["p"]
    assert child_rows(any_store, "p") == [f"{CHILD_KEY_PREFIX}{k}" for k in "abc"]
    for child in ("p/a", "p/b", "p/c"):
        assert [h.event for h in any_store.history(child)] == ["start", "exited", "complete"]
    assert jobs.get("p").state == "completed"


def test_a_child_created_before_its_ledger_row_is_adopted_and_a_strangers_id_is_refused(
    any_store: Store, clock: ManualClock
) -> None:
    """A worker that died between the create and the ledger row left the child without a
    record: the next run finds it (its parent is this one) and records it instead of
    failing; an entity with the child's id and another parent (or none) is EntityExists."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("p")
    engine.create("p/landed", parent="p", data={"n": 7})
    engine.create("stranger")
    engine.create("p/theirs", parent="stranger")
    engine.create("p/orphan")
    seen: dict[str, Any] = {}

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.id != "p":
            return child_running(job)
        adopted = job.start_child("landed", data={"n": 1})
        seen.setdefault("adopted", (adopted.id, adopted.data.get("n"), adopted.parent_id))
        for key in ("theirs", "orphan"):
            try:
                job.start_child(key)
            except EntityExists as err:
                seen.setdefault(key, err.entity_id)
        seen["results"] = [(r.id, r.data.get("exit_code")) for r in job.wait_children(poll=POLL)]
        return "exited"

    with Worker(engine, {"running": running, "finalizing": complete}, **QUICK) as worker:
        drive([worker], final(engine, "p"))
    assert seen == {
        "adopted": ("p/landed", 7, "p"),  # the child as it landed: not created again
        "theirs": "p/theirs",
        "orphan": "p/orphan",
        "results": [("p/landed", 7)],
    }
    assert child_rows(any_store, "p") == [f"{CHILD_KEY_PREFIX}landed"]
    assert children_ids(any_store, "p") == ["p/landed"]
    assert any_store.get("p/theirs").parent_id == "stranger" and any_store.get("p/orphan").parent_id is None
    assert all_ids(any_store, "job") == ["p", "p/landed", "p/orphan", "p/theirs", "stranger"]
    assert [h.event for h in any_store.history("p/landed")] == ["start", "exited", "complete"]  # created once
    assert engine.get("p").state == "completed"


def test_an_id_held_by_an_entity_of_another_kind_is_entity_exists(any_store: Store, clock: ManualClock) -> None:
    """The child's id is taken by an entity of another lifecycle (another parent's, or even
    this parent's started with another ``lifecycle=``): it cannot be adopted as the child
    asked for, and the answer is the documented EntityExists, recording nothing."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)
    engine.create("p")
    tasks.create("p/alien", parent="stranger")
    tasks.create("p/mine", parent="p")
    seen: dict[str, str] = {}

    def running(job: Job) -> str:
        for key in ("alien", "mine"):
            try:
                job.start_child(key)
                seen[key] = "accepted"
            except Exception as err:
                seen[key] = f"{type(err).__name__}: {err}"[:100]
        return "exited"

    with Worker(engine, {"running": running}, **QUICK) as worker:
        _turn(worker)
    assert {k: v.split(":")[0] for k, v in seen.items()} == {"alien": "EntityExists", "mine": "EntityExists"}, seen
    assert child_rows(any_store, "p") == []
    assert [(s.id, s.kind) for s in any_store.children("p")] == [("p/mine", "childtask")]
    assert engine.get("p").state == "finalizing"  # its handler went on (this worker has no finalizing handler)


def test_a_waiting_parent_holds_no_lease_and_no_slot(any_store: Store, clock: ManualClock) -> None:
    """One slot: the children run in it while the parent waits, parked."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    parent_seen_by_children: list[tuple[str, str | None, bool]] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.snapshot.parent_id is not None:
            p = engine.get("p")
            parked = p.run_after is not None and p.run_after > clock.now()
            parent_seen_by_children.append((p.state, p.lease_owner, parked))
            return child_running(job)
        for n in range(3):
            job.start_child(f"k{n}", data={"n": n})
        job.wait_children(poll=POLL)
        return "exited"

    engine.create("p")
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=1, **QUICK) as worker:
        _once(worker)  # the parent: starts its children and parks
        snap = engine.get("p")
        assert (snap.state, snap.lease_owner, snap.lease) == ("running", None, None)
        assert snap.run_after == clock.now() + POLL
        assert worker.running == 0 and worker.stats.parked == 1
        drive([worker], final(engine, "p"))
    assert len(parent_seen_by_children) == 3
    # each child ran in the only slot while the parent waited; before the last child's end
    # woke it the parent was due later (a child's end sets it due now: the next ones see that)
    assert all(state == "running" and owner is None for state, owner, _ in parent_seen_by_children)
    assert parent_seen_by_children[0][2] is True
    assert engine.get("p").state == "completed"


def test_long_parent_ids_and_odd_keys_give_distinct_stable_child_ids(any_store: Store, clock: ManualClock) -> None:
    """``{parent}/{key}`` longer than an id may be: a prefix and a digest of the whole, the
    same at every replay; keys with ``:``, ``/``, non-ASCII and 160 characters."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    parent_id = "P" * 250
    keys = ["k:1", "k/2", "ключ🎉", "x" * 160, "x" * 159 + "y"]
    runs: list[list[str]] = []
    got: list[list[ChildResult]] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.id != parent_id:
            # the children end only once their parent has parked, so that it waits, and
            # its replay (whose child ids must be the same) always happens
            for _ in range(3000):  # 30 s at most: then the assertions below say what went wrong
                parent = engine.get(parent_id)
                if parent.state == "running" and parent.lease_owner is None:
                    break
                threading.Event().wait(0.01)
            return child_running(job)
        runs.append([job.start_child(k, data={"n": n}).id for n, k in enumerate(keys)])
        got.append(job.wait_children(poll=POLL))
        return "exited"

    engine.create(parent_id)
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=3, **QUICK) as worker:
        drive([worker], final(engine, parent_id))
    assert engine.get(parent_id).state == "completed"
    first = runs[0]
    assert len(runs) >= 2 and all(r == first for r in runs)
    assert len(set(first)) == len(keys) and all(len(i) <= 255 for i in first)
    assert all(i.startswith(parent_id[:200]) for i in first)
    assert sorted(children_ids(any_store, parent_id)) == sorted(first)
    assert sorted(all_ids(any_store, "job")) == sorted([parent_id, *first])
    results = got[-1]  # once, or again after a replay: always the recorded answer
    assert all(run == results for run in got)
    assert sorted((r.id, r.state, r.data["exit_code"]) for r in results) == sorted(
        (i, "completed", n) for n, i in enumerate(first)
    )


def test_a_wait_without_children_returns_at_once(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    got: list[list[ChildResult]] = []

    def running(job: Job) -> str:
        got.append(job.wait_children())
        got.append(job.wait_children(on_failure="wait"))
        return "exited"

    engine.create("p")
    with Worker(engine, {"running": running}, **QUICK) as worker:
        _once(worker)
    assert got == [[], []] and worker.stats.parked == 0
    assert engine.get("p").state == "finalizing"


# -- failures --------------------------------------------------------------------------------


def test_a_failed_child_fails_the_parent_at_once_without_retries(any_store: Store, clock: ManualClock) -> None:
    """``on_failure="fail"``: the parent fails (reason ``error``, the error a ChildFailed
    naming the child) while another child is still queued; no ``retry`` on the parent."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    reached: list[str] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.snapshot.parent_id is not None:
            return child_running(job)
        job.start_child("slow", lifecycle=ChildTask)  # nobody runs ChildTask here: stays queued
        job.start_child("bad", data={"fail": True})
        job.wait_children(poll=POLL)
        reached.append("after the wait")
        return "exited"

    jobs.create("p")
    with Worker(jobs, {"running": running, "finalizing": complete}, **QUICK) as worker:
        drive([worker], final(jobs, "p"))
    assert reached == []
    snap = jobs.get("p")
    assert snap.state == "failed"
    history = jobs.history("p")
    assert [h.event for h in history] == ["start", "fail"], history
    assert "retry" not in [h.event for h in history]
    last = history[-1]
    assert last.reason == "error" and last.error is not None
    assert last.error["type"] == "ChildFailed" and last.error["attempt"] == 1
    assert "p/bad" in last.error["message"] and "'failed'" in last.error["message"]
    assert any_store.get("p/slow").state == "queued"  # not waited for
    assert any_store.get("p/bad").state == "failed"
    failed = RetryPolicy()  # the default policy retries any Exception, but not this one
    error = ChildFailed("p", child=ChildResult("p/bad", "job", "failed", {}, True))
    assert failed.retries(error) is False and failed.retries(RuntimeError("x")) is True


def test_on_failure_wait_waits_for_every_child_and_marks_the_failed_one(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    got: list[list[ChildResult]] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.snapshot.parent_id is not None:
            return child_running(job)
        job.start_child("a", data={"n": 1})
        job.start_child("b", data={"fail": True})
        job.start_child("c", data={"n": 3})
        got.append(job.wait_children(on_failure="wait", poll=POLL))
        return "exited"

    engine.create("p")
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=2, **QUICK) as worker:
        drive([worker], final(engine, "p"))
    assert engine.get("p").state == "completed"
    assert [h.event for h in engine.history("p")] == ["start", "exited", "complete"]
    (results,) = got
    assert result_rows(results) == [
        ("p/a", "job", "completed", 1, False),
        ("p/b", "job", "failed", None, True),
        ("p/c", "job", "completed", 3, False),
    ]


def test_failed_names_the_states_that_count_as_failures(any_store: Store, clock: ManualClock) -> None:
    """``failed=("completed",)``: a completed child is the failure; ``failed=[]``: none is."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    got: dict[str, Any] = {}

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.snapshot.parent_id is not None:
            return child_running(job)
        job.start_child("a-ok")  # start order = key order: the order is another test's business
        job.start_child("b-bad", data={"fail": True})
        got["none"] = [r.failed for r in job.wait_children(failed=[], poll=POLL)]
        got["completed"] = [r.failed for r in job.wait_children(on_failure="wait", failed=("completed",))]
        try:
            job.wait_children(failed={"completed"})
        except ChildFailed as err:
            got["raised"] = (err.child.id, err.child.state)
        return "exited"

    engine.create("p")
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=2, **QUICK) as worker:
        drive([worker], final(engine, "p"))
    assert got == {"none": [False, False], "completed": [True, False], "raised": ("p/a-ok", "completed")}
    assert FAILED_STATES == ("failed",)


def test_a_child_whose_handler_error_fails_it_wakes_the_parent(any_store: Store, clock: ManualClock) -> None:
    """The worker's error path (the handler raised, the attempts spent: ``fail``, reason
    ``error``) wakes the parked parent too: it is due at once, not at its poll."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    brittle = Engine(BrittleTask, any_store, clock=clock)
    got: list[list[ChildResult]] = []

    def parent(job: Job) -> str:
        job.start_child("boom", lifecycle=BrittleTask)
        got.append(job.wait_children(on_failure="wait", poll=POLL))
        return "exited"

    def explode(job: Job) -> str:
        raise RuntimeError("child handler broke")

    jobs.create("p")
    with (
        Worker(jobs, {"running": parent}, **QUICK) as parents,
        Worker(brittle, {"running": explode}, **QUICK) as kids,
    ):
        _turn(parents)
        assert jobs.get("p").run_after == clock.now() + POLL
        _turn(kids)
        child = brittle.get("p/boom")
        assert (child.state, brittle.history("p/boom")[-1].reason) == ("failed", "error")
        assert jobs.get("p").run_after == clock.now()  # woken by the child's worker
        _turn(parents)
    assert [(r.id, r.state, r.failed) for r in got[0]] == [("p/boom", "failed", True)]
    assert jobs.get("p").state == "finalizing"


def test_a_second_wait_returns_every_child_started_so_far(any_store: Store, clock: ManualClock) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    got: list[list[str]] = []

    def running(job: Job) -> str | tuple[str, dict[str, Any]]:
        if job.id != "p":
            return child_running(job)
        job.start_child("a")
        first = [r.id for r in job.wait_children(poll=POLL)]
        job.start_child("b")
        second = [r.id for r in job.wait_children(poll=POLL)]
        got.append([*first, "|", *second])
        return "exited"

    engine.create("p")
    with Worker(engine, {"running": running, "finalizing": complete}, concurrency=2, **QUICK) as worker:
        drive([worker], final(engine, "p"))
    assert got == [["p/a", "|", "p/a", "p/b"]]
    assert children_ids(any_store, "p") == ["p/a", "p/b"] and len(child_rows(any_store, "p")) == 2


def test_a_child_failed_by_an_operator_is_seen_at_the_next_poll(any_store: Store, clock: ManualClock) -> None:
    """No worker ends the child, so no one wakes the parent: its poll does."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)

    def running(job: Job) -> str:
        job.start_child("x", lifecycle=ChildTask)
        job.wait_children(poll=POLL)
        return "exited"

    jobs.create("p")
    with Worker(jobs, {"running": running, "finalizing": complete}, **QUICK) as worker:
        _turn(worker)
        parked_until = jobs.get("p").run_after
        assert parked_until == clock.now() + POLL
        cancelled = tasks.cancel("p/x")
        assert cancelled.result.state == "failed"
        assert jobs.get("p").run_after == parked_until  # no wake
        clock.advance(POLL - timedelta(seconds=1))
        _turn(worker)
        assert jobs.get("p").state == "running" and jobs.get("p").lease_owner is None
        clock.advance(timedelta(seconds=1))
        _turn(worker)
    snap = jobs.get("p")
    assert snap.state == "failed"
    last = jobs.history("p")[-1]
    assert (last.event, last.reason) == ("fail", "error")
    assert last.error is not None and last.error["type"] == "ChildFailed" and "p/x" in last.error["message"]


def test_a_deleted_child_counts_as_failed(any_store: Store, clock: ManualClock) -> None:
    """A child deleted while its parent waits will never end: the next poll reports it
    ``deleted`` and failed (with ``on_failure="wait"``, alongside the others)."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    got: list[list[ChildResult]] = []

    def running(job: Job) -> str:
        job.start_child("gone", lifecycle=ChildTask)  # nobody runs ChildTask here
        got.append(job.wait_children(on_failure="wait", poll=POLL))
        return "exited"

    jobs.create("p")
    with Worker(jobs, {"running": running}, **QUICK) as worker:
        _turn(worker)
        any_store.soft_delete("p/gone")
        clock.advance(POLL)
        _turn(worker)
    assert got, [(h.event, h.error and h.error["message"]) for h in jobs.history("p")]  # the wait returned
    assert [(r.id, r.kind, r.state, r.failed) for r in got[0]] == [("p/gone", "childtask", "deleted", True)]
    assert jobs.get("p").state == "finalizing"


# -- cancel ------------------------------------------------------------------------------------


def _claim(engine: Engine, entity_id: str) -> Snapshot:
    """Claim the one due entity of the engine's lifecycle (it must be ``entity_id``)."""
    (snap,) = engine.claim(1)
    assert snap.id == entity_id, snap
    return snap


def test_cancel_cascades_to_live_children_and_grandchildren_and_leaves_a_finalizer(
    any_store: Store, clock: ManualClock
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)
    jobs.create("root")
    _claim(jobs, "root")
    jobs.create("root/r", parent="root")
    _claim(jobs, "root/r")  # running, held
    jobs.create("root/f", parent="root")
    held = _claim(jobs, "root/f")
    assert held.lease is not None
    jobs.fire(held, "exited", lease=held.lease)  # a live finalizer
    jobs.create("root/done", parent="root")
    done = _claim(jobs, "root/done")
    assert done.lease is not None
    fired = jobs.fire(done, "exited", lease=done.lease)
    jobs.fire(fired.snapshot, "complete", lease=done.lease)
    jobs.create("root/q", parent="root")
    jobs.create("root/r/g", parent="root/r")  # a grandchild under a running child
    jobs.create("root/f/g", parent="root/f")  # and one under the finalizer
    tasks.create("root/t", parent="root")  # another lifecycle
    jobs.create("elsewhere", parent="other")

    cancelled = jobs.cancel("root")
    assert cancelled.result.state == "failed" and cancelled.result.snapshot.id == "root"
    assert sorted(cancelled.children) == ["root/f/g", "root/q", "root/r", "root/r/g", "root/t"]
    assert [i for i, _ in cancelled.left] == ["root/f"]
    assert "cancel" in cancelled.left[0][1]
    states = {i: any_store.get(i).state for i in all_ids(any_store, "job", "childtask")}
    assert states == {
        "root": "failed",
        "root/done": "completed",
        "root/f": "finalizing",
        "root/f/g": "failed",
        "root/q": "failed",
        "root/r": "failed",
        "root/r/g": "failed",
        "root/t": "failed",
        "elsewhere": "queued",
    }
    assert any_store.get("root/f").lease_owner is not None  # the finalizer keeps its holder
    assert [h.event for h in any_store.history("root/done")] == ["start", "exited", "complete"]
    reasons = {i: any_store.history(i)[-1].reason for i in cancelled.children}
    assert reasons == {
        "root/f/g": "parent root/f cancelled",
        "root/q": "parent root cancelled",
        "root/r": "parent root cancelled",
        "root/r/g": "parent root/r cancelled",
        "root/t": "parent root cancelled",
    }


def test_cancel_without_children_cancels_only_the_parent(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("solo")
    jobs.create("solo/a", parent="solo")
    cancelled = jobs.cancel("solo", children=False, reason="cancelled")
    assert (cancelled.result.state, cancelled.children, cancelled.left) == ("failed", (), ())
    assert jobs.get("solo/a").state == "queued"
    # a second cancel of the final parent is refused and cascades nowhere
    before = frozen(jobs, "solo/a")
    with pytest.raises(Exception, match="cancel"):
        jobs.cancel("solo")
    assert frozen(jobs, "solo/a") == before


def test_cancel_leaves_a_child_whose_lifecycle_it_cannot_choose(any_store: Store, clock: ManualClock) -> None:
    """Two imported lifecycles claim the child's kind: the cascade leaves it (and says so)
    unless ``lifecycles=`` names one."""
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    twins = Engine(TwinA, any_store, clock=clock)
    for root in ("r1", "r2"):
        jobs.create(root)
        twins.create(f"{root}/twin", parent=root)
    first = jobs.cancel("r1")
    assert first.children == () and [i for i, _ in first.left] == ["r1/twin"]
    assert "lifecycles=" in first.left[0][1]
    assert twins.get("r1/twin").state == "queued"
    second = jobs.cancel("r2", lifecycles=[TwinB])
    assert second.children == ("r2/twin",) and second.left == ()
    assert twins.get("r2/twin").state == "failed"


def test_a_child_of_another_lifecycle_is_started_waited_for_and_cancelled(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)
    got: list[list[ChildResult]] = []
    made: list[Snapshot] = []

    def parent(job: Job) -> str:
        made.append(job.start_child("by-class", data={"n": 1}, lifecycle=ChildTask))
        made.append(job.start_child("by-engine", data={"n": 2}, lifecycle=tasks))
        made.append(job.start_child("same", data={"n": 3}))
        got.append(job.wait_children(poll=POLL))
        return "exited"

    def child(job: Job) -> str | tuple[str, dict[str, Any]]:
        return child_running(job)

    def either(job: Job) -> str | tuple[str, dict[str, Any]]:
        return child(job) if job.snapshot.parent_id else parent(job)

    jobs.create("p")
    with (
        Worker(jobs, {"running": either, "finalizing": complete}, **QUICK) as w1,
        Worker(tasks, {"running": child, "finalizing": complete}, **QUICK) as w2,
    ):
        drive([w1, w2], final(jobs, "p"))
    assert [(s.id, s.kind) for s in made[:3]] == [
        ("p/by-class", "childtask"),
        ("p/by-engine", "childtask"),
        ("p/same", "job"),
    ]
    (results,) = got
    assert result_rows(results) == [
        ("p/by-class", "childtask", "completed", 1, False),
        ("p/by-engine", "childtask", "completed", 2, False),
        ("p/same", "job", "completed", 3, False),
    ]
    assert jobs.get("p").state == "completed"

    # the cascade cancels a live child of the other lifecycle by that lifecycle's cancel
    jobs.create("q")
    tasks.create("q/task", parent="q")
    jobs.create("q/job", parent="q")
    cancelled = jobs.cancel("q")
    assert sorted(cancelled.children) == ["q/job", "q/task"] and cancelled.left == ()
    assert tasks.get("q/task").state == "failed" and jobs.get("q/job").state == "failed"
    jobs.create("r")
    tasks.create("r/task", parent="r")
    assert jobs.cancel("r", lifecycles=[ChildTask]).children == ("r/task",)


# -- Store.children ------------------------------------------------------------------------------


def test_store_children_pages_by_id_over_every_kind_and_skips_the_deleted(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    tasks = Engine(ChildTask, any_store, clock=clock)
    jobs.create("p")
    for key in ("e", "a", "d"):
        jobs.create(f"p/{key}", parent="p")
    tasks.create("p/b", parent="p")
    jobs.create("p/c", parent="p")
    any_store.soft_delete("p/c")
    jobs.create("p/x", parent="other")
    jobs.create("p/a/deep", parent="p/a")
    assert children_ids(any_store, "p") == ["p/a", "p/b", "p/d", "p/e"]
    assert [s.id for s in any_store.children("p", limit=2)] == ["p/a", "p/b"]
    assert [s.id for s in any_store.children("p", limit=2, after_id="p/b")] == ["p/d", "p/e"]
    assert any_store.children("p", after_id="p/e") == []
    assert any_store.children("nobody") == []
    assert [s.id for s in any_store.children("p/a")] == ["p/a/deep"]
    assert any_store.children("p", limit=1)[0] == any_store.get("p/a")


# -- hostile inputs -------------------------------------------------------------------------------


class Other:
    pass


def test_start_child_and_wait_children_refuse_bad_arguments_and_start_nothing(
    any_store: Store, clock: ManualClock
) -> None:
    engine = Engine(JobLifecycle, any_store, clock=clock)
    elsewhere = Engine(JobLifecycle, MemoryStore(clock=clock), clock=clock)
    engine.create("p")
    outcomes: dict[str, str] = {}

    def attempt(label: str, call: Callable[[], object]) -> None:
        try:
            call()
            outcomes[label] = "accepted"
        except (InvalidArgument, InvalidData) as err:
            outcomes[label] = "InvalidArgument" if isinstance(err, InvalidArgument) else "InvalidData"
        except Exception as err:  # anything else is a wrong answer, named in the diff below
            outcomes[label] = f"{type(err).__name__}: {err}"[:120]

    def running(job: Job) -> str:
        calls: dict[str, Callable[[], object]] = {
            "key empty": lambda: job.start_child(""),
            "key NUL": lambda: job.start_child("a\x00b"),
            "key surrogate": lambda: job.start_child("\ud800"),
            "key 200 chars": lambda: job.start_child("k" * 200),
            "key 161 chars": lambda: job.start_child("k" * 161),
            "key int": lambda: job.start_child(5),  # type: ignore[arg-type]
            "key None": lambda: job.start_child(None),  # type: ignore[arg-type]
            "key bytes": lambda: job.start_child(b"key"),  # type: ignore[arg-type]
            "lifecycle int": lambda: job.start_child("l1", lifecycle=int),
            "lifecycle str": lambda: job.start_child("l2", lifecycle="job"),
            "lifecycle object": lambda: job.start_child("l3", lifecycle=Other()),
            "lifecycle class": lambda: job.start_child("l4", lifecycle=Other),
            "lifecycle other store": lambda: job.start_child("l5", lifecycle=elsewhere),
            "priority str": lambda: job.start_child("p1", priority="1"),  # type: ignore[arg-type]
            "priority 1000": lambda: job.start_child("p2", priority=1000),
            "priority bool": lambda: job.start_child("p3", priority=True),
            "concurrency_key NUL": lambda: job.start_child("c1", concurrency_key="\x00"),
            "concurrency_key int": lambda: job.start_child("c2", concurrency_key=5),  # type: ignore[arg-type]
            "data NUL": lambda: job.start_child("d1", data={"x": "\x00"}),
            "data nan": lambda: job.start_child("d2", data={"x": math.nan}),
            "data bad model": lambda: job.start_child("d3", data={"exit_code": "not an int"}),
            "on_failure x": lambda: job.wait_children(on_failure="x"),
            "on_failure None": lambda: job.wait_children(on_failure=None),  # type: ignore[arg-type]
            "failed str": lambda: job.wait_children(failed="failed"),
            "failed int": lambda: job.wait_children(failed=5),  # type: ignore[arg-type]
            "failed NUL": lambda: job.wait_children(failed=("\x00",)),
            "failed None": lambda: job.wait_children(failed=None),  # type: ignore[arg-type]
            "poll -1": lambda: job.wait_children(poll=-1),
            "poll nan": lambda: job.wait_children(poll=math.nan),
            "poll inf": lambda: job.wait_children(poll=math.inf),
            "poll str": lambda: job.wait_children(poll="1"),  # type: ignore[arg-type]
            "poll bool": lambda: job.wait_children(poll=True),
            "poll negative timedelta": lambda: job.wait_children(poll=timedelta(seconds=-1)),
            "poll 1000 years": lambda: job.wait_children(poll=timedelta(days=365_000)),
        }
        for label, call in calls.items():
            attempt(label, call)
        return "exited"

    with Worker(engine, {"running": running}, **QUICK) as worker:
        _turn(worker)
    expected = dict.fromkeys(outcomes, "InvalidArgument")
    for label in ("data bad model", "data NUL", "data nan"):  # the data model's refusal, as create's
        expected[label] = "InvalidData"
    assert outcomes == expected
    assert len(outcomes) == 34
    assert engine.get("p").state == "finalizing"  # the handler went on: nothing parked it
    assert any_store.children("p") == [] and all_ids(any_store, "job") == ["p"]
    assert [e.key for e in any_store.effects("p") if e.key.startswith("fsm:step:")] == []


def test_start_child_refuses_data_that_is_not_a_mapping(any_store: Store, clock: ManualClock) -> None:
    """``data=["ab"]`` is no mapping: refused like ``Engine.create(data=["ab"])``, never read
    as the pairs of a ``dict()`` call (``{"a": "b"}``, a child created with it), nor a
    ``ValueError``/``TypeError`` out of ``dict()`` for ``"ab"`` or ``5``."""
    engine = Engine(JobLifecycle, any_store, clock=clock)
    engine.create("p")
    for data in (["ab"], "ab", 5):
        with pytest.raises(InvalidArgument):
            engine.create("direct", data=data)  # type: ignore[arg-type]
    outcomes: dict[str, str] = {}

    def running(job: Job) -> str:
        if job.id != "p":  # a child started by mistake: no children of its own
            return "exited"
        for label, data in (("str pair", ["ab"]), ("str", "ab"), ("int", 5), ("list of pairs", [("a", 1)])):
            try:
                job.start_child(label.replace(" ", "-"), data=data)  # type: ignore[arg-type]
                outcomes[label] = "accepted"
            except InvalidArgument:
                outcomes[label] = "InvalidArgument"
            except Exception as err:
                outcomes[label] = type(err).__name__
        return "exited"

    with Worker(engine, {"running": running}, **QUICK) as worker:
        _turn(worker)
    assert outcomes == dict.fromkeys(outcomes, "InvalidArgument"), outcomes
    assert any_store.children("p") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lifecycles": [int]},
        {"lifecycles": "job"},
        {"lifecycles": 5},
        {"lifecycles": [JobLifecycle, "childtask"]},
        {"lifecycles": [Other]},
        {"children": "yes"},
        {"children": None},
        {"children": 1},
        {"reason": 5},
        {"reason": "a\x00b"},
    ],
    ids=lambda kw: repr(kw)[:40],
)
def test_cancel_refuses_bad_arguments_and_changes_nothing(
    any_store: Store, clock: ManualClock, kwargs: dict[str, Any]
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("p")
    jobs.create("p/a", parent="p")
    before = (frozen(jobs, "p"), frozen(jobs, "p/a"))
    with pytest.raises(InvalidArgument):
        jobs.cancel("p", **kwargs)
    assert (frozen(jobs, "p"), frozen(jobs, "p/a")) == before


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("",), {}),
        (("a\x00b",), {}),
        (("\ud800",), {}),
        (("x" * 10_000,), {}),
        ((5,), {}),
        ((None,), {}),
        (("p",), {"limit": 0}),
        (("p",), {"limit": -1}),
        (("p",), {"limit": 10**9}),
        (("p",), {"limit": True}),
        (("p",), {"limit": "1"}),
        (("p",), {"limit": 1.5}),
        (("p",), {"after_id": "\x00"}),
        (("p",), {"after_id": 5}),
        (("p",), {"after_id": ""}),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_store_children_refuses_hostile_arguments(
    any_store: Store, clock: ManualClock, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("p")
    jobs.create("p/a", parent="p")
    before = (frozen(jobs, "p"), frozen(jobs, "p/a"))
    with pytest.raises(InvalidArgument):
        any_store.children(*args, **kwargs)
    assert (frozen(jobs, "p"), frozen(jobs, "p/a")) == before
    assert [s.id for s in any_store.children("p")] == ["p/a"]


# -- the asyncio face ------------------------------------------------------------------------------


def _async_store(name: str, tmp_path: Any) -> Any:
    from stores.aio import AsyncMemoryStore, AsyncSqlStore

    return AsyncMemoryStore() if name == "memory" else AsyncSqlStore(f"sqlite:///{tmp_path}/fsm.db")


async def _until(predicate: Callable[[], Any], what: str) -> None:
    for _ in range(3000):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.parametrize("name", ["memory", "sqlite"])
def test_an_async_parent_starts_and_waits_for_its_children(name: str, tmp_path: Any) -> None:
    """``await job.start_child`` and ``await job.wait_children`` on the asyncio worker (real
    time): the results in start order, each child started once, a failure with
    ``on_failure="fail"`` failing the parent, and ``await engine.cancel`` cascading."""

    async def scenario() -> None:
        store = _async_store(name, tmp_path)
        jobs = AsyncEngine(JobLifecycle, store)
        tasks = AsyncEngine(ChildTask, store)
        runs: list[list[str]] = []
        got: dict[str, list[tuple[str, str, Any, bool]]] = {}

        async def running(job: AsyncJob) -> str | tuple[str, dict[str, Any]]:
            if job.snapshot.parent_id is not None:
                if job.data.get("fail"):
                    return "fail"
                return "exited", {"exit_code": job.data.get("n", 0)}
            plan = job.data["plan"]
            runs.append([(await job.start_child(k, data=d)).id for k, d in plan])
            if job.id == "p-other":
                runs.append([(await job.start_child("t", lifecycle=ChildTask)).id])
            results = await job.wait_children(on_failure=job.data["on_failure"], poll=0.2)
            got[job.id] = [(r.id, r.state, r.data.get("exit_code"), r.failed) for r in results]
            return "exited"

        async def finalizing(job: AsyncJob) -> str:
            return "complete"

        await jobs.create(
            "p-ok", data={"plan": [["b", {"n": 2}], ["c", {"n": 3}], ["a", {"n": 1}]], "on_failure": "wait"}
        )
        await jobs.create("p-bad", data={"plan": [["x", {"fail": True}], ["y", {"n": 1}]], "on_failure": "fail"})
        worker = AsyncWorker(
            jobs,
            {"running": running, "finalizing": finalizing},
            concurrency=3,
            poll_interval=timedelta(milliseconds=20),
        )
        task = asyncio.create_task(worker.run())
        try:

            async def parents_final() -> bool:
                return all([(await jobs.get(i)).state in ("completed", "failed") for i in ("p-ok", "p-bad")])

            await _until(parents_final, "both parents final")
            # a parent waiting on a child of another lifecycle nobody runs: cancelled with it
            await jobs.create("p-other", data={"plan": [], "on_failure": "fail"})

            async def parked() -> bool:
                snap = await jobs.get("p-other")
                return snap.state == "running" and snap.lease_owner is None and bool(await store.children("p-other"))

            await _until(parked, "p-other parked")
            cancelled = await jobs.cancel("p-other")
            assert cancelled.children == ("p-other/t",) and cancelled.left == ()
            assert (await tasks.get("p-other/t")).state == "failed"
        finally:
            await worker.stop()
            await task
        assert got["p-ok"] == [
            ("p-ok/b", "completed", 2, False),
            ("p-ok/c", "completed", 3, False),
            ("p-ok/a", "completed", 1, False),
        ]
        assert (await jobs.get("p-ok")).state == "completed"
        assert "p-bad" not in got and (await jobs.get("p-bad")).state == "failed"
        bad = (await jobs.history("p-bad"))[-1]
        assert (bad.event, bad.reason) == ("fail", "error") and bad.error is not None
        assert bad.error["type"] == "ChildFailed"
        assert all(r == ["p-ok/b", "p-ok/c", "p-ok/a"] for r in runs if r and r[0].startswith("p-ok"))
        ids = sorted(s.id for s in await jobs.entities(limit=100))
        assert ids == ["p-bad", "p-bad/x", "p-bad/y", "p-ok", "p-ok/a", "p-ok/b", "p-ok/c", "p-other"]
        await store.close()

    asyncio.run(scenario())


def test_an_async_child_engine_on_the_same_store_is_accepted(tmp_path: Any) -> None:
    """``lifecycle=`` an :class:`AsyncEngine` of the parent's own async store: its sync twin
    is on that store, so the child is created (the children index is per store)."""

    async def scenario() -> None:
        from stores.aio import AsyncMemoryStore

        store = AsyncMemoryStore()
        jobs = AsyncEngine(JobLifecycle, store)
        tasks = AsyncEngine(ChildTask, store)
        seen: list[str] = []

        async def running(job: AsyncJob) -> str:
            try:
                seen.append((await job.start_child("t", lifecycle=tasks)).kind)
            except InvalidArgument as err:
                seen.append(f"InvalidArgument: {err}")
            return "exited"

        await jobs.create("p")
        worker = AsyncWorker(jobs, {"running": running}, poll_interval=timedelta(milliseconds=20))
        assert await worker.run_once() == 1
        await _until(lambda: _true_when(lambda: bool(seen)), "the handler ran")
        await worker.stop()
        assert seen == ["childtask"]

    asyncio.run(scenario())


async def _true_when(check: Callable[[], bool]) -> bool:
    return check()


@pytest.mark.parametrize("data", [["ab"], "ab", 5])
def test_an_async_start_child_refuses_data_that_is_not_a_mapping(data: Any) -> None:
    """The asyncio twin of :func:`test_start_child_refuses_data_that_is_not_a_mapping`."""

    async def scenario() -> None:
        from stores.aio import AsyncMemoryStore

        store = AsyncMemoryStore()
        jobs = AsyncEngine(JobLifecycle, store)
        seen: list[str] = []

        async def running(job: AsyncJob) -> str:
            if job.id != "p":
                return "exited"
            try:
                await job.start_child("d", data=data)
                seen.append("accepted")
            except Exception as err:
                seen.append(type(err).__name__)
            return "exited"

        await jobs.create("p")
        worker = AsyncWorker(jobs, {"running": running}, poll_interval=timedelta(milliseconds=20))
        assert await worker.run_once() == 1
        await _until(lambda: _true_when(lambda: bool(seen)), "the handler ran")
        await worker.stop()
        assert seen == ["InvalidArgument"]
        assert await store.children("p") == []

    asyncio.run(scenario())
