"""Issue 18, the library's items: the fuzzer's last escapes, on every store.

- ``Engine.configuration`` (and ``allowed_events``) of a snapshot in a state the lifecycle
  does not have is a typed error, never a bare ``KeyError``;
- a clock returning ``None`` or a naive datetime is one ``ConfigError`` on every store
  (the memory store raised ``TypeError``, SQLite ``ValueError``, PostgreSQL took it);
- the README's table-binding block, and the migration helpers, against a database that
  cannot be reached raise ``StoreUnavailable``, not a raw SQLAlchemy error;
- a duration under a microsecond (``1e-9`` seconds) is refused: it rounds to zero.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from tests_support import guide_block_after

from fsm import Engine, JobLifecycle, ManualClock, PipelineLifecycle
from fsm.errors import (
    ConfigError,
    FsmError,
    InvalidArgument,
    MalformedRow,
    StoreCorrupt,
    StoreUnavailable,
    UnknownEntity,
)
from stores import Store

README = Path(__file__).resolve().parents[1] / "README.md"
DOWN = "postgresql+psycopg://app:s3cret@127.0.0.1:1/app"
"""A PostgreSQL URL nothing listens on (port 1): refused at once, no server needed."""


class HostileClock(ManualClock):
    """A manual clock that can be told to return something else than an aware datetime."""

    def __init__(self) -> None:
        super().__init__()
        self.value: Any = None
        self.hostile = False

    def now(self) -> Any:
        return self.value if self.hostile else super().now()

    def __repr__(self) -> str:
        return "HostileClock()"


@pytest.fixture
def clock() -> HostileClock:  # any_store (tests/conftest.py) builds each store on this clock
    return HostileClock()


def _rows(store: Store, *ids: str) -> list[Any]:
    return [(store.get(i), store.history(i), store.effects(i)) for i in ids]


# -- configuration() ---------------------------------------------------------------------------

UNKNOWN_STATES: list[Any] = ["bogus", "", None, "active", "'; DROP TABLE fsm_entities; --", "queued\x00", ["queued"]]


@pytest.mark.parametrize("state", UNKNOWN_STATES, ids=repr)
def test_configuration_of_an_unknown_state_is_a_typed_error(any_store: Store, state: Any) -> None:
    jobs = Engine(JobLifecycle, any_store)
    snap = jobs.create("j1")
    bad = snap._replace(state=state)
    for read in (jobs.configuration, jobs.allowed_events):
        with pytest.raises(MalformedRow) as caught:
            read(bad)
        assert "unknown state" in str(caught.value) and caught.value.entity_id == "j1"
    assert jobs.would_fire(bad, "start") is None  # refused, as any branch it cannot take
    assert _rows(any_store, "j1") == [(snap, any_store.history("j1"), [])]
    assert jobs.configuration(snap) == ("queued",) and jobs.configuration("j1") == ("queued",)


def test_configuration_refuses_what_is_no_snapshot_and_a_snapshot_of_another_lifecycle(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store)
    pipes = Engine(PipelineLifecycle, any_store)
    pipe = pipes.create("p1")
    for value in (42, b"j1", ("j1",), {"state": "queued"}):
        with pytest.raises(InvalidArgument):
            jobs.configuration(value)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            jobs.would_fire(value, "start")  # type: ignore[arg-type]
    with pytest.raises(UnknownEntity):
        jobs.configuration(pipe)  # a pipeline's row read through the job engine
    with pytest.raises(UnknownEntity):
        jobs.configuration("p1")
    assert pipes.configuration(pipe) == ("queued",)


# -- clocks ------------------------------------------------------------------------------------

BAD_CLOCK_VALUES: list[Any] = [
    None,
    datetime(2026, 1, 1),  # naive
    "2026-01-01T00:00:00Z",
    1767225600,
    float("nan"),
    date(2026, 1, 1),
]


@pytest.mark.parametrize("value", BAD_CLOCK_VALUES, ids=repr)
def test_a_clock_that_returns_no_aware_datetime_is_one_config_error_on_every_store(
    any_store: Store, clock: HostileClock, value: Any
) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="w")
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.create("j3")  # queued: something for the claim to take
    before = _rows(any_store, "j1", "j3")
    clock.value, clock.hostile = value, True
    writes = [
        lambda: jobs.create("j2"),
        lambda: jobs.fire("j1", "exited", lease=lease),
        lambda: jobs.renew_lease(lease),
        lambda: jobs.run("j1", "gate", lambda key: 1, lease),
        lambda: jobs.claim(1),
        any_store.now,
    ]
    for write in writes:
        with pytest.raises(ConfigError) as caught:
            write()
        assert "HostileClock()" in str(caught.value) and "aware" in str(caught.value)
    clock.hostile = False
    assert _rows(any_store, "j1", "j3") == before
    with pytest.raises(UnknownEntity):
        any_store.get("j2")
    assert jobs.fire("j1", "exited", lease=lease).state == "finalizing"  # the store still works


def test_an_aware_clock_in_another_zone_is_stored_as_the_same_instant_in_utc(
    any_store: Store, clock: HostileClock
) -> None:
    plus_two = timezone(timedelta(hours=2))
    clock.value, clock.hostile = datetime(2026, 1, 1, 2, 0, tzinfo=plus_two), True
    snap = Engine(JobLifecycle, any_store).create("j1")
    assert snap.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert any_store.get("j1").created_at.utcoffset() == timedelta(0)


def test_the_manual_clock_refuses_a_naive_jump() -> None:
    with pytest.raises(ValueError, match="aware"):
        ManualClock().set(datetime(2027, 1, 1))


# -- unreachable databases: the README's binding block and the migration helpers ----------------


def _binding_block() -> str:
    return guide_block_after("# Run a lifecycle on your existing table")


def test_the_readme_binding_block_raises_store_unavailable_for_its_placeholder_url() -> None:
    block = _binding_block()
    assert "postgresql+psycopg://app@db-host/app" in block  # the placeholder this test is about
    block = block.replace("postgresql+psycopg://app@db-host/app", DOWN)  # refused at once, no DNS wait
    with pytest.raises(StoreUnavailable) as caught:
        exec(compile(block, "README.md", "exec"), {})
    message = str(caught.value)
    assert "127.0.0.1" in message and "s3cret" not in message and "OperationalError" not in message


def test_the_migration_helpers_raise_typed_errors(tmp_path: Path) -> None:
    from stores.sql import add_missing_columns, create_engine, downgrade, stamp, upgrade
    from stores.sql.migrate import current_revision, drop_schema
    from stores.sql.migrations.__main__ import main as migrations

    down = create_engine(DOWN)
    calls = [
        lambda: upgrade(DOWN),
        lambda: downgrade(DOWN, "base"),
        lambda: stamp(DOWN),
        lambda: current_revision(DOWN),
        lambda: drop_schema(down, table_prefix="fsm_"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert "OperationalError" not in str(caught.value) and "s3cret" not in str(caught.value)
    down.dispose()
    ok = f"sqlite:///{tmp_path}/ok.db"
    assert migrations(["upgrade", ok]) == 0
    with pytest.raises(ConfigError, match="nope"):
        upgrade(ok, revision="nope")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database file at all" * 200)
    from stores.sql import TableBinding

    binding = TableBinding(table="t", kind="job", columns={"id": "id", "updated_at": "updated_at"})
    engine = create_engine(f"sqlite:///{garbage}")
    try:
        with pytest.raises(StoreCorrupt):
            add_missing_columns(engine, binding)
        with pytest.raises(StoreCorrupt):
            current_revision(engine)
    finally:
        engine.dispose()


# -- durations that round to zero ---------------------------------------------------------------


def test_a_duration_under_a_microsecond_is_refused_everywhere(any_store: Store) -> None:
    from fsm.policy import Policy
    from fsm.reaping.service import validated_config

    jobs = Engine(JobLifecycle, any_store)
    jobs.create("j1")
    before = _rows(any_store, "j1")
    with pytest.raises(InvalidArgument, match="microsecond"):
        jobs.acquire_lease("j1", ttl=1e-9)
    assert _rows(any_store, "j1") == before
    with pytest.raises(ConfigError, match="microsecond"):
        validated_config({"interval": 1e-9, "leader": True})  # its leader lease would have a zero TTL
    with pytest.raises(ConfigError, match="microsecond"):
        Policy(lease_ttl=4e-7)
    assert validated_config({"interval": 1e-6, "leader": True}).effective_leader_ttl == timedelta(microseconds=3)


def test_every_refusal_here_is_an_fsm_error() -> None:
    """The errors this file expects are all FsmError: one ``except`` catches them."""
    for error in (ConfigError, InvalidArgument, MalformedRow, StoreCorrupt, StoreUnavailable, UnknownEntity):
        assert issubclass(error, FsmError)
