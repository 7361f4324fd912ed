"""``fire`` through SqlStore against the fastest honest raw driver code on the same tables.

Pipeline start, finish, succeed on fresh entities.  Ours: ``Engine.fire`` from the
``FireResult`` the caller holds (no read first; the store's one guarded write).  The raw
side holds the same facts in local variables and does, per event, what the library must:
the guarded ``UPDATE`` (id, version, not deleted, and the lease holder where the event
needs it) and the history row, committed; prepared statements, one connection, no reads,
no ``RETURNING`` it does not need.  Both sides run on the store's own tables and indexes.
The toy limit is one ``UPDATE`` of a three-column table (id, state, version) per event,
with no history: the cost of the schema and of the history row shows against it.

By id: ours is ``Engine.fire(entity_id, ...)`` (the store judges the branch in its
statement, no read first); the raw side holds only the id (and, for ``succeed``, the lease
``finish`` gave it), so its update chooses by state (``WHERE id AND kind AND NOT deleted
AND state = ..``) and returns what the history row needs (``RETURNING version,
lease_token``).

- SQLite: a WAL file, both sides with the same ``synchronous`` (NORMAL: a commit is a WAL
  append, so the library's own cost shows; FULL, the store's default, fsyncs each commit).
  Raw: ``BEGIN``, ``UPDATE``, ``INSERT``, ``COMMIT``; by id ``BEGIN``, ``UPDATE ..
  RETURNING``, ``INSERT``, ``COMMIT``.
- PostgreSQL (``--pg-url``): raw as one CTE statement (``WITH u AS (UPDATE .. RETURNING)
  INSERT ..``, autocommit; by id the same, its update choosing by state) and as the
  two-statement transaction (``UPDATE``, ``INSERT``, ``COMMIT``); then 1, 2, 4 and 8
  writer threads, each on its own connection, ours against the raw CTE (the threads and
  their connections live across the rounds and are warmed before the clock, on both
  sides, as a deployment's writers are).
"""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import Report

from fsm import Engine, PipelineLifecycle
from stores.sql import SqlStore
from stores.sql.schema import encode_sqlite_time

TTL = timedelta(minutes=2)
OWNER = "bench-worker"
WRITERS = (1, 2, 4, 8)


def _fsm_fire(store: SqlStore, n: int) -> Callable[[], Callable[[], int]]:
    engine = Engine(PipelineLifecycle, store, owner=OWNER)

    def setup() -> Callable[[], int]:
        created = [engine.create() for _ in range(n)]

        def body() -> int:
            fire = engine.fire
            for snap in created:
                result = fire(snap, "start")
                result = fire(result, "finish")
                fire(result, "succeed", lease=result.lease)
            return 3 * n

        return body

    return setup


def _fsm_fire_by_id(store: SqlStore, n: int) -> Callable[[], Callable[[], int]]:
    """Firing by id: the store judges the branch in its write (no read first)."""
    engine = Engine(PipelineLifecycle, store, owner=OWNER)

    def setup() -> Callable[[], int]:
        ids = [engine.create().id for _ in range(n)]

        def body() -> int:
            fire = engine.fire
            for i in ids:
                fire(i, "start")
                lease = fire(i, "finish").lease
                fire(i, "succeed", lease=lease)
            return 3 * n

        return body

    return setup


# -- SQLite ---------------------------------------------------------------------------------------


