"""Real processes racing on one database (I3, I6, I8), on a SQLite file and on PostgreSQL.

Processes are spawned (not forked): each opens its own ``SqlStore`` on the URL, as
separate workers and reapers on separate machines would.
"""

from __future__ import annotations

import multiprocessing
import random
from datetime import timedelta
from typing import Any

import pytest
from conftest import SqlTarget

from fsm import (
    ConditionFailed,
    Engine,
    JobLifecycle,
    LeaseLost,
    StaleVersion,
    TransitionNotAllowed,
)
from fsm.records import BatchWrite, LeaseChange, LeaseStale, NewEntity, TransitionWrite
from stores.sql import SqlStore

PROCESSES = 4
JOBS = 24
INCREMENTS = 15
BATCH_ROWS = 40


def _race(url: str, prefix: str, n: int, barrier: Any, results: Any) -> None:
    """One racing process: three phases, each started together with the others."""
    store = SqlStore(url, table_prefix=prefix, create=False)
    engine = Engine(JobLifecycle, store, owner=f"proc-{n}")
    rng = random.Random(n)
    out: dict[str, Any] = {"wins": [], "increments": 0, "moved": [], "claimed": [], "errors": []}
    try:
        # 1. every process tries to start every job: one compare-and-set winner each
        jobs = [f"job{i}" for i in range(JOBS)]
        rng.shuffle(jobs)
        barrier.wait()
        for job in jobs:
            try:
                result = engine.fire(job, "start")
                out["wins"].append((job, result.snapshot.lease_token))
            except (StaleVersion, TransitionNotAllowed):
                pass
        # 2. read-modify-write of one counter with retries: no increment may be lost
        barrier.wait()
        done = 0
        while done < INCREMENTS:
            snap = store.get("counter")
            n_now = int(snap.data.get("n", 0))
            write = TransitionWrite(
                "counter", "bump", snap.state, snap.state, "worker", snap.version,
                data={"n": n_now + 1}, data_patch={"n": n_now + 1, "by": n},
            )  # fmt: skip
            try:
                store.apply(write)
                done += 1
            except StaleVersion:
                continue
        out["increments"] = done
        # 3. every process reaps the same stale rows in one batch: each row moves once
        barrier.wait()
        ids = tuple(f"stale{i}" for i in range(BATCH_ROWS))
        batch = BatchWrite(
            ids, "job", "expire", "running", "failed", "reaper", (LeaseStale(timedelta(0)),),
            LeaseChange.CLEAR, reason="expired",
        )  # fmt: skip
        out["moved"] = [s.id for s, _ in store.apply_batch(batch)]
        # 4. every process claims pages of the same stale rows until a page comes back short:
        # the claims divide the rows, each moved exactly once
        barrier.wait()
        claim = BatchWrite(
            (), "claimed", "expire", "running", "failed", "reaper", (LeaseStale(timedelta(0)),),
            LeaseChange.CLEAR, reason="expired",
        )  # fmt: skip
        while True:
            page = store.move_candidates(claim, limit=3)
            out["claimed"] += [s.id for s, _ in page]
            if len(page) < 3:
                break
    except Exception as err:  # reported to the parent, which fails the test with it
        out["errors"].append(repr(err))
    finally:
        store.close()
        results.put((n, out))


def _prepare(target: SqlTarget) -> SqlStore:
    store = target.store()
    assert isinstance(store, SqlStore)
    setup = Engine(JobLifecycle, store, owner="setup")
    for i in range(JOBS):
        setup.create(f"job{i}")
    setup.create("counter")
    setup.fire("counter", "start")
    for i in range(BATCH_ROWS):
        setup.fire(setup.create(f"stale{i}").id, "start")
        store.release_lease(f"stale{i}", owner="setup", token=1)  # lease-less: stale at once (stale_after 0)
    for i in range(BATCH_ROWS):
        store.create(NewEntity(f"claimed{i}", "claimed", "running"))
    return store


