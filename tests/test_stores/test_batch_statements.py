"""The SQL stores write a batch in one statement (issue 22): a claim of many entities, the
outcomes of one shape, a round of renewals, a create_many; rows they cannot read are
answered on their own; the claim still walks the due-time index without a sort."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg.sql
import sqlalchemy as sa
from conftest import SqlTarget

from fsm import MalformedRow, ManualClock
from fsm.records import ClaimRequest, ClaimStart, LeaseChange, NewEntity, Snapshot, TransitionWrite
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


ODD_IDS = ["é-ü-ß", "日本語", "emoji-😀-𝄞", "quote-'\"-\\back\\slash", "line\nbreak\ttab\u2028\u0001", "plain"]
ODD_TEXT = "é 😀 𝄞 ' \" \\ \\u0000 \n \u2028 \u0001 </script> NULL null"
ODD_DATA = {
    "text": ODD_TEXT, "big": 2**80, "low": -(2**63), "float": 0.1, "tiny": 2.5e-7, "": "empty key",
    "nested": {"a": [1, None, True, False, {"ключ": ODD_TEXT}], "json text": '{"not": "parsed"}'},
}  # fmt: skip


def odd_write(snap: Snapshot, owner: str, ttl: timedelta, due: timedelta, *, held: bool) -> TransitionWrite:
    """The finalizer's lease taken, with odd texts and data in every field a batch binds."""
    return TransitionWrite(
        snap.id, "exited", "running", "finalizing", "worker", snap.version, expect_owner=owner,
        expect_token=snap.lease_token, lease_change=LeaseChange.ACQUIRE, new_owner=f"fin-{snap.id}", lease_ttl=ttl,
        data={**ODD_DATA, "id": snap.id}, data_patch={"patch": ODD_TEXT, "id": snap.id},
        reason=f"reason {ODD_TEXT} {snap.id}", before=snap if held else None, run_after=due,
        error={"error": ODD_TEXT, "n": 2**70},
    )  # fmt: skip


def test_a_batch_keeps_its_texts_data_and_durations_exactly(sql_target: SqlTarget) -> None:
    """Every field a batch binds reads back as given: odd ids, owners, reasons and data
    (quotes, backslashes, control and astral characters, wide numbers), and the lease and
    due durations to the microsecond, whole days included; from a held snapshot or not."""
    store, clock = sql_store(sql_target)
    queued(store, ODD_IDS)
    owner = "wörker-😀-'\"\\"
    held = store.claim(replace(REQUEST, owner=owner))
    assert {s.id for s in held} == set(ODD_IDS) and {s.lease_owner for s in held} == {owner}
    ttl = timedelta(days=1, seconds=7, microseconds=1)
    due = timedelta(days=2, hours=3, microseconds=3)
    writes = [odd_write(snap, owner, ttl, due, held=i % 2 == 1) for i, snap in enumerate(held)]
    results = store.apply_many(writes)
    now = clock.now()
    for write, result in zip(writes, results, strict=True):
        assert not isinstance(result, Exception), result
        snap, record = result
        stored = store.get(write.entity_id)
        assert snap == stored  # what the batch answered is what it wrote
        assert (stored.id, stored.state, stored.lease_owner) == (write.entity_id, "finalizing", write.new_owner)
        assert stored.lease_expires_at == now + ttl and stored.run_after == now + due
        assert stored.data == write.data
        (last,) = store.history(write.entity_id)[-1:]
        assert last == record
        assert (last.reason, last.data, last.error, last.owner) == (
            write.reason, write.data_patch, write.error, write.new_owner,
        )  # fmt: skip


class Recording(Counting):
    """A counting cursor that keeps each statement's parameters too."""

    def __init__(self, cur: Any) -> None:
        super().__init__(cur)
        self.runs: list[tuple[str, Any]] = []

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.runs.append((sql, args[0] if args else None))
        return super().execute(sql, *args, **kwargs)


def test_the_postgres_batch_statement_probes_the_primary_key_in_a_generic_plan(sql_target: SqlTarget) -> None:
    """psycopg prepares the batch statement, and after five runs PostgreSQL may keep one
    generic plan; that plan still reads each row of the batch through the primary key (the
    ids again as an array it probes), never a scan of the table per row of the batch."""
    if sql_target.dialect != "postgres":
        return
    store, _ = sql_store(sql_target)
    queued(store, [f"q{i:04d}" for i in range(3000)])
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"ANALYZE {store.table_prefix}entities"))
    held = store.claim(replace(REQUEST, limit=16))
    slot = store._conns.slot()
    recorder = Recording(slot.cursor)
    slot.cursor = recorder
    writes = [exited(s) for s in held]
    # the statement and its parameters, run in a transaction rolled back: the writes still qualify
    with slot.conn.transaction(force_rollback=True):
        store.apply_many(writes)
    slot.cursor = recorder._cur
    ((sql, params),) = [(s, p) for s, p in recorder.runs if "UPDATE" in s]
    names = list(params)
    for i, name in enumerate(names):
        sql = sql.replace(f"%({name})s", f"${i + 1}")
    pkey = f"{store.table_prefix}entities_pkey"
    assert slot.conn.autocommit  # each statement below its own transaction
    with slot.conn.cursor() as cur:
        cur.execute(f"PREPARE fsm_batch_plan AS {sql}")
        try:
            cur.execute("SET plan_cache_mode = force_generic_plan")
            args = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[n]) for n in names)
            cur.execute(psycopg.sql.SQL("EXPLAIN EXECUTE fsm_batch_plan({})").format(args))
            plan = "\n".join(r[0] for r in cur.fetchall())
        finally:
            cur.execute("RESET plan_cache_mode")
            cur.execute("DEALLOCATE fsm_batch_plan")
    assert f"Index Scan using {pkey}" in plan and "= ANY ($" in plan, plan  # the ids' array probes the key
    assert "Seq Scan" not in plan, plan
    assert all(not isinstance(r, Exception) for r in store.apply_many(writes))  # and they do qualify