def _sqlite_conn(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous = {synchronous}")  # as the store's connection
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _raw_sqlite(path: str, prefix: str, synchronous: str, n: int) -> Callable[[], Callable[[], int]]:
    conn = _sqlite_conn(path, synchronous)
    ent, hist = f"{prefix}entities", f"{prefix}history"
    guard = "WHERE id = ? AND NOT deleted AND version = ?"
    start = f"UPDATE {ent} SET state = 'running', version = version + 1, state_entered_at = ?, updated_at = ? {guard}"
    finish = (
        f"UPDATE {ent} SET state = 'finalizing', version = version + 1, lease_owner = ?, "
        f"lease_token = lease_token + 1, lease_expires_at = ?, state_entered_at = ?, updated_at = ? {guard}"
    )
    succeed = (
        f"UPDATE {ent} SET state = 'completed', version = version + 1, lease_owner = NULL, lease_expires_at = NULL, "
        f"state_entered_at = ?, updated_at = ? {guard} AND lease_owner = ? AND lease_token = ?"
    )
    history = (
        f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, at) "
        "VALUES (?, ?, ?, ?, ?, 'worker', ?, ?)"
    )

    def setup() -> Callable[[], int]:
        now = encode_sqlite_time(datetime.now(UTC))
        ids = [uuid.uuid4().hex for _ in range(n)]
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO {ent} (id, kind, state, state_entered_at, created_at, updated_at, data) "
            "VALUES (?, 'pipeline', 'queued', ?, ?, ?, '{}')",
            [(i, now, now, now) for i in ids],
        )
        conn.execute("COMMIT")

        def body() -> int:
            execute = conn.execute
            for i in ids:
                # what the caller holds: version 0, token 0, no lease
                t = encode_sqlite_time(datetime.now(UTC))
                execute("BEGIN")
                assert execute(start, (t, t, i, 0)).rowcount == 1
                execute(history, (i, 1, "start", "queued", "running", 0, t))
                execute("COMMIT")
                now_dt = datetime.now(UTC)
                t = encode_sqlite_time(now_dt)
                execute("BEGIN")
                assert execute(finish, (OWNER, encode_sqlite_time(now_dt + TTL), t, t, i, 1)).rowcount == 1
                execute(history, (i, 2, "finish", "running", "finalizing", 1, t))
                execute("COMMIT")
                t = encode_sqlite_time(datetime.now(UTC))
                execute("BEGIN")
                assert execute(succeed, (t, t, i, 2, OWNER, 1)).rowcount == 1
                execute(history, (i, 3, "succeed", "finalizing", "completed", 1, t))
                execute("COMMIT")
            return 3 * n

        return body

    return setup


def _raw_sqlite_by_id(path: str, prefix: str, synchronous: str, n: int) -> Callable[[], Callable[[], int]]:
    """The raw fire by id: the update chooses by state and returns the history row's facts."""
    conn = _sqlite_conn(path, synchronous)
    ent, hist = f"{prefix}entities", f"{prefix}history"
    guard = "WHERE id = ? AND kind = 'pipeline' AND NOT deleted AND state = "
    ret = "RETURNING version, lease_token"
    start = (
        f"UPDATE {ent} SET state = 'running', version = version + 1, state_entered_at = ?, updated_at = ? "
        f"{guard}'queued' {ret}"
    )
    finish = (
        f"UPDATE {ent} SET state = 'finalizing', version = version + 1, lease_owner = ?, "
        f"lease_token = lease_token + 1, lease_expires_at = ?, state_entered_at = ?, updated_at = ? "
        f"{guard}'running' {ret}"
    )
    succeed = (
        f"UPDATE {ent} SET state = 'completed', version = version + 1, lease_owner = NULL, lease_expires_at = NULL, "
        f"state_entered_at = ?, updated_at = ? {guard}'finalizing' AND lease_owner = ? AND lease_token = ? {ret}"
    )
    history = (
        f"INSERT INTO {hist} (entity_id, seq, event, source, target, actor, lease_token, at) "
        "VALUES (?, ?, ?, ?, ?, 'worker', ?, ?)"
    )

    def setup() -> Callable[[], int]:
        now = encode_sqlite_time(datetime.now(UTC))
        ids = [uuid.uuid4().hex for _ in range(n)]
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO {ent} (id, kind, state, state_entered_at, created_at, updated_at, data) "
            "VALUES (?, 'pipeline', 'queued', ?, ?, ?, '{}')",
            [(i, now, now, now) for i in ids],
        )
        conn.execute("COMMIT")

        def body() -> int:
            execute = conn.execute
            for i in ids:  # what the caller holds: the id (and the lease finish gave it)
                t = encode_sqlite_time(datetime.now(UTC))
                execute("BEGIN")
                ((v, token),) = execute(start, (t, t, i)).fetchall()
                execute(history, (i, v, "start", "queued", "running", token, t))
                execute("COMMIT")
                now_dt = datetime.now(UTC)
                t = encode_sqlite_time(now_dt)
                execute("BEGIN")
                ((v, token),) = execute(finish, (OWNER, encode_sqlite_time(now_dt + TTL), t, t, i)).fetchall()
                execute(history, (i, v, "finish", "running", "finalizing", token, t))
                execute("COMMIT")
                t = encode_sqlite_time(datetime.now(UTC))
                execute("BEGIN")
                ((v, token),) = execute(succeed, (t, t, i, OWNER, token)).fetchall()
                execute(history, (i, v, "succeed", "finalizing", "completed", token, t))
                execute("COMMIT")
            return 3 * n

        return body

    return setup


