"""Every index pays for itself, and every reaper rule finds its rows through one (EXPLAIN).

A table of 20,000 rows with statistics (``ANALYZE``): each built-in rule's claim and
candidate statements must reach the entity table through an index (PostgreSQL: no
``Seq Scan``; SQLite: every access to the table a ``SEARCH``), so their cost follows the
stale rows, not the table.  Also: a real unreadable row is never claimed, and the reaper
counts and steps over it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import SqlTarget

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.reaping import Reaper
from fsm.reaping.rules import plan_rules
from stores.sql import SqlStore

ROWS = 20_000


class _Recording:
    """Wraps a DBAPI cursor and keeps every statement with its parameters."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.seen: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = None, **options: Any) -> Any:  # options: psycopg's prepare=
        self.seen.append((sql, params))
        return self._cursor.execute(sql, **options) if params is None else self._cursor.execute(sql, params, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def _fill(target: SqlTarget, store: SqlStore) -> None:
    table = f"{target.prefix}entities"
    engine = target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        if target.dialect == "sqlite":
            now = "'2026-01-01 00:00:00.000000+00:00'"
            conn.execute(
                sa.text(
                    f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) "
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, data, "
                    "concurrency_key) SELECT 'r' || i, CASE WHEN i % 2 THEN 'job' ELSE 'pipeline' END, "
                    f"CASE WHEN i % 10 = 0 THEN 'running' ELSE 'completed' END, {now}, {now}, {now}, '{{}}', "
                    "CASE WHEN i % 100 = 0 THEN 'k' || (i % 7) END FROM n"
                )
            )
            conn.execute(sa.text("ANALYZE"))
        else:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, concurrency_key)"
                    " SELECT 'r' || g, CASE WHEN g % 2 = 1 THEN 'job' ELSE 'pipeline' END,"
                    " CASE WHEN g % 10 = 0 THEN 'running' ELSE 'completed' END, now(), now(), now(),"
                    " CASE WHEN g % 100 = 0 THEN 'k' || (g % 7) END FROM generate_series(1, :n) AS g"
                ),
                {"n": ROWS},
            )
            conn.execute(sa.text(f"ANALYZE {table}"))


def _plan(store: SqlStore, sql: str, params: Any) -> str:
    cur = store._conns.slot().cursor
    cur.execute(("EXPLAIN QUERY PLAN " if store._sqlite else "EXPLAIN ") + sql, params)
    return "\n".join(str(r[-1] if store._sqlite else r[0]) for r in cur.fetchall())


def _scans_the_table(plan: str, sqlite: bool) -> bool:
    if sqlite:  # "SCAN e" (or "SCAN e USING INDEX"): every row of the table or an index, walked
        return re.search(r"\bSCAN (e|s\d+)\b", plan) is not None
    return "Seq Scan" in plan


def test_every_built_in_rule_claims_and_reads_its_candidates_through_an_index(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    _fill(sql_target, store)
    slot = store._conns.slot()
    recording = _Recording(slot.cursor)
    slot.cursor = recording
    rules = [r for lc in (PipelineLifecycle, JobLifecycle) for r in plan_rules(Engine(lc, store, clock=clock))]
    reaper = Reaper(store, [PipelineLifecycle, JobLifecycle], clock=clock)
    reaper.run_once()  # brief claims (nobody listens), then the keyset read of what the claims left
    for rule in rules:
        # what a tick also runs: the full claim (when a receiver listens), and the keyset read
        if rule.set_based:
            store.move_candidates(reaper._batch(rule, ()), limit=50)
        store.candidates(rule.engine.kind, rule.branch.source, rule.require, limit=50)
    slot.cursor = recording._cursor
    statements = [(sql, params) for sql, params in recording.seen if params and "LIMIT" in sql]
    # brief and full claims, candidate reads: one statement per rule shape (two rules of one
    # shape in two states share their SQL; the state is a parameter)
    shapes = {
        (
            tuple((type(c).__name__, getattr(c, "counter", None)) for c in r.require),
            r.branch.lease_effect,
            r.branch.bump_attempt,
            r.branch.bump_reclaims,
        )
        for r in rules
    }
    assert len({sql for sql, _ in statements}) >= 3 * len(shapes) - 3
    for sql, params in statements:
        plan = _plan(store, sql, params)
        assert not _scans_the_table(plan, store._sqlite), f"{sql}\n{plan}"
        assert "ix_" in plan, plan


def test_a_newer_sibling_guard_probes_the_partial_siblings_index(sql_target: SqlTarget) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    _fill(sql_target, store)
    plan = _plan(store, store._sql.sibling, {"id": "r100"})
    assert not _scans_the_table(plan, store._sqlite), plan
    assert f"ix_{sql_target.prefix}entities_siblings" in plan


def test_a_real_unreadable_row_is_never_claimed_and_the_reaper_steps_over_it(
    sql_target: SqlTarget, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    engine = Engine(PipelineLifecycle, store, clock=clock)
    for i in range(5):
        engine.fire(engine.create(f"p{i}").id, "start")
    bad = "'{broken'" if sql_target.dialect == "sqlite" else "'[1, 2]'"
    eng = sql_target.engine()
    assert isinstance(eng, sa.Engine)
    with eng.begin() as conn:
        conn.execute(sa.text(f"UPDATE {sql_target.prefix}entities SET data = {bad} WHERE id = 'p2'"))
    clock.advance(PipelineLifecycle.policy.stale_after * 2)
    with caplog.at_level(logging.ERROR, logger="fsm.reaper"):
        result = Reaper(store, [PipelineLifecycle], clock=clock).run_once()
    assert result.moved == {"pipeline.expire": 4} and result.bad_rows == 1 and result.errors == 0
    assert any("p2" in r.getMessage() for r in caplog.records)


def test_a_prune_batch_walks_the_recent_index_per_final_state_instead_of_sorting_every_finished_row(
    sql_target: SqlTarget,
) -> None:
    """With two final states, one ``state IN (..)`` filter cannot read the index in order:
    it read every finished row and sorted them, at every batch.  Each state's walk now stops
    at the batch's size."""
    from datetime import UTC, datetime

    store = sql_target.store()
    assert isinstance(store, SqlStore)
    _fill(sql_target, store)
    params = {"kind": "job", "st0": "completed", "st1": "failed", "limit": 500}
    params["before"] = store._f.time(datetime(2100, 1, 1, tzinfo=UTC))
    for lock in (False, True) if not store._sqlite else (False,):
        plan = _plan(store, store._prune_pick(2, lock), params)
        assert not _scans_the_table(plan, store._sqlite), plan
        assert "recent" in plan, plan
        if not store._sqlite:  # a LIMIT under each state's index walk, not one sort above them all
            assert plan.count("Limit") >= 3, plan
    # and it removes the oldest first, across the states, as before
    rows = store.prune("job", ("completed", "failed"), datetime(2100, 1, 1, tzinfo=UTC), limit=5, dry_run=True)
    assert len(rows) == 5
