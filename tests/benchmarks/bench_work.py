"""The work path against pgqueuer (and oban, in the drain) on one PostgreSQL: enqueue, drain, idle pickup.

pgqueuer (the closest Python PostgreSQL queue: batched dequeue and acknowledgement,
heartbeats, LISTEN/NOTIFY) is the baseline of DESIGN section 11's work-path targets.
Both sides run on the same server, in the same database, interleaved round by round
(A B A B .., the order flipped each round), medians printed with their spread and the
machine's load (the machine is shared: a busy round shows in the spread).

- **enqueue**: one call per job (``Engine.create`` against ``Queries.enqueue`` of one
  job), and the list form (``Engine.create_many`` when the engine has it, against
  ``Queries.enqueue`` of a list);
- **drain**: ``JOBS`` no-op jobs, already queued, drained by 1 and by 4 worker processes
  (each its own process with its own connections, started and connected before the
  clock starts).  On our side the built-in ``JobLifecycle``, three transitions and their
  history per job (``start`` by the claim, ``exited``, ``complete``), run by

  - ``fsm.Worker`` as shipped (its defaults), two no-op handlers;
  - ``fsm.aio.AsyncWorker`` as shipped, on ``AsyncSqlStore`` (pgqueuer is asyncio too);
  - the raw claim loop: ``engine.claim(10)`` then two fires from the held result;
  - ``fsm.aio.AsyncWorker`` whose handler records the same three steps, against the
    plain ``AsyncWorker`` (target: at least 0.4x);
  - ``fsm.Worker`` whose ``running`` handler records three durable steps (``job.run``,
    each a write of its own under the lease) before it exits, against the plain worker
    (target: at least 0.4x: each step is one more guarded write and commit), and
    against DBOS's durable workflow of the same three steps (target: at least 7x): a
    ``@DBOS.workflow`` calling a ``@DBOS.step`` three times, enqueued on one queue by
    ``DBOSClient`` before the clock starts, worked by executors launched with DBOS's
    defaults (:mod:`dbos_child`, in a venv of its own made on first use at
    ``FSM_BENCH_DBOS_VENV``, default ``~/.cache/fsm-bench/dbos-venv``, with ``pip install
    dbos``; skipped with the reason when that fails); its queue is registered at ``go``,
    and a workflow is done when its row says ``SUCCESS``;
  - the limit of our own writes: a hand-written psycopg worker sending the statements
    the shipped worker sends (captured from it at each run), with no library Python
    between them (:mod:`work_limit`; target: the shipped worker at least 0.9x of it);

  pgqueuer's ``PgQueuer.run()`` with its defaults and one no-op entrypoint; and oban
  (the Python port of Oban): ``Oban(queues=...)`` with its defaults (one queue at the
  producer's default limit of 10, a pool of 1 to 10 connections) and one no-op
  ``@worker``, run as ``oban start`` runs it (uvloop, orjson) by :mod:`oban_child`.  oban
  needs Python 3.12 or newer, this project's 3.11: its worker processes run under an
  interpreter of their own, a venv made on first use at ``FSM_BENCH_OBAN_VENV``
  (default ``~/.cache/fsm-bench/oban-venv``) from ``FSM_BENCH_OBAN_PYTHON``, else
  ``python3.14`` .. ``python3.12`` on the PATH, else a pyenv one, with ``pip install
  oban``; with no such interpreter, or when the install fails, oban is skipped with the
  reason printed and the others run.  Its queue starts paused and ``go`` resumes it on
  each node (its jobs were queued before it started).  A round ends when the database
  says every job is done (our rows ``completed``; pgqueuer's queue table empty: its
  acknowledgement deletes the row; oban's rows ``completed``: it keeps them), polled
  every 5 ms on a connection of the parent's; a contender still short at ``CAP``
  seconds is stopped and its rate is what it finished by then (printed as "capped");
- **limited**: the same drain over jobs spread across 20 concurrency keys, with
  ``Limits(per_key=concurrency)`` (a limit that never binds one process: the cost of
  keeping it) and without (target: at least 0.8x);
- **idle pickup**: an idle worker process, then one job created at a time; the latency
  runs from just before the create call to the handler's first line (``time.monotonic``
  is one clock for every process on Linux), ``SAMPLES`` samples per round, a random
  pause between them so that a poll's phase is not always the same; p50 and p90 of all
  samples.

Each drain line gives the CPU per job of the worker processes and of the PostgreSQL
backends serving them, and the share of the queue table's updates that were HOT
(``pg_stat_user_tables``: an update that changes no indexed column and finds room in its
page writes no index entry, and its dead version is pruned without a vacuum).

Ratios are ours over pgqueuer's (rates; for pickup, pgqueuer's latency over ours, so
higher is better everywhere), and in the drain the shipped worker's over oban's (no
target: DESIGN's are against pgqueuer).  Needs the PostgreSQL URL (``--pg-url`` or
``FSM_BENCH_POSTGRES_URL``) and the ``bench`` extra (``pip install -e '.[bench]'``:
pgqueuer and asyncpg); the suite says what is missing and skips otherwise.  pgqueuer's
tables are made with a prefix of their own (``PGQUEUER_PREFIX``), oban's in a PostgreSQL
schema of their own (its ``prefix``), and both dropped after.
Run alone: ``python tests/benchmarks/run.py --only work --pg-url URL``; ``--rounds``,
``FSM_BENCH_WORK_JOBS`` / ``FSM_BENCH_WORK_CAP`` (seconds) to shorten a run, and
``FSM_BENCH_WORK_PARTS`` (``enqueue,drain,limited,pickup``) to run some parts only,
``FSM_BENCH_WORK_MODES`` (``worker,aio,loop,steps``) to drain with some of ours only.
"""

