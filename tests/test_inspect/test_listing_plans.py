"""The inspector's entity table reads the ``recent`` index ``(kind, state, updated_at, id)``
in its own order, on SQLite and PostgreSQL (EXPLAIN): the default list, a keyset next page
and the data field search's bounded window each walk it per (kind, state) pair, never
sorting a pair's rows nor scanning the table (revision 0006; without the index every page
sorted each pair whole).  And the keyset seek stays exact through rows sharing one
``updated_at`` (a batch of creates writes them so)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inspect_support import a_store  # noqa: F401 - the store fixture
from inspect_support import inspector as shared_inspector

from fsm import Engine, JobLifecycle, PipelineLifecycle
from fsm.inspect import listing
from fsm.inspect.data import Filters, InspectorData
from stores.sql import SqlStore


def inspector(store: SqlStore) -> InspectorData:
    data: InspectorData = shared_inspector(store, count_every=3600)
    return data


def seed(store: SqlStore) -> None:
    """Enough rows in several (kind, state) pairs that a planner with statistics weighs a
    sort against the walk (a few rows sort for free, and would prove nothing)."""
    jobs, pipes = Engine(JobLifecycle, store), Engine(PipelineLifecycle, store)
    for batch in range(3):
        jobs.create_many(
            [{"task": f"task-{i % 7}"} for i in range(500)], ids=[f"job-{batch}-{i:03d}" for i in range(500)]
        )
    pipes.create_many([{"task": "build"} for _ in range(400)], ids=[f"pipe-{i:03d}" for i in range(400)])
    assert len(jobs.claim(60)) == 60  # a second pair of jobs, under leases
    for i in range(40):
        pipes.fire(f"pipe-{i:03d}", "start")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


@contextlib.contextmanager
def captured_statements(store: SqlStore) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Inside the block, every statement the store runs, with its parameters."""
    captured: list[tuple[str, dict[str, Any]]] = []
    run = store._run

    def spy(sql: str, params: dict[str, Any], **kw: Any) -> Any:
        captured.append((sql, dict(params)))
        return run(sql, params, **kw)

    store._run = spy  # type: ignore[method-assign]
    try:
        yield captured
    finally:
        store._run = run  # type: ignore[method-assign]


def statements(store: SqlStore, data: InspectorData) -> dict[str, tuple[str, dict[str, Any]]]:
    """The SQL of the default list, its keyset next page and a data field search's two
    reads (the window's end, then the matches in it), with their parameters."""
    first = data.entities(Filters(limit=50))
    assert first.more is not None
    with captured_statements(store) as captured:
        data.entities(Filters(limit=50))
        data.entities(Filters(limit=50, after=first.more))
        data.entities(Filters(data_path="task", data_value="task-3"))
    assert len(captured) == 4, [s for s, _ in captured]
    return dict(zip(("default list", "next page", "data search window", "data search matches"), captured, strict=True))


def sqlite_walks(store: SqlStore, sql: str, params: dict[str, Any]) -> list[list[str]]:
    """Each per-pair walk of the plan: the details of one co-routine's own steps."""
    rows = store._run("EXPLAIN QUERY PLAN " + sql, params)
    children: dict[int, list[str]] = {}
    for _, parent, _, detail in rows:
        children.setdefault(int(parent), []).append(str(detail))
    walks = [children.get(int(node), []) for node, _, _, detail in rows if str(detail).startswith("CO-ROUTINE")]
    assert all("SCAN e" not in d for details in children.values() for d in details), rows
    return walks


def pg_walks(store: SqlStore, sql: str, params: dict[str, Any], table: str) -> list[tuple[dict[str, Any], list[str]]]:
    """Each scan of ``table`` in the PostgreSQL plan (EXPLAIN, JSON), with the node types
    between it and the nearest ``Limit`` above it: its pair's walk."""
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        with raw.cursor() as cur:
            cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            (document,) = cur.fetchone()  # type: ignore[misc]
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    found: list[tuple[dict[str, Any], list[str]]] = []
    todo: list[tuple[dict[str, Any], list[str]]] = [(plan, [])]
    while todo:
        node, above = todo.pop()
        if node.get("Relation Name") == table:
            found.append((node, above))
        below = [] if node["Node Type"] == "Limit" else [*above, node["Node Type"]]
        todo.extend((child, below) for child in node.get("Plans", []))
    return found


