"""The stored schedules on the inspector's overview, on SQLite and PostgreSQL: each listed
with its lifecycle, id, cron and time zone or interval, policies, status, next due time and
last run (linked); a paused one shown paused; markup shown as text; their reserved rows
(kind ``fsm.schedule``) never counted or listed as a lifecycle's entities; and the reads
bounded (index walks).  Over HTTP and in headless Chromium (a screenshot of the section)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from inspect_support import (  # noqa: F401 - fixtures
    Served,
    a_store,
    artifacts_dir,
    chromium,
    http,
    inspector,
    serve_asgi,
    served_store,
    stop_serving,
)

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.inspect.data import SCHEDULES_SHOWN, Filters, InspectorData, ScheduleList
from fsm.inspect.security import CSP
from fsm.inspect.timeline import esc
from fsm.inspect.views import schedules_section
from fsm.records import NewEntity
from fsm.scheduling import SCHEDULE_KIND, Schedule, Schedules, schedule_row_id
from stores.sql import SqlStore

HOSTILE_SCHEDULE = "<script>window.__pwned=4</script>\"'&<b>x"
HOSTILE_RUN_DATA = {"note": '<img src=x onerror="window.__pwned=5">'}
BERLIN = "Europe/Berlin"


def add_schedules(store: SqlStore, clock: ManualClock) -> str:
    """Three schedules: a cron one in Berlin, a hostile-named interval one that has run once,
    and a paused one of another lifecycle.  Returns the id of the run created."""
    jobs = Schedules(Engine(JobLifecycle, store, clock=clock))
    pipelines = Schedules(Engine(PipelineLifecycle, store, clock=clock))
    jobs.add(Schedule("nightly", cron="30 2 * * *", timezone=BERLIN, overlap="cancel", catch_up="none"))
    jobs.add(Schedule(HOSTILE_SCHEDULE, every=90, data=HOSTILE_RUN_DATA, overlap="allow", catch_up="all"))
    pipelines.add(Schedule("hourly", every=timedelta(hours=1)))
    pipelines.pause("hourly")
    clock.advance(timedelta(seconds=91))
    [run] = jobs.run_due().created
    assert run.startswith(HOSTILE_SCHEDULE + "@")
    return run


def seed_entities(store: SqlStore, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, store, clock=clock)
    for i in range(3):
        jobs.create(f"job-{i}", data={"task": "build"})
    jobs.claim(1)


def test_schedules_are_listed_with_their_fields(store: SqlStore) -> None:
    clock = ManualClock(datetime.now(UTC))
    seed_entities(store, clock)
    run = add_schedules(store, clock)
    listed = inspector(store).schedules()
    assert listed.problem is None and not listed.more
    by_id = {(r.kind, r.schedule_id): r for r in listed.rows}
    assert [(r.kind, r.schedule_id) for r in listed.rows] == sorted(by_id)  # by lifecycle, then id
    nightly, hostile, hourly = by_id["job", "nightly"], by_id["job", HOSTILE_SCHEDULE], by_id["pipeline", "hourly"]
    assert (nightly.cron, nightly.every, nightly.timezone) == ("30 2 * * *", None, BERLIN)
    assert (nightly.overlap, nightly.catch_up, nightly.paused, nightly.last_run) == ("cancel", "none", False, None)
    assert nightly.next_due is not None and nightly.next_due.astimezone(UTC).minute == 30  # 02:30 Berlin is :30 UTC
    assert (hostile.cron, hostile.every, hostile.overlap, hostile.catch_up) == (None, 90.0, "allow", "all")
    assert hostile.last_run == run and listed.runs[run] == ("queued", False)
    assert hostile.next_due is not None and hostile.row_id == schedule_row_id("job", HOSTILE_SCHEDULE)
    assert hourly.paused and hourly.next_due is None and hourly.every == 3600.0
    assert all(r.problem is None for r in listed.rows)

    now = datetime.now(UTC)
    html = schedules_section(now, listed)
    assert "2 active, 1 paused" in html
    assert "cron <code>30 2 * * *</code> <span class=muted>Europe/Berlin</span>" in html
    assert "every <code>1m30s</code>" in html and "every <code>1h</code>" in html
    assert "data-schedule='pipeline/hourly' data-status='paused'" in html
    assert "<span class='state sched-paused'>paused</span>" in html and "none while paused" in html
    assert "<script>" not in html and "<b>x" not in html  # the hostile id, escaped everywhere
    assert "&lt;script&gt;window.__pwned=4&lt;/script&gt;&quot;&#x27;&amp;&lt;b&gt;x" in html
    assert "/entity?" + urlencode({"id": run}) in html.replace("&amp;", "&")  # the last run, linked
    assert "<span class=muted>none yet</span>" in html  # nightly has not run


def test_nothing_is_shown_without_schedules(store: SqlStore) -> None:
    seed_entities(store, ManualClock(datetime.now(UTC)))
    listed = inspector(store).schedules()
    assert listed.rows == [] and listed.problem is None
    assert schedules_section(datetime.now(UTC), listed) == ""


def test_delayed_fire_rows_are_not_counted_or_listed_as_entities(store: SqlStore) -> None:
    clock = ManualClock(datetime.now(UTC))
    seed_entities(store, clock)
    jobs = Engine(JobLifecycle, store, clock=clock)
    request = jobs.fire_later("job-0", "cancel", after=3600)
    data = inspector(store)
    counts = data.counts().value
    assert all(not kind.startswith("fsm.later:") for kind in counts)
    assert all(not kind.startswith("fsm.later:") for kind, _ in data.pairs())
    assert request.id not in [s.id for s in data.entities(Filters(limit=500)).rows]
    assert data.entities(Filters(kind="fsm.later:job")).rows == []


def test_schedule_rows_are_not_counted_or_listed_as_entities(store: SqlStore) -> None:
    clock = ManualClock(datetime.now(UTC))
    seed_entities(store, clock)
    run = add_schedules(store, clock)
    data = inspector(store)
    counts = data.counts().value
    assert SCHEDULE_KIND not in counts and counts["job"] == {"queued": 3, "running": 1}  # 2 + the run, 1 claimed
    assert all(kind != SCHEDULE_KIND for kind, _ in data.pairs())
    listed = [s.id for s in data.entities(Filters(limit=500)).rows]
    assert sorted(listed) == sorted([run, "job-0", "job-1", "job-2"])
    for filters in (
        Filters(kind=SCHEDULE_KIND),
        Filters(kind=SCHEDULE_KIND, state="active"),
        Filters(kind=SCHEDULE_KIND, state="paused"),
        Filters(text="fsm-schedule:"),
        Filters(data_path="id", data_value="nightly"),
    ):
        assert data.entities(filters).rows == [], filters
    activity = data.activity().value
    assert activity.sampled == 4  # the entities only: no schedule row in the charts' sample
    assert all(m.kind != SCHEDULE_KIND for m in activity.moves)
    assert all(not i.startswith("fsm-schedule:") for h in data.holders().value for i in h.all_ids)
    flags = data.flags().value
    assert SCHEDULE_KIND not in flags.expired and SCHEDULE_KIND not in flags.waiting


def test_a_damaged_schedule_row_still_shows_as_text(store: SqlStore) -> None:
    store.create(
        NewEntity(
            id="fsm-schedule:job:<i>bad</i>",
            kind=SCHEDULE_KIND,
            state="active",
            concurrency_key="job",
            data={
                "id": "<i>bad</i>",
                "schedule": {"cron": 5, "every": "<b>soon</b>", "overlap": "<script>x()</script>", "grace": -1},
                "last_run": 7,
            },
            run_after=datetime.now(UTC) + timedelta(minutes=5),
        )
    )
    store.create(NewEntity(id="fsm-schedule:job:empty", kind=SCHEDULE_KIND, state="paused", data={}))
    listed = inspector(store).schedules()
    bad, empty = sorted(listed.rows, key=lambda r: r.row_id)
    assert bad.schedule_id == "<i>bad</i>" and bad.cron is None and bad.every is None and bad.last_run is None
    assert bad.problem is not None and "neither a cron expression nor an interval" in bad.problem
    assert "last_run is not an id" in bad.problem
    assert empty.kind == "" and empty.problem is not None and "no stored schedule" in empty.problem
    html = schedules_section(datetime.now(UTC), listed)
    assert "damaged row" in html and "<script>" not in html and "<i>" not in html
    assert "&lt;script&gt;x()&lt;/script&gt;" in html and "&lt;i&gt;bad&lt;/i&gt;" in html


def test_a_long_list_of_schedules_is_cut_and_says_so(store: SqlStore) -> None:
    schedules = Schedules(Engine(JobLifecycle, store))
    for i in range(5):
        schedules.add(Schedule(f"every-{i}", every=60 + i))
    data = inspector(store)
    listed = data.schedules(shown=3)
    assert [r.schedule_id for r in listed.rows] == ["every-0", "every-1", "every-2"] and listed.more
    assert f"The first {SCHEDULES_SHOWN} active" in schedules_section(datetime.now(UTC), listed)
    assert len(data.schedules().rows) == 5 and not data.schedules().more


def test_the_schedule_reads_walk_indexes(store: SqlStore) -> None:
    clock = ManualClock(datetime.now(UTC))
    seed_entities(store, clock)
    add_schedules(store, clock)
    data = inspector(store)
    captured: list[tuple[str, dict[str, Any]]] = []
    run = store._run

    def spy(sql: str, params: dict[str, Any], **kw: Any) -> Any:
        captured.append((sql, dict(params)))
        return run(sql, params, **kw)

    store._run = spy  # type: ignore[method-assign]
    try:
        assert len(data.schedules().rows) == 3
    finally:
        store._run = run  # type: ignore[method-assign]
    assert len(captured) == 3  # a walk per state (active, paused), one primary key read of the last runs
    entities = store._sql.E.split(".")[-1].strip('"')
    for sql, params in captured:
        if store._f.name == "sqlite":
            plan = "\n".join(str(r[-1]) for r in store._run("EXPLAIN QUERY PLAN " + sql, params))
            assert "SCAN e\n" not in plan + "\n" and "SCAN e USING" not in plan.replace("COVERING", ""), plan
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan or "PRIMARY KEY" in plan, plan
        else:
            with store.engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                with raw.cursor() as cur:
                    cur.execute("SET enable_seqscan = off")
                    cur.execute("EXPLAIN " + sql, params)
                    plan = "\n".join(r[0] for r in cur.fetchall())
                    cur.execute("RESET enable_seqscan")
            assert f"Seq Scan on {entities}" not in plan, plan


# -- served: over HTTP and in the browser --------------------------------------------------------


@pytest.fixture(name="scheduled", scope="module")
def scheduled_store(served: Served) -> Iterator[tuple[Served, str]]:
    """The served store with the three schedules added (once per module and dialect)."""
    yield served, add_schedules(served.store, served.clock)


def test_the_overview_lists_the_schedules_over_http(scheduled: tuple[Served, str]) -> None:
    served, run = scheduled
    for path in ("/", "/fragment/overview"):
        answer = http(served.base + path)
        assert answer.status == 200, answer.body[:300]
        body = answer.body
        assert answer.headers.get("content-security-policy") == CSP
        assert "<section class=schedules>" in body and "data-schedule='job/nightly' data-status='active'" in body
        assert "data-schedule='pipeline/hourly' data-status='paused'" in body
        assert "<script>window.__pwned=4" not in body and "&lt;script&gt;window.__pwned=4" in body
        assert "data-id='fsm-schedule:" not in body  # not an entity row
        assert f"data-kind='{SCHEDULE_KIND}'" not in body and f"data-count='{SCHEDULE_KIND}/" not in body
        assert f"<option value='{SCHEDULE_KIND}'" not in body  # nor a lifecycle to filter by
        assert f"data-id='{esc(run)}'" in body  # its run is an entity like any other
    listed = http(served.base + "/?" + urlencode({"kind": SCHEDULE_KIND, "state": "active"}))
    assert listed.status == 200 and "No entity matches." in listed.body
    runs = http(served.base + "/?" + urlencode({"kind": "job", "q": HOSTILE_SCHEDULE + "@"}))  # its "runs" link
    assert f"data-id='{esc(run)}'" in runs.body and "data-id='job-" not in runs.body
    history = http(served.base + "/entity?" + urlencode({"id": schedule_row_id("job", "nightly")}))
    assert history.status == 200 and "fsm-schedule:job:nightly" in history.body  # the schedule's own page


def test_the_section_is_absent_from_a_store_without_schedules(tmp_path: Path) -> None:
    from fsm.inspect.app import create_app

    store = SqlStore(f"sqlite:///{tmp_path}/none.db", table_prefix="fsm_")
    seed_entities(store, ManualClock(datetime.now(UTC)))
    server, thread, base = serve_asgi(create_app(store, [JobLifecycle], count_every=0.1))
    try:
        answer = http(base + "/")
        assert answer.status == 200 and "<section class=schedules>" not in answer.body
        assert "Schedules" not in answer.body
        Schedules(Engine(JobLifecycle, store)).add(Schedule("later", every=600))
        answer = http(base + "/")
        assert "<section class=schedules>" in answer.body and "data-schedule='job/later'" in answer.body
    finally:
        stop_serving(server, thread)
        store.close()


def _rows(browser: Any) -> dict[str, dict[str, str]]:
    """Each schedule row's cells, by ``data-schedule`` (one script call: the page swaps live)."""
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-schedule]')).map(r => [r.getAttribute('data-schedule'),"
        " r.getAttribute('data-status'), Array.from(r.cells).map(c => c.innerText)])"
    )
    names = ("lifecycle", "schedule", "when", "overlap", "catch-up", "status", "next due", "last run", "links")
    return {key: {"data-status": status, **dict(zip(names, cells, strict=True))} for key, status, cells in found}


