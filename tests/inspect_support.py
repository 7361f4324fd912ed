"""Fixtures of the inspector's browser tests (imported by them): the inspector served for
real (uvicorn in a thread) and a headless Chromium driving it.

Chromium is Debian's (``/usr/bin/chromium`` and ``chromedriver``); the tests skip with the
reason when either is missing, unless ``FSM_REQUIRE_BROWSER=1`` (set in CI) makes that a
failure.  Screenshots go to ``FSM_ARTIFACTS_DIR`` when set, else under pytest's tmp path.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import postgres_url

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle, Reaper, ReapResult
from fsm.reaping.ticklog import TickLog
from fsm.work.keeper import KeeperCore

REQUIRE_BROWSER_ENV = "FSM_REQUIRE_BROWSER"
ARTIFACTS_ENV = "FSM_ARTIFACTS_DIR"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
    # a hostile name resolving to this machine, as after DNS rebinding: the Host check must refuse it
    "--host-resolver-rules=MAP evil.example 127.0.0.1",
)
HOSTILE_ID = "<script>window.__pwned=1</script>\"'&<b>x"
HOSTILE_DATA = {"note": '<img src=x onerror="window.__pwned=2">', "quote": 'it\'s "quoted" </pre>'}
HOSTILE_OWNER = '<img src=x onerror="window.__pwned=3">\'worker'
LONG_JOB = "job-long"
"""Renewed for minutes by one holder, reclaimed by the reaper when that holder died, resumed
by another: the timeline's lease renewals."""
FIRST_HOLDER, SECOND_HOLDER = "worker-b:host2:77", "worker-c:host3:19"
FAILED_JOB = "job-failed"
FAILURE = {"type": "GateFailed", "message": "merge-gate: 2 tests failed", "traceback": "Traceback (most recent)\n..."}
ORPHAN = "job-orphan"
"""A finalizer reclaimed by the reaper that no worker claimed: waiting for a worker."""


def _problem() -> str | None:
    for name in ("chromium", "chromedriver"):
        if shutil.which(name) is None:
            return f"{name} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed (pip install 'fsm-lifecycles[inspect,test]')"
    return None