from __future__ import annotations

import asyncio
import glob
import json
import multiprocessing
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from harness import Measurement, Report, load
from work_limit import capture, limit_child

JOBS = int(os.environ.get("FSM_BENCH_WORK_JOBS", "5000"))
CAP = float(os.environ.get("FSM_BENCH_WORK_CAP", "10"))
PARTS = os.environ.get("FSM_BENCH_WORK_PARTS", "enqueue,drain,limited,pickup").split(",")
ENQUEUE_ONE = 500
SAMPLES = 8
POLL_DONE = 0.005
PROCS = (1, 4)
FSM_MODES = tuple(os.environ.get("FSM_BENCH_WORK_MODES", "worker,aio,loop,steps,aiosteps").split(","))
"""Our drain contenders (``FSM_BENCH_WORK_MODES``; the limit and pgqueuer always run)."""
STEPS = 3
"""Durable steps per job of the ``steps`` contender (``job.run`` effects, each recorded)."""
LABEL = {
    "worker": "fsm.Worker (shipped defaults)",
    "steps": f"fsm.Worker, {STEPS} durable steps per job",
    "aio": "fsm.aio.AsyncWorker (shipped defaults)",
    "aiosteps": f"fsm.aio.AsyncWorker, {STEPS} durable steps per job",
    "loop": "fsm raw claim loop (claim 10 + 2 fires held)",
    "pgq": "pgqueuer PgQueuer.run() (defaults)",
    "keyed": "fsm.Worker, no limit",
    "limited": "fsm.Worker, Limits(per_key=its concurrency)",
    "limit": "limit: hand-written psycopg, the worker's statements",
    "oban": "oban Oban(), one queue (defaults: limit 10)",
    "dbos": f"DBOS workflow of {STEPS} @DBOS.step calls (one queue, defaults)",
}
KEYS = 20
"""The concurrency keys of the limited drain's jobs."""
HERE = os.path.dirname(os.path.abspath(__file__))
OBAN_CHILD = os.path.join(HERE, "oban_child.py")
"""oban's worker process, run by a Python 3.12+ interpreter of its own (oban needs 3.12)."""
OBAN_VENV = os.environ.get("FSM_BENCH_OBAN_VENV") or os.path.join(
    os.path.expanduser("~"), ".cache", "fsm-bench", "oban-venv"
)


DBOS_CHILD = os.path.join(HERE, "dbos_child.py")
"""DBOS's executor process, run by an interpreter of its own (DBOS's dependencies stay out of ours)."""
DBOS_VENV = os.environ.get("FSM_BENCH_DBOS_VENV") or os.path.join(
    os.path.expanduser("~"), ".cache", "fsm-bench", "dbos-venv"
)


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


# -- oban's interpreter ----------------------------------------------------------------------


def _is_312(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
            check=False,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _python_312() -> str | None:
    """A Python 3.12 or newer: ``FSM_BENCH_OBAN_PYTHON``, else ``python3.14`` .. ``python3.12``
    on the PATH, else a pyenv one (``$PYENV_ROOT`` or ``~/.pyenv``)."""
    given = os.environ.get("FSM_BENCH_OBAN_PYTHON")
    candidates = [given] if given else []
    candidates += [found for name in ("python3.14", "python3.13", "python3.12") if (found := shutil.which(name))]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions", "3.1[2-9]*", "bin", "python")), reverse=True)
    return next((c for c in candidates if _is_312(c)), None)


def _oban_python() -> tuple[str | None, str]:
    """The interpreter of oban's own virtual environment (``OBAN_VENV``), made and given
    oban (and its psycopg driver, a dependency of it) on first use; or None and why not."""
    python = os.path.join(OBAN_VENV, "bin", "python")
    if (
        os.path.exists(python)
        and subprocess.run([python, "-c", "import oban"], check=False, capture_output=True).returncode == 0
    ):
        return python, f"venv {OBAN_VENV}"
    base = _python_312()
    if base is None:
        return None, (
            "no Python 3.12 or newer found (oban needs one: set FSM_BENCH_OBAN_PYTHON, or put python3.12 on the PATH)"
        )
    print(f"  making oban's venv with {base} at {OBAN_VENV} (pip install oban) ...", flush=True)
    return _made_venv(base, OBAN_VENV, ["oban"])


def _dbos_python() -> tuple[str | None, str]:
    """The interpreter of DBOS's own virtual environment (``DBOS_VENV``), made with this
    Python and given DBOS on first use; or None and why not."""
    python = os.path.join(DBOS_VENV, "bin", "python")
    if (
        os.path.exists(python)
        and subprocess.run([python, "-c", "import dbos"], check=False, capture_output=True).returncode == 0
    ):
        return python, f"venv {DBOS_VENV}"
    print(f"  making DBOS's venv at {DBOS_VENV} (pip install dbos) ...", flush=True)
    return _made_venv(sys.executable, DBOS_VENV, ["dbos", "psycopg[binary]"])


def _made_venv(base: str, venv: str, packages: list[str]) -> tuple[str | None, str]:
    """A venv at ``venv`` made by ``base`` with ``packages`` installed: its interpreter, or
    None and the failing step's last error line."""
    python = os.path.join(venv, "bin", "python")
    for step in ([base, "-m", "venv", venv], [python, "-m", "pip", "install", "-q", *packages]):
        done = subprocess.run(step, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            why = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1])
            return None, f"`{' '.join(step)}` failed: {why}"
    return python, f"venv {venv}, made now"


