"""The inspector's reads at scale, on SQLite and PostgreSQL: keyset pages and the bounded data
search find every matching entity once, the counts come from a cache whose age is known,
and the list walks an index (EXPLAIN), never the whole table."""

from __future__ import annotations

from typing import Any

import pytest
from inspect_support import a_store, inspector  # noqa: F401 - a_store is the store fixture

from fsm import Engine, JobLifecycle, PipelineLifecycle
from fsm.inspect import listing
from fsm.inspect.data import Filters, InspectorData
from stores.sql import SqlStore


def seed(store: SqlStore) -> tuple[Engine, Engine]:
    jobs, pipes = Engine(JobLifecycle, store), Engine(PipelineLifecycle, store)
    for i in range(30):
        jobs.create(f"job-{i:02d}", data={"task": "build" if i % 3 == 0 else "test", "n": i, "ok": i % 2 == 0})
    for i in range(10):
        pipes.create(f"pipe-{i:02d}", data={"task": "build", "meta": {"branch": "main" if i < 4 else "dev"}})
    for snap in jobs.claim(8):  # some running, in another (kind, state) pair
        assert snap.lease is not None
    for i in range(5):
        pipes.fire(f"pipe-{i:02d}", "start")
    return jobs, pipes


def every_page(data: InspectorData, **filters: Any) -> list[list[str]]:
    pages, query = [], Filters(**filters)
    for _ in range(100):
        listed = data.entities(query)
        pages.append([s.id for s in listed.rows])
        if listed.more is None:
            return pages
        query = Filters(**filters, after=listed.more)
    raise AssertionError("the pages never ended")


def test_keyset_pages_cover_every_entity_once_newest_first(store: SqlStore) -> None:
    seed(store)
    data = inspector(store)
    pages = every_page(data, limit=7)
    seen = [i for page in pages for i in page]
    assert len(seen) == len(set(seen)) == 40 and all(len(p) <= 7 for p in pages)
    snaps = {s.id: s for s in [store.get(i) for i in seen]}
    order = [(snaps[i].updated_at, i) for i in seen]
    assert order == sorted(order, reverse=True)  # most recently updated first, across pairs


@pytest.mark.parametrize("scan", [3, 2000])
def test_the_data_search_finds_each_match_once_through_its_bounded_window(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch, scan: int
) -> None:
    seed(store)
    monkeypatch.setattr(listing, "SCAN", scan)  # a window smaller than a pair: many pages
    data = inspector(store)
    wanted = {f"job-{i:02d}" for i in range(0, 30, 3)} | {f"pipe-{i:02d}" for i in range(10)}
    found = [i for page in every_page(data, data_path="task", data_value="build", limit=4) for i in page]
    assert sorted(found) == sorted(wanted) and len(found) == len(set(found))
    nested = [i for page in every_page(data, data_path="meta.branch", data_value="main") for i in page]
    assert sorted(nested) == [f"pipe-{i:02d}" for i in range(4)]
    numbers = [i for p in every_page(data, data_path="n", data_value="7") for i in p]
    assert numbers == ["job-07"]
    booleans = {i for p in every_page(data, data_path="ok", data_value="true", kind="job") for i in p}
    assert booleans == {f"job-{i:02d}" for i in range(0, 30, 2)}  # JSON true, on both stores alike
    hostile = [i for p in every_page(data, data_path="task", data_value="' OR 1=1 --") for i in p]
    assert hostile == []


def test_an_id_prefix_a_holder_and_expired_leases_walk_their_indexes(store: SqlStore) -> None:
    jobs, _ = seed(store)
    data = inspector(store)
    assert [s.id for s in data.entities(Filters(text="pipe-0")).rows] == [f"pipe-{i:02d}" for i in range(10)]
    assert [s.id for s in data.entities(Filters(text="job-1", state="running")).rows] == []
    assert [s.id for s in data.entities(Filters(text="%")).rows] == []  # LIKE's wildcard is escaped
    held = sorted(s.id for s in data.entities(Filters(holder=jobs.owner)).rows)
    assert held == [f"job-{i:02d}" for i in range(8)]
    assert data.entities(Filters(expired=True)).rows == []  # their leases are fresh


def test_the_counts_are_cached_and_recounted_in_the_background(store: SqlStore) -> None:
    jobs, _ = seed(store)
    data = InspectorData(store, count_every=3600)
    first = data.counts()
    assert first.value["job"] == {"queued": 22, "running": 8}
    jobs.create("job-new")
    again = data.counts()
    assert again is first and again.value["job"]["queued"] == 22  # the cached value, its age shown
    assert data.counts_cache.refresh().value["job"]["queued"] == 23


def test_work_waiting_for_a_worker_is_flagged(store: SqlStore) -> None:
    jobs, _ = seed(store)
    [snap] = [s for s in jobs.claim(1)]
    assert snap.lease is not None
    jobs.fire(snap.id, "exited", lease=snap.lease, data={"exit_code": 0})
    jobs.release_lease(snap.lease)  # a stopping worker hands the finalizer back: nobody holds it
    flags = inspector(store).flags().value
    assert flags.waiting == {"job": {"finalizing": 1}}


def _plans(store: SqlStore, data: InspectorData) -> list[str]:
    """The plans of the list's statements for the default page, one kind+state, and a holder."""
    captured: list[tuple[str, dict[str, Any]]] = []
    run = store._run

    def spy(sql: str, params: dict[str, Any], **kw: Any) -> Any:
        captured.append((sql, dict(params)))
        return run(sql, params, **kw)

    data.counts()  # the cached recount is the one whole-index read, off the page's path
    store._run = spy  # type: ignore[method-assign]
    try:
        data.entities(Filters())
        data.entities(Filters(kind="job", state="queued"))
        data.entities(Filters(holder="x"))
        data.entities(Filters(data_path="task", data_value="build"))
        data.flags_cache.refresh()
        data.holders_cache.refresh()
    finally:
        store._run = run  # type: ignore[method-assign]
    plans = []
    for sql, params in captured:
        if "GROUP BY" in sql:
            continue
        if store._f.name == "sqlite":
            rows = store._run("EXPLAIN QUERY PLAN " + sql, params)
            plans.append("\n".join(str(r[-1]) for r in rows))
        else:
            with store.engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                with raw.cursor() as cur:
                    cur.execute("SET enable_seqscan = off")  # small tables: is there an index path at all?
                    cur.execute("EXPLAIN " + sql, params)
                    plans.append("\n".join(r[0] for r in cur.fetchall()))
                    cur.execute("RESET enable_seqscan")
    return plans


def test_the_list_walks_indexes_and_never_scans_the_table(store: SqlStore) -> None:
    seed(store)
    data = inspector(store)
    data.counts_cache.floor = 3600
    plans = _plans(store, data)
    assert plans
    entities = store._sql.E.split(".")[-1].strip('"')
    for plan in plans:
        if store._f.name == "sqlite":
            assert "SCAN e\n" not in plan + "\n" and "SCAN e USING" not in plan.replace("COVERING", ""), plan
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan
        else:
            assert f"Seq Scan on {entities}" not in plan, plan
