"""The store's PostgreSQL connections parse each long statement once (psycopg re-parses a
statement over 4 kB at every run): the store's cursors are the parsed-once cursor, a long
statement answers right for every set of parameters, and the kept parses stay bounded."""

from __future__ import annotations

import pytest
from conftest import SqlTarget

from fsm import Engine, JobLifecycle
from stores.sql import SqlStore, parsed

pytestmark = pytest.mark.parametrize("sql_target", ["postgres"], indirect=True)

LONG = "SELECT %(a)s::int + %(b)s::int AS total /* " + "x" * 5000 + " */"


def _store(sql_target: SqlTarget) -> SqlStore:
    store = sql_target.store()
    assert isinstance(store, SqlStore)
    return store


def test_the_stores_connections_use_the_parsed_once_cursor_and_claims_work(sql_target: SqlTarget) -> None:
    store = _store(sql_target)
    factory = parsed.cursor_factory()
    assert factory is not None and type(store._conns.slot().cursor) is factory
    jobs = Engine(JobLifecycle, store)
    jobs.create_many([{} for _ in range(3)])
    assert len(jobs.claim(2)) == 2 and len(jobs.claim(2)) == 1  # the 8 kB claim, parsed once, twice right


def test_a_long_statement_answers_for_each_set_of_parameters(sql_target: SqlTarget) -> None:
    cur = _store(sql_target)._conns.slot().cursor
    for a, b in ((1, 2), (40, 2), (-5, 5)):
        cur.execute(LONG, {"a": a, "b": b})
        assert cur.fetchone() == (a + b,)
    assert any(query == LONG for query, _ in parsed._PARSED)


def test_past_the_bound_a_statement_is_parsed_each_time_and_still_answers(
    sql_target: SqlTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    cur = _store(sql_target)._conns.slot().cursor
    monkeypatch.setattr(parsed, "MAX_STATEMENTS", len(parsed._PARSED))
    other = LONG.replace("total", "other_total")
    cur.execute(other, {"a": 2, "b": 3})
    assert cur.fetchone() == (5,)
    assert all(query != other for query, _ in parsed._PARSED)