def wait_for(condition: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the page")
        time.sleep(0.05)


def shoot(browser: Any, path: Path) -> Path:
    """The whole page (Chromium's capture beyond the window), as the README's screenshots are taken."""
    import base64

    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


@pytest.mark.browser
def test_the_schedules_in_a_browser(browser: Any, scheduled: tuple[Served, str], artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    served, run = scheduled
    dialect = served.url.split(":")[0].split("+")[0]
    browser.get(served.base + "/")
    rows = wait_for(lambda: _rows(browser))
    assert sorted(rows) == sorted(["job/nightly", f"job/{HOSTILE_SCHEDULE}", "pipeline/hourly"])
    nightly, hostile, hourly = rows["job/nightly"], rows[f"job/{HOSTILE_SCHEDULE}"], rows["pipeline/hourly"]
    assert (nightly["lifecycle"], nightly["schedule"], nightly["when"]) == (
        "job",
        "nightly",
        f"cron 30 2 * * * {BERLIN}",
    )
    assert (nightly["overlap"], nightly["catch-up"], nightly["status"]) == ("cancel", "none", "active")
    assert nightly["next due"].startswith("in ") and nightly["next due"].endswith(":30:00 UTC")
    assert nightly["last run"] == "none yet"
    assert (hostile["schedule"], hostile["when"], hostile["overlap"], hostile["catch-up"]) == (
        HOSTILE_SCHEDULE,
        "every 1m30s",
        "allow",
        "all",
    )
    assert hostile["last run"] == f"{run} queued"
    assert (hourly["lifecycle"], hourly["status"], hourly["data-status"]) == ("pipeline", "paused", "paused")
    assert hourly["when"] == "every 1h" and hourly["next due"] == "none while paused"
    heading = browser.execute_script("return document.querySelector('section.schedules h2').innerText")
    assert "2 active, 1 paused" in heading
    # not entities: no row of the table, no count card, no lifecycle in the filter
    ids = browser.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-id]')).map(r => r.getAttribute('data-id'))"
    )
    assert run in ids and not [i for i in ids if i.startswith("fsm-schedule:")]
    assert browser.execute_script(f"return document.querySelectorAll(\"[data-kind='{SCHEDULE_KIND}']\").length") == 0
    options = browser.execute_script("return Array.from(document.querySelectorAll('select option')).map(o => o.value)")
    assert SCHEDULE_KIND not in options
    assert browser.execute_script("return window.__pwned") is None
    assert browser.execute_script("return document.querySelectorAll('main script, main img[src=x]').length") == 0
    browser.execute_script("document.querySelector('section.schedules').scrollIntoView()")
    section = browser.find_element(By.CSS_SELECTOR, "section.schedules")
    section.screenshot(str(artifacts / f"schedules-{dialect}.png"))
    shoot(browser, artifacts / f"schedules-page-{dialect}.png")

    # a schedule paused elsewhere shows paused without a reload (its row's transition is in the feed)
    browser.execute_script("window.__same_page = 'yes'")
    Schedules(Engine(JobLifecycle, served.store, clock=served.clock)).pause("nightly")
    try:
        wait_for(lambda: _rows(browser).get("job/nightly", {}).get("data-status") == "paused")
        assert browser.execute_script("return window.__same_page") == "yes"
        assert _rows(browser)["job/nightly"]["next due"] == "none while paused"
    finally:
        Schedules(Engine(JobLifecycle, served.store, clock=served.clock)).resume("nightly")

    # the last run's link opens that entity's page
    wait_for(lambda: browser.execute_script("return document.querySelector('a.last-run') !== null"))
    browser.execute_script("document.querySelector('a.last-run').click()")
    wait_for(lambda: browser.execute_script("var h = document.querySelector('h1.id'); return h && h.innerText") == run)
    assert browser.execute_script("return window.__pwned") is None

    # its history link: the schedule's own row, each step it took in its timeline
    browser.get(served.base + "/")
    wait_for(lambda: browser.execute_script("return document.querySelector('a.history') !== null"))
    browser.execute_script("document.querySelector(\"tr[data-schedule='pipeline/hourly'] a.history\").click()")
    row_id = schedule_row_id("pipeline", "hourly")
    wait_for(
        lambda: browser.execute_script("var h = document.querySelector('h1.id'); return h && h.innerText") == row_id
    )
    timeline = wait_for(
        lambda: browser.execute_script("var t = document.querySelector('ol.timeline'); return t && t.innerText")
    )
    assert "paused" in timeline
    box = browser.execute_script("return document.querySelector('section.diagram-box').innerText")
    assert "the library's own bookkeeping" in box  # not "give its lifecycle to fsm inspect"
    assert browser.execute_script("return document.querySelector('section.attempts')") is None  # a pause is no error
    shoot(browser, artifacts / f"schedule-history-{dialect}.png")