def _toy_sqlite(path: str, synchronous: str, n: int) -> Callable[[], Callable[[], int]]:
    conn = _sqlite_conn(path, synchronous)
    conn.execute("CREATE TABLE IF NOT EXISTS toy (id TEXT PRIMARY KEY, state TEXT NOT NULL, version INTEGER NOT NULL)")
    update = "UPDATE toy SET state = ?, version = version + 1 WHERE id = ? AND version = ?"

    def setup() -> Callable[[], int]:
        ids = [uuid.uuid4().hex for _ in range(n)]
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO toy VALUES (?, 'queued', 0)", [(i,) for i in ids])
        conn.execute("COMMIT")

        def body() -> int:
            execute = conn.execute
            for i in ids:  # each statement commits on its own (autocommit)
                execute(update, ("running", i, 0))
                execute(update, ("finalizing", i, 1))
                execute(update, ("completed", i, 2))
            return 3 * n

        return body

    return setup


def _sqlite_suite(report: Report, synchronous: str, n: int) -> None:
    directory = tempfile.mkdtemp(prefix="fsm-bench-")
    try:
        path = f"{directory}/fsm.db"
        store = SqlStore(f"sqlite:///{path}", sqlite_synchronous=synchronous)
        ours = f"fire/sqlite {synchronous} (Engine.fire from held result)"
        by_id = f"fire/sqlite {synchronous} by id (Engine.fire(entity_id), no read)"
        raw = f"raw sqlite3 {synchronous} (begin, update, insert, commit)"
        raw_id = f"raw sqlite3 {synchronous} by id (begin, update .. returning, insert, commit)"
        toy = f"toy limit sqlite3 {synchronous} (3-column update)"
        report.measure(
            {
                ours: _fsm_fire(store, n),
                raw: _raw_sqlite(path, "fsm_", synchronous, n),
                by_id: _fsm_fire_by_id(store, n),
                raw_id: _raw_sqlite_by_id(path, "fsm_", synchronous, n),
                toy: _toy_sqlite(path, synchronous, n),
            }
        )
        report.ratio(f"sqlite {synchronous} fire from a held result vs honest raw sqlite3", ours, raw, 0.95)
        report.ratio(f"sqlite {synchronous} fire by id vs honest raw sqlite3 by id", by_id, raw_id, 0.9)
        report.ratio(f"sqlite {synchronous} fire vs toy 3-column limit", ours, toy, 0.0)
        store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- PostgreSQL -----------------------------------------------------------------------------------


def _pg_connect(url: str, *, autocommit: bool) -> Any:
    import psycopg

    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=autocommit)
    conn.execute("SET TIME ZONE 'UTC'")  # as the store's connections
    return conn


