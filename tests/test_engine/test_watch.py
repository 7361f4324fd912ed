"""``engine.watch``: committed transitions made by a reaper in another process reach this
one, on both faces, resumably."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import SqlTarget
from tests_support import guide_block_after

from fsm import ConfigError, Engine, InvalidArgument, JobLifecycle, PipelineLifecycle
from fsm.records import FeedEntry
from stores import MemoryStore

SHORT = JobLifecycle.policy.model_copy(update={"lease_ttl": timedelta(seconds=1)})


def reaper_process(target: SqlTarget) -> subprocess.Popen[str]:
    """``fsm reaper --once`` in a process of its own, after the leases have lapsed."""
    code = "import sys, time; time.sleep(1.3); from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["reaper", "--db", target.url, "--prefix", target.prefix, "--once", "--no-tick-log"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def claimed_jobs(engine: Engine, count: int) -> list[str]:
    for i in range(count):
        engine.create(f"j{i}")
    return [snap.id for snap in engine.claim(count)]


def test_watch_sees_a_reaper_in_another_process_expire_the_jobs_and_resumes_from_a_position(
    sql_target: SqlTarget,
) -> None:
    store = sql_target.store()
    engine = Engine(JobLifecycle, store, policy=SHORT)
    feed = engine.watch(poll=0.05, timeout=60)  # from now on
    ids = claimed_jobs(engine, 3)
    proc = reaper_process(sql_target)
    seen: list[FeedEntry] = []
    try:
        for entry in feed:
            seen.append(entry)
            if sum(e.record.actor == "reaper" for e in seen) >= 3:
                break
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    starts = [(e.record.entity_id, e.record.event) for e in seen if e.record.actor == "worker"]
    moves = [(e.record.entity_id, e.record.event) for e in seen if e.record.actor == "reaper"]
    assert sorted(starts) == [(i, "start") for i in ids]
    assert sorted(moves) == [(i, "expire") for i in ids]
    assert all(e.kind == "job" for e in seen)
    # resuming after the first start gives the rest, in the same order
    again = list(engine.watch(seen[0].position, poll=0.05, timeout=0))
    assert [e.position for e in again][: len(seen) - 1] == [e.position for e in seen[1:]]


def test_the_async_watch_sees_the_other_process_too(sql_target: SqlTarget) -> None:
    from fsm.aio import AsyncEngine
    from stores.aio import AsyncSqlStore

    async def main() -> list[FeedEntry]:
        store = AsyncSqlStore(sql_target.url, table_prefix=sql_target.prefix)
        try:
            engine = AsyncEngine(JobLifecycle, store, policy=SHORT)
            feed = engine.watch(poll=0.05, timeout=60)
            first = asyncio.ensure_future(anext(feed))  # the watch starts (reads its head) first
            await asyncio.sleep(0.2)
            await engine.create("a1")
            [snap] = await engine.claim()
            proc = await asyncio.to_thread(reaper_process, sql_target)
            seen = [await first]
            async for entry in feed:
                seen.append(entry)
                if entry.record.actor == "reaper":
                    break
            await asyncio.to_thread(proc.communicate, timeout=60)
            assert proc.returncode == 0
            return seen
        finally:
            await store.close()

    seen = asyncio.run(main())
    assert [(e.record.entity_id, e.record.event, e.record.actor) for e in seen] == [
        ("a1", "start", "worker"),
        ("a1", "expire", "reaper"),
    ]


def test_watch_tells_only_its_lifecycle_and_stops_when_asked() -> None:
    store = MemoryStore()
    jobs, pipelines = Engine(JobLifecycle, store), Engine(PipelineLifecycle, store)
    pipelines.create("p1")
    jobs.create("j1")
    stop = threading.Event()
    got: list[FeedEntry] = []

    def consume() -> None:
        got.extend(pipelines.watch(from_start=True, poll=0.01, stop=stop))

    thread = threading.Thread(target=consume)
    thread.start()
    jobs.claim()
    pipelines.fire("p1", "start")
    for _ in range(500):
        if got:
            break
        time.sleep(0.01)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert [(e.kind, e.record.entity_id, e.record.event) for e in got] == [("pipeline", "p1", "start")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after": 5}, "after must be"),
        ({"after": "zz"}, "not a feed position"),
        ({"poll": 0}, "poll must be"),
        ({"poll": float("nan")}, "poll must be"),
        ({"timeout": -1}, "timeout must be"),
        ({"timeout": float("nan")}, "timeout must be"),
    ],
)
def test_watch_refuses_bad_arguments_before_the_first_entry(kwargs: dict[str, object], message: str) -> None:
    engine = Engine(JobLifecycle, MemoryStore())
    with pytest.raises(InvalidArgument, match=message):
        engine.watch(**kwargs)  # type: ignore[arg-type]


def test_on_postgresql_a_notify_wakes_the_watch_long_before_its_poll(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    if sql_target.dialect != "postgres":
        with pytest.raises(ConfigError):
            store.enable_feed_notify()  # type: ignore[attr-defined]
        return
    store.enable_feed_notify()  # type: ignore[attr-defined]
    store.enable_feed_notify()  # type: ignore[attr-defined]  # idempotent
    engine = Engine(JobLifecycle, store, policy=SHORT)
    claimed_jobs(engine, 1)
    stop = threading.Event()
    got: list[FeedEntry] = []

    def consume() -> None:
        for entry in engine.watch(poll=3600, stop=stop):  # an hour: only a NOTIFY can wake it in time
            got.append(entry)
            if entry.record.actor == "reaper":
                return

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    proc = reaper_process(sql_target)
    try:
        thread.join(60)
    finally:
        stop.set()
        proc.communicate(timeout=60)
    assert not thread.is_alive(), "the watch was not woken: no notification heard"
    assert [(e.record.event, e.record.actor) for e in got][-1] == ("expire", "reaper")
    store.disable_feed_notify()  # type: ignore[attr-defined]


def test_the_readme_watch_example_runs_as_written(tmp_path: Path) -> None:

    script = tmp_path / "watch_example.py"
    script.write_text(guide_block_after("# A live feed across processes"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, str(script)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["pipeline", "p1", "start"]