def test_the_list_its_next_page_and_the_data_search_walk_the_recent_index_unsorted(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a window smaller than the pairs, as at scale (a pair smaller than its window is read
    # whole either way, and a planner may rightly sort it)
    monkeypatch.setattr(listing, "SCAN", 30)
    seed(store)
    data = inspector(store)
    data.counts_cache.refresh()
    table = store._sql.E.split(".")[-1].strip('"')
    recent = f"ix_{table}_recent"
    pairs = len(data.pairs())
    assert pairs >= 4
    for name, (sql, params) in statements(store, data).items():
        if store._f.name == "sqlite":
            walks = sqlite_walks(store, sql, params)
            assert len(walks) == pairs, (name, walks)
            for steps in walks:
                # the walk itself: one search of the recent index, no sort of its rows (the
                # merge above re-orders at most a page per pair, the walks' output)
                assert len(steps) == 1 and steps[0].startswith(f"SEARCH e USING INDEX {recent} (kind=? AND state=?"), (
                    name,
                    steps,
                )
            if name == "next page":
                assert all("(updated_at,id)<(?,?)" in steps[0] for steps in walks), walks  # a seek, not a filter
        else:
            walks = pg_walks(store, sql, params, table)
            assert len(walks) == pairs, (name, walks)
            for scan, between in walks:
                # each pair's LIMIT reads the index scan itself, newest first: no sort between
                assert (scan["Node Type"], scan.get("Index Name"), between) == ("Index Scan", recent, []), (
                    name,
                    scan["Node Type"],
                    scan.get("Index Name"),
                    between,
                )
                assert scan["Scan Direction"] == "Backward", (name, scan)
                if name == "next page":
                    assert "ROW(" in scan["Index Cond"], scan  # the keyset is the index's seek


def test_keyset_pages_stay_exact_through_rows_sharing_one_updated_at(store: SqlStore) -> None:
    jobs = Engine(JobLifecycle, store)
    ids = [f"tie-{i:02d}" for i in range(23)]
    made = jobs.create_many([None] * len(ids), ids=ids)  # one statement: one updated_at
    assert len({s.updated_at for s in made}) == 1
    jobs.create("later")
    data = inspector(store)
    data.counts_cache.refresh()
    seen, query = [], Filters(limit=5)
    for _ in range(10):
        listed = data.entities(query)
        seen.extend(s.id for s in listed.rows)
        if listed.more is None:
            break
        query = Filters(limit=5, after=listed.more)
    assert seen == ["later", *sorted(ids, reverse=True)]  # each once, newest first, then by id


@pytest.mark.parametrize("statistics", ["none", "all but the recent index", "all"])
def test_the_id_prefix_search_reads_a_primary_key_range_whatever_sqlite_knows(tmp_path: Path, statistics: str) -> None:
    """Without statistics (or with none for one index, as after an upgrade) SQLite would take
    a (kind, state, ...) index for the prefix search and sort every row it holds by id."""
    url = f"sqlite:///{tmp_path}/fsm.db"
    store = SqlStore(url, table_prefix="fsm_")
    seed(store)  # ANALYZE: every index described
    with store.engine.begin() as conn:
        if statistics == "none":
            conn.exec_driver_sql("DELETE FROM sqlite_stat1")
        elif statistics == "all but the recent index":
            conn.exec_driver_sql("DELETE FROM sqlite_stat1 WHERE idx = 'ix_fsm_entities_recent'")
    store.close()
    store = SqlStore(url, table_prefix="fsm_")  # connections that read the statistics anew
    try:
        data = inspector(store)
        data.counts_cache.refresh()
        with captured_statements(store) as captured:
            found = data.entities(Filters(text="job-1-04"))
        assert [s.id for s in found.rows] == [f"job-1-04{i}" for i in range(10)]
        ((sql, params),) = captured
        plan = [str(r[-1]) for r in store._run("EXPLAIN QUERY PLAN " + sql, params)]
        assert plan == ["SEARCH e USING INDEX sqlite_autoindex_fsm_entities_1 (id>? AND id<?)"], plan
    finally:
        store.close()
