"""Retention: Engine.prune and ``fsm prune`` on memory, SQLite and PostgreSQL.

Final entities older than the retention go with their history, effects and renewals, in
batches; entities in any other state stay, however old; a dry run changes nothing;
hostile arguments get typed errors (the CLI: exit 2, one line, no traceback).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

import pytest
from conftest import SqlTarget

from fsm import AsyncEngine, Engine, InvalidArgument, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.cli import main
from stores import Store


def finished_job(jobs: Engine) -> str:
    job = jobs.create()
    lease = jobs.fire(job.id, "start").lease
    assert lease is not None
    jobs.renew_lease(lease)
    jobs.run(job.id, "gate", lambda key: {"ok": True}, lease)
    jobs.fire(job.id, "exited", lease=lease, data={"exit_code": 0})
    jobs.fire(job.id, "complete", lease=lease)
    return job.id


def everything(store: Store, ids: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for entity_id in ids:
        try:
            found[entity_id] = (store.get(entity_id), store.history(entity_id), store.effects(entity_id))
        except Exception as err:
            found[entity_id] = type(err).__name__
    return found


def scene(store: Store, clock: ManualClock) -> tuple[Engine, list[str], list[str]]:
    """Five old finished jobs, an old running one, an old queued one, a young finished one."""
    jobs = Engine(JobLifecycle, store, clock=clock)
    old = [finished_job(jobs) for _ in range(5)]
    running = jobs.create().id
    jobs.fire(running, "start")
    queued = jobs.create().id
    clock.advance(seconds=40 * 86400)
    young = finished_job(jobs)
    return jobs, old, [running, queued, young]


def test_prune_removes_old_final_entities_in_batches_and_keeps_the_rest(any_store: Store, clock: ManualClock) -> None:
    jobs, old, kept = scene(any_store, clock)
    before = everything(any_store, kept)
    preview = jobs.prune(timedelta(days=30), dry_run=True)
    assert sorted(preview.removed) == sorted(old) and preview.dry_run and not preview.more
    assert everything(any_store, old + kept) == {**everything(any_store, old), **before}  # nothing changed
    assert all(not isinstance(v, str) for v in everything(any_store, old).values())
    result = jobs.prune(timedelta(days=30), batch_size=2)
    assert sorted(result.removed) == sorted(old) and result.batches == 3  # 2 + 2 + 1
    assert "removed 5 final entities" in result.summary()
    assert set(everything(any_store, old).values()) == {"UnknownEntity"}
    assert everything(any_store, kept) == before  # running, queued and young: untouched
    assert jobs.prune(30 * 86400.0).removed == []
    clock.advance(seconds=31 * 86400)  # now the young one is old too; running and queued never go
    assert jobs.prune(timedelta(days=30)).removed == [kept[2]]
    assert {s.state for s in jobs.entities()} == {"running", "queued"}


@pytest.mark.parametrize(
    ("older_than", "batch_size", "dry_run"),
    [
        (timedelta(0), 500, False),
        (timedelta(days=-1), 500, False),
        (math.nan, 500, False),
        (math.inf, 500, False),
        ("30d", 500, False),
        (True, 500, False),
        (None, 500, False),
        (1e300, 500, False),
        (timedelta.max, 500, False),
        (60.0, 0, False),
        (60.0, 10**9, False),
        (60.0, "10", False),
        (60.0, 500, "yes"),
    ],
)
def test_prune_refuses_hostile_arguments_and_removes_nothing(
    any_store: Store, clock: ManualClock, older_than: Any, batch_size: Any, dry_run: Any
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    done = finished_job(jobs)
    clock.advance(seconds=3600)
    with pytest.raises(InvalidArgument):
        jobs.prune(older_than, batch_size=batch_size, dry_run=dry_run)
    assert jobs.get(done).state == "completed" and len(jobs.history(done)) == 3


def test_the_async_engine_prunes_as_the_sync_one(tmp_path: Any) -> None:
    from stores.aio import AsyncSqlStore

    async def scenario() -> list[str]:
        store = AsyncSqlStore(f"sqlite:///{tmp_path}/a.db")
        jobs = AsyncEngine(PipelineLifecycle, store)
        try:
            p = await jobs.create()
            await jobs.fire(p.id, "start")
            lease = (await jobs.fire(p.id, "finish")).lease
            await jobs.fire(p.id, "succeed", lease=lease)
            await jobs.create()  # queued: stays
            assert (await jobs.prune(timedelta(seconds=1), dry_run=True)).removed == []  # too young
            await asyncio.sleep(0.02)
            return (await jobs.prune(0.01)).removed
        finally:
            await store.close()

    assert len(asyncio.run(scenario())) == 1


def test_fsm_prune_on_sqlite_and_postgresql(sql_target: SqlTarget, capsys: pytest.CaptureFixture[str]) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    jobs, old, kept = scene(store, clock)
    pipelines = Engine(PipelineLifecycle, store, clock=clock)
    stuck = pipelines.create().id  # an old pipeline never finished: never pruned
    pipelines.fire(stuck, "start")
    before = everything(store, old + kept + [stuck])
    db = ["--db", sql_target.url, "--prefix", str(store.table_prefix)]  # type: ignore[attr-defined]
    # the CLI's store runs on the database's clock; the scene's manual clock (from 2026-01-01)
    # is months behind it, so every finished job, the young one too, is older than 1 s there
    assert main(["prune", *db, "--older-than", "1s", "--dry-run", "--list", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("would remove job ") == 2 and "... and 4 more" in out
    assert "job: would remove 6 final entities" in out and "pipeline: would remove 0" in out
    assert everything(store, old + kept + [stuck]) == before  # the dry run changed nothing
    assert main(["prune", *db, "--older-than", "1s", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "job: removed 6 final entities" in out and out.count("removed job ") == 6
    assert {s.state for s in jobs.entities()} == {"running", "queued"}
    assert pipelines.get(stuck).state == "running"
    assert main(["prune", *db, "--older-than", "1s"]) == 0
    assert "job: removed 0 final entities" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["prune", "--db", "memory://", "--older-than", "30x"],
        ["prune", "--db", "memory://", "--older-than", "-1d"],
        ["prune", "--db", "memory://", "--older-than", "0"],
        ["prune", "--db", "memory://", "--older-than", "\udcff"],
        ["prune", "--db", "memory://", "--older-than", "9" * 400 + "w"],
        ["prune", "--db", "memory://"],
        ["prune", "--db", "memory://", "--older-than", "30d", "--batch-size", "0"],
        ["prune", "--db", "memory://", "--older-than", "30d", "--lifecycle", "fsm.lifecycles:Nope"],
        ["prune", "--db", "sqlite:///does/not/exist.db", "--older-than", "30d"],
        ["prune", "--db", "nope://x", "--older-than", "30d"],
    ],
)
def test_fsm_prune_refuses_bad_arguments_with_one_line_and_no_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" in err
