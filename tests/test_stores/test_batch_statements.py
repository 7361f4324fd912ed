"""The SQL stores write a batch in one statement (issue 22): a claim of many entities, the
outcomes of one shape, a round of renewals, a create_many; rows they cannot read are
answered on their own; the claim still walks the due-time index without a sort."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from conftest import SqlTarget

from fsm import MalformedRow, ManualClock
from fsm.records import ClaimRequest, ClaimStart, NewEntity, Snapshot, TransitionWrite
from stores.sql import SqlStore

TTL = timedelta(minutes=2)
START = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)
REQUEST = ClaimRequest(
    kind="job", owner="w1", limit=50, ttl=TTL, starts=(START,), resumes=("finalizing",),
    budgets=(("finalizing", timedelta(hours=1)),),
)  # fmt: skip
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


class Counting:
    """A cursor that counts the statements it runs (transaction control left out)."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur
        self.statements: list[str] = []

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if not sql.lstrip().upper().startswith(CONTROL):
            self.statements.append(sql)
        self._cur.execute(sql, *args, **kwargs)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def counted(store: SqlStore) -> Counting:
    slot = store._conns.slot()
    counter = Counting(slot.cursor)
    slot.cursor = counter
    return counter


def sql_store(target: SqlTarget) -> tuple[SqlStore, ManualClock]:
    clock = ManualClock()
    store = target.store(clock=clock)
    assert isinstance(store, SqlStore)
    return store, clock


def queued(store: SqlStore, ids: list[str], state: str = "queued") -> None:
    store.create_many([NewEntity(id=i, kind="job", state=state) for i in ids])


def exited(snap: Snapshot, *, held: bool = True) -> TransitionWrite:
    return TransitionWrite(
        snap.id, "exited", "running", "finalizing", "worker", snap.version,
        expect_owner=snap.lease_owner, expect_token=snap.lease_token, before=snap if held else None,
    )  # fmt: skip


def corrupt(target: SqlTarget, store: SqlStore, entity_id: str) -> None:
    """Make a row's data unreadable, as an application writing the table by hand might."""
    bad = "'[1]'" if target.dialect == "postgres" else "'not json'"
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.table_prefix}entities SET data = {bad} WHERE id = :id"), {"id": entity_id})


def test_a_claim_of_many_resumes_and_starts_is_one_statement_per_dialect(sql_target: SqlTarget) -> None:
    store, _ = sql_store(sql_target)
    queued(store, [f"f{i}" for i in range(5)], state="finalizing")
    queued(store, [f"q{i}" for i in range(20)])
    counter = counted(store)
    got = store.claim(REQUEST)
    assert len(got) == 25
    # PostgreSQL: one statement; SQLite: a read without the write lock (is anything
    # claimable?), then per state the update and its history rows or renewal log entries
    assert len(counter.statements) == (1 if sql_target.dialect == "postgres" else 5), counter.statements
    if sql_target.dialect == "sqlite":
        assert counter.statements[0].lstrip().upper().startswith("SELECT 1 FROM")
    assert {len(store.history(s.id)) for s in got if s.state == "running"} == {1}


def test_a_batch_of_one_shape_is_one_statement_and_a_round_of_renewals_too(sql_target: SqlTarget) -> None:
    store, clock = sql_store(sql_target)
    queued(store, [f"q{i}" for i in range(12)])
    held = store.claim(REQUEST)
    counter = counted(store)
    results = store.apply_many([exited(s) for s in held])
    assert all(not isinstance(r, Exception) for r in results)
    one = 1 if sql_target.dialect == "postgres" else 2  # SQLite: the update, then the history rows
    assert len(counter.statements) == one, counter.statements
    counter.statements.clear()
    clock.advance(timedelta(seconds=30))
    leases = [snap.lease for snap, _ in results]  # type: ignore[union-attr]
    answers = store.renew_leases(leases, ttl=TTL)  # type: ignore[arg-type]
    assert all(isinstance(a, Snapshot) and a.lease_expires_at == clock.now() + TTL for a in answers)
    assert len(counter.statements) == one, counter.statements  # SQLite: the update, then the log
    counter.statements.clear()
    queued(store, [f"n{i}" for i in range(30)])
    assert len(counter.statements) == 1


def test_a_row_the_store_cannot_read_is_answered_alone_and_the_others_commit(sql_target: SqlTarget) -> None:
    store, _ = sql_store(sql_target)
    queued(store, ["a", "b", "c"])
    held = {s.id: s for s in store.claim(REQUEST)}
    corrupt(sql_target, store, "b")
    results = store.apply_many([exited(held[i], held=False) for i in ("a", "b", "c")])
    assert isinstance(results[1], MalformedRow) and results[1].entity_id == "b"
    for i in (0, 2):
        snap, _ = results[i]  # type: ignore[misc]
        assert snap.state == "finalizing" and store.get(snap.id) == snap
    answers = store.renew_leases([held[i].lease for i in ("a", "b", "c")], ttl=TTL)  # type: ignore[misc]
    assert isinstance(answers[0], Snapshot) and isinstance(answers[2], Snapshot)
    assert isinstance(answers[1], MalformedRow)
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text(f"SELECT version, lease_token FROM {store.table_prefix}entities WHERE id = 'b'")
        ).one()
    assert tuple(row) == (1, 1)  # the unreadable row was left as it was
    queued(store, ["d", "e"])
    corrupt(sql_target, store, "d")
    assert [s.id for s in store.claim(REQUEST)] == ["e"]  # stepped over, the next one taken


def test_the_claim_statement_walks_the_due_time_index_without_a_sort(sql_target: SqlTarget) -> None:
    store, _ = sql_store(sql_target)
    table = f"{store.table_prefix}entities"
    with store.engine.begin() as conn:
        if sql_target.dialect == "postgres":
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, run_after)"
                    " SELECT 'e' || g, 'job', CASE WHEN g % 10 = 0 THEN 'finalizing' ELSE 'queued' END,"
                    " now(), now(), now(), now() - g * interval '1 second' FROM generate_series(1, 20000) AS g"
                )
            )
            conn.execute(sa.text(f"ANALYZE {table}"))
        else:
            conn.exec_driver_sql(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000) "
                f"INSERT INTO {table} (id, kind, state, state_entered_at, created_at, updated_at, run_after) "
                "SELECT 'e' || n, 'job', CASE WHEN n % 10 = 0 THEN 'finalizing' ELSE 'queued' END, 't', 't', 't', "
                "'t' || n FROM g"
            )
            conn.exec_driver_sql("ANALYZE")
    request = ClaimRequest(kind="job", owner="w", limit=5, ttl=TTL, starts=(START,), resumes=("finalizing",))
    raw = store._conns.slot().cursor
    if sql_target.dialect == "postgres":
        params = store._claim_params(request, datetime.now(UTC))
        raw.execute(f"EXPLAIN {store._claim_pg_sql(request)}", params)
        plan = "\n".join(r[0] for r in raw.fetchall())
        assert plan.count(f"Index Scan using ix_{table}_claim") == 2, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan  # walked in due order
    else:
        for what in ("resume", "start"):
            sql, values = store._qmark(store._claim_sqlite_sql(what, False))
            params = {"kind": "job", "state": "queued", "now": "u", "left": 5, "owner": "w", "ttl": "v", "target": "x"}
            plan = " | ".join(str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {sql}", values(params)).fetchall())
            assert f"USING INDEX ix_{table}_claim (kind=? AND state=? AND run_after<?)" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