def test_processes_racing_get_one_winner_per_cas_no_lost_update_and_gap_free_history(sql_target: SqlTarget) -> None:
    store = _prepare(sql_target)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(sql_target.url, sql_target.prefix, n, barrier, results))
        for n in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    outs = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert all(not out["errors"] for out in outs.values()), outs

    # I3: exactly one process started each job, and the row names it
    winners: dict[str, list[int]] = {}
    for n, out in outs.items():
        for job, token in out["wins"]:
            winners.setdefault(job, []).append(n)
            assert token == 1
    assert sorted(winners) == sorted(f"job{i}" for i in range(JOBS))
    assert all(len(w) == 1 for w in winners.values()), winners
    for job, (n,) in winners.items():
        snap = store.get(job)
        assert (snap.state, snap.version, snap.lease_owner) == ("running", 1, f"proc-{n}")
        assert [(r.seq, r.event) for r in store.history(job)] == [(1, "start")]

    # no lost update; I6: history runs 1..version without a gap
    counter = store.get("counter")
    total = PROCESSES * INCREMENTS
    assert sum(out["increments"] for out in outs.values()) == total
    assert counter.data["n"] == total and counter.version == total + 1
    history = store.history("counter")
    assert [r.seq for r in history] == list(range(1, counter.version + 1))
    assert [r.data["n"] for r in history[1:] if r.data] == list(range(1, total + 1))

    # the set-based reaper write: each stale row moved by exactly one process, once
    moved = [i for out in outs.values() for i in out["moved"]]
    assert sorted(moved) == sorted(f"stale{i}" for i in range(BATCH_ROWS))
    for i in range(BATCH_ROWS):
        assert [r.event for r in store.history(f"stale{i}")] == ["start", "expire"]

    # the reapers' claims: each stale row claimed and moved by exactly one process, once
    claimed = [i for out in outs.values() for i in out["claimed"]]
    assert sorted(claimed) == sorted(f"claimed{i}" for i in range(BATCH_ROWS))
    for i in range(BATCH_ROWS):
        assert [(r.seq, r.event) for r in store.history(f"claimed{i}")] == [(1, "expire")]


def _reopen(url: str, prefix: str) -> dict[str, Any]:
    """A new process: a new store object on the same database."""
    store = SqlStore(url, table_prefix=prefix, create=False)
    try:
        snap = store.get("j1")
        history = store.history("j1")
        lease = snap.lease
        assert lease is not None
        renewed = store.renew_lease("j1", owner=lease.owner, token=lease.token, ttl=timedelta(minutes=5), budget=None)
        try:
            store.renew_lease("j1", owner=lease.owner, token=lease.token - 1, ttl=timedelta(minutes=5), budget=None)
            stale_refused = False
        except LeaseLost:
            stale_refused = True
        return {"snap": snap, "history": history, "renewed": renewed, "stale_refused": stale_refused}
    finally:
        store.close()


def test_a_new_process_with_a_new_store_sees_the_same_leases_and_history(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    engine = Engine(JobLifecycle, store, owner="first-run")
    engine.create("j1", data={"exit_code": None})
    lease = engine.fire("j1", "start").lease
    assert lease is not None
    before, history = store.get("j1"), store.history("j1")
    store.close()  # type: ignore[attr-defined]  # the first process is gone

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        seen = pool.apply(_reopen, (sql_target.url, sql_target.prefix))
    assert seen["snap"] == before and seen["history"] == history
    assert seen["renewed"].lease_token == lease.token and seen["stale_refused"]
    again = sql_target.store(create=False)
    assert again.get("j1").lease_expires_at == seen["renewed"].lease_expires_at
    with pytest.raises(ConditionFailed):  # the renewed lease guards the row against the reaper
        again.apply(
            TransitionWrite("j1", "expire", "running", "failed", "reaper", 1, require=(LeaseStale(timedelta(0)),))
        )
