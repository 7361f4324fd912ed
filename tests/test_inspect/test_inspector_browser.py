"""The inspector in a real browser (headless Chromium): counts, timeline, live updates, escaping."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from inspect_support import (  # noqa: F401 - fixtures
    FIRST_HOLDER,
    HOSTILE_DATA,
    HOSTILE_ID,
    HOSTILE_OWNER,
    LONG_JOB,
    SECOND_HOLDER,
    Served,
    artifacts_dir,
    chromium,
    served_store,
)

pytestmark = pytest.mark.browser


def has_graphviz() -> bool:
    from fsm.diagram.graphviz_render import GraphvizNotFound, find_dot

    try:
        find_dot()
    except GraphvizNotFound:
        return False
    return True


def wait_for(condition: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the page")
        time.sleep(0.05)


# The page swaps its live region in every few hundred ms, so each read is one script
# call (an element reference could go stale between two WebDriver calls).


def texts(browser: Any, selector: str) -> list[str]:
    return list(
        browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", selector
        )
    )


def attrs(browser: Any, selector: str, name: str) -> list[str]:
    return list(
        browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]))",
            selector,
            name,
        )
    )


def rows_by_id(browser: Any) -> dict[str, str]:
    pairs = browser.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-id]')).map(r => [r.getAttribute('data-id'), r.innerText])"
    )
    return {k: v for k, v in pairs}


def text(browser: Any, selector: str) -> str:
    found = texts(browser, selector)
    return found[0] if found else ""


def count_cell(browser: Any, kind: str, state: str) -> str:
    return text(browser, f"td[data-count='{kind}/{state}']")


def test_the_overview_shows_the_stores_counts_and_entities(browser: Any, served: Served, artifacts: Path) -> None:
    browser.get(served.base + "/")
    for kind, engine in (("job", served.jobs), ("pipeline", served.pipelines)):
        for state, n in engine.counts().items():
            assert count_cell(browser, kind, state) == str(n), (kind, state)
    rows = rows_by_id(browser)
    assert "job-live" in rows and "worker-a:host1:4242" in rows["job-live"]
    assert "job-stuck" in rows  # requeued by the reaper: its lease gone
    assert "expired" in rows["pipe-deploy-41"] and "reaper due" in rows["pipe-deploy-41"]
    assert text(browser, "p[data-expired='pipeline']").startswith("1 with an expired lease")
    reaper = text(browser, "section.reaper")
    assert "job-stuck" in reaper and "expire" in reaper
    ticks = texts(browser, "tr[data-tick]")
    assert len(ticks) == 2
    assert "reaper:ops-2:91" in ticks[0] and "2\t0\t1\t1" in ticks[0]  # lost races, refused, bad rows, errors
    assert "reaper:ops-1:77" in ticks[1] and "job.expire 1" in ticks[1]
    browser.save_screenshot(str(artifacts / f"overview-{served.url.split(':')[0]}.png"))


def test_the_filters_narrow_the_table(browser: Any, served: Served) -> None:
    browser.get(served.base + "/?" + urlencode({"kind": "job", "state": "completed"}))
    ids = sorted(rows_by_id(browser))
    assert ids == ["job-done-0", "job-done-1", "job-done-2"]
    browser.get(served.base + "/?" + urlencode({"q": "job-done-"}))  # an id prefix
    assert sorted(rows_by_id(browser)) == ["job-done-0", "job-done-1", "job-done-2"]
    browser.get(served.base + "/?" + urlencode({"holder": "worker-a:host1:4242"}))
    assert list(rows_by_id(browser)) == ["job-live"]
    browser.get(served.base + "/?" + urlencode({"expired": "1"}))
    assert list(rows_by_id(browser)) == ["pipe-deploy-41"]
    browser.get(served.base + "/?" + urlencode({"q": "' OR 1=1 --"}))  # a bound parameter, not SQL
    assert rows_by_id(browser) == {}
    browser.get(served.base + "/?" + urlencode({"data": "task", "value": "index"}))  # a data field
    assert list(rows_by_id(browser)) == ["job-live"]
    browser.get(served.base + "/?" + urlencode({"data": "task", "value": "' OR 1=1 --"}))
    assert rows_by_id(browser) == {}
    browser.get(served.base + "/?" + urlencode({"data": "exit_code", "value": "0", "state": "completed"}))
    assert sorted(rows_by_id(browser)) == ["job-done-0", "job-done-1", "job-done-2"]  # a number, as text


def test_pages_go_on_by_keyset_and_cover_every_entity_once(browser: Any, served: Served) -> None:
    every = {s.id for s in served.jobs.entities()} | {s.id for s in served.pipelines.entities()}
    browser.get(served.base + "/?" + urlencode({"limit": "3"}))
    seen: list[str] = []
    for _ in range(20):
        page = list(rows_by_id(browser))
        assert len(page) <= 3
        seen += page
        nxt = browser.execute_script("const a = document.querySelector('a.next'); return a ? a.href : null")
        if not nxt:
            break
        browser.get(nxt)
    assert len(seen) == len(set(seen)) and set(seen) == every
    assert "first page" in text(browser, "p.pager")


def test_an_entitys_page_shows_its_timeline_effects_and_diagram(browser: Any, served: Served, artifacts: Path) -> None:
    browser.get(served.base + "/entity?" + urlencode({"id": "job-done-0"}))
    seqs = [int(v) for v in attrs(browser, "li[data-seq]", "data-seq")]
    history = served.jobs.history("job-done-0")
    assert sorted(seqs) == [h.seq for h in history]
    timeline = text(browser, "ol.timeline")
    for h in history:
        assert f"#{h.seq} {h.event}: {h.source} → {h.target}" in timeline
    assert "merge-gate" in timeline  # the recorded effect
    if has_graphviz():
        width = "const i = document.querySelector('img.diagram'); return i && i.complete ? i.naturalWidth : 0"
        assert wait_for(lambda: browser.execute_script(width)) > 0
    else:  # no Graphviz here: the page shows the transition table instead of a broken image
        assert texts(browser, "img.diagram") == [] and "install Graphviz" in text(browser, "p.hint")
    browser.save_screenshot(str(artifacts / f"entity-{served.url.split(':')[0]}.png"))

    browser.get(served.base + "/entity?" + urlencode({"id": "job-stuck"}))
    story = text(browser, "ol.timeline")
    assert "REAPER MOVE" in story.upper() and "expire" in story
    browser.get(served.base + "/entity?" + urlencode({"id": "job-live"}))
    story = text(browser, "ol.timeline")
    assert "LEASE RENEWAL" in story.upper() and "indexing" in story
    browser.save_screenshot(str(artifacts / f"entity-live-{served.url.split(':')[0]}.png"))


def test_an_entitys_timeline_shows_its_lease_renewals_folded_by_holder(
    browser: Any, served: Served, artifacts: Path
) -> None:
    browser.get(served.base + "/entity?" + urlencode({"id": LONG_JOB}))
    logged = served.jobs.renewals(LONG_JOB)
    folded = [int(v) for v in attrs(browser, "li.renewal[data-renewals]", "data-renewals")]
    taken = texts(browser, "li.renewal.acquired")
    assert sum(folded) + len(taken) == len(logged) and len(folded) < len(logged)
    # newest first; a transition ends a run, so the first holder's renewals are two lines
    assert attrs(browser, "li.renewal", "data-owner") == [SECOND_HOLDER, SECOND_HOLDER, FIRST_HOLDER, FIRST_HOLDER]
    assert folded == [1, 1, 7]
    story = text(browser, "ol.timeline")
    assert f"renewed 7 times by {FIRST_HOLDER}" in story and "about every 40s" in story
    assert f"{SECOND_HOLDER} took the lease" in story and "token 3" in taken[0]
    # the second holder took over after the reaper reclaimed the dead first holder's lease
    reclaim = story.index("reclaim")
    assert story.index(f"{SECOND_HOLDER} took the lease") < reclaim < story.index(f"renewed by {FIRST_HOLDER}")
    assert story.index(f"renewed by {FIRST_HOLDER}") < story.index("exited") < story.index("renewed 7 times")
    assert "then no renewal: the lease lapsed" in texts(browser, "li.renewal")[2]  # why the reaper reclaimed it
    assert SECOND_HOLDER in text(browser, "table.facts")  # the last renewal, in the facts
    browser.execute_script("document.querySelector('ol.timeline').parentElement.scrollIntoView()")
    browser.save_screenshot(str(artifacts / f"renewals-{served.url.split(':')[0]}.png"))

    browser.execute_script("window.__same_page = 'yes'")
    assert served.keeper is not None and served.keeper.renew().renewed  # the keeper renews: the page follows
    wait_for(lambda: f"renewed 2 times by {SECOND_HOLDER}" in text(browser, "ol.timeline"))
    assert browser.execute_script("return window.__same_page") == "yes"
    assert len(served.jobs.renewals(LONG_JOB)) == len(logged) + 1


def test_a_transition_shows_up_without_a_reload(browser: Any, served: Served, artifacts: Path) -> None:
    browser.get(served.base + "/entity?" + urlencode({"id": "pipe-0"}))
    browser.execute_script("window.__same_page = 'yes'")
    before = len(attrs(browser, "li[data-seq]", "data-seq"))
    lease = served.pipelines.fire("pipe-0", "finish").lease
    served.pipelines.fire("pipe-0", "succeed", lease=lease)
    wait_for(lambda: len(attrs(browser, "li[data-seq]", "data-seq")) == before + 2)
    wait_for(lambda: "completed" in text(browser, "table.facts"))
    assert browser.execute_script("return window.__same_page") == "yes"  # not reloaded

    browser.get(served.base + "/")
    browser.execute_script("window.__same_page = 'yes'")
    old = int(count_cell(browser, "job", "queued"))
    served.jobs.create("job-new")
    wait_for(lambda: count_cell(browser, "job", "queued") == str(old + 1))
    assert browser.execute_script("return window.__same_page") == "yes"
    browser.save_screenshot(str(artifacts / f"live-{served.url.split(':')[0]}.png"))


def test_hostile_ids_and_data_are_shown_as_text(browser: Any, served: Served, artifacts: Path) -> None:
    browser.get(served.base + "/")
    assert HOSTILE_ID in rows_by_id(browser)
    assert HOSTILE_ID in text(browser, "table.entities")
    browser.get(served.base + "/entity?" + urlencode({"id": HOSTILE_ID}))
    time.sleep(0.7)  # let a live update or two swap the fragment in as well
    assert text(browser, "h1.id") == HOSTILE_ID
    data = text(browser, "pre.data")
    for value in HOSTILE_DATA.values():  # shown as the JSON text it is stored as
        assert json.dumps(value)[1:-1] in data
    assert HOSTILE_OWNER in text(browser, "ol.timeline")  # its lease holder's name, as text
    assert f"renewed by {HOSTILE_OWNER}" in text(browser, "ol.timeline")
    assert browser.execute_script("return window.__pwned") is None
    assert texts(browser, "main script, main img[src=x]") == []
    browser.save_screenshot(str(artifacts / f"hostile-{served.url.split(':')[0]}.png"))


def test_the_inspector_has_no_write_action(served: Served) -> None:
    import urllib.error
    import urllib.request

    for path in ("/", "/entity?id=job-live", "/fragment/overview"):
        request = urllib.request.Request(served.base + path, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 405
    with urllib.request.urlopen(served.base + "/", timeout=5) as response:
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]


def test_a_rebound_hostile_name_gets_no_data(browser: Any, served: Served) -> None:
    """DNS rebinding: evil.example resolves to this machine (the browser's resolver rule), so
    a hostile page could read the inspector as same-origin; the Host check refuses it."""
    port = served.base.rsplit(":", 1)[1]
    browser.get(f"http://evil.example:{port}/")
    body = text(browser, "body")
    assert "Invalid host header" in body and "job-live" not in body
    browser.get(f"http://localhost:{port}/")
    assert "job-live" in rows_by_id(browser)


def test_bad_input_gets_a_4xx_page_in_the_browser(browser: Any, served: Served) -> None:
    browser.get(served.base + "/entity?id=a%00b")
    assert text(browser, "p.problem").startswith("id must not contain NUL")
    assert text(browser, "h1").startswith("400")
    browser.get(served.base + "/?q=%00")
    assert text(browser, "h1").startswith("400") and "q must not contain NUL" in text(browser, "p.problem")
    browser.get(served.base + "/no/such/page")
    assert text(browser, "h1").startswith("404")
    browser.get(served.base + "/entity?" + urlencode({"id": "job-queued-0"}))  # never fired: shown, not a 500
    assert text(browser, "h1.id") == "job-queued-0"


def test_a_guarded_page_opens_once_from_its_one_time_url(browser: Any, served: Served, artifacts: Path) -> None:
    from inspect_support import serve_asgi, stop_serving

    from fsm import JobLifecycle, PipelineLifecycle
    from fsm.inspect.app import create_app
    from fsm.inspect.security import Tokens

    tokens = Tokens("a-long-enough-bearer-token-for-tests")
    server, thread, base = serve_asgi(create_app(served.reader, [JobLifecycle, PipelineLifecycle], tokens=tokens))
    try:
        browser.get(base + "/")
        assert text(browser, "h1").startswith("401") and "job-live" not in text(browser, "body")
        code = tokens.new_code()
        browser.get(f"{base}/login?code={code}")  # sets the cookie, then goes to the overview
        assert browser.current_url == base + "/"
        assert "job-live" in rows_by_id(browser)
        browser.get(base + "/entity?" + urlencode({"id": "job-live"}))
        assert text(browser, "h1.id") == "job-live"
        browser.delete_all_cookies()
        browser.get(f"{base}/login?code={code}")  # used: refused, no cookie
        assert text(browser, "h1").startswith("403")
        browser.get(base + "/")
        assert text(browser, "h1").startswith("401")
        browser.save_screenshot(str(artifacts / "signin-refused.png"))
    finally:
        stop_serving(server, thread)


def test_the_overview_answers_operators_questions(browser: Any, served: Served, artifacts: Path) -> None:
    from inspect_support import FAILED_JOB, FAILURE, ORPHAN

    browser.get(served.base + "/")
    # work waiting for a worker: the reclaimed finalizer nobody claimed
    orphan = served.jobs.get(ORPHAN)
    assert orphan.state == "finalizing" and orphan.lease_owner is None
    assert text(browser, "p[data-waiting='job/finalizing']").startswith("1 finalizing waiting for a worker")
    # the failure reason column
    assert f"{FAILURE['type']}: {FAILURE['message']}" in rows_by_id(browser)[FAILED_JOB]
    # workers and holders: each owner with what it holds and its last renewal
    holders = dict(
        browser.execute_script(
            "return Array.from(document.querySelectorAll('tr[data-holder]')).map(r => "
            "[r.getAttribute('data-holder'), r.innerText])"
        )
    )
    assert SECOND_HOLDER in holders and LONG_JOB in holders[SECOND_HOLDER]
    assert "job-live" in holders["worker-a:host1:4242"] and "ago" in holders["worker-a:host1:4242"]
    assert "pipe-deploy-41" in holders["ci-runner-7"] and "lapsed" in holders["ci-runner-7"]
    # the charts count what history holds
    entities = [*served.jobs.entities(), *served.pipelines.entities()]
    kinds = {s.id: s.kind for s in entities}
    CLAIMS = {("job", "start"), ("pipeline", "finish")}  # noqa: N806
    history = [h for s in entities for h in served.store.history(s.id)]
    wanted = {
        "transitions": len(history),
        # a claim is a lease-taking start: a job's start, a pipeline's finish (its finalizer lease)
        "claims": sum(1 for h in history if (kinds[h.entity_id], h.event) in CLAIMS),
        "reaper": sum(1 for h in history if h.actor == "reaper"),
    }

    def totals() -> dict[str, int]:
        pairs = browser.execute_script(
            "return Array.from(document.querySelectorAll('figure[data-chart]')).map(f => "
            "[f.getAttribute('data-chart'), f.getAttribute('data-total')])"
        )
        return {k: int(float(v.replace(",", ""))) for k, v in pairs if k in wanted}

    wait_for(lambda: totals() == wanted)
    assert len(texts(browser, "figure[data-chart] svg rect")) > 0
    browser.save_screenshot(str(artifacts / f"overview-operators-{served.url.split(':')[0]}.png"))


def test_an_entitys_page_lists_each_attempts_error(browser: Any, served: Served) -> None:
    from inspect_support import FAILED_JOB, FAILURE

    browser.get(served.base + "/entity?" + urlencode({"id": FAILED_JOB}))
    attempts = text(browser, "section.attempts")
    assert f"{FAILURE['type']}: {FAILURE['message']}" in attempts and "fail: finalizing → failed" in attempts
    assert attrs(browser, "section.attempts details", "open") == [None]  # the traceback, folded
    assert texts(browser, "tr[data-attempt-seq] td.n") == ["1"]  # the first attempt failed
    browser.get(served.base + "/entity?" + urlencode({"id": "job-stuck"}))
    assert "expire: running → queued" in text(browser, "section.attempts")  # the reaper's reason


def test_without_graphviz_the_diagram_is_a_transition_table(
    browser: Any, served: Served, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsm.diagram.graphviz_render import DOT_ENV

    monkeypatch.setenv(DOT_ENV, "no-such-dot-program")  # the server runs in this process
    browser.get(served.base + "/entity?" + urlencode({"id": LONG_JOB}))
    assert texts(browser, "img.diagram") == []
    current = set(attrs(browser, "table.transitions tr.current", "data-from"))
    assert current and current <= {"finalizing", "active"}  # the current state's (and its parent's) rows
    events = texts(browser, "table.transitions tr.current td:first-child")
    assert "complete" in events and "reclaim" in events
    assert "install Graphviz" in text(browser, "p.hint")
    browser.execute_script("document.querySelector('section.diagram-box').scrollIntoView()")
    browser.save_screenshot(str(artifacts / f"diagram-fallback-{served.url.split(':')[0]}.png"))
    monkeypatch.delenv(DOT_ENV)
    if has_graphviz():  # with Graphviz back, the picture
        browser.get(served.base + "/entity?" + urlencode({"id": LONG_JOB}))
        width = "const i = document.querySelector('img.diagram'); return i && i.complete ? i.naturalWidth : 0"
        assert wait_for(lambda: browser.execute_script(width)) > 0


def test_idle_ticks_are_folded_into_one_row(browser: Any, served: Served) -> None:
    from fsm import ReapResult
    from fsm.reaping.ticklog import TickLog

    log = TickLog(served.store)
    for _ in range(20):
        assert log.record(ReapResult(duration_s=0.001), "reaper:ops-1:77")
    browser.get(served.base + "/")
    assert attrs(browser, "tr[data-idle-ticks]", "data-idle-ticks")[0] == "20"
    assert "20 idle ticks" in text(browser, "section.ticks")
    assert len(texts(browser, "section.ticks tr")) <= 10
    # the entities come before the reaper's sections: idle ticks never push them down
    order = browser.execute_script("return Array.from(document.querySelectorAll('main section')).map(s => s.className)")
    assert order.index("list") < order.index("ticks")
