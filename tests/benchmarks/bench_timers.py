"""Timed transitions: 10,000 timers falling due together, fired by a started reaper.

    python tests/benchmarks/run.py --only timers [--pg-url URL]

Two parts, on SQLite (a WAL file) and, with ``--pg-url``, on PostgreSQL:

- lateness: a ``Reaper`` with the default config (a five-minute interval: its loop must
  sleep until the timers, :meth:`fsm.reaping.Reaper.sleep_for`) is started, then 10,000
  entities of a lifecycle whose initial state times out after 10 s are created with
  ``Engine.create_many`` (10 calls of 1,000, a fraction of a second in all: their
  ``timer_since`` is set by the store at creation, never by this script).  Each timer's
  lateness is its ``timeout`` history row's ``at`` minus ``timer_since + after``, both
  the store's own times (PostgreSQL: the server's ``statement_timestamp()``); printed:
  p50, p99, max (target: p99 under 1 s), how long after the first timer fell due the
  last one fired, the loop's ticks and the client's CPU time over that stretch;
- cost: ``Reaper.run_once`` firing 1,000 due timers (among 9,000 waiting ones not yet
  due) against the honest baseline on an identical copy of the tables (same DDL and
  indexes, same rows): one set-based ``UPDATE .. SET state, version + 1, timer_since =
  NULL, state_entered_at, updated_at WHERE kind AND state AND NOT deleted AND timer_since
  <= now - after RETURNING id`` issued by the raw driver (sqlite3, psycopg), bare and with
  the history rows the library writes per move (PostgreSQL: one CTE statement; SQLite:
  the update and one batched insert in one ``BEGIN IMMEDIATE`` transaction).  The due
  rows are put back (untimed) before every round; PostgreSQL vacuums both tables then,
  as the reaper benchmark does.  Each contender runs one untimed round first.  Client CPU
  on SQLite includes the database engine itself (it runs in process).

The cost ratio's target is the reaper tick's (``bench_reaper``): within 1.5x of the
set-based limit with history rows.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import Measurement, Report, load
from statemachine import State

from fsm import Engine, Lifecycle, reaper, starts, worker
from fsm.reaping import Reaper
from stores.sql import SqlStore
from stores.sql.schema import decode_time, encode_sqlite_time

COUNT = 10_000
BATCH = 1_000
AFTER = timedelta(seconds=10)
FIRE = 1_000
WAITING = 9_000
DEADLINE = timedelta(hours=1)
TARGET_P99 = 1.0
TARGET_COST = 1.5


class Timed(Lifecycle):
    """Waits for a start that never comes; times out after 10 s (the lateness part)."""

    kind = "timed"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    timeout = reaper(waiting.to(failed), after=AFTER, reason="timed out")


class Deadline(Lifecycle):
    """The same chart with an hour's timer (the cost part: due rows are set two hours back)."""

    kind = "deadline"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    timeout = reaper(waiting.to(failed), after=DEADLINE, reason="timed out")


