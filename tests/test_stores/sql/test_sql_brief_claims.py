"""The SQL store's brief claim (issue 12, item 5): the reaper's claim, decoded no further
than the history rows need, and no more round trips than the full claim.

A brief claim never takes a row it cannot read (the reaper finds it with its keyset read,
counts it and steps over it) nor a row another transaction holds (skipped, not waited for).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from conftest import SqlTarget

from fsm import Engine, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper, ReaperConfig
from fsm.records import BatchWrite, LeaseChange, LeaseStale
from stores.sql import SqlStore

CLAIM = BatchWrite(
    (), "pipeline", "expire", "running", "failed", "reaper", (LeaseStale(timedelta(minutes=60)),),
    LeaseChange.CLEAR, reason="expired",
)  # fmt: skip


def _stale(target: SqlTarget, n: int) -> tuple[SqlStore, ManualClock]:
    clock = ManualClock()
    store = target.store(clock=clock)
    assert isinstance(store, SqlStore)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(n):
        engine.fire(engine.create(f"p{i}").id, "start")
    clock.advance(timedelta(hours=2))
    return store, clock


def test_a_brief_claim_never_takes_an_unreadable_row_and_the_reaper_counts_it(sql_target: SqlTarget) -> None:
    store, clock = _stale(sql_target, 4)
    broken = "'{broken'" if sql_target.dialect == "sqlite" else "'[1, 2]'"  # jsonb only holds valid JSON
    engine = sql_target.engine()
    with engine.begin() as conn:  # type: ignore[attr-defined]
        conn.exec_driver_sql(f"UPDATE {sql_target.prefix}entities SET data = {broken} WHERE id = 'p2'")
    assert sorted(r.entity_id for r in store.move_candidates_brief(CLAIM, limit=10)) == ["p0", "p1", "p3"]
    result = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=10), clock=clock).run_once()
    assert result.bad_rows == 1 and result.total_moved == 0  # the reaper read it, counted it, left it


def test_a_brief_claim_skips_a_row_another_transaction_holds(sql_target: SqlTarget) -> None:
    if sql_target.dialect != "postgres":
        pytest.skip("row locks: PostgreSQL (SQLite locks the whole database for a writer)")
    import psycopg

    store, _ = _stale(sql_target, 3)
    with psycopg.connect(sql_target.url.replace("postgresql+psycopg://", "postgresql://")) as other:
        other.execute(f"SELECT 1 FROM {sql_target.prefix}entities WHERE id = 'p1' FOR UPDATE")  # held, not committed
        assert sorted(r.entity_id for r in store.move_candidates_brief(CLAIM, limit=10)) == ["p0", "p2"]
        other.rollback()
    assert [r.entity_id for r in store.move_candidates_brief(CLAIM, limit=10)] == ["p1"]


class _Statements:
    """Wraps a DBAPI cursor and records the first word of each statement it runs."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.seen: list[str] = []
        self.options: list[dict[str, Any]] = []

    def execute(self, sql: str, params: Any = None, **options: Any) -> Any:
        self.seen.append(sql.split(maxsplit=1)[0].upper())
        self.options.append(options)
        return self._cursor.execute(sql, **options) if params is None else self._cursor.execute(sql, params, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def test_a_tick_is_one_statement_per_claim_on_postgres_and_one_transaction_per_claim_on_sqlite(
    sql_target: SqlTarget,
) -> None:
    store, clock = _stale(sql_target, 5)
    slot = store._conns.slot()
    counting = _Statements(slot.cursor)
    slot.cursor = counting
    try:
        result = Reaper(store, [PipelineLifecycle], ReaperConfig(batch_size=3), clock=clock).run_once()
    finally:
        slot.cursor = counting._cursor
    assert result.moved == {"pipeline.expire": 5}
    rules = 3  # expire from running, supersede, expire from finalizing
    claims = rules + 1  # expire from running: a full page of 3, then a short one of 2
    # the tick's other steps: the read of the stored schedules, the claim of due delayed
    # fires (PostgreSQL: one statement; SQLite: a read that finds none, no transaction) and,
    # at a reaper's first tick, the read of requests whose deliverer died
    if sql_target.dialect == "postgres":  # autocommit: no BEGIN/COMMIT round trips
        assert counting.seen.count("WITH") == claims + 1 and counting.seen.count("BEGIN") == 0
        # never prepared: each claim and read is planned with its parameters (a generic plan
        # guesses the page size and the staleness bounds, and may scan every stale row)
        # (but the delayed fires' claim: the workers' own claim statement, prepared)
        rest = [o for o, word in zip(counting.options, counting.seen, strict=True) if word != "WITH"]
        assert all(o == {"prepare": False} for o in rest), counting.options
        claims_options = [o for o, word in zip(counting.options, counting.seen, strict=True) if word == "WITH"]
        assert claims_options.count({"prepare": False}) == claims, claims_options
    else:  # each claim in BEGIN IMMEDIATE
        assert counting.seen.count("BEGIN") == claims == counting.seen.count("COMMIT")
    # the keyset read after each rule's last claim, and the other steps' reads (above)
    later_reads = 2 if sql_target.dialect == "postgres" else 3
    assert counting.seen.count("SELECT") == rules + later_reads
