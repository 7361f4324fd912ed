"""The SQLite hot path binds tuples: ``:name`` parameters become ``?`` in order."""

from __future__ import annotations

from stores.sql.core import positional


def test_named_parameters_become_question_marks_in_order_repeats_included() -> None:
    sql, values = positional("UPDATE t SET a = :a, b = :now, c = :now WHERE id = :id AND v = :version")
    assert sql == "UPDATE t SET a = ?, b = ?, c = ? WHERE id = ? AND v = ?"
    assert values({"a": 1, "now": "t", "id": "x", "version": 3, "unused": 9}) == (1, "t", "t", "x", 3)


def test_quoted_literals_and_casts_are_left_alone() -> None:
    sql, values = positional("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', :at), ':not_a_param', x::text FROM t")
    assert sql == "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', ?), ':not_a_param', x::text FROM t"
    assert values({"at": "now"}) == ("now",)


def test_one_and_no_parameters_still_give_tuples() -> None:
    assert positional("SELECT :x")[1]({"x": 5}) == (5,)
    sql, values = positional("SELECT 1")
    assert (sql, values({})) == ("SELECT 1", ())


def test_double_quoted_identifiers_are_not_parameters() -> None:
    """A bound application table's names are quoted identifiers; one may hold a quote or a colon."""
    import sqlite3

    sql = 'UPDATE t SET "it\'s" = :a WHERE "x:y" = :b AND c = :c'
    conn = sqlite3.connect(":memory:")
    conn.execute('CREATE TABLE t ("it\'s" TEXT, "x:y" TEXT, c TEXT)')
    conn.execute("INSERT INTO t VALUES ('old', 'k', 'z')")
    text, values = positional(sql)
    assert text == 'UPDATE t SET "it\'s" = ? WHERE "x:y" = ? AND c = ?'
    conn.execute(text, values({"a": "newer", "b": "k", "c": "z"}))
    assert conn.execute('SELECT "it\'s" FROM t').fetchone()[0] == "newer"
