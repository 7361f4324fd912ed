"""The claim's plans with priorities (EXPLAIN), on SQLite and PostgreSQL.

A table of 20,000 rows at mixed priorities (about 500 raised per state), with statistics
(``ANALYZE``): every claim statement (each state's pick, with and without the starvation
rule; PostgreSQL's one-statement claim and SQLite's per-state update; the limited claim's
candidate picks, recorded from real claims) reaches its rows by walking the ``claim`` and
the partial ``priority`` indexes in the claim's order, and never sorts (PostgreSQL: no
``Sort`` node; SQLite: no ``USE TEMP B-TREE FOR ORDER BY``) nor scans the table.

The limits are a worker's (a claim of 5 to 10; a limited claim picks four candidates a
slot).  On a small table PostgreSQL prefers, once a LIMIT nears a sixth of a state's raised
rows, a bitmap scan of the partial ``priority`` index and a top-N sort of what it finds (a
cost bounded by the raised rows, not the backlog): with 6,000 rows it sorts from a LIMIT of
about 40, with 20,000 from about 80, and with 200,000 it walks the index at every limit up
to 160.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import SqlTarget
from test_stores.sql.test_sql_plans import _Recording, _scans_the_table

from fsm import Engine, JobLifecycle, Limits, ManualClock, Rate
from fsm.engine.work import claim_plan
from fsm.records import ClaimRequest, TimerMode
from stores.sql import SqlStore

ROWS = 20_000
START = datetime(2026, 1, 1, tzinfo=UTC)
STARVE = timedelta(seconds=30)
STATES = ("queued", "running", "finalizing", "completed")


def _fill(target: SqlTarget, store: SqlStore) -> None:
    """ROWS entities (a sixth of them pipelines) over four states, due a second apart up to
    the clock's now; a tenth raised (1 to 7), a tenth lowered (-1 to -5), keys over 11; half
    the running and finalizing rows hold a live lease (every key holds some), the others
    wait for a new holder."""
    table = f"{target.prefix}entities"
    engine = target.engine()
    assert isinstance(engine, sa.Engine)
    states = "CASE i % 4 " + " ".join(f"WHEN {n} THEN '{s}'" for n, s in enumerate(STATES)) + " END"
    kind = "CASE WHEN i % 6 = 5 THEN 'pipeline' ELSE 'job' END"
    priority = "CASE WHEN i % 10 = 1 THEN 1 + i % 7 WHEN i % 10 = 2 THEN -1 - i % 5 ELSE 0 END"
    key = "CASE WHEN i % 3 = 0 THEN 'k' || (i % 11) END"
    owned = "i % 8 IN (1, 2)"
    with engine.begin() as conn:
        if target.dialect == "sqlite":
            stamp = "'2025-12-01 00:00:00.000000+00:00'"
            conn.execute(
                sa.text(
                    f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) "
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, data, "
                    "run_after, priority, concurrency_key, lease_owner, lease_expires_at) "
                    f"SELECT 'r' || i, {kind}, {states}, {stamp}, {stamp}, {stamp}, '{{}}', "
                    "strftime('%Y-%m-%d %H:%M:%S.000000+00:00', '2026-01-01', '-' || i || ' seconds'), "
                    f"{priority}, {key}, CASE WHEN {owned} THEN 'w0' END, "
                    f"CASE WHEN {owned} THEN '2026-01-01 01:00:00.000000+00:00' END FROM n"
                )
            )
            conn.execute(sa.text("ANALYZE"))
        else:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, run_after, "
                    f"priority, concurrency_key, lease_owner, lease_expires_at) SELECT 'r' || i, {kind}, {states}, "
                    f":t, :t, :t, :t - i * interval '1 second', {priority}, {key}, CASE WHEN {owned} THEN 'w0' END, "
                    f"CASE WHEN {owned} THEN :t + interval '1 hour' END FROM generate_series(1, :n) AS g(i)"
                ),
                {"n": ROWS, "t": START},
            )
            conn.execute(sa.text(f"ANALYZE {table}"))


@pytest.fixture
def filled(sql_target: SqlTarget) -> Iterator[tuple[SqlStore, ManualClock]]:
    clock = ManualClock(START)
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    _fill(sql_target, store)
    yield store, clock


class Plan:
    """One statement's plan: its text, the indexes it walks, whether it sorts."""

    def __init__(self, store: SqlStore, sql: str, params: Any) -> None:
        cur = store._conns.slot().cursor
        self.sql = sql
        if store._sqlite:
            cur.execute("EXPLAIN QUERY PLAN " + sql, params)
            self.text = "\n".join(str(r[-1]) for r in cur.fetchall())
            self.sorts = "USE TEMP B-TREE FOR ORDER BY" in self.text
        else:
            cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            [(found,)] = cur.fetchall()
            nodes = list(_nodes(found[0]["Plan"]))
            self.text = "\n".join(
                f"{n['Node Type']} {n.get('Index Name', '')} {n.get('Relation Name', '')}" for n in nodes
            )
            self.sorts = any("Sort" in n["Node Type"] for n in nodes)  # Sort, Incremental Sort
        if store._sqlite:
            self.scans = _scans_the_table(self.text, sqlite=True)
        else:  # a sequential scan of the entity table (a few rows of the starts table may be read so)
            table = f"{store.table_prefix}entities"
            self.scans = any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table for n in nodes)

    def __str__(self) -> str:
        return f"{self.sql}\n--\n{self.text}"


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _request(*, starve: bool, limit: int = 10) -> ClaimRequest:
    starts, resumes = claim_plan(JobLifecycle.table)
    policy = JobLifecycle.policy
    return ClaimRequest(
        kind="job",
        owner="w1",
        limit=limit,
        ttl=policy.lease_ttl,
        starts=starts,
        resumes=resumes,
        budgets=tuple((s, b) for s in JobLifecycle.table.leaves if (b := policy.budget_for(s)) is not None),
        starve_after=STARVE if starve else None,
    )


