"""The inspector's entity page with timed transitions: the timers an entity is waiting out
and when each is due (the facts, the top of the timeline, the diagram and its fallback),
escaped like every other value, over HTTP and in headless Chromium (screenshots)."""

from __future__ import annotations

import re
import shutil
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import postgres_url
from inspect_support import (  # noqa: F401 - fixtures
    artifacts_dir,
    chromium,
    http,
    serve_asgi,
    stop_serving,
)
from statemachine import State
from test_timers.charts import Approval

from fsm import Engine, JobLifecycle, Lifecycle, ManualClock, PipelineLifecycle, reaper, starts, worker
from fsm.inspect.security import CSP

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE_REASON = '<img src=x onerror="window.__pwned=7">\'"&'


class Hostile(Lifecycle):
    """A timer whose reason is markup: the page must show it as text."""

    kind = "hostile-timer"
    waiting = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(waiting.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    timeout = reaper(waiting.to(failed), after=timedelta(hours=3), reason=HOSTILE_REASON)


class Site:
    """A store seeded with timed entities, the inspector serving it with their lifecycles,
    and a second inspector that was not given them."""

    def __init__(self, url: str, prefix: str) -> None:
        from stores.sql import SqlStore

        self.url, self.prefix = url, prefix
        self.writer = SqlStore(url, table_prefix=prefix)
        self.since: dict[str, datetime] = {}
        self.servers: list[Any] = []

    def make(self, lifecycle: type[Lifecycle], entity: str, ago: timedelta, *events: str) -> None:
        """``entity`` created ``ago`` before now, then ``events`` fired at once."""
        from stores.sql import SqlStore

        clock = ManualClock(datetime.now(UTC) - ago)
        store = SqlStore(self.url, table_prefix=self.prefix, clock=clock)
        engine = Engine(lifecycle, store, clock=clock)
        engine.create(entity)
        for event in events:
            engine.fire(entity, event)
        since = engine.get(entity).timer_since
        if since is not None:
            self.since[entity] = since
        store.close()

    def seed(self) -> None:
        self.make(Approval, "req-wait", timedelta(hours=2))  # timeout due in about 22h
        self.make(Approval, "req-run", timedelta(minutes=30), "start")  # deadline due in about 1h, needs lease_stale
        self.make(Approval, "req-over", timedelta(hours=26))  # timeout overdue by about 2h
        self.make(Approval, "req-done", timedelta(minutes=5), "cancel")  # failed: no timer
        self.make(Hostile, "hostile-1", timedelta(minutes=1))
        Engine(JobLifecycle, self.writer).create("job-1")

    def serve(self, lifecycles: list[type[Lifecycle]]) -> str:
        from fsm.inspect.app import create_app
        from stores.sql import SqlStore

        reader = SqlStore(self.url, table_prefix=self.prefix, create=False)
        app = create_app(reader, lifecycles, refresh_ms=300, count_every=0.2)
        server, thread, base = serve_asgi(app)
        self.servers.append((server, thread, reader))
        return str(base)

    def close(self) -> None:
        for server, thread, reader in self.servers:
            stop_serving(server, thread)
            reader.close()
        self.writer.close()


class Served:
    def __init__(self, site: Site, base: str, blind: str) -> None:
        self.site, self.base, self.blind = site, base, blind
        self.dialect = site.url.split(":")[0].split("+")[0]

    def page(self, entity: str, base: str | None = None) -> str:
        answer = http(f"{base or self.base}/entity?" + urlencode({"id": entity}))
        assert answer.status == 200, answer.body[:300]
        assert answer.headers.get("content-security-policy") == CSP
        return answer.body

    def due(self, entity: str, after: timedelta) -> datetime:
        return self.site.since[entity] + after


@pytest.fixture(name="served", params=["sqlite", "postgres"], scope="module")
def served_site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if request.param == "sqlite":
        site = Site(f"sqlite:///{tmp_path_factory.mktemp('timers')}/fsm.db", "fsm_")
    else:
        site = Site(postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    try:
        site.seed()
        base = site.serve([JobLifecycle, PipelineLifecycle, Approval, Hostile])
        blind = site.serve([JobLifecycle, PipelineLifecycle])  # not given the timed lifecycles
        yield Served(site, base, blind)
    finally:
        site.close()
        if request.param == "postgres":
            import sqlalchemy as sa

            from stores.sql.migrate import drop_schema

            engine = sa.create_engine(site.url)
            drop_schema(engine, table_prefix=site.prefix)
            engine.dispose()


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def timer_items(body: str) -> list[str]:
    return re.findall(r"<li class='ev timer[^']*'.*?</li>", body)


def facts_row(body: str, name: str) -> str:
    found = re.search(rf"<tr><th[^>]*>{name}</th><td>(.*?)</td></tr>", body)
    return found.group(1) if found else ""


# -- over HTTP -------------------------------------------------------------------------------


def test_a_waiting_entitys_page_says_when_its_timer_is_due(served: Served) -> None:
    body = served.page("req-wait")
    due = served.due("req-wait", timedelta(hours=24))
    (item,) = timer_items(body)
    assert f"data-timer='timeout' data-due='{due.isoformat()}'" in item
    assert "timeout: waiting → failed" in item and "after 24h in waiting, by reaper, reason: timed out" in item
    assert re.search(r">in 2[12]h \d\dm</span>", item) and f"due {stamp(due)}" in item
    # the one line still to come is the timeline's first: it runs newest first
    timeline = body[body.index("<ol class=timeline>") :]
    assert timeline.index("ev timer") < timeline.index("<li", timeline.index("ev timer") + 1)
    fact = facts_row(body, "timers")
    assert fact.startswith("<div class='timer' data-timer='timeout'><b>timeout</b> due <span class='when due'")
    assert f"</span> · {stamp(due)} <span class=muted>(after 24h in waiting)</span>" in fact


def test_a_timer_that_needs_another_guard_says_so(served: Served) -> None:
    body = served.page("req-run")
    (item,) = timer_items(body)
    assert "deadline: active → failed" in item and "after 1h30m in active" in item
    assert "also needs lease_stale" in item and re.search(r">in (59m \d\ds|1h 00m)</span>", item)
    assert "also needs lease_stale" in facts_row(body, "timers")


def test_an_overdue_timer_is_marked(served: Served) -> None:
    body = served.page("req-over")
    (item,) = timer_items(body)
    assert item.startswith("<li class='ev timer overdue'") and re.search(r">overdue by (1h 59m|2h 00m)</span>", item)
    fact = facts_row(body, "timers")
    assert fact.startswith("<div class='timer overdue' data-timer='timeout'><b>timeout</b> <span class='when due")
    assert "<span class=tag>timer overdue</span>" in item


def test_no_timer_is_shown_when_none_runs(served: Served) -> None:
    for entity in ("req-done", "job-1"):
        body = served.page(entity)
        assert timer_items(body) == [] and facts_row(body, "timers") == "", entity


def test_an_inspector_not_given_the_lifecycle_says_the_clock_runs(served: Served) -> None:
    body = served.page("req-wait", served.blind)
    assert timer_items(body) == []
    fact = facts_row(body, "timers")
    assert re.search(r"clock running for <span title='[^']+'>2h 00m</span>", fact)
    assert "--lifecycle MODULE:Class" in fact


def test_a_timers_reason_is_shown_as_text(served: Served) -> None:
    body = served.page("hostile-1")
    (item,) = timer_items(body)
    assert "reason: &lt;img src=x onerror=&quot;window.__pwned=7&quot;&gt;&#x27;&quot;&amp;" in item
    assert "<img src=x" not in body


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_the_entitys_diagram_marks_the_due_time_on_the_timed_edge(served: Served) -> None:
    from fsm.diagram.pending import timestamp

    answer = http(f"{served.base}/diagram.svg?" + urlencode({"id": "req-run"}))
    assert answer.status == 200 and answer.headers.get("content-type", "").startswith("image/svg+xml")
    due = timestamp(served.due("req-run", timedelta(minutes=90)), millis=False)
    lines = ["".join(t.itertext()).replace("\xa0", " ") for t in ET.fromstring(answer.body).iter(f"{SVG}text")]
    assert f"due {due}" in lines  # on the timed edge
    box = "timer deadline after 1h30m in active (also needs lease_stale): "
    assert any(line.startswith(box) for line in lines)  # in the entity's box
    assert not any("after_1h30m" in line for line in lines)  # its generated guard is drawn "after 1h30m"


def test_without_graphviz_the_transition_table_says_when_the_timer_is_due(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsm.diagram.graphviz_render import DOT_ENV

    monkeypatch.setenv(DOT_ENV, "no-such-dot-program")  # the server runs in this process
    body = served.page("req-wait")
    rows = re.findall(r"<tr class='(current|)' data-from='(\w+)'><td>(.*?)</td>.*?<td>([^<]*)</td></tr>", body)
    timed = {(frm, re.sub(r"<[^>]+>", "", cell)): (current, guards) for current, frm, cell, guards in rows}
    (wait_row,) = [k for k in timed if k[0] == "waiting" and k[1].startswith("timeout")]
    assert re.fullmatch(r"timeout after 24h due in 2[12]h \d\dm", wait_row[1]) and timed[wait_row][0] == "current"
    deadlines = [k for k in timed if k[1].startswith("deadline")]
    assert {k[1] for k in deadlines} == {"deadline after 1h30m"}  # not the entity's timer: no due time
    assert {timed[k][1] for k in deadlines} == {"lease_stale"}  # its generated guard is not a guard


# -- in the browser --------------------------------------------------------------------------


def texts(browser: Any, selector: str) -> list[str]:
    return list(
        browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", selector
        )
    )


def wait_for(condition: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the page")
        time.sleep(0.05)


@pytest.mark.browser
def test_the_entity_page_shows_its_timers_in_the_browser(browser: Any, served: Served, artifacts: Path) -> None:
    browser.get(served.base + "/entity?" + urlencode({"id": "req-run"}))
    items = texts(browser, "ol.timeline li")
    assert items[0].startswith("in ") and "TIMER DUE" in items[0].upper() and "deadline: active → failed" in items[0]
    assert "also needs lease_stale" in items[0]
    (fact,) = texts(browser, "table.facts div.timer")
    said = r"deadline due in \d\dm \d\ds · [-\d]+ [:\d]+ UTC \(after 1h30m in active, also needs lease_stale\)"
    assert re.fullmatch(said, fact), fact
    # drawn from the style sheet (the CSP allows no inline style): a dashed red rule
    style = browser.execute_script(
        "const s = getComputedStyle(document.querySelector('li.timer'));return [s.borderLeftStyle, s.borderLeftColor]"
    )
    assert style == ["dashed", "rgb(192, 57, 43)"]
    if shutil.which("dot") is not None:
        width = "const i = document.querySelector('img.diagram'); return i && i.complete ? i.naturalWidth : 0"
        assert wait_for(lambda: browser.execute_script(width)) > 0
    shots = artifacts / served.dialect
    shots.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shots / "entity-timer.png"))
    browser.execute_script("document.querySelector('section.diagram-box').scrollIntoView()")
    browser.save_screenshot(str(shots / "entity-timer-diagram.png"))

    browser.get(served.base + "/entity?" + urlencode({"id": "req-over"}))
    (overdue,) = texts(browser, "li.timer.overdue")
    assert overdue.startswith("overdue by ") and "TIMER OVERDUE" in overdue.upper()
    (fact,) = texts(browser, "table.facts div.timer.overdue")
    assert fact.startswith("timeout overdue by ")
    browser.save_screenshot(str(shots / "entity-timer-overdue.png"))

    browser.get(served.base + "/entity?" + urlencode({"id": "hostile-1"}))
    (line,) = texts(browser, "li.timer")
    assert HOSTILE_REASON in line and browser.execute_script("return window.__pwned") is None
