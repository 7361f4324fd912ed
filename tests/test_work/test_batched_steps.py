"""A handler's durable steps go through the worker's completer: the ledger's asks of many
handlers share a statement, each still answered under its own lease.

Under a running worker, ``job.run``'s read before the effect (holder and record) and its
record after are queued in the completer's next batch with other handlers' asks and
outcomes (``holders_and_effects`` and ``record_effects``: one statement each on
PostgreSQL) instead of taking a handler connection each.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from test_completer import eventually

from fsm import Engine, JobLifecycle, LeaseLost
from fsm.records import EFFECT_SUCCEEDED
from fsm.work import Worker
from fsm.work.completer import BatchCompleter
from stores import MemoryStore, Store

JOBS = 24


STEPS = 3


def test_steps_of_many_handlers_share_batches_and_each_is_recorded_once(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def effect(key: str) -> dict[str, str]:
        with lock:
            calls[key] = calls.get(key, 0) + 1
        return {"done": key}

    def running(job: Any) -> str:
        first = job.run("step-0", effect)
        for i in range(1, STEPS):
            job.run(f"step-{i}", effect)
        assert first == {"done": f"{job.id}:step-0"}
        return "exited"

    jobs.create_many([{} for _ in range(JOBS)])
    worker = Worker(jobs, {"running": running, "finalizing": lambda job: "complete"}, concurrency=8)
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    thread.start()
    try:
        assert eventually(lambda: any_store.count_states("job").get("completed", 0) == JOBS)  # type: ignore[attr-defined]
    finally:
        worker.stop()
        thread.join(10)
    assert worker.completer.steps == 2 * JOBS * STEPS  # a read and a record per step, all answered here
    assert worker.completer.batches < worker.completer.steps  # asks shared batches
    assert len(calls) == JOBS * STEPS and set(calls.values()) == {1}  # each effect ran once
    for snap in any_store.entities("job", limit=JOBS + 1):
        records = [r for r in any_store.effects(snap.id) if r.key.startswith("step-")]
        assert [(r.key, r.status) for r in records] == [(f"step-{i}", EFFECT_SUCCEEDED) for i in range(STEPS)]


def test_a_replayed_step_returns_its_record_without_running_again(store: MemoryStore) -> None:
    jobs = Engine(JobLifecycle, store, owner="w1")
    (a,) = jobs.create_many([{}])
    (held,) = jobs.claim(1)
    assert held.lease is not None
    runs: list[str] = []
    completer = BatchCompleter(jobs).start()
    try:
        first = jobs._run_held(
            a.id, "charge", lambda key: runs.append(key) or {"charged": True}, held.lease, ledger=completer
        )
        again = jobs._run_held(a.id, "charge", runs.append, held.lease, ledger=completer)
    finally:
        completer.stop()
    assert first == again == {"charged": True}
    assert runs == [f"{a.id}:charge"]  # the replay read the record: one charge
    assert completer.steps == 3  # read, record, read


def test_a_step_of_a_lost_lease_is_refused_in_its_batch_and_runs_nothing(store: MemoryStore) -> None:
    jobs = Engine(JobLifecycle, store, owner="w1")
    a, b = jobs.create_many([{}, {}])
    claimed = {s.id: s for s in jobs.claim(2)}
    completer = BatchCompleter(jobs, all_waiting=lambda n: n >= 2).start()
    try:
        lease_a, lease_b = claimed[a.id].lease, claimed[b.id].lease
        assert lease_a is not None and lease_b is not None
        stale = lease_b._replace(token=lease_b.token + 7)
        results: list[Any] = []
        ran: list[str] = []

        def step(entity_id: str, lease: Any) -> None:
            try:
                results.append(jobs._run_held(entity_id, "k", ran.append, lease, ledger=completer))
            except LeaseLost as err:
                results.append(err)

        threads = [
            threading.Thread(target=step, args=(a.id, lease_a)),
            threading.Thread(target=step, args=(b.id, stale)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        completer.stop()
    assert ran == [f"{a.id}:k"]  # b's holder was refused before its effect ran
    assert sum(isinstance(r, LeaseLost) for r in results) == 1
    assert store.effect(b.id, "k") is None and store.effect(a.id, "k") is not None
    assert completer.steps == 3  # two reads (one batch when both wait), one record


@pytest.mark.parametrize("running", [False, True])
def test_asks_are_answered_alone_when_the_completer_does_not_run(store: MemoryStore, running: bool) -> None:
    jobs = Engine(JobLifecycle, store, owner="w1")
    (a,) = jobs.create_many([{}])
    (held,) = jobs.claim(1)
    completer = BatchCompleter(jobs)
    if running:
        completer.start()
    try:
        assert completer.batches_steps is running
        assert held.lease is not None
        assert jobs._run_held(a.id, "k", lambda key: 7, held.lease, ledger=completer) == 7
    finally:
        completer.stop()
    assert completer.steps == (2 if running else 0)


def test_an_ask_on_the_completers_own_thread_is_answered_there(store: MemoryStore) -> None:
    """A batch's continuation runs on the completer's thread: an ask from there cannot wait
    for that thread's next batch, so it is answered at once."""
    jobs = Engine(JobLifecycle, store, owner="w1")
    (a,) = jobs.create_many([{}])
    (held,) = jobs.claim(1)
    assert held.lease is not None
    completer = BatchCompleter(jobs).start()
    answers: list[Any] = []
    try:
        completer.fire_then(
            held,
            "exited",
            lease=held.lease,
            data=None,
            then=lambda result: answers.append(completer.holder_and_effect(a.id, "k")),
        )
        assert eventually(lambda: bool(answers))
    finally:
        completer.stop()
    assert answers == [(("w1", held.lease.token), None)]