class _RawPg:
    """The raw PostgreSQL statements of start, finish, succeed on the store's tables."""

    def __init__(self, prefix: str) -> None:
        ent, hist = f"{prefix}entities", f"{prefix}history"
        self.ent = ent
        guard = "WHERE id = %(id)s AND NOT deleted AND version = %(v)s"
        times = "state_entered_at = now(), updated_at = now()"
        self.updates = {
            "start": f"UPDATE {ent} SET state = 'running', version = version + 1, {times} {guard}",
            "finish": f"UPDATE {ent} SET state = 'finalizing', version = version + 1, lease_owner = %(owner)s, "
            f"lease_token = lease_token + 1, lease_expires_at = now() + %(ttl)s, {times} {guard}",
            "succeed": f"UPDATE {ent} SET state = 'completed', version = version + 1, lease_owner = NULL, "
            f"lease_expires_at = NULL, {times} {guard} AND lease_owner = %(owner)s AND lease_token = %(token)s",
        }
        cols = "entity_id, seq, event, source, target, actor, lease_token, at"
        self.cte = {
            event: f"WITH u AS ({sql} RETURNING id, version, lease_token, updated_at) INSERT INTO {hist} ({cols}) "
            f"SELECT id, version, %(event)s, %(source)s, %(target)s, 'worker', lease_token, updated_at FROM u"
            for event, sql in self.updates.items()
        }
        by_state = "WHERE id = %(id)s AND kind = 'pipeline' AND NOT deleted AND state = %(source)s"
        self.cte_by_id = {
            event: f"WITH u AS ({sql.replace(guard, by_state)} RETURNING id, version, lease_token, updated_at) "
            f"INSERT INTO {hist} ({cols}) "
            f"SELECT id, version, %(event)s, %(source)s, %(target)s, 'worker', lease_token, updated_at FROM u"
            for event, sql in self.updates.items()
        }
        self.history = (
            f"INSERT INTO {hist} ({cols}) VALUES (%(id)s, %(seq)s, %(event)s, %(source)s, %(target)s, 'worker', "
            "%(token)s, now())"
        )

    def create(self, conn: Any, n: int) -> list[str]:
        ids = [uuid.uuid4().hex for _ in range(n)]
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self.ent} (id, kind, state, state_entered_at, created_at, updated_at, data) "
                "VALUES (%s, 'pipeline', 'queued', now(), now(), now(), '{}')",
                [(i,) for i in ids],
            )
        if not conn.autocommit:
            conn.commit()
        return ids

    @staticmethod
    def steps(i: str) -> list[tuple[str, dict[str, Any]]]:
        """The three events with what the caller holds: version, token."""
        base = {"id": i, "owner": OWNER, "ttl": TTL}
        return [
            ("start", {**base, "v": 0, "event": "start", "source": "queued", "target": "running", "token": 0}),
            ("finish", {**base, "v": 1, "event": "finish", "source": "running", "target": "finalizing", "token": 1}),
            ("succeed", {**base, "v": 2, "event": "succeed", "source": "finalizing", "target": "completed",
                         "token": 1}),
        ]  # fmt: skip

    def run_cte(self, conn: Any, ids: list[str]) -> int:
        cur = conn.cursor()
        for i in ids:
            for event, params in self.steps(i):
                cur.execute(self.cte[event], params, prepare=True)
                assert cur.rowcount == 1
        return 3 * len(ids)

    def run_cte_by_id(self, conn: Any, ids: list[str]) -> int:
        """By id: the caller holds the id, and the lease ``finish`` gave it (token 1)."""
        cur = conn.cursor()
        for i in ids:
            for event, params in self.steps(i):
                cur.execute(self.cte_by_id[event], params, prepare=True)
                assert cur.rowcount == 1
        return 3 * len(ids)

    def run_two(self, conn: Any, ids: list[str]) -> int:
        cur = conn.cursor()
        for i in ids:
            for event, params in self.steps(i):
                cur.execute(self.updates[event], params, prepare=True)
                assert cur.rowcount == 1
                cur.execute(self.history, {**params, "seq": params["v"] + 1}, prepare=True)
                conn.commit()
        return 3 * len(ids)


def _toy_pg(conn: Any, n: int) -> Callable[[], Callable[[], int]]:
    conn.execute("CREATE TABLE IF NOT EXISTS fsm_bench_toy (id text PRIMARY KEY, state text NOT NULL, version bigint)")
    update = "UPDATE fsm_bench_toy SET state = %s, version = version + 1 WHERE id = %s AND version = %s"

    def setup() -> Callable[[], int]:
        ids = [uuid.uuid4().hex for _ in range(n)]
        conn.cursor().executemany("INSERT INTO fsm_bench_toy VALUES (%s, 'queued', 0)", [(i,) for i in ids])

        def body() -> int:
            cur = conn.cursor()
            for i in ids:
                cur.execute(update, ("running", i, 0), prepare=True)
                cur.execute(update, ("finalizing", i, 1), prepare=True)
                cur.execute(update, ("completed", i, 2), prepare=True)
            return 3 * n

        return body

    return setup


