"""The batch completer and ``Engine.fire_many``: outcomes share a transaction, each fenced
by its own version and token, each refusal told to its own handler, none acknowledged
before its commit."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

import signals
from fsm import Engine, Fire, FireResult, JobLifecycle, LeaseLost, ManualClock, StoreUnavailable
from fsm.records import Snapshot, TransitionWrite
from fsm.work import Worker
from fsm.work.completer import BatchCompleter
from stores import MemoryStore, Store

WAIT = 10.0


def eventually(predicate: Any, timeout: float = WAIT) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (checked every 10 ms)."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        pause.wait(0.01)
    return bool(predicate())


def running(jobs: Engine, n: int) -> list[Snapshot]:
    jobs.create_many([{} for _ in range(n)])
    claimed = jobs.claim(n)
    assert len(claimed) == n
    return claimed


def test_fire_many_answers_each_item_in_its_place(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="w1")
    a, b, c = running(jobs, 3)
    moved_on = jobs.fire(b, "exited", lease=b.lease).snapshot  # b's held snapshot is now stale
    other = c.lease._replace(owner="someone-else")  # type: ignore[union-attr]
    results = jobs.fire_many(
        [Fire(a, "exited", a.lease), Fire(moved_on, "complete", b.lease), Fire(c, "exited", other)]
    )
    assert isinstance(results[0], FireResult) and results[0].snapshot.state == "finalizing"
    assert isinstance(results[1], FireResult) and results[1].snapshot.state == "completed"
    assert isinstance(results[2], LeaseLost)
    assert jobs.get(c.id) == c  # the refused one is unchanged
    assert [h.event for h in jobs.history(a.id)] == ["start", "exited"]


def test_fire_many_rejudges_a_stale_held_snapshot_on_the_row(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="w1")
    (a,) = running(jobs, 1)
    jobs.fire(a, "exited", lease=a.lease)  # the caller's snapshot a is now one version behind
    (result,) = jobs.fire_many([Fire(a, "complete", a.lease)])
    assert isinstance(result, FireResult) and result.snapshot.state == "completed"


def test_a_fenced_item_sends_lease_lost(store: MemoryStore, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    (a,) = running(jobs, 1)
    lost: list[Any] = []
    with signals.lease_lost.connected_to(lambda sender, **kw: lost.append(kw)):
        (result,) = jobs.fire_many([Fire(a, "exited", a.lease._replace(token=99))])  # type: ignore[union-attr]
    assert isinstance(result, LeaseLost) and len(lost) == 1


class Gate(MemoryStore):
    """A memory store whose ``apply_many`` waits for the test, and counts its batches."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.open = threading.Event()
        self.open.set()
        self.batches: list[int] = []

    def apply_many(self, writes: Sequence[TransitionWrite]) -> Any:
        self.open.wait(WAIT)
        self.batches.append(len(writes))
        return super().apply_many(writes)


