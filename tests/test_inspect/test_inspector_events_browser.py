"""The page's live feed in a real browser (headless Chromium): a transition made by another
process shows up without a reload through ``/events`` (polling practically off), and a
browser without ``EventSource`` falls back to polling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import SqlTarget
from inspect_support import artifacts_dir, chromium  # noqa: F401 - fixtures
from test_inspector_browser import wait_for
from test_inspector_events import Inspector, elsewhere

from fsm.inspect.events import StreamLimits

pytestmark = pytest.mark.browser


def read(browser: Any, script: str) -> Any:
    """One script call per read: the live region may be swapped between two WebDriver calls."""
    return browser.execute_script(script)


SEQS = "return Array.from(document.querySelectorAll('li[data-seq]')).map(e => e.getAttribute('data-seq'))"
IDS = "return Array.from(document.querySelectorAll('tr[data-id]')).map(r => r.getAttribute('data-id'))"
STATUS = "return document.getElementById('status').textContent"
QUEUED = "const c = document.querySelector(\"td[data-count='pipeline/queued']\"); return c ? c.textContent : ''"


@pytest.fixture(name="events_page")
def events_only_page(sql_target: SqlTarget) -> Iterator[Inspector]:
    sql_target.store()
    elsewhere(sql_target, "create:pipe-live")
    # a poll an hour: only the stream can update the page
    page = Inspector(sql_target, StreamLimits(poll=0.05), refresh_ms=3_600_000, count_every=0.2)
    try:
        yield page
    finally:
        page.close()


def test_a_transition_in_another_process_appears_through_the_event_stream(
    browser: Any, events_page: Inspector, sql_target: SqlTarget, artifacts: Path
) -> None:
    browser.get(events_page.base + "/entity?" + urlencode({"id": "pipe-live"}))
    browser.execute_script("window.__same_page = 'yes'")
    wait_for(lambda: read(browser, STATUS).startswith("live (events)"))  # the stream is open
    assert read(browser, SEQS) == []
    elsewhere(sql_target, "start:pipe-live", "finish:pipe-live")  # a worker in another process
    wait_for(lambda: sorted(read(browser, SEQS)) == ["1", "2"])
    assert "finalizing" in read(browser, "return document.querySelector('table.facts').textContent")
    assert read(browser, "return window.__same_page") == "yes"  # not reloaded
    browser.save_screenshot(str(artifacts / f"events-entity-{sql_target.dialect}.png"))

    browser.get(events_page.base + "/")
    browser.execute_script("window.__same_page = 'yes'")
    wait_for(lambda: read(browser, STATUS).startswith("live (events)"))
    # queued pipelines: 1 when the server started, 0 since; 2 only after a recount after the
    # event (a create is no transition: the start is what the stream tells)
    elsewhere(sql_target, "create:pipe-a", "create:pipe-b", "create:pipe-c", "start:pipe-c")
    wait_for(lambda: {"pipe-a", "pipe-b", "pipe-c"} <= set(read(browser, IDS)))  # the list, read live
    wait_for(lambda: read(browser, QUEUED) == "2")  # the counts, recounted after the event
    assert read(browser, "return window.__same_page") == "yes"
    assert events_page.app.streams.opened() >= 1
    browser.save_screenshot(str(artifacts / f"events-overview-{sql_target.dialect}.png"))


def test_without_event_source_the_page_polls(browser: Any, sql_target: SqlTarget) -> None:
    sql_target.store()
    elsewhere(sql_target, "create:pipe-polled")
    page = Inspector(sql_target, StreamLimits(poll=0.05), refresh_ms=300, count_every=0.2)
    hidden = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "delete window.EventSource;"})
    try:
        browser.get(page.base + "/entity?" + urlencode({"id": "pipe-polled"}))
        browser.execute_script("window.__same_page = 'yes'")
        assert read(browser, "return typeof window.EventSource") == "undefined"
        elsewhere(sql_target, "start:pipe-polled")
        wait_for(lambda: read(browser, SEQS) == ["1"])
        assert read(browser, STATUS).startswith("live (polling)")
        assert read(browser, "return window.__same_page") == "yes"
        assert page.app.streams.opened() == 0  # it never opened one
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": hidden["identifier"]})
        page.close()