class _WriterThreads:
    """``n`` writer threads that live across the rounds, as a deployment's writer threads
    (and so their connections) do; each round hands each thread its body, all started
    together (the hand-over untimed).  Both sides run on them: the raw side's threads use
    connections opened once, ours open theirs (per thread, the store's) in the first
    round only, which :meth:`warm` runs before the clock."""

    def __init__(self, n: int) -> None:
        import queue

        self._inboxes: list[Any] = [queue.SimpleQueue() for _ in range(n)]
        self._out: Any = queue.SimpleQueue()
        for inbox in self._inboxes:
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()

    def _serve(self, inbox: Any) -> None:
        while (item := inbox.get()) is not None:
            go, body = item
            go.wait()
            try:
                self._out.put(body())
            except BaseException as err:  # reported by the timed body
                self._out.put(err)

    def round(self, bodies: list[Callable[[], int]]) -> Callable[[], int]:
        """The timed body of one round: let every thread run its body, wait for all."""
        go = threading.Event()
        for inbox, b in zip(self._inboxes, bodies, strict=True):
            inbox.put((go, b))

        def body() -> int:
            go.set()
            results = [self._out.get() for _ in bodies]
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            return sum(results)

        return body

    def warm(self, bodies: list[Callable[[], int]]) -> None:
        """One untimed round (each thread connects and its statements are prepared)."""
        self.round(bodies)()


def _writers_ours(store: SqlStore, writers: int, n: int) -> Callable[[], Callable[[], int]]:
    engine = Engine(PipelineLifecycle, store, owner=OWNER)
    threads = _WriterThreads(writers)

    def one(created: list[Any]) -> Callable[[], int]:
        def body() -> int:
            fire = engine.fire
            for snap in created:
                result = fire(snap, "start")
                result = fire(result, "finish")
                fire(result, "succeed", lease=result.lease)
            return 3 * len(created)

        return body

    threads.warm([one([engine.create() for _ in range(12)]) for _ in range(writers)])

    def setup() -> Callable[[], int]:
        batches = [[engine.create() for _ in range(n)] for _ in range(writers)]
        return threads.round([one(b) for b in batches])

    return setup


def _writers_raw(url: str, raw: _RawPg, writers: int, n: int) -> Callable[[], Callable[[], int]]:
    conns = [_pg_connect(url, autocommit=True) for _ in range(writers)]
    threads = _WriterThreads(writers)
    warm = [raw.create(conns[w], 12) for w in range(writers)]
    threads.warm([lambda c=conns[w], ids=warm[w]: raw.run_cte(c, ids) for w in range(writers)])

    def setup() -> Callable[[], int]:
        batches = [raw.create(conns[w], n) for w in range(writers)]
        return threads.round([lambda c=conns[w], ids=batches[w]: raw.run_cte(c, ids) for w in range(writers)])

    return setup


def _writer_process(kind: str, url: str, prefix: str, n: int, ready: Any, go: Any, done: Any) -> None:
    """One writer process: its own connection, its ``n`` fresh pipelines, then (on ``go``)
    start, finish, succeed on each; reports its own CPU seconds."""
    if kind == "ours":
        engine = Engine(PipelineLifecycle, SqlStore(url, table_prefix=prefix, create=False), owner=OWNER)
        created = [engine.create() for _ in range(n)]

        def body() -> None:
            fire = engine.fire
            for snap in created:
                result = fire(snap, "start")
                result = fire(result, "finish")
                fire(result, "succeed", lease=result.lease)

    else:
        conn = _pg_connect(url, autocommit=True)
        raw = _RawPg(prefix)
        ids = raw.create(conn, n)

        def body() -> None:
            raw.run_cte(conn, ids)

    ready.put(None)
    go.wait()
    cpu = time.process_time()
    body()
    done.put(time.process_time() - cpu)


def _writer_processes(
    kind: str, url: str, prefix: str, procs: int, n: int, cpu: list[float]
) -> Callable[[], Callable[[], int]]:
    """``procs`` writer processes (spawned, set up untimed); the body lets them go and waits.
    Their CPU per fire is appended to ``cpu`` (the harness's own CPU column is the parent's)."""
    ctx = multiprocessing.get_context("spawn")

    def setup() -> Callable[[], int]:
        ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        workers = [
            ctx.Process(target=_writer_process, args=(kind, url, prefix, n, ready, go, done)) for _ in range(procs)
        ]
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=120)

        def body() -> int:
            go.set()
            seconds = sum(done.get(timeout=600) for _ in workers)
            for w in workers:
                w.join()
            cpu.append(seconds / (3 * n * procs) * 1e6)
            return 3 * n * procs

        return body

    return setup


