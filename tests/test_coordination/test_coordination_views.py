"""What an operator sees of coordination: ``fsm show``, the inspector's entity page and an
entity's diagram name its priority, its parent and children, and the limit that holds a
waiting entity back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")

from inspect_support import http, serve_asgi, stop_serving

from fsm import Engine, JobLifecycle
from fsm.cli import main
from fsm.diagram.extract import extract
from fsm.diagram.mermaid import to_mermaid
from stores.sql import SqlStore

from .keyed import FewJob, KeyedJob

KEYED = ["--lifecycle", "test_coordination.keyed:KeyedJob"]


@pytest.fixture(name="url")
def seeded(tmp_path: Path) -> Iterator[str]:
    """A SQLite store: a parent with three children (one started), a prioritised job, and
    two jobs of one key under a limit of one, the first holding its slot."""
    url = f"sqlite:///{tmp_path / 'fsm.db'}"
    store = SqlStore(url)
    jobs = Engine(JobLifecycle, store)
    jobs.create("build-1", priority=7)
    for name in ("lint", "test", "docs"):
        jobs.create(f"build-1/{name}", parent="build-1")
    assert [s.id for s in jobs.claim(1)] == ["build-1"]  # the raised priority goes first
    keyed = Engine(KeyedJob, store)
    keyed.create("k-1", concurrency_key="acme")
    keyed.create("k-2", concurrency_key="acme")
    keyed.create("k-3", concurrency_key="other")
    assert sorted(s.id for s in keyed.claim(5)) == ["k-1", "k-3"]
    few = Engine(FewJob, store)
    for i in range(3):
        few.create(f"f-{i}")
    assert len(few.claim(5)) == 2
    store.close()
    yield url


def show(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["show", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_show_lists_the_children_and_the_priority(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = show(capsys, "--db", url, "build-1")
    assert "  priority 7\n" in out
    assert "  children (3):\n    build-1/docs (job): queued\n    build-1/lint (job): queued\n" in out
    child = show(capsys, "--db", url, "build-1/lint")
    assert "  parent: build-1\n" in child and "children" not in child and "priority" not in child


def test_show_says_which_limit_holds_a_waiting_entity_back(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "  waiting for its key 'acme': 1 of 1 slots held\n" in show(capsys, "--db", url, "k-2", *KEYED)
    assert "waiting for" not in show(capsys, "--db", url, "k-1", *KEYED)  # it holds the slot
    few = ["--lifecycle", "test_coordination.keyed:FewJob"]
    assert "  waiting for a slot of 'few-job': 2 of 2 held\n" in show(capsys, "--db", url, "f-2", *few)
    # without its lifecycle the limit is not known here: nothing is claimed about it
    assert "waiting for" not in show(capsys, "--db", url, "k-2")


def test_show_json_has_the_family_and_the_limit(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(show(capsys, "--db", url, "--json", "k-2", *KEYED))
    assert doc["waiting_for"] == "waiting for its key 'acme': 1 of 1 slots held"
    assert doc["priority"] == 0 and doc["parent_id"] is None and doc["children"] == []
    parent = json.loads(show(capsys, "--db", url, "--json", "build-1"))
    assert parent["priority"] == 7 and not parent["more_children"]
    assert [c["id"] for c in parent["children"]] == ["build-1/docs", "build-1/lint", "build-1/test"]


def test_the_diagram_names_the_parent_and_counts_the_children(url: str) -> None:
    store = SqlStore(url, create=False)
    try:
        parent = to_mermaid(extract(JobLifecycle, store=store, entity_id="build-1"))
        child = to_mermaid(extract(JobLifecycle, store=store, entity_id="build-1/test"))
    finally:
        store.close()
    assert "children: 3: 3 queued" in parent and "parent:" not in parent
    assert "parent: build-1" in child and "children:" not in child


def test_the_inspector_links_parent_and_children_and_flags_the_limit(url: str) -> None:
    from fsm.inspect.app import create_app

    reader = SqlStore(url, create=False)
    server, thread, base = serve_asgi(create_app(reader, [JobLifecycle, KeyedJob]))
    try:

        def page(entity: str) -> str:
            answer: Any = http(f"{base}/entity?" + urlencode({"id": entity}))
            assert answer.status == 200, answer.body[:300]
            return str(answer.body)

        parent = page("build-1")
        assert parent.count("data-child>") == 3
        assert "href='/entity?id=build-1%2Flint'" in parent and "<th>priority</th><td>7</td>" in parent
        child = page("build-1/lint")
        assert "data-parent>build-1</a>" in child and "data-child>" not in child
        assert "waiting for its key &#x27;acme&#x27;: 1 of 1 slots held" in page("k-2")
        assert "data-limit" not in page("k-1")
    finally:
        stop_serving(server, thread)
        reader.close()
