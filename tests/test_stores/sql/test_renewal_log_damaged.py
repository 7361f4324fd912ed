"""A damaged renewal log never makes a renewal fail, whatever its length (a
keeper whose renewals fail loses a live lease, and the reaper takes over live work)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
from conftest import SqlTarget

from fsm import ManualClock
from fsm.records import RENEWALS_KEPT, RENEWALS_KEY, NewEntity
from stores.sql import SqlStore

TTL = timedelta(minutes=2)


@pytest.mark.parametrize("item", ["text", True, [1], None], ids=["string", "bool", "list", "null"])
def test_a_long_damaged_renewal_log_never_fails_a_renewal(sql_target: SqlTarget, item: object) -> None:
    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    store.create(NewEntity("e1", "job", "running"))
    store.acquire_lease("e1", owner="w", ttl=TTL, budget=None, expect_version=0)
    cast = ":log" if sql_target.dialect == "sqlite" else "CAST(:log AS jsonb)"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:  # longer than kept (a log from a larger RENEWALS_KEPT, or by hand)
        conn.execute(
            sa.text(f"UPDATE {store._sql.L.effects} SET result = {cast} WHERE key = :k"),
            {"k": RENEWALS_KEY, "log": json.dumps([item] * (RENEWALS_KEPT + 5))},
        )
    clock.advance(seconds=5)
    renewed = store.renew_lease("e1", owner="w", token=1, ttl=TTL, budget=None)  # the lease is what matters
    assert renewed.lease_expires_at == clock.now() + TTL
    assert store.get("e1").lease_expires_at == clock.now() + TTL
    with engine.begin() as conn:  # the damaged entries kept as they were, cut to the newest
        (text,) = conn.execute(
            sa.text(f"SELECT result FROM {store._sql.L.effects} WHERE key = :k"), {"k": RENEWALS_KEY}
        ).one()
    log = json.loads(text) if isinstance(text, str) else text
    assert len(log) == RENEWALS_KEPT and log[:-1] == [item] * (RENEWALS_KEPT - 1)


def test_a_long_damaged_renewal_log_never_fails_a_claim(sql_target: SqlTarget) -> None:
    """A claim resuming a finalizer acquires its lease (and logs it) inside the claim's
    transaction: a log the upsert cannot cut must not fail every worker's claim."""
    from fsm.records import ClaimRequest, ClaimStart

    clock = ManualClock()
    store = sql_target.store(clock=clock)
    assert isinstance(store, SqlStore)
    store.create(NewEntity("f1", "job", "finalizing"))
    store.create(NewEntity("q1", "job", "queued"))
    held = store.acquire_lease("f1", owner="w1", ttl=TTL, budget=None, expect_version=0)
    store.release_lease("f1", owner="w1", token=held.lease_token)  # free for a claim (as a reclaim leaves it)
    cast = ":log" if sql_target.dialect == "sqlite" else "CAST(:log AS jsonb)"
    engine = sql_target.engine()
    assert isinstance(engine, sa.Engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {store._sql.L.effects} SET result = {cast} WHERE key = :k"),
            {"k": RENEWALS_KEY, "log": json.dumps(["text"] * (RENEWALS_KEPT + 5))},
        )
    clock.advance(TTL * 2)
    start = ClaimStart(source="queued", target="running", event="start", bump_attempt=True)
    request = ClaimRequest(kind="job", owner="w2", limit=5, ttl=TTL, starts=(start,), resumes=("finalizing",))
    assert sorted(s.id for s in store.claim(request)) == ["f1", "q1"]
