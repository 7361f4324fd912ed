"""Async fire on PostgreSQL: ``AsyncEngine`` with 8 tasks, against the sync engine with 8
threads and against raw async psycopg with 8 tasks.

Each contender takes fresh pipelines through start, finish, succeed (three fires each),
8 workers at once, each on its own entities.  The engines fire ``start`` by id (one read)
and the next two from the result they hold (no read), as a worker does:

- ``AsyncEngine`` over ``AsyncSqlStore`` (psycopg ``AsyncConnection``, a pool of 8), 8 tasks;
- ``Engine`` over ``SqlStore``, 8 threads (one connection each);
- raw async psycopg, 8 tasks on 8 connections (autocommit), doing what the engines do on
  the wire and nothing more: one read (the store's own ``get`` statement) before the first
  fire, then the store's own one-statement transitions (``WITH u AS (UPDATE .. RETURNING)
  INSERT ..``), parameters built by hand.  The SQL text is taken from the store once,
  before timing, so both sides run byte-identical statements on the same tables;
- for reference, the raw loop without the read: one round trip per fire.

Needs the PostgreSQL URL explicitly: ``--pg-url URL`` or ``FSM_BENCH_POSTGRES_URL``; the
suite says so and skips otherwise (never a silent default).  Run alone:
``python tests/benchmarks/run.py --only aio --pg-url postgresql+psycopg://USER@HOST/BENCHDB``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from harness import Report

from fsm import AsyncEngine, Engine, PipelineLifecycle
from fsm.records import Actor
from stores.aio import AsyncSqlStore
from stores.sql import SqlStore

WORKERS = 8
PER_WORKER = 60
EVENTS = (("start", "queued"), ("finish", "running"), ("succeed", "finalizing"))
OWNER = "bench-worker"


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i::WORKERS] for i in range(WORKERS)]


def _async_engine(runner: asyncio.Runner, url: str, prefix: str) -> Callable[[], Callable[[], int]]:
    store = AsyncSqlStore(url, table_prefix=prefix, pool_size=WORKERS)
    engine = AsyncEngine(PipelineLifecycle, store, owner=OWNER)

    async def one(ids: list[str]) -> None:
        for i in ids:
            started = await engine.fire(i, "start")
            finished = await engine.fire(started, "finish")  # from the held result: no read
            await engine.fire(finished, "succeed", lease=finished.lease)

    def setup() -> Callable[[], int]:
        async def create() -> list[str]:
            return [(await engine.create()).id for _ in range(WORKERS * PER_WORKER)]

        chunks = _chunks(runner.run(create()))

        def body() -> int:
            async def all_tasks() -> None:
                await asyncio.gather(*(one(c) for c in chunks))

            runner.run(all_tasks())
            return 3 * WORKERS * PER_WORKER

        return body

    return setup


def _sync_engine(store: SqlStore, pool: ThreadPoolExecutor) -> Callable[[], Callable[[], int]]:
    engine = Engine(PipelineLifecycle, store, owner=OWNER)

    def one(ids: list[str]) -> None:
        fire = engine.fire
        for i in ids:
            started = fire(i, "start")
            finished = fire(started, "finish")  # from the held result: no read
            fire(finished, "succeed", lease=finished.lease)

    def setup() -> Callable[[], int]:
        chunks = _chunks([engine.create().id for _ in range(WORKERS * PER_WORKER)])

        def body() -> int:
            for f in [pool.submit(one, c) for c in chunks]:
                f.result()
            return 3 * WORKERS * PER_WORKER

        return body

    return setup


def _raw(runner: asyncio.Runner, url: str, store: SqlStore, read: bool) -> tuple[Callable[[], Callable[[], int]], Any]:
    import psycopg
    import sqlalchemy as sa

    sql = store._sql
    table = PipelineLifecycle.table
    shapes = {}
    for event, source in EVENTS:
        (branch,) = [b for b in table.branches_for(source, event) if b.actor is Actor.WORKER]
        ttl = branch.lease_effect.name == "ACQUIRE"
        # lean: the engines hand the store the snapshot they judged, so it returns only the
        # columns a transition changes; the raw side runs the same statement
        statement = sql.apply(branch.lease_effect, ttl, branch.holds_lease, (), (), False, False, False, True)[0]
        shapes[event] = (statement, source, branch.target, branch.holds_lease, ttl)
    get = sql.get
    u = sa.make_url(url)
    conns: list[Any] = []

    async def connect() -> None:
        for _ in range(WORKERS):
            conn = await psycopg.AsyncConnection.connect(
                host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database, autocommit=True
            )
            await conn.execute("SET TIME ZONE 'UTC'")
            conns.append(conn)

    runner.run(connect())
    lease_ttl = PipelineLifecycle.policy.lease_ttl if hasattr(PipelineLifecycle, "policy") else timedelta(minutes=2)

    async def one(conn: Any, ids: list[str]) -> None:
        cur = conn.cursor()
        for i in ids:
            token = 0
            version = 0
            for n, (event, _) in enumerate(EVENTS):
                if read and n == 0:  # what the engines do: read once, then fire from the held result
                    await cur.execute(get, {"id": i})
                    row = await cur.fetchone()
                    version, token = row[3], row[5]
                statement, source, target, holds, ttl = shapes[event]
                params = {
                    "id": i, "version": version, "owner": OWNER if holds else None, "token": token if holds else None,
                    "event": event, "source": source, "target": target, "actor": "worker", "reason": None,
                    "key": None, "patch": None, "data": None, "new_owner": OWNER, "ttl": lease_ttl if ttl else None,
                }  # fmt: skip
                await cur.execute(statement, params)
                row = await cur.fetchone()
                assert row is not None  # the compare-and-set matched: what the client knew is right
                version, token = version + 1, token + 1 if ttl else token

    def setup() -> Callable[[], int]:
        engine = Engine(PipelineLifecycle, store, owner=OWNER)
        chunks = _chunks([engine.create().id for _ in range(WORKERS * PER_WORKER)])

        def body() -> int:
            async def all_tasks() -> None:
                await asyncio.gather(*(one(c, chunk) for c, chunk in zip(conns, chunks, strict=True)))

            runner.run(all_tasks())
            return 3 * WORKERS * PER_WORKER

        return body

    async def close() -> None:
        for conn in conns:
            await conn.close()

    return setup, close


def run(report: Report, *, pg_url: str | None = None, big: bool = False) -> None:
    print(f"aio: fire on PostgreSQL, {WORKERS} concurrent workers (Pipeline start/finish/succeed)")
    url = pg_url
    if not url:
        print("  SKIPPED aio: no PostgreSQL URL (pass --pg-url URL or set FSM_BENCH_POSTGRES_URL)")
        report.notes.append("aio skipped: no PostgreSQL URL given")
        return
    print("  durable commits (the server's synchronous_commit):")
    _pass(report, url, "")
    # Every commit waits for a WAL flush, so the first pass measures the disk's group commit
    # as much as the library; the second turns the wait off for every contender alike (PGOPTIONS
    # reaches each libpq connection, sync and async), so the clients' own costs show.
    previous = os.environ.get("PGOPTIONS")
    os.environ["PGOPTIONS"] = "-c synchronous_commit=off"
    try:
        print("  synchronous_commit=off for every contender (client cost visible):")
        _pass(report, url, ", async commit")
    finally:
        if previous is None:
            os.environ.pop("PGOPTIONS", None)
        else:
            os.environ["PGOPTIONS"] = previous


def _pass(report: Report, url: str, label: str) -> None:
    from stores.sql.migrate import drop_schema

    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    store = SqlStore(url, table_prefix=prefix)
    pool = ThreadPoolExecutor(WORKERS)
    runner = asyncio.Runner()
    closers = []
    try:
        raw_setup, raw_close = _raw(runner, url, store, read=True)
        bare_setup, bare_close = _raw(runner, url, store, read=False)
        closers += [raw_close, bare_close]
        ours = f"AsyncEngine fire, {WORKERS} tasks{label}"
        sync = f"Engine fire (sync), {WORKERS} threads{label}"
        raw = f"raw async psycopg, same round trips, {WORKERS} tasks{label}"
        bare = f"raw async psycopg, CTE only, {WORKERS} tasks{label}"
        report.measure(
            {
                ours: _async_engine(runner, url, prefix),
                sync: _sync_engine(store, pool),
                raw: raw_setup,
                bare: bare_setup,
            },
            rounds=5,
        )
        report.ratio(f"async fire vs sync engine (8 threads){label}", ours, sync, 1.0)
        report.ratio(f"async fire vs raw async psycopg (same round trips){label}", ours, raw, 0.8)
        report.ratio(f"async fire vs raw async psycopg CTE only (reference){label}", ours, bare, 0.5)
        report.notes.append(f"aio{label}: {WORKERS} workers x {PER_WORKER} pipelines x 3 fires per round, best of 5")
    finally:
        for close in closers:
            runner.run(close())
        runner.close()
        pool.shutdown()
        drop_schema(store.engine, table_prefix=prefix)
        store.close()