# -- the children ------------------------------------------------------------------------


def _fsm_child(
    url: str, prefix: str, mode: str, ready: Any, go: Any, stop: Any, picked: Any, knobs: dict[str, Any]
) -> None:
    """One worker process of ours: ``mode`` is ``worker``, ``aio`` or ``loop``."""
    from fsm import Engine, JobLifecycle

    def first_line(job: Any) -> None:
        if picked is not None:
            picked.put(time.monotonic())

    if mode in ("aio", "aiosteps"):
        _fsm_aio_child(url, prefix, ready, go, stop, first_line, knobs, STEPS if mode == "aiosteps" else 0)
        return
    from fsm.work import Worker
    from stores.sql import SqlStore

    store = SqlStore(url, table_prefix=prefix, create=False)
    engine = Engine(JobLifecycle, store)
    store.now()  # connected before the clock starts
    ready.put(os.getpid())
    go.wait()
    if mode in ("worker", "keyed", "limited", "steps"):
        steps = STEPS if mode == "steps" else 0

        def running(job: Any) -> str:
            first_line(job)
            for i in range(steps):  # each: run, then recorded under the lease (its own write)
                job.run(f"step-{i}", lambda key: {"ok": True})
            return "exited"

        if mode == "limited":  # a per-key limit at the worker's concurrency: it never binds one process
            from fsm import Limits
            from fsm.work.loop import DEFAULT_CONCURRENCY

            knobs = {**knobs, "limits": Limits(per_key=knobs.get("concurrency", DEFAULT_CONCURRENCY))}
        worker = Worker(engine, {"running": running, "finalizing": lambda job: "complete"}, **knobs)
        threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
        worker.run(install_signals=False)
    else:
        while not stop.is_set():
            claimed = engine.claim(10)
            if not claimed:
                time.sleep(0.005)
            for snap in claimed:
                first_line(snap)
                exited = engine.fire(snap, "exited", lease=snap.lease)
                engine.fire(exited, "complete", lease=snap.lease)
    store.close()


def _fsm_aio_child(
    url: str,
    prefix: str,
    ready: Any,
    go: Any,
    stop: Any,
    first_line: Callable[[Any], None],
    knobs: dict[str, Any],
    steps: int = 0,
) -> None:
    from fsm import AsyncEngine, JobLifecycle
    from fsm.aio import AsyncWorker
    from stores.aio import AsyncSqlStore

    async def main() -> None:
        store = AsyncSqlStore(url, table_prefix=prefix, create=False)
        engine = AsyncEngine(JobLifecycle, store)
        await store.now()
        ready.put(os.getpid())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, go.wait)

        async def running(job: Any) -> str:
            first_line(job)
            for i in range(steps):  # each: run, then recorded under the lease
                await job.run(f"step-{i}", lambda key: {"ok": True})
            return "exited"

        async def finalizing(job: Any) -> str:
            return "complete"

        worker = AsyncWorker(engine, {"running": running, "finalizing": finalizing}, **knobs)
        task = asyncio.create_task(worker.run())
        await loop.run_in_executor(None, stop.wait)
        await worker.stop()
        await task
        await store.close()

    asyncio.run(main())