def _postgres_suite(report: Report, url: str, n: int) -> None:
    from stores.sql.migrate import drop_schema

    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    store = SqlStore(url, table_prefix=prefix)
    raw = _RawPg(prefix)
    cte_conn, two_conn, toy_conn, id_conn = (_pg_connect(url, autocommit=a) for a in (True, False, True, True))
    try:
        ours = "fire/postgres (Engine.fire from held result)"
        by_id = "fire/postgres by id (Engine.fire(entity_id), no read)"
        cte = "raw psycopg CTE (one statement)"
        cte_id = "raw psycopg CTE by id (one statement, update by state)"
        two = "raw psycopg two statements (update, insert, commit)"
        toy = "toy limit psycopg (3-column update)"

        def raw_setup(conn: Any, run: Callable[[Any, list[str]], int]) -> Callable[[], Callable[[], int]]:
            def setup() -> Callable[[], int]:
                ids = raw.create(conn, n)
                return lambda: run(conn, ids)

            return setup

        report.measure(
            {
                ours: _fsm_fire(store, n),
                cte: raw_setup(cte_conn, raw.run_cte),
                two: raw_setup(two_conn, raw.run_two),
                by_id: _fsm_fire_by_id(store, n),
                cte_id: raw_setup(id_conn, raw.run_cte_by_id),
                toy: _toy_pg(toy_conn, n),
            }
        )
        report.ratio("postgres fire from a held result vs raw CTE", ours, cte, 0.9)
        report.ratio("postgres fire by id vs raw CTE by id", by_id, cte_id, 0.8)
        report.ratio("postgres fire vs raw two-statement", ours, two, 1.2)
        report.ratio("postgres fire vs toy 3-column limit", ours, toy, 0.0)
        per_writer = max(20, (2 * n) // 3)  # long enough rounds that thread start-up and scheduling noise average out
        for writers in WRITERS:
            w_ours = f"fire/postgres {writers} writers (Engine.fire from held result)"
            w_raw = f"raw psycopg CTE {writers} writers"
            report.measure(
                {w_ours: _writers_ours(store, writers, per_writer), w_raw: _writers_raw(url, raw, writers, per_writer)}
            )
            report.ratio(f"postgres {writers}-writer throughput vs raw CTE", w_ours, w_raw, 0.8)
        # threads share one interpreter (the GIL): the client's Python per fire is paid
        # serially; processes, as fsm workers are deployed, pay it in parallel
        procs = 8
        p_ours = f"fire/postgres {procs} writer processes (Engine.fire from held result)"
        p_raw = f"raw psycopg CTE {procs} writer processes"
        cpu_ours: list[float] = []
        cpu_raw: list[float] = []
        report.measure(
            {
                p_ours: _writer_processes("ours", url, store.table_prefix, procs, per_writer, cpu_ours),
                p_raw: _writer_processes("raw", url, store.table_prefix, procs, per_writer, cpu_raw),
            }
        )
        print(
            f"  writer processes' own cpu per fire (median): ours {statistics.median(cpu_ours):.1f} us,"
            f" raw {statistics.median(cpu_raw):.1f} us",
            flush=True,
        )
        report.ratio(f"postgres {procs}-writer-process throughput vs raw CTE", p_ours, p_raw, 0.8)
    finally:
        toy_conn.execute("DROP TABLE IF EXISTS fsm_bench_toy")
        for conn in (cte_conn, two_conn, toy_conn, id_conn):
            conn.close()
        drop_schema(store.engine, table_prefix=prefix)
        store.close()


def run(report: Report, *, pg_url: str | None = None, **_: object) -> None:
    print("sql: Engine.fire through SqlStore vs honest raw driver code (Pipeline start/finish/succeed)")
    _sqlite_suite(report, "NORMAL", 1000)
    _sqlite_suite(report, "FULL", 200)
    if pg_url is None:
        print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("sql postgres skipped: no URL given")
        return
    _postgres_suite(report, pg_url, 300)