class Backend:
    """One database: the library's tables (``lib``) and an identical copy (``raw``) that
    the raw driver fires on."""

    name: str
    store: SqlStore
    lib: str
    raw: str
    conn: Any

    def query(self, sql: str, params: Any = ()) -> list[Any]: ...
    def write(self, *statements: str) -> None: ...
    def reset(self, prefix: str) -> None: ...
    def raw_update(self) -> int: ...
    def raw_update_history(self) -> int: ...
    def close(self) -> None: ...

    def copy_tables(self) -> None:
        """The copy gets the library tables' rows (same DDL and indexes: a store made it)."""
        self.write(
            f"INSERT INTO {self.raw}entities SELECT * FROM {self.lib}entities",
            f"INSERT INTO {self.raw}history SELECT * FROM {self.lib}history",
        )

    def due_back(self, prefix: str, set_due: str) -> tuple[str, str]:
        ent, hist = f"{prefix}entities", f"{prefix}history"
        due = "id >= 'due-' AND id < 'due.'"
        return (
            f"UPDATE {ent} SET state = 'waiting', version = 1, timer_since = {set_due}, "
            f"state_entered_at = {set_due}, updated_at = {set_due} WHERE {due}",
            f"DELETE FROM {hist} WHERE entity_id >= 'due-' AND entity_id < 'due.'",
        )


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="fsm-timers-bench-")
        path = f"{self.dir}/fsm.db"
        self.lib, self.raw = "fsm_", "raw_"
        SqlStore(f"sqlite:///{path}", table_prefix=self.raw).close()  # the copy's tables, by the same DDL
        self.store = SqlStore(f"sqlite:///{path}", table_prefix=self.lib)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("synchronous = FULL", "foreign_keys = ON", "busy_timeout = 5000"):  # as the store's
            self.conn.execute(f"PRAGMA {pragma}")
        ent = f"{self.raw}entities"
        where = "kind = :kind AND state = 'waiting' AND NOT deleted AND timer_since <= :cutoff"
        # the set-based baseline: the store's own timer index, pinned as the reaper pins it
        # (with statistics SQLite may rather walk another (kind, state) index)
        self.update = (
            f"UPDATE {ent} SET state = 'failed', version = version + 1, timer_since = NULL, "
            f"state_entered_at = :now, updated_at = :now WHERE id IN (SELECT id FROM {ent} INDEXED BY "
            f"ix_{ent}_timer WHERE {where}) RETURNING id"
        )
        self.update_h = self.update.replace("RETURNING id", "RETURNING id, version, lease_token")
        self.history = (
            f"INSERT INTO {self.raw}history (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
            "VALUES (?, ?, 'timeout', 'waiting', 'failed', 'reaper', ?, 'timed out', ?)"
        )

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def write(self, *statements: str) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        for sql in statements:
            self.conn.execute(sql)
        self.conn.execute("COMMIT")

    def reset(self, prefix: str) -> None:
        two_hours = encode_sqlite_time(datetime.now(UTC) - 2 * DEADLINE)
        self.write(*self.due_back(prefix, f"'{two_hours}'"))

    def _params(self) -> dict[str, Any]:
        now = datetime.now(UTC)
        return {"kind": "deadline", "now": encode_sqlite_time(now), "cutoff": encode_sqlite_time(now - DEADLINE)}

    def raw_update(self) -> int:
        moved = self.conn.execute(self.update, self._params()).fetchall()  # autocommit: one transaction
        assert len(moved) == FIRE, len(moved)
        return len(moved)

    def raw_update_history(self) -> int:
        params = self._params()
        self.conn.execute("BEGIN IMMEDIATE")
        moved = self.conn.execute(self.update_h, params).fetchall()
        self.conn.executemany(self.history, [(i, v, t, params["now"]) for i, v, t in moved])
        self.conn.execute("COMMIT")
        assert len(moved) == FIRE, len(moved)
        return len(moved)

    def analyze(self) -> None:
        self.conn.execute("ANALYZE")

    def close(self) -> None:
        self.conn.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg

        tag = uuid.uuid4().hex[:6]
        self.url = url
        self.lib, self.raw = f"benchtl{tag}_", f"benchtr{tag}_"
        SqlStore(url, table_prefix=self.raw).close()
        self.store = SqlStore(url, table_prefix=self.lib)
        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        ent = f"{self.raw}entities"
        update = (
            f"UPDATE {ent} SET state = 'failed', version = version + 1, timer_since = NULL, "
            "state_entered_at = now(), updated_at = now() WHERE kind = %(kind)s AND state = 'waiting' "
            "AND NOT deleted AND timer_since <= now() - %(after)s "
        )
        self.update = update + "RETURNING id"
        self.update_h = (
            f"WITH u AS ({update} RETURNING id, version, lease_token, updated_at) "
            f"INSERT INTO {self.raw}history (entity_id, seq, event, source, target, actor, lease_token, reason, at) "
            "SELECT id, version, 'timeout', 'waiting', 'failed', 'reaper', lease_token, 'timed out', updated_at "
            "FROM u RETURNING entity_id"
        )

    def query(self, sql: str, params: Any = ()) -> list[Any]:
        return self.conn.execute(sql.replace("?", "%s"), params).fetchall()

    def write(self, *statements: str) -> None:
        with self.conn.transaction():
            for sql in statements:
                self.conn.execute(sql)

    def reset(self, prefix: str) -> None:
        self.write(*self.due_back(prefix, "now() - interval '2 hours'"))
        self.conn.execute(f"VACUUM {prefix}entities")  # every round starts from a clean index

    def _run(self, sql: str) -> int:
        with self.conn.transaction():  # one statement, committed
            moved = self.conn.execute(sql, {"kind": "deadline", "after": DEADLINE}).fetchall()
        assert len(moved) == FIRE, len(moved)
        return len(moved)

    def raw_update(self) -> int:
        return self._run(self.update)

    def raw_update_history(self) -> int:
        return self._run(self.update_h)

    def analyze(self) -> None:
        for prefix in (self.lib, self.raw):
            self.conn.execute(f"VACUUM ANALYZE {prefix}entities")
            self.conn.execute(f"VACUUM ANALYZE {prefix}history")

    def close(self) -> None:
        from stores.sql.migrate import drop_schema

        self.conn.close()
        try:
            for prefix in (self.lib, self.raw):
                drop_schema(self.store.engine, table_prefix=prefix)
        finally:
            self.store.close()


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted ``values``."""
    return values[max(0, math.ceil(q * len(values)) - 1)]


def _times(backend: Backend, sql: str) -> dict[str, datetime]:
    return {row[0]: decode_time(row[1]) for row in backend.query(sql)}


def _lateness(report: Report, backend: Backend) -> tuple[str, str]:
    """Start a reaper, create the 10,000 timers, wait until all fired; the summary's
    lateness part and the printed line."""
    n, lib = backend.name, backend.lib
    ticker = Reaper(backend.store, [Timed])  # default config: a five-minute interval
    ticker.start()
    try:
        started = time.monotonic()
        while ticker.ticks < 1 and time.monotonic() - started < 10:  # its first (empty) tick is done
            time.sleep(0.005)
        engine = Engine(Timed, backend.store)
        began = time.perf_counter()
        for b in range(COUNT // BATCH):
            engine.create_many([None] * BATCH, ids=[f"t-{b:02d}-{i:04d}" for i in range(BATCH)])
        created = time.perf_counter() - began
        # the store's own clock: when each entity entered its timed state
        since = _times(backend, f"SELECT id, timer_since FROM {lib}entities WHERE kind = 'timed'")
        assert len(since) == COUNT, len(since)
        due = {i: s + AFTER for i, s in since.items()}
        first, last = min(due.values()), max(due.values())
        ticks, cpu = ticker.ticks, time.process_time()
        # no polling while the timers fire: sleep past the last one, then count
        time.sleep(max(0.0, (last - datetime.now(UTC)).total_seconds() + 0.3))
        give_up = time.monotonic() + 60
        count = f"SELECT COUNT(*) FROM {lib}history WHERE event = 'timeout' AND entity_id >= 't-' AND entity_id < 't.'"
        while backend.query(count)[0][0] < COUNT and time.monotonic() < give_up:
            time.sleep(0.05)
        cpu = time.process_time() - cpu
        ticks = ticker.ticks - ticks
    finally:
        ticker.stop()
    at = _times(backend, f"SELECT entity_id, at FROM {lib}history WHERE event = 'timeout' AND entity_id >= 't-'")
    late = sorted((at[i] - due[i]).total_seconds() for i in at)
    assert late, f"no timer fired on {n}"
    all_fired = (max(at.values()) - first).total_seconds()
    p50, p99, worst = _quantile(late, 0.5), _quantile(late, 0.99), late[-1]
    missing = f", {COUNT - len(at):,} NOT FIRED within 60 s" if len(at) < COUNT else ""
    if late[0] < 0:  # a timer fired before it was due: a defect, not a timing
        missing += f", {sum(x < 0 for x in late):,} FIRED EARLY (by up to {-late[0]:.3f} s)"
    spread = (last - first).total_seconds()
    line = (
        f"  timers {n}: {COUNT:,} due within {spread:.2f} s (Engine.create_many, {COUNT // BATCH} x {BATCH:,}, "
        f"in {created:.2f} s), lateness p50 {p50:.3f} s p99 {p99:.3f} s max {worst:.3f} s "
        f"(target p99 < {TARGET_P99:.0f} s) {'OK' if p99 < TARGET_P99 and not missing else 'SHORT'}; "
        f"all fired {all_fired:.2f} s after the first fell due, in {ticks} ticks, client cpu {cpu * 1000:.0f} ms"
        f"{missing}"
    )
    print(line, flush=True)
    report.notes.append(line.strip())
    m = Measurement(f"timers fire {COUNT:,} due/{n}", len(at), all_fired, [all_fired], load(), cpu)
    report.measurements[m.name] = m
    summary = (
        f"{COUNT} due in one second, lateness p50 {p50:.2f} s p99 {p99:.2f} s max {worst:.2f} s, "
        f"all fired in {all_fired:.2f} s{missing}"
    )
    return summary, line


def _load_cost(backend: Backend) -> None:
    """1,000 due deadlines among 9,000 waiting ones, in both copies of the tables."""
    engine = Engine(Deadline, backend.store)
    for prefix, count in (("due", FIRE), ("wait", WAITING)):
        for b in range(0, count, BATCH):
            engine.create_many([None] * BATCH, ids=[f"{prefix}-{b + i:05d}" for i in range(BATCH)])
    backend.reset(backend.lib)
    backend.copy_tables()
    backend.analyze()


def _round(backend: Backend, prefix: str, body: Callable[[], int]) -> Callable[[], Callable[[], int]]:
    def setup() -> Callable[[], int]:
        backend.reset(prefix)  # untimed: the due rows back in their timed state, their history gone
        return body

    return setup


def _cost(report: Report, backend: Backend) -> str:
    n = backend.name
    started = time.perf_counter()
    _load_cost(backend)
    print(
        f"  loaded {FIRE + WAITING:,} deadlines ({FIRE:,} due) into two copies on {n} "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    ticker = Reaper(backend.store, [Deadline])  # default config: claims of 500

    def tick() -> int:
        result = ticker.run_once()
        assert result.moved == {"deadline.timeout": FIRE}, result.summary()
        return FIRE

    ours, bare, hist = (
        f"timers {what}/{n} {FIRE:,} due" for what in ("reaper tick", "raw update", "raw update+history")
    )
    for prefix, warm_up in (
        (backend.lib, tick),
        (backend.raw, backend.raw_update),
        (backend.raw, backend.raw_update_history),
    ):
        backend.reset(prefix)
        warm_up()
    found = report.measure(
        {
            ours: _round(backend, backend.lib, tick),
            bare: _round(backend, backend.raw, backend.raw_update),
            hist: _round(backend, backend.raw, backend.raw_update_history),
        }
    )
    report.ratio(f"timers {n}: reaper tick vs raw update+history (cost)", ours, hist, TARGET_COST, higher=False)

    def ms(m: Measurement) -> str:
        return f"{m.seconds / m.ops * 1e6:.1f} ms"

    fsm, raw, raw_h = found[ours], found[bare], found[hist]
    return (
        f"fire 1000: fsm {ms(fsm)} (client cpu {fsm.cpu_seconds / fsm.ops * 1e6:.1f} ms), "
        f"raw update {ms(raw)} ({fsm.seconds / raw.seconds:.1f}x), "
        f"raw update+history {ms(raw_h)} ({fsm.seconds / raw_h.seconds:.1f}x; "
        f"client cpu {raw_h.cpu_seconds / raw_h.ops * 1e6:.1f} ms)"
    )


def _suite(report: Report, backend: Backend) -> None:
    lateness, _ = _lateness(report, backend)
    cost = _cost(report, backend)
    print(f"  timers {backend.name}: {lateness}; {cost}", flush=True)


def run(report: Report, *, pg_url: str | None = None, **_: object) -> None:
    print(
        f"timers: {COUNT:,} timers due together, fired by a started reaper (default config); "
        f"the cost of firing {FIRE:,} vs one raw set-based UPDATE"
    )
    sqlite_backend = SqliteBackend()
    try:
        _suite(report, sqlite_backend)
    finally:
        sqlite_backend.close()
    if pg_url is None:
        print("  postgres: skipped (give --pg-url or FSM_BENCH_POSTGRES_URL)")
        report.notes.append("timers postgres skipped: no URL given")
        return
    pg = PostgresBackend(pg_url)
    try:
        _suite(report, pg)
    finally:
        pg.close()


__all__ = ["run"]