def _pgq_child(url: str, ready: Any, go: Any, stop: Any, picked: Any) -> None:
    """One pgqueuer worker process: ``PgQueuer.run()`` with its defaults."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    async def main() -> None:
        conn = await asyncpg.connect(dsn=_plain(url))
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("fetch")
        async def fetch(job: Any) -> None:
            if picked is not None:
                picked.put(time.monotonic())

        ready.put(os.getpid())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, go.wait)
        task = asyncio.create_task(pgq.run())
        await loop.run_in_executor(None, stop.wait)
        pgq.shutdown.set()
        await task
        await conn.close()

    asyncio.run(main())


# -- the tables ----------------------------------------------------------------------------


class _Tables:
    """Our tables (a prefix of their own) and pgqueuer's (``PGQUEUER_PREFIX``), one database."""

    def __init__(self, url: str) -> None:
        import psycopg

        from stores.sql import SqlStore

        self.url = url
        tag = uuid.uuid4().hex[:6]
        self.prefix = f"benchw{tag}_"
        self.pgq_prefix = f"benchq{tag}_"
        os.environ["PGQUEUER_PREFIX"] = self.pgq_prefix  # read by pgqueuer here and in the children
        SqlStore(url, table_prefix=self.prefix).close()
        self.conn = psycopg.connect(_plain(url), autocommit=True)
        self.runner = asyncio.Runner()
        self.queries: Any = self.runner.run(self._pgq_install())
        self.own_backends = {
            int(self.conn.info.backend_pid),
            int(self.runner.run(self.apg.fetchval("SELECT pg_backend_pid()"))),
        }
        """The parent's own connections: their backends' CPU is not the workers'."""
        self._statements: dict[str, Any] | None = None
        self.oban_python: str | None = None
        """oban's interpreter once :meth:`install_oban` installed its schema; None: no oban."""
        self.oban_schema = f"bencho{tag}"
        self.oban_worker = ""
        self.oban_version = ""
        self.dbos_python: str | None = None
        """DBOS's interpreter once :meth:`install_dbos` made its system tables; None: no DBOS."""
        self.dbos_schema = f"benchd{tag}"

    def install_oban(self) -> str:
        """oban's tables in a PostgreSQL schema of their own (its ``prefix``; installed with
        that schema first on the search path, so that its one unprefixed object, a counting
        function, lands there too); what was found, or the reason oban is skipped."""
        python, where = _oban_python()
        if python is None:
            return f"oban: skipped ({where})"
        done = subprocess.run(
            [python, OBAN_CHILD, "info", self.oban_schema], check=False, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            return f"oban: skipped (its interpreter could not load it: {tail[0]})"
        info = json.loads(done.stdout)
        s = self.oban_schema
        try:
            self.conn.execute(f"CREATE SCHEMA {s}")
            self.conn.execute(f"SET search_path TO {s}, public")
            try:
                self.conn.execute(info["install"])
            finally:
                self.conn.execute("RESET search_path")
        except Exception as err:
            self.conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
            return f"oban: skipped (its schema did not install: {err})"
        self.oban_python, self.oban_worker, self.oban_version = python, info["worker"], info["version"]
        return f"oban {info['version']} on Python {info['python']} ({where}), schema {s}"

    def install_dbos(self) -> str:
        """DBOS's system tables in a PostgreSQL schema of their own (its ``dbos_system_schema``,
        made by a first launch); what was found, or the reason DBOS is skipped."""
        python, where = _dbos_python()
        if python is None:
            return f"DBOS: skipped ({where})"
        done = subprocess.run(
            [python, DBOS_CHILD, "info", _plain(self.url), self.dbos_schema],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            self.conn.execute(f"DROP SCHEMA IF EXISTS {self.dbos_schema} CASCADE")
            return f"DBOS: skipped (its interpreter could not launch it: {tail[0]})"
        info = json.loads(done.stdout.strip().splitlines()[-1])
        self.dbos_python = python
        return f"DBOS {info['version']} on Python {info['python']} ({where}), schema {self.dbos_schema}"

    @property
    def dbos_workflows(self) -> str:
        return f"{self.dbos_schema}.workflow_status"

    def fill_dbos(self, n: int) -> None:
        """``n`` workflows enqueued by DBOS's own client (before the clock starts)."""
        assert self.dbos_python is not None
        subprocess.run(
            [self.dbos_python, DBOS_CHILD, "enqueue", _plain(self.url), self.dbos_schema, str(n)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        self.conn.execute(f"VACUUM ANALYZE {self.dbos_workflows}")

    def dbos_left(self) -> int:
        """DBOS keeps a finished workflow's row: done is ``SUCCESS``."""
        row = self.conn.execute(f"SELECT count(*) FROM {self.dbos_workflows} WHERE status <> 'SUCCESS'").fetchone()
        return int(row[0]) if row else 0

    def statements(self) -> dict[str, Any]:
        """The shipped worker's statements (:func:`work_limit.capture`), captured once."""
        if self._statements is None:
            self.reset()
            self._statements = capture(self.url, self.prefix)
        return self._statements

    def updates(self, table: str) -> tuple[int, int]:
        """``table``'s updates so far (``schema.table`` for one outside the search path),
        and how many of them were HOT (every backend's counts, flushed when it ends: read
        after the round's processes are gone)."""
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        schema, _, name = table.rpartition(".")
        row = self.conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s"
            " AND schemaname = coalesce(nullif(%s, ''), current_schema())",
            (name, schema),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def _pgq_install(self) -> Any:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.apg = await asyncpg.connect(dsn=_plain(self.url))
        queries = Queries(AsyncpgDriver(self.apg))
        await queries.install()
        return queries

    @property
    def pgq_queue(self) -> str:
        return f"{self.pgq_prefix}pgqueuer"

    def reset(self) -> None:
        p = self.prefix
        self.conn.execute(f"TRUNCATE {p}history, {p}effects, {p}entities")
        self.conn.execute(f"TRUNCATE {self.pgq_queue}, {self.pgq_prefix}pgqueuer_log")
        if self.oban_python is not None:
            o = self.oban_schema
            self.conn.execute(f"TRUNCATE {o}.oban_jobs, {o}.oban_leaders, {o}.oban_producers")
        if self.dbos_python is not None:  # the queue's row too: an executor works the queue once told ("go")
            self.conn.execute(f"TRUNCATE {self.dbos_workflows}, {self.dbos_schema}.queues CASCADE")

    def fill_fsm(self, n: int, keys: int = 0) -> None:
        """``n`` queued jobs, due in id order; ``keys``: spread over that many concurrency keys."""
        key = f"'key-' || (i %% {keys})" if keys else "NULL"
        self.conn.execute(
            f"""INSERT INTO {self.prefix}entities (id, kind, state, version, lease_token, state_entered_at,
                    created_at, updated_at, deleted, concurrency_key, attempt, reclaims, data, run_after)
                SELECT 'job-' || lpad(i::text, 7, '0'), 'job', 'queued', 0, 0, now(), now(),
                    now() - (interval '1 microsecond' * (%s - i)), false, {key}, 0, 0, '{{}}'::jsonb,
                    now() - (interval '1 microsecond' * (%s - i))
                FROM generate_series(1, %s) AS i""",
            (n, n, n),
        )
        self.conn.execute(f"VACUUM ANALYZE {self.prefix}entities")

    def fill_pgq(self, n: int) -> None:
        self.runner.run(self.queries.enqueue(["fetch"] * n, [b""] * n, [0] * n))
        self.conn.execute(f"VACUUM ANALYZE {self.pgq_queue}")

    @property
    def oban_jobs(self) -> str:
        return f"{self.oban_schema}.oban_jobs"

    def fill_oban(self, n: int) -> None:
        """``n`` available jobs of the no-op worker in one statement, every other column at
        its default (the values ``Noop.new()`` gives: queue ``default``, priority 0, 20
        attempts, scheduled now)."""
        self.conn.execute(
            f"INSERT INTO {self.oban_jobs} (worker) SELECT %s FROM generate_series(1, %s)", (self.oban_worker, n)
        )
        self.conn.execute(f"VACUUM ANALYZE {self.oban_jobs}")

    def oban_left(self) -> int:
        """oban keeps a finished job's row: done is ``completed``."""
        row = self.conn.execute(f"SELECT count(*) FROM {self.oban_jobs} WHERE state <> 'completed'").fetchone()
        return int(row[0]) if row else 0

    def fsm_left(self) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {self.prefix}entities WHERE state <> 'completed'").fetchone()
        return int(row[0]) if row else 0

    def pgq_left(self) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {self.pgq_queue}").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        from stores.sql import create_engine
        from stores.sql.migrate import drop_schema

        try:
            if self.oban_python is not None:
                self.conn.execute(f"DROP SCHEMA {self.oban_schema} CASCADE")
            self.conn.execute(f"DROP SCHEMA IF EXISTS {self.dbos_schema} CASCADE")
            self.runner.run(self.queries.uninstall())
            self.runner.run(self.apg.close())
        finally:
            self.runner.close()
            self.conn.close()
            engine = create_engine(self.url)
            drop_schema(engine, table_prefix=self.prefix)
            engine.dispose()


# -- rounds --------------------------------------------------------------------------------


class _Procs:
    """Worker processes started and connected; ``go`` starts them, ``stop`` ends them."""

    def __init__(self, target: Callable[..., None], args: Callable[[Any, Any, Any], tuple[Any, ...]], n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.go, self.stop = ctx.Queue(), ctx.Event(), ctx.Event()
        self.procs = [ctx.Process(target=target, args=args(self.ready, self.go, self.stop)) for _ in range(n)]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            self.ready.get(timeout=120)

    def end(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()


class _ChildProcs:
    """A peer's worker processes under its own interpreter (:mod:`oban_child`,
    :mod:`dbos_child`: their pids are the interpreters', whose CPU is read as the others'),
    started and settled; the gates are lines on their stdin: ``go`` starts them, ``stop``
    ends them."""

    def __init__(self, python: str, child: str, url: str, schema: str, n: int) -> None:
        self.procs = [
            subprocess.Popen(
                [python, child, "work", _plain(url), schema],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        self.go = self
        try:
            for p in self.procs:
                assert p.stdout is not None
                if not select.select([p.stdout], [], [], 120)[0] or p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a worker process of {child} did not start (exit code {p.poll()})")
        except BaseException:
            self.end()
            raise

    def _say(self, line: str) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.write(line + "\n")
                p.stdin.flush()
            except (OSError, ValueError):  # gone, or its pipe closed
                pass

    def set(self) -> None:
        """``go``: every process resumes its queue."""
        self._say("go")

    def end(self) -> None:
        self._say("stop")
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()


Round = Callable[[], tuple[int, float, dict[str, Any]]]


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process spent so far; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class _CpuMeter:
    """Where a drain round's CPU goes: the worker processes (the client: both faces'
    Python) and the PostgreSQL backends serving them (every backend of the database but
    the parent's own), read from ``/proc`` at the start and at the end of the clock (a
    quiet machine: another client of the same database would count as server time).
    Together they bound the rate: on 2 cores, jobs/s <= 2 / (client + server per job)."""

    def __init__(self, tables: _Tables, procs: _Procs | _ChildProcs) -> None:
        self.tables, self.procs = tables, procs
        self.start = self._read()

    def _backends(self) -> list[int]:
        rows = self.tables.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
        ).fetchall()
        return [int(r[0]) for r in rows if int(r[0]) not in self.tables.own_backends]

    def _read(self) -> dict[str, dict[int, float]]:
        return {
            "client": {p.pid: _proc_cpu(p.pid) for p in self.procs.procs if p.pid is not None},
            "server": {pid: _proc_cpu(pid) for pid in self._backends()},
        }

    def spent(self) -> tuple[float, float]:
        """CPU seconds the workers and their backends spent since the start."""
        end = self._read()
        out = []
        for side in ("client", "server"):
            out.append(sum(max(0.0, t - self.start[side].get(pid, 0.0)) for pid, t in end[side].items()))
        return out[0], out[1]


def _drain_round(tables: _Tables, who: str, n: int) -> Round:
    def one() -> tuple[int, float, dict[str, Any]]:
        statements = tables.statements() if who == "limit" else None
        tables.reset()
        queue = {"pgq": tables.pgq_queue, "oban": tables.oban_jobs, "dbos": tables.dbos_workflows}.get(
            who, f"{tables.prefix}entities"
        )
        procs: _Procs | _ChildProcs
        if who == "pgq":
            tables.fill_pgq(JOBS)
            procs = _Procs(_pgq_child, lambda r, g, s: (tables.url, r, g, s, None), n)
            left = tables.pgq_left
        elif who == "oban":
            assert tables.oban_python is not None
            tables.fill_oban(JOBS)
            procs = _ChildProcs(tables.oban_python, OBAN_CHILD, tables.url, tables.oban_schema, n)
            left = tables.oban_left
        elif who == "dbos":
            assert tables.dbos_python is not None
            tables.fill_dbos(JOBS)
            procs = _ChildProcs(tables.dbos_python, DBOS_CHILD, tables.url, tables.dbos_schema, n)
            left = tables.dbos_left
        elif who == "limit":
            from fsm.work.loop import DEFAULT_CONCURRENCY

            tables.fill_fsm(JOBS)
            procs = _Procs(limit_child, lambda r, g, s: (tables.url, statements, r, g, s, DEFAULT_CONCURRENCY), n)
            left = tables.fsm_left
        else:
            tables.fill_fsm(JOBS, keys=KEYS if who in ("keyed", "limited") else 0)
            procs = _Procs(_fsm_child, lambda r, g, s: (tables.url, tables.prefix, who, r, g, s, None, {}), n)
            left = tables.fsm_left
        updates_before = tables.updates(queue)
        try:
            cpu = _CpuMeter(tables, procs)
            started = time.perf_counter()
            procs.go.set()
            remaining = JOBS
            while remaining and time.perf_counter() - started < CAP:
                time.sleep(POLL_DONE)
                remaining = left()
            elapsed = time.perf_counter() - started
            client, server = cpu.spent()
        finally:
            procs.end()
        time.sleep(0.3)  # the backends' counts are flushed as they exit
        updates, hot = (a - b for a, b in zip(tables.updates(queue), updates_before, strict=True))
        extra = {"capped": remaining > 0, "client_cpu": client, "server_cpu": server, "updates": updates, "hot": hot}
        return JOBS - remaining, elapsed, extra

    return one


def _pickup_round(tables: _Tables, who: str, samples: list[float]) -> Round:
    def one() -> tuple[int, float, dict[str, Any]]:
        tables.reset()
        ctx = multiprocessing.get_context("spawn")
        picked = ctx.Queue()
        if who == "pgq":
            procs = _Procs(_pgq_child, lambda r, g, s: (tables.url, r, g, s, picked), 1)
        else:
            procs = _Procs(_fsm_child, lambda r, g, s: (tables.url, tables.prefix, who, r, g, s, picked, {}), 1)
        from fsm import Engine, JobLifecycle
        from stores.sql import SqlStore

        store = SqlStore(tables.url, table_prefix=tables.prefix, create=False)
        engine = Engine(JobLifecycle, store)
        store.now()
        mine: list[float] = []
        try:
            procs.go.set()
            time.sleep(0.5)  # let the worker settle into its idle wait
            for _ in range(SAMPLES):
                time.sleep(random.uniform(0.2, 0.6))
                if who == "pgq":
                    t0 = time.monotonic()
                    tables.runner.run(tables.queries.enqueue("fetch", b"", 0))
                else:
                    t0 = time.monotonic()
                    engine.create()
                mine.append(picked.get(timeout=60) - t0)
        finally:
            procs.end()
            store.close()
        samples.extend(mine)
        return len(mine), statistics.median(mine), {}

    return one


def _enqueue_round(tables: _Tables, who: str, many: bool) -> Round | None:
    from fsm import Engine, JobLifecycle
    from stores.sql import SqlStore

    store = SqlStore(tables.url, table_prefix=tables.prefix, create=False)
    engine = Engine(JobLifecycle, store)
    if many and who != "pgq" and not hasattr(engine, "create_many"):
        store.close()
        return None

    def one() -> tuple[int, float, dict[str, Any]]:
        tables.reset()
        n = JOBS if many else ENQUEUE_ONE
        q = tables.queries
        started = time.perf_counter()
        if who == "pgq" and many:
            tables.runner.run(q.enqueue(["fetch"] * n, [b""] * n, [0] * n))
        elif who == "pgq":

            async def each() -> None:
                for _ in range(n):
                    await q.enqueue("fetch", b"", 0)

            tables.runner.run(each())
        elif many:
            engine.create_many([{} for _ in range(n)])  # type: ignore[attr-defined]
        else:
            for _ in range(n):
                engine.create()
        return n, time.perf_counter() - started, {}

    return one


def _interleave(report: Report, contenders: dict[str, Round], unit: str = "jobs") -> dict[str, Measurement]:
    """Rounds interleaved and flipped (the harness's rule); each round times itself, so a
    worker process's start and stop stay out of the clock."""
    rounds = report.default_rounds
    seen: dict[str, list[tuple[int, float, dict[str, Any]]]] = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(rounds):
        for name in order if r % 2 == 0 else list(reversed(order)):
            seen[name].append(contenders[name]())
    now = load()
    found: dict[str, Measurement] = {}
    for name in order:
        rows = seen[name]
        rates = sorted(rows, key=lambda row: row[0] / row[1] if row[1] else 0.0)
        ops, secs, extra = rates[len(rates) // 2]  # the median round by rate
        m = Measurement(name, ops, secs, [row[1] * ops / max(row[0], 1) for row in rows], now)
        report.measurements[name] = found[name] = m
        capped = sum(1 for row in rows if row[2].get("capped"))
        note = f"  capped at {CAP:.0f} s in {capped}/{rounds} rounds ({ops:,} of {JOBS:,} done)" if capped else ""
        if unit == "jobs":
            cpu = ""
            if "client_cpu" in extra and ops:
                cpu = (
                    f"  cpu/job: workers {extra['client_cpu'] / ops * 1e3:.3f} ms,"
                    f" server {extra['server_cpu'] / ops * 1e3:.3f} ms"
                )
                report.notes.append(
                    f"{name}: cpu/job workers {extra['client_cpu'] / ops * 1e3:.3f} ms,"
                    f" server {extra['server_cpu'] / ops * 1e3:.3f} ms"
                )
            if extra.get("updates"):
                cpu += f"  HOT {extra['hot'] / extra['updates']:.0%} of {extra['updates']:,} updates"
            print(f"  {name:<66} {m.rate:>9,.0f} jobs/s  spread {m.spread}{cpu}{note}", flush=True)
    print(f"    ({rounds} rounds interleaved, order flipped each round; {now})", flush=True)
    return found


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(report: Report, *, pg_url: str | None = None, **_: object) -> None:
    print(f"work: enqueue, drain {JOBS:,} no-op jobs with 1 and 4 processes, idle pickup; against pgqueuer and oban")
    if pg_url is None:
        print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("work skipped: no URL given")
        return
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError as err:
        print(f"  skipped: {err} (install the bench extra: pip install -e '.[bench]')")
        report.notes.append(f"work skipped: {err}")
        return
    from importlib.metadata import version

    print(f"  pgqueuer {version('pgqueuer')}, asyncpg {version('asyncpg')}; {load()}", flush=True)
    tables = _Tables(pg_url)
    try:
        if "drain" in PARTS:
            found = tables.install_oban()
            print(f"  {found}", flush=True)
            report.notes.append(f"work: {found}")
            if "steps" in FSM_MODES:  # DBOS's durable workflow against our durable job
                found = tables.install_dbos()
                print(f"  {found}", flush=True)
                report.notes.append(f"work: {found}")
        for part, measure in (("enqueue", _enqueue), ("drain", _drain), ("limited", _limited), ("pickup", _pickup)):
            if part in PARTS:
                measure(report, tables)
    finally:
        tables.close()


def _enqueue(report: Report, tables: _Tables) -> None:
    print(f"  enqueue, one call per job ({ENQUEUE_ONE} jobs a round):")
    one = {
        "enqueue one/fsm Engine.create": _enqueue_round(tables, "fsm", False),
        "enqueue one/pgqueuer Queries.enqueue(one)": _enqueue_round(tables, "pgq", False),
    }
    _interleave(report, {k: v for k, v in one.items() if v is not None})
    report.ratio("enqueue one call per job: fsm vs pgqueuer", *one, 1.0)  # type: ignore[call-arg]
    print(f"  enqueue, list form ({JOBS:,} jobs in one call):")
    many = {
        "enqueue list/fsm Engine.create_many": _enqueue_round(tables, "fsm", True),
        "enqueue list/pgqueuer Queries.enqueue(lists)": _enqueue_round(tables, "pgq", True),
    }
    _interleave(report, {k: v for k, v in many.items() if v is not None})
    if many["enqueue list/fsm Engine.create_many"] is None:
        print("  RATIO create_many vs pgqueuer batch enqueue: n/a (the engine has no create_many) SHORT")
        report.notes.append("work: no create_many to measure")
    else:
        report.ratio("create_many vs pgqueuer batch enqueue", *many, 1.0)  # type: ignore[call-arg]


def _drain(report: Report, tables: _Tables) -> None:
    for n in PROCS:
        print(f"  drain {JOBS:,} no-op jobs, {n} worker process{'es' if n > 1 else ''}:", flush=True)
        oban = ("oban",) if tables.oban_python is not None else ()
        dbos = ("dbos",) if tables.dbos_python is not None and "steps" in FSM_MODES else ()
        names = {who: f"drain {n}p/{LABEL[who]}" for who in ("pgq", *oban, *FSM_MODES, *dbos, "limit")}
        _interleave(report, {names[who]: _drain_round(tables, who, n) for who in names})
        for who in FSM_MODES:
            if who == "aiosteps":  # the asyncio face's durable job against its plain one
                if "aio" in names:
                    report.ratio(f"drain {n}p: {LABEL[who]} vs plain jobs", names[who], names["aio"], 0.4)
                continue
            if who == "steps":  # a durable job against a plain one: each step is one more write
                if "worker" in names:
                    report.ratio(f"drain {n}p: {LABEL[who]} vs plain jobs", names[who], names["worker"], 0.4)
                if dbos:  # the same three recorded steps, DBOS's way
                    report.ratio(f"drain {n}p: {LABEL[who]} vs {LABEL['dbos']}", names[who], names["dbos"], 7.0)
                continue
            target = 1.0 if who == "worker" else 0.0
            report.ratio(f"drain {n}p: {LABEL[who]} vs pgqueuer", names[who], names["pgq"], target)
        if oban and "worker" in names:  # the efficiency target: at least as fast as each peer
            report.ratio(f"drain {n}p: {LABEL['worker']} vs oban", names["worker"], names["oban"], 1.0)
        if "worker" in names:
            report.ratio(
                f"drain {n}p: {LABEL['worker']} vs the limit of its writes", names["worker"], names["limit"], 0.9
            )


def _limited(report: Report, tables: _Tables) -> None:
    """The drain with a per-key limit at the worker's concurrency (so the limit never binds
    one process: what is measured is what keeping it costs) next to the same drain without
    one, over the same jobs spread across ``KEYS`` keys."""
    for n in PROCS:
        print(f"  drain {JOBS:,} no-op jobs over {KEYS} keys, {n} worker process{'es' if n > 1 else ''}:", flush=True)
        names = {who: f"drain {n}p/{LABEL[who]}" for who in ("keyed", "limited")}
        _interleave(report, {names[who]: _drain_round(tables, who, n) for who in names})
        report.ratio(f"drain {n}p: per-key limit vs no limit", names["limited"], names["keyed"], 0.8)


def _pickup(report: Report, tables: _Tables) -> None:
    print(f"  idle pickup, create -> handler's first line ({SAMPLES} samples a round):", flush=True)
    whos = ("pgq", "worker", "aio")
    samples: dict[str, list[float]] = {who: [] for who in whos}
    names = {who: f"pickup/{LABEL[who]}" for who in whos}
    _interleave(report, {names[who]: _pickup_round(tables, who, samples[who]) for who in whos}, unit="pickup")
    p50: dict[str, float] = {}
    for who in whos:
        got = samples[who]
        p50[who] = _percentile(got, 0.5)
        print(
            f"  {names[who]:<66} p50 {p50[who] * 1000:7.1f} ms  p90 {_percentile(got, 0.9) * 1000:7.1f} ms"
            f"  max {max(got) * 1000:7.1f} ms  ({len(got)} samples)",
            flush=True,
        )
        report.notes.append(f"pickup {who}: p50 {p50[who] * 1000:.1f} ms, p90 {_percentile(got, 0.9) * 1000:.1f} ms")
    for who in ("worker", "aio"):
        value = p50["pgq"] / p50[who] if p50[who] else float("inf")
        meets = value >= 1.0
        target = 1.0 if who == "worker" else 0.0
        print(
            f"  RATIO idle pickup p50: pgqueuer's / {LABEL[who]}'s: {value:.2f}x (target >= {target}x) "
            f"{'OK' if value >= target else 'SHORT'}",
            flush=True,
        )
        report.notes.append(f"pickup ratio {who}: {value:.3f} (meets 1.0: {meets})")


__all__ = ["run"]