def _indexes(store: SqlStore) -> tuple[str, str]:
    prefix = store.table_prefix
    return f"ix_{prefix}entities_claim", f"ix_{prefix}entities_priority"


@pytest.mark.parametrize("which", ["start", "resume", "start+starve", "resume+starve"])
def test_each_states_pick_walks_the_claim_and_priority_indexes_without_a_sort(
    filled: tuple[SqlStore, ManualClock], which: str
) -> None:
    store, clock = filled
    claim_ix, priority_ix = _indexes(store)
    params = store._claim_params(_request(starve="starve" in which), clock.now())
    for state in ("queued", "running", "finalizing"):
        plan = Plan(store, store._claim_sql()[which], {**params, "state": state})
        assert not plan.sorts, str(plan)
        assert not plan.scans, str(plan)
        assert claim_ix in plan.text and priority_ix in plan.text, str(plan)


@pytest.mark.parametrize("starve", [False, True], ids=["strict", "starve_after"])
def test_the_whole_claim_statement_walks_indexes_without_a_sort(
    filled: tuple[SqlStore, ManualClock], starve: bool
) -> None:
    store, clock = filled
    claim_ix, priority_ix = _indexes(store)
    request = _request(starve=starve)
    params = store._claim_params(request, clock.now())
    plans: list[Plan] = []
    if store._sqlite:  # one update per state, as _claim_set runs them
        for n, state in enumerate(request.resumes):
            budget = request.budget_for(state) is not None
            sql, values = store._qmark(store._claim_sqlite_sql("resume", budget, starve=starve))
            plans.append(Plan(store, sql, values({**params, "state": state, "left": 10, "bud": params.get(f"bud{n}")})))
        for start in request.starts:
            sql, values = store._qmark(store._claim_sqlite_sql("start", start.bump_attempt, start.timer, starve))
            row = {**params, "state": start.source, "target": start.target, "left": 10}
            plans.append(Plan(store, sql, values(row)))
        assert TimerMode.KEEP in {s.timer for s in request.starts}
    else:
        plans.append(Plan(store, store._claim_pg_sql(request), params))
    for plan in plans:
        assert not plan.sorts, str(plan)
        assert not plan.scans, str(plan)
        assert claim_ix in plan.text and priority_ix in plan.text, str(plan)
    # and the statement takes what its plan promises: raised rows first
    claimed = Engine(JobLifecycle, store, clock=clock).claim(3, limits=Limits(starve_after=STARVE) if starve else None)
    assert len(claimed) == 3


@pytest.mark.parametrize("starve", [False, True], ids=["strict", "starve_after"])
def test_the_limited_claims_candidate_picks_walk_indexes_without_a_sort(
    filled: tuple[SqlStore, ManualClock], starve: bool
) -> None:
    """The statements a limited claim runs, recorded from real claims (whose picks step
    over the full keys), then explained with their own parameters."""
    store, clock = filled
    claim_ix, priority_ix = _indexes(store)
    jobs = Engine(JobLifecycle, store, clock=clock)
    # a rate high enough never to bind: the claim still counts the starts in its window
    limits = Limits(
        per_key=1, total=100_000, rate=Rate(1_000, per=timedelta(minutes=1)), starve_after=STARVE if starve else None
    )
    slot = store._conns.slot()
    recording = _Recording(slot.cursor)
    slot.cursor = recording
    try:
        first = jobs.claim(5, limits=limits)
        second = jobs.claim(5, limits=limits)
    finally:
        slot.cursor = recording._cursor
    assert first and second, (first, second)
    assert all(s.concurrency_key is None for s in [*first, *second])  # every key holds its one slot
    picks = [(sql, params) for sql, params in recording.seen if "ORDER BY" in sql and "SELECT" in sql]
    assert picks, [sql for sql, _ in recording.seen]
    assert all("full_keys" in sql for sql, _ in picks)  # stepping over the full keys
    for sql, params in picks:
        plan = Plan(store, sql, params)
        assert not plan.sorts, str(plan)
        assert not plan.scans, str(plan)
        assert claim_ix in plan.text and priority_ix in plan.text, str(plan)
    # the counts (live leases per key, starts in the window) find their rows by index too
    for sql, params in recording.seen:
        if sql.lstrip().upper().startswith("SELECT") and "COUNT(" in sql.upper():
            plan = Plan(store, sql, params)
            assert not plan.scans, str(plan)