def test_outcomes_of_waiting_handlers_share_one_transaction(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    claimed = running(jobs, 3)
    completer = BatchCompleter(jobs, max_delay=timedelta(seconds=1), all_waiting=lambda n: n >= 3).start()
    results: dict[str, FireResult] = {}

    def handler(snap: Snapshot) -> None:
        results[snap.id] = completer.fire(snap, "exited", lease=snap.lease)

    threads = [threading.Thread(target=handler, args=(s,)) for s in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    completer.stop()
    assert store.batches == [3] and completer.batches == 1
    assert {r.snapshot.state for r in results.values()} == {"finalizing"}


def test_an_outcome_is_acknowledged_only_after_its_commit(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    (a,) = running(jobs, 1)
    completer = BatchCompleter(jobs, all_waiting=lambda n: True).start()
    store.open.clear()  # the write is held back
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (completer.fire(a, "exited", lease=a.lease), returned.set()))
    thread.start()
    assert not returned.wait(0.3)  # no answer while the write has not committed
    assert jobs.get(a.id).state == "running"
    store.open.set()
    assert returned.wait(WAIT)
    assert jobs.get(a.id).state == "finalizing"
    thread.join(WAIT)
    completer.stop()


def test_a_refusal_is_raised_in_its_own_handler_only(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    good, bad = running(jobs, 2)
    completer = BatchCompleter(jobs, max_delay=timedelta(seconds=1), all_waiting=lambda n: n >= 2).start()
    outcome: dict[str, object] = {}

    def handler(snap: Snapshot, lease: Any) -> None:
        try:
            outcome[snap.id] = completer.fire(snap, "exited", lease=lease).snapshot.state
        except LeaseLost as err:
            outcome[snap.id] = err

    threads = [
        threading.Thread(target=handler, args=(good, good.lease)),
        threading.Thread(target=handler, args=(bad, bad.lease._replace(token=7))),  # type: ignore[union-attr]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    completer.stop()
    assert outcome[good.id] == "finalizing" and isinstance(outcome[bad.id], LeaseLost)
    assert completer.batches == 1


def test_a_stopped_completer_fires_alone(store: MemoryStore) -> None:
    jobs = Engine(JobLifecycle, store, owner="w1")
    (a,) = running(jobs, 1)
    completer = BatchCompleter(jobs)
    completer.start()
    completer.stop()
    completer.stop()  # idempotent
    assert completer.fire(a, "exited", lease=a.lease).snapshot.state == "finalizing"
    assert completer.batches == 0


@pytest.mark.parametrize("bad", [{"max_batch": 0}, {"max_batch": True}, {"max_delay": timedelta(seconds=5)}])
def test_a_bad_setting_is_refused(store: MemoryStore, bad: dict[str, Any]) -> None:
    from fsm import ConfigError

    with pytest.raises(ConfigError):
        BatchCompleter(Engine(JobLifecycle, store), **bad)


def test_a_worker_writes_its_outcomes_through_the_completer(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    made = jobs.create_many([{} for _ in range(12)])
    done = threading.Semaphore(0)

    def finalizing(job: Any) -> str:
        return "complete"

    def run_agent(job: Any) -> str:
        return "exited"

    worker = Worker(jobs, {"running": run_agent, "finalizing": finalizing}, poll_interval=timedelta(milliseconds=20))
    signals.transitioned.connect(lambda sender, **kw: done.release(), weak=False)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        for _ in range(12 * 2):  # exited and complete (the claim's start is the store's)
            assert done.acquire(timeout=WAIT)
    finally:
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
        signals.transitioned.receivers.clear()
    assert all(jobs.get(s.id).state == "completed" for s in made)
    assert all([h.seq for h in jobs.history(s.id)] == [1, 2, 3] for s in made)
    assert worker.completer.outcomes == 24  # exited and complete of each, through the batches


# -- continuations: an outcome handed over, its handler's thread free at once ------------------


def test_fire_then_calls_back_after_the_commit_on_the_completers_thread(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    good, bad = running(jobs, 2)
    completer = BatchCompleter(jobs, all_waiting=lambda n: n >= 2).start()
    answers: dict[str, object] = {}
    seen_state: dict[str, str] = {}
    called = threading.Semaphore(0)

    def then(entity_id: str) -> Any:
        def answer(result: object) -> None:
            answers[entity_id] = result
            seen_state[entity_id] = jobs.get(entity_id).state  # the row as committed
            assert threading.current_thread().name.startswith("fsm-completer")
            called.release()

        return answer

    store.open.clear()  # the batch is held back: nobody hears before it commits
    assert completer.fire_then(good, "exited", lease=good.lease, data=None, then=then(good.id))
    stale = bad.lease._replace(token=7)  # type: ignore[union-attr]
    assert completer.fire_then(bad, "exited", lease=stale, data=None, then=then(bad.id))
    assert not called.acquire(timeout=0.3)
    assert answers == {}
    store.open.set()
    assert called.acquire(timeout=WAIT) and called.acquire(timeout=WAIT)
    completer.stop()
    result = answers[good.id]
    assert isinstance(result, FireResult) and result.snapshot.state == "finalizing"
    assert seen_state[good.id] == "finalizing"
    assert isinstance(answers[bad.id], LeaseLost)  # its own refusal, and only its own
    assert seen_state[bad.id] == "running"
    assert completer.batches == 1


def test_fire_then_queues_nothing_on_a_stopped_completer(store: MemoryStore) -> None:
    jobs = Engine(JobLifecycle, store, owner="w1")
    (a,) = running(jobs, 1)
    completer = BatchCompleter(jobs)
    assert not completer.fire_then(a, "exited", lease=a.lease, data=None, then=lambda result: None)
    completer.start()
    completer.stop()
    assert not completer.fire_then(a, "exited", lease=a.lease, data=None, then=lambda result: None)
    assert jobs.get(a.id).state == "running" and completer.outcomes == 0


def test_a_workers_next_handler_starts_only_after_its_outcome_committed(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    (made,) = jobs.create_many([{}])
    seen: list[tuple[str, int, int]] = []
    finalized = threading.Event()
    exited = threading.Event()

    def run_agent(job: Any) -> str:
        store.open.clear()  # the outcome's batch waits for the test
        exited.set()
        return "exited"

    def finalizing(job: Any) -> str:
        row = jobs.get(job.id)
        seen.append((row.state, row.version, job.snapshot.version))
        finalized.set()
        return "complete"

    worker = Worker(jobs, {"running": run_agent, "finalizing": finalizing}, poll_interval=timedelta(milliseconds=20))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert exited.wait(WAIT)
        assert not finalized.wait(0.3)  # `exited` has not committed: the finalizer must not run
        assert jobs.get(made.id).state == "running"
        assert worker.running == 1  # the job keeps its slot while its outcome is on its way
        store.open.set()
        assert finalized.wait(WAIT)
    finally:
        store.open.set()
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
    assert seen == [("finalizing", 2, 2)]  # it ran on the committed row, from the snapshot it holds
    assert jobs.get(made.id).state == "completed"
    assert worker.stats.finished == 1 and worker.running == 0


def test_an_outcome_whose_lease_was_taken_meanwhile_is_refused_and_told(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    thief = Engine(JobLifecycle, store, clock=clock, owner="w2")
    (made,) = jobs.create_many([{}])
    exited = threading.Event()

    def run_agent(job: Any) -> str:
        store.open.clear()
        exited.set()
        return "exited"

    finalizer_ran = threading.Event()
    worker = Worker(
        jobs,
        {"running": run_agent, "finalizing": lambda job: finalizer_ran.set()},
        poll_interval=timedelta(milliseconds=20),
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert exited.wait(WAIT)
        clock.advance(timedelta(minutes=10))  # the lease lapses; another holder takes it over
        taken = thief.acquire_lease(made.id)
        assert taken.owner == "w2"
        store.open.set()
        eventually(lambda: worker.stats.fenced)
    finally:
        store.open.set()
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
    assert worker.stats.fenced == 1 and not finalizer_ran.is_set()
    after = jobs.get(made.id)
    assert after.state == "running" and after.lease_owner == "w2"  # the late write changed nothing


# -- a last outcome gives its slot back at hand-over -----------------------------------------


def _run_worker(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return thread


def test_a_last_outcome_frees_its_slot_while_its_batch_commits(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    first, second = jobs.create_many([{}, {}])
    started: list[str] = []
    second_started = threading.Event()
    completing = threading.Event()

    def run_agent(job: Any) -> str:
        started.append(job.id)
        if len(started) == 2:
            second_started.set()
        return "exited"

    def finalizing(job: Any) -> str:
        if not completing.is_set():
            store.open.clear()  # the first job's `complete` waits for the test
            completing.set()
        return "complete"

    worker = Worker(
        jobs, {"running": run_agent, "finalizing": finalizing}, concurrency=1, poll_interval=timedelta(milliseconds=20)
    )
    thread = _run_worker(worker)
    try:
        assert completing.wait(WAIT)
        # one slot, and the first job's last outcome not committed: the next job runs anyway
        assert second_started.wait(WAIT)
        held = [s.id for s in (first, second) if jobs.get(s.id).state == "finalizing"]
        assert len(held) == 1  # the first one's `complete` is still on its way, its lease held
        assert jobs.get(held[0]).lease_owner == "w1"
        assert held[0] in worker._running.values()
        store.open.set()
        eventually(lambda: worker.stats.finished == 2)
    finally:
        store.open.set()
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
    assert [jobs.get(s.id).state for s in (first, second)] == ["completed", "completed"]
    assert worker.stats.finished == 2 and worker.running == 0 and not worker._running


def test_an_outcome_that_leads_to_a_handler_keeps_its_slot(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    jobs.create_many([{}, {}])
    started = threading.Semaphore(0)
    exited = threading.Event()

    def run_agent(job: Any) -> str:
        started.release()
        store.open.clear()  # `exited` (a finalizer follows it) waits for the test
        exited.set()
        return "exited"

    worker = Worker(
        jobs,
        {"running": run_agent, "finalizing": lambda job: "complete"},
        concurrency=1,
        poll_interval=timedelta(milliseconds=20),
    )
    thread = _run_worker(worker)
    try:
        assert exited.wait(WAIT) and started.acquire(timeout=WAIT)
        assert not started.acquire(timeout=0.3)  # the slot is the first job's until its finalizer ran
        assert worker.running == 1
        store.open.set()
    finally:
        store.open.set()
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)


def test_a_refused_last_outcome_leaves_the_slot_count_whole(clock: ManualClock) -> None:
    store = Gate(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    thief = Engine(JobLifecycle, store, clock=clock, owner="w2")
    (made,) = jobs.create_many([{}])
    completing = threading.Event()

    def finalizing(job: Any) -> str:
        store.open.clear()
        completing.set()
        return "complete"

    worker = Worker(
        jobs,
        {"running": lambda job: "exited", "finalizing": finalizing},
        concurrency=2,
        poll_interval=timedelta(milliseconds=20),
    )
    thread = _run_worker(worker)
    try:
        assert completing.wait(WAIT)
        eventually(lambda: worker.running == 0)  # given back at hand-over
        assert worker.running == 0 and made.id in worker._running.values()
        clock.advance(timedelta(minutes=10))  # the lease lapses; another holder takes it over
        assert thief.acquire_lease(made.id).owner == "w2"
        store.open.set()
        eventually(lambda: worker.stats.fenced)
    finally:
        store.open.set()
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
    assert worker.stats.fenced == 1 and worker.running == 0 and not worker._running
    after = jobs.get(made.id)
    assert after.state == "finalizing" and after.lease_owner == "w2"  # the late write changed nothing


def test_a_last_outcome_whose_batch_failed_takes_a_slot_again_for_its_retry(clock: ManualClock) -> None:
    class Failing(Gate):
        failures = 1

        def apply_many(self, writes: Sequence[TransitionWrite]) -> Any:
            if self.failures and writes[0].target == "completed":
                self.failures -= 1
                raise StoreUnavailable("the store went away mid-batch")
            return super().apply_many(writes)

    store = Failing(clock)
    jobs = Engine(JobLifecycle, store, clock=clock, owner="w1")
    (made,) = jobs.create_many([{}])
    worker = Worker(
        jobs,
        {"running": lambda job: "exited", "finalizing": lambda job: "complete"},
        concurrency=1,
        poll_interval=timedelta(milliseconds=20),
    )
    thread = _run_worker(worker)
    try:
        eventually(lambda: worker.stats.retried)
    finally:
        worker.stop(grace=timedelta(seconds=5))
        thread.join(WAIT)
    assert worker.stats.retried == 1 and worker.running == 0 and not worker._running
    retried = jobs.history(made.id)[-1]
    assert (retried.event, retried.source, retried.target) == ("retry", "finalizing", "finalizing")