def test_schedules_list_data_is_what_the_page_reads(scheduled: tuple[Served, str]) -> None:
    """The served page and the data layer agree (one reader each, same store)."""
    served, _ = scheduled
    data = InspectorData(served.reader)
    listed: ScheduleList = data.schedules()
    body = http(served.base + "/fragment/overview").body
    for r in listed.rows:
        status = "paused" if r.paused else "active"
        assert f"data-schedule='{esc(r.kind)}/{esc(r.schedule_id)}' data-status='{status}'" in body


def test_a_tick_that_created_scheduled_runs_is_not_folded_as_idle() -> None:
    """When the tick log records the runs a tick's schedules created (``scheduled``), the
    ticks table says so and does not fold that tick into the idle ones."""
    from fsm.inspect.data import ReaperTick
    from fsm.inspect.views import ticks_section

    now = datetime.now(UTC)
    idle = {"owner": "r1", "moved": {}, "lost_races": 0, "refused": 0, "bad_rows": 0, "errors": 0}
    ticks = [
        ReaperTick(3, now, idle),
        ReaperTick(2, now - timedelta(seconds=1), {**idle, "scheduled": {"job": 2, "pipeline": 0}}),
        ReaperTick(1, now - timedelta(seconds=2), {**idle, "scheduled": {"job": 0}}),
        ReaperTick(0, now - timedelta(seconds=3), idle),
    ]
    html = ticks_section(now, ticks)
    assert "<tr data-tick='2'>" in html and "nothing; scheduled job 2</td>" in html
    assert html.count("data-idle-ticks='2'") == 1  # tick 1 (scheduled nothing) folds with tick 0
