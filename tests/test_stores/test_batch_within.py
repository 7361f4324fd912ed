"""The batched writes inside the caller's transaction (``Engine.within``): a claim of many,
a batch of outcomes, a round of renewals and a ``create_many`` commit and roll back with
the caller's writes; a batch the store refuses leaves the caller's transaction usable."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import postgres_url

from fsm import Engine, EntityExists, JobLifecycle
from fsm.engine.many import Fire
from stores.sql import SqlStore
from stores.sql.migrate import drop_schema


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        found = SqlStore(f"sqlite:///{tmp_path}/app.db")
    else:
        found = SqlStore(postgres_url(), table_prefix=f"t{uuid.uuid4().hex[:10]}_")
    with found.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {found.table_prefix}orders (id VARCHAR(40) PRIMARY KEY)")
    yield found
    with found.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {found.table_prefix}orders")
    if found.engine.dialect.name == "postgresql":
        drop_schema(found.engine, table_prefix=found.table_prefix)
    found.close()


def orders(store: SqlStore) -> list[str]:
    reader = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)
    with reader.connect() as conn:
        found = sorted(r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {store.table_prefix}orders"))
    reader.dispose()
    return found


def test_batches_commit_and_roll_back_with_the_callers_transaction(store: SqlStore) -> None:
    jobs = Engine(JobLifecycle, store)
    jobs.create_many([{} for _ in range(4)])
    for commit in (False, True):
        with store.engine.connect() as conn:
            with jobs.within(conn):
                conn.exec_driver_sql(f"INSERT INTO {store.table_prefix}orders (id) VALUES ('o-{commit}')")
                made = jobs.create_many([{} for _ in range(3)])
                claimed = jobs.claim(10)
                assert len(claimed) == 7
                renewed = jobs.renew_leases([s.lease for s in claimed])  # type: ignore[misc]
                assert all(not isinstance(r, Exception) for r in renewed)
                fired = jobs.fire_many([Fire(s, "exited", s.lease) for s in claimed])
                assert all(not isinstance(f, Exception) for f in fired)
            conn.commit() if commit else conn.rollback()
        counts = {state: n for state, n in jobs.counts().items() if n}
        if commit:
            assert counts == {"finalizing": 7}
            assert all(len(jobs.history(s.id)) == 2 for s in claimed)
            assert orders(store) == ["o-True"]
        else:
            assert counts == {"queued": 4} and made[0].id not in {s.id for s in jobs.entities()}
            assert orders(store) == []


def test_a_refused_create_many_leaves_the_callers_transaction_usable(store: SqlStore) -> None:
    jobs = Engine(JobLifecycle, store)
    (taken,) = jobs.create_many([{}])
    with store.engine.connect() as conn:
        with jobs.within(conn):
            conn.exec_driver_sql(f"INSERT INTO {store.table_prefix}orders (id) VALUES ('o-1')")
            with pytest.raises(EntityExists) as refused:
                jobs.create_many([{}, {}], ids=["fresh", taken.id])
            assert refused.value.entity_id == taken.id
            conn.exec_driver_sql(f"INSERT INTO {store.table_prefix}orders (id) VALUES ('o-2')")  # still usable
            jobs.create_many([{}], ids=["fresh"])
        conn.commit()
    assert orders(store) == ["o-1", "o-2"]
    assert sorted(s.id for s in jobs.entities()) == sorted(["fresh", taken.id])