@pytest.fixture(scope="session", name="browser")
def chromium() -> Iterator[Any]:
    problem = _problem()
    if problem is not None:
        if os.environ.get(REQUIRE_BROWSER_ENV) == "1":
            pytest.fail(f"browser tests cannot run: {problem} ({REQUIRE_BROWSER_ENV}=1)")
        pytest.skip(f"browser tests skipped: {problem}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="fsm-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(name="artifacts")
def artifacts_dir(tmp_path: Path) -> Path:
    directory = Path(os.environ.get(ARTIFACTS_ENV) or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class Served:
    """A seeded store, the inspector serving it, and an engine to change it meanwhile."""

    def __init__(self, url: str, prefix: str) -> None:
        from stores.sql import SqlStore

        self.url, self.prefix = url, prefix
        # seeded in the recent past, so the page shows live leases and an expired one
        start = datetime.now(UTC) - timedelta(minutes=7) - JobLifecycle.policy.lease_ttl
        self.clock = ManualClock(start)
        self.store = SqlStore(url, table_prefix=prefix, clock=self.clock)
        self.jobs = Engine(JobLifecycle, self.store, owner="worker-a:host1:4242")
        self.first = Engine(JobLifecycle, self.store, owner=FIRST_HOLDER)
        self.second = Engine(JobLifecycle, self.store, owner=SECOND_HOLDER)
        self.keeper: KeeperCore | None = None
        self.pipelines = Engine(PipelineLifecycle, self.store, owner="ci-runner-7")
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.base = ""

    def advance(self, delta: timedelta) -> None:
        """Move the clock on, the long job's keeper renewing its lease on the way (as a
        keeper does, every third of the TTL)."""
        step = JobLifecycle.policy.lease_ttl / 3
        while delta > timedelta():
            moved = min(step, delta)
            self.clock.advance(moved)
            delta -= moved
            if self.keeper is not None and moved == step:
                assert self.keeper.renew().renewed

    def seed(self) -> None:
        jobs, pipelines, clock = self.jobs, self.pipelines, self.clock
        self.first.create(LONG_JOB, data={"task": "reindex the catalogue"})
        [long] = self.first.claim(1)
        assert long.lease is not None and long.id == LONG_JOB
        self.keeper = KeeperCore(self.first, long.lease)
        pipelines.create("pipe-deploy-41", data={"commit": "9f2c1e"})  # its finalizer dies: lease expires
        pipelines.fire("pipe-deploy-41", "start")
        pipelines.fire("pipe-deploy-41", "finish")
        for i in range(3):
            jobs.create(f"job-done-{i}", data={"task": "deploy"})
        done = jobs.claim(3)
        for snap in done:
            assert snap.lease is not None
            jobs.run(snap.id, "merge-gate", lambda key: {"status": "passed"}, snap.lease)
            jobs.fire(snap.id, "exited", lease=snap.lease, data={"exit_code": 0})
            jobs.fire(snap.id, "complete", lease=snap.lease)
        jobs.create(FAILED_JOB, data={"task": "deploy"})  # its gate fails: the failure reason column
        [failing] = jobs.claim(1)
        assert failing.lease is not None and failing.id == FAILED_JOB
        jobs.fire(FAILED_JOB, "exited", lease=failing.lease, data={"exit_code": 0})
        jobs.fire(FAILED_JOB, "fail", lease=failing.lease, data={"error": FAILURE})
        self.advance(timedelta(minutes=5))
        self.first.fire(LONG_JOB, "exited", lease=self.keeper.held.check(), data={"exit_code": 0})
        jobs.create("job-stuck", data={"task": "migrate"})
        [stuck] = jobs.claim(1)
        jobs.create(ORPHAN, data={"task": "publish"})  # its finalizer dies and nobody resumes it
        [orphan] = jobs.claim(1)
        assert orphan.lease is not None and orphan.id == ORPHAN
        jobs.fire(ORPHAN, "exited", lease=orphan.lease, data={"exit_code": 0})
        self.advance(timedelta(minutes=1))
        self.keeper = None  # the long job's first holder dies: its lease lapses, the reaper reclaims it
        jobs.create("job-live", data={"task": "index"})
        [live] = jobs.claim(1)
        assert stuck.id == "job-stuck" and live.id == "job-live"
        clock.advance(JobLifecycle.policy.lease_ttl - timedelta(seconds=10))  # job-stuck's lease lapses
        assert live.lease is not None
        jobs.renew_lease(live.lease)
        jobs.record_progress(live.lease, {"phase": "indexing", "done": 40})
        reaper = Reaper(self.store, [JobLifecycle], clock=clock, owner="reaper:ops-1:77")
        ticks = TickLog(self.store)
        ticks.record(reaper.run_once(), reaper.owner)
        [resumed] = self.second.claim(1)  # the reclaimed finalizer, resumed by another worker
        assert resumed.id == LONG_JOB and resumed.lease is not None
        self.keeper = KeeperCore(self.second, resumed.lease)
        self.advance(timedelta(seconds=5))
        ticks.record(ReapResult(lost_races=2, bad_rows=1, errors=1, duration_s=0.004), "reaper:ops-2:91")
        for i in range(4):
            jobs.create(f"job-queued-{i}", data={"task": f"build #{i}"})
        for i in range(2):
            pipelines.create(f"pipe-{i}", concurrency_key="main")
            pipelines.fire(f"pipe-{i}", "start")
        jobs.create(HOSTILE_ID, data=HOSTILE_DATA)
        hostile = jobs.acquire_lease(HOSTILE_ID, owner=HOSTILE_OWNER, ttl=timedelta(hours=1))
        jobs.renew_lease(hostile, ttl=timedelta(hours=1))
        self.advance(timedelta(seconds=50))  # the second holder's keeper renews too
        clock.set(datetime.now(UTC))  # later writes (the tests') happen now; a test renews through the keeper

    def serve(self, **options: Any) -> str:
        from fsm.inspect.app import create_app
        from stores.sql import SqlStore

        reader = SqlStore(self.url, table_prefix=self.prefix, create=False)
        options.setdefault("count_every", 0.2)
        app = create_app(reader, [JobLifecycle, PipelineLifecycle], refresh_ms=300, **options)
        self.reader = reader
        self.server, self.thread, self.base = serve_asgi(app)
        return self.base

    def close(self) -> None:
        if self.server is not None:
            stop_serving(self.server, self.thread)
            self.reader.close()
        self.store.close()


def serve_asgi(app: Any) -> tuple[Any, threading.Thread, str]:
    """``app`` served by uvicorn in a thread on a free loopback port, bounded as ``fsm
    inspect`` serves it (:mod:`fsm.inspect.serving`): (server, thread, base URL)."""
    import uvicorn

    from fsm.inspect import serving

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(serving.config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


def stop_serving(server: Any, thread: threading.Thread | None) -> None:
    streams = getattr(server.config.app, "streams", None)
    if streams is not None:  # open /events streams (a browser still on the page) would hold uvicorn
        streams.close()
    server.should_exit = True
    if thread is not None:
        thread.join(10)


class Answer:
    """One HTTP answer (any status), read whole."""

    def __init__(self, status: int, headers: Any, body: str) -> None:
        self.status, self.headers, self.body = status, headers, body


def http(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None) -> Answer:
    """``url`` fetched with urllib (redirects not followed), whatever its status."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return Answer(response.status, response.headers, response.read().decode())
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.headers, err.read().decode(errors="replace"))


@pytest.fixture(name="served", params=["sqlite", "postgres"], scope="module")
def served_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Seeded and served once per dialect: the tests only add to it (and check relative to it)."""
    if request.param == "sqlite":
        target = Served(f"sqlite:///{tmp_path_factory.mktemp('inspect')}/fsm.db", "fsm_")
    else:
        target = Served(postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    try:
        target.seed()
        target.serve()
        yield target
    finally:
        target.close()
        if request.param == "postgres":
            import sqlalchemy as sa

            from stores.sql.migrate import drop_schema

            engine = sa.create_engine(target.url)
            drop_schema(engine, table_prefix=target.prefix)
            engine.dispose()


INSPECTED = (JobLifecycle, PipelineLifecycle)
"""The lifecycles :func:`inspector` shows."""


def inspector(store: Any, count_every: float = 0.0) -> Any:
    """The inspector's data layer on ``store`` for the built-in lifecycles (counts cached for
    ``count_every`` seconds)."""
    from fsm.engine.work import claim_plan
    from fsm.inspect.data import InspectorData

    plans = {lc.kind: claim_plan(lc.table) for lc in INSPECTED}
    return InspectorData(
        store,
        {lc.kind: list(lc.table.leaves) for lc in INSPECTED},
        resumes={k: list(r) for k, (_, r) in plans.items()},
        claim_events={k: {s.event for s in starts} for k, (starts, _) in plans.items()},
        finals={lc.kind: lc.table.finals for lc in INSPECTED},
        count_every=count_every,
    )


@pytest.fixture(name="store", params=["sqlite", "postgres"])
def a_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A SQL store on SQLite (a file) or PostgreSQL (a prefix of its own, dropped after)."""
    from stores.sql import SqlStore

    if request.param == "sqlite":
        store = SqlStore(f"sqlite:///{tmp_path}/fsm.db", table_prefix="fsm_")
        yield store
        store.close()
        return
    url, prefix = postgres_url(), f"t{uuid.uuid4().hex[:10]}_"
    store = SqlStore(url, table_prefix=prefix)
    try:
        yield store
    finally:
        store.close()
        import sqlalchemy as sa

        from stores.sql.migrate import drop_schema

        engine = sa.create_engine(url)
        drop_schema(engine, table_prefix=prefix)
        engine.dispose()


def post_action(base: str, form: dict[str, str], token: str, headers: dict[str, str] | None = None) -> Answer:
    """The form ``form`` posted to the inspector's ``/action`` as the bearer of ``token``."""
    from urllib.parse import urlencode

    return http(
        base + "/action",
        method="POST",
        data=urlencode(form).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-www-form-urlencoded",
            **(headers or {}),
        },
    )
