"""Shared fixtures: a manual clock, and stores parametrized over every adapter.

``any_store`` runs a test against each store adapter; adapters that need a server skip
with a reason when it is absent, unless ``FSM_REQUIRE_POSTGRES=1`` (set in CI) turns the
skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator

import pytest

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.records import HistoryRecord, Snapshot
from stores import MemoryStore, Store

pytest_plugins = ["fsm.testing.pytest_plugin"]  # hypothesis profiles (FSM_HYPOTHESIS_PROFILE), kit fixtures

StoreFactory = Callable[[ManualClock], Store]


def _memory(clock: ManualClock) -> Store:
    return MemoryStore(clock=clock)


POSTGRES_URL_ENV = "FSM_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "FSM_REQUIRE_POSTGRES"
_postgres_problem: list[str] = []  # why PostgreSQL cannot be used, once found out


def postgres_url() -> str:
    """The PostgreSQL URL for tests, or skip (fail under ``FSM_REQUIRE_POSTGRES=1``) with the reason."""
    url = os.environ.get(POSTGRES_URL_ENV)
    problem = _postgres_problem[0] if _postgres_problem else None
    if url is None:
        problem = f"PostgreSQL tests need {POSTGRES_URL_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)"
    elif problem is None:
        import sqlalchemy as sa

        from stores.sql import create_engine

        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except Exception as err:
            problem = f"PostgreSQL at {url} is unreachable: {str(err).splitlines()[0]}"
            _postgres_problem.append(problem)
        finally:
            engine.dispose()
    if problem is not None:
        if os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
            pytest.fail(f"{problem} ({REQUIRE_POSTGRES_ENV}=1)")
        pytest.skip(problem)
    assert url is not None
    return url


POSTGRES_SKIP_PREFIX = "PostgreSQL "

WORKERS_PER_CORE = 2
"""``-n auto`` (the suite's addopts, pytest-xdist) starts this many workers per core, at least
four: most of the suite waits (on child processes, servers, PostgreSQL, Chromium), not
computes.  ``PYTEST_XDIST_AUTO_NUM_WORKERS=N`` picks N; ``-n 0`` runs in one process."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if chosen and chosen.isdigit():
        return int(chosen)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(4, WORKERS_PER_CORE * cores)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault suite's printed summaries (``record_property``), which reach the end of the
    run from whichever worker ran them (a worker's own output is not shown)."""
    for report in (r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])):
        for name, text in getattr(report, "user_properties", []):
            if name == "fault suite summary" and report.when == "call":
                terminalreporter.section(f"{name}: {report.nodeid}")
                terminalreporter.write_line(str(text))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Every PostgreSQL skip reported at one place, so ``pytest -ra`` prints it once
    (``SKIPPED [63] tests/conftest.py: PostgreSQL tests need ...``), not once per test."""
    report = yield
    longrepr = getattr(report, "longrepr", None)
    if getattr(report, "skipped", False) and isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        if reason.startswith(POSTGRES_SKIP_PREFIX):
            report.longrepr = ("tests/conftest.py", postgres_url.__code__.co_firstlineno, f"Skipped: {reason}")  # type: ignore[attr-defined]
    return report


def _sqlite(clock: ManualClock) -> Store:
    """A SqlStore on a fresh SQLite file, removed with its directory on close."""
    from stores.sql import SqlStore

    directory = tempfile.mkdtemp(prefix="fsm-sqlite-")
    store = SqlStore(f"sqlite:///{directory}/fsm.db", clock=clock)
    close = store.close

    def close_and_remove() -> None:
        close()
        shutil.rmtree(directory, ignore_errors=True)

    store.close = close_and_remove  # type: ignore[method-assign]
    return store


def isolated_postgres_store(clock: ManualClock | None = None, **options: object) -> Store:
    """A SqlStore on PostgreSQL with tables of its own (a unique prefix), dropped on close."""
    from stores.sql import SqlStore
    from stores.sql.migrate import drop_schema

    prefix = f"t{uuid.uuid4().hex[:10]}_"
    store = SqlStore(postgres_url(), clock=clock, table_prefix=prefix, **options)  # type: ignore[arg-type]
    close = store.close

    def close_and_drop() -> None:
        try:
            drop_schema(store.engine, table_prefix=prefix)
        finally:
            close()

    store.close = close_and_drop  # type: ignore[method-assign]
    return store


def _postgres(clock: ManualClock) -> Store:
    return isolated_postgres_store(clock)


STORE_FACTORIES: dict[str, StoreFactory] = {"memory": _memory, "sqlite": _sqlite, "postgres": _postgres}


class SqlTarget:
    """A database for one SQL test: a fresh SQLite file, or PostgreSQL with a unique table
    prefix; every store it opens is closed and its tables dropped afterwards."""

    def __init__(self, dialect: str, url: str, prefix: str) -> None:
        self.dialect = dialect
        self.url = url
        self.prefix = prefix
        self.stores: list[Store] = []
        self.cleanups: list[Callable[[], None]] = []
        self.prefixes: set[str] = {prefix}

    def store(self, **options: object) -> Store:
        from stores.sql import SqlStore

        options.setdefault("table_prefix", self.prefix)
        self.prefixes.add(str(options["table_prefix"]))  # each one's tables are dropped at close
        store = SqlStore(self.url, **options)  # type: ignore[arg-type]
        self.stores.append(store)
        return store

    def engine(self) -> object:
        from stores.sql import create_engine

        engine = create_engine(self.url)
        self.cleanups.append(engine.dispose)
        return engine

    def close(self) -> None:
        from stores.sql.migrate import drop_schema

        for store in self.stores:
            store.close()  # type: ignore[attr-defined]
        for cleanup in reversed(self.cleanups):
            cleanup()
        if self.dialect == "postgres":
            from stores.sql import create_engine

            engine = create_engine(self.url)
            try:
                for prefix in sorted(self.prefixes | {self.prefix}):
                    drop_schema(engine, table_prefix=prefix)
            finally:
                engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def sql_target(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[SqlTarget]:
    """Each SQL dialect in turn (PostgreSQL skips, or fails under FSM_REQUIRE_POSTGRES=1)."""
    if request.param == "sqlite":
        target = SqlTarget("sqlite", f"sqlite:///{tmp_path}/fsm.db", "fsm_")
    else:
        target = SqlTarget("postgres", postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    yield target
    target.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=sorted(STORE_FACTORIES))
def any_store(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[Store]:
    store = STORE_FACTORIES[request.param](clock)
    yield store
    close = getattr(store, "close", None)
    if close is not None:
        close()


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def pipelines(store: MemoryStore, clock: ManualClock) -> Engine:
    return Engine(PipelineLifecycle, store, clock=clock, owner="worker-1")


@pytest.fixture
def jobs(store: MemoryStore, clock: ManualClock) -> Engine:
    return Engine(JobLifecycle, store, clock=clock, owner="worker-1")


def frozen(engine: Engine, entity_id: str) -> tuple[Snapshot, list[HistoryRecord]]:
    """The entity and its history, to check a refused write changed nothing (I10)."""
    return engine.store.get(entity_id, include_deleted=True), engine.store.history(entity_id)
