"""The README's screenshots of ``fsm inspect``, taken from the browser tests' seeded store
with operator actions on (each page checked for what its picture is meant to show).

``FSM_SCREENSHOTS_DIR=diagrams/screenshots pytest tests/test_inspect/test_inspector_screenshots.py``
rewrites the README's pictures (from the SQLite store); otherwise they go to the artifacts
directory like every browser test's.  Each is the whole page, not the window.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from inspect_support import (  # noqa: F401 - fixtures
    FAILED_JOB,
    LONG_JOB,
    ORPHAN,
    Served,
    artifacts_dir,
    chromium,
    serve_asgi,
    served_store,
    stop_serving,
)

from fsm.inspect.actions import RETRY
from fsm.inspect.security import Tokens

pytestmark = pytest.mark.browser

SCREENSHOTS_ENV = "FSM_SCREENSHOTS_DIR"


def wait_for(found: Callable[[], Any], tries: int = 200) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(tries):
        try:
            value = found()
            if value:
                return value
        except StaleElementReferenceException:  # the live update replaced the element as we read it
            pass
        time.sleep(0.05)
    raise AssertionError("the page never showed it")


def shoot(browser: Any, directory: Path, name: str) -> Path:
    """The whole page as ``directory/name``: Chromium's DevTools capture beyond the window
    (the window keeps its size, so no scroll bar or empty band is drawn)."""
    import base64

    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = directory / name
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def test_the_readme_screenshots_show_the_operators_views(browser: Any, served: Served, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    dialect = served.url.split(":")[0]
    wanted = os.environ.get(SCREENSHOTS_ENV)
    directory = Path(wanted) if wanted and dialect == "sqlite" else artifacts / dialect
    directory.mkdir(parents=True, exist_ok=True)
    tokens = Tokens("a-screenshot-token-0123456789abcdef")
    server, thread, base = serve_asgi(
        _app(served, tokens)  # the same store, behind the token, with the actions on
    )

    def css(selector: str) -> list[Any]:
        return list(browser.find_elements(By.CSS_SELECTOR, selector))

    try:
        browser.get(f"{base}/login?code={tokens.new_code()}")
        # the overview: counts and flags (waiting for a worker, expired leases), the entities
        # with their failure reasons, reaper ticks, the charts, the workers holding leases
        browser.get(base + "/")
        wait_for(lambda: css("p[data-waiting='job/finalizing']") and css("figure[data-chart] svg rect"))
        assert css("tr[data-holder]") and ORPHAN in browser.page_source
        shoot(browser, directory, "inspector.png")
        # one entity: its facts, timeline (a holder's renewals folded, the lapse, the next holder), diagram
        browser.get(base + "/entity?" + urlencode({"id": LONG_JOB}))
        wait_for(lambda: css("ol.timeline li"))
        assert css("form.action[data-event='release']")  # a live finalizer: release, never cancel
        assert not css("form.action[data-event='cancel']")
        shoot(browser, directory, "inspector-entity.png")
        # a running job: the operator's cancel and release
        browser.get(base + "/entity?" + urlencode({"id": "job-live"}))
        wait_for(lambda: css("form.action[data-event='cancel']") and css("form.action[data-event='release']"))
        shoot(browser, directory, "inspector-actions.png")
        # a failed job: each attempt's error, and the retry (a new entity; the failed one stays failed)
        browser.get(base + "/entity?" + urlencode({"id": FAILED_JOB}))
        wait_for(lambda: css("section.attempts") and css(f"form.action[data-event='{RETRY}']"))
        retry_form = f"form.action[data-event='{RETRY}']"

        def typed() -> bool:  # found afresh: a live update may swap the form until it holds text
            css(retry_form)[0].find_element(By.NAME, "operator").send_keys("alice")
            return True

        wait_for(typed)  # an edited form is never swapped again (fsm.inspect.assets)
        form = css(retry_form)[0]
        form.find_element(By.NAME, "note").send_keys("the merge gate was flaky")
        shoot(browser, directory, "inspector-failed.png")
        form.find_element(By.TAG_NAME, "button").click()
        link = wait_for(lambda: css("a.retry-of"))[0]
        assert link.text == FAILED_JOB and served.jobs.get(FAILED_JOB).state == "failed"
        assert "resubmit: queued → queued" in browser.find_element(By.CSS_SELECTOR, "ol.timeline").text
        labels = [b.text for b in css("form.action button")]
        assert labels == ["cancel (to failed)"], labels  # a queued job: cancel, nothing else
        shoot(browser, directory, "inspector-retry.png")
    finally:
        stop_serving(server, thread)


def _app(served: Served, tokens: Tokens) -> Any:
    from fsm import JobLifecycle, PipelineLifecycle
    from fsm.inspect.app import create_app

    return create_app(
        served.reader, [JobLifecycle, PipelineLifecycle], tokens=tokens, allow_actions=True, count_every=0.2
    )
