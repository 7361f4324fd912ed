"""Issue 11, item 2: bad arguments are refused with a typed error, identically on every store.

The limits live in one place (:mod:`fsm.limits`); the engine checks them before reading
anything, and each store checks them again before writing (so a store used directly is
protected too).  ``tests/test_hostile_inputs.py`` throws the same classes of values at
every entry point with hypothesis.
"""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from fsm import (
    ConfigError,
    Engine,
    FsmError,
    InvalidArgument,
    InvalidData,
    JobLifecycle,
    ManualClock,
    PipelineLifecycle,
    Policy,
    UnknownEntity,
)
from fsm.cli import main
from fsm.limits import MAX_DURATION, MAX_ID_LENGTH, MAX_JSON_DEPTH
from fsm.reaping import ReaperConfig
from fsm.reaping.service import validated_config
from fsm.records import NewEntity
from stores import Store


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _cycle() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


class Opaque:
    pass


NOT_JSON: list[Any] = [
    math.nan,
    math.inf,
    {1, 2},
    b"bytes",
    datetime(2026, 1, 1, tzinfo=UTC),
    Decimal("1.5"),
    Opaque(),
    _cycle(),
    _nested(MAX_JSON_DEPTH + 1),
    "nul\x00inside",
    "lone \ud800 surrogate",
    {"nul\x00key": 1},
    {1: "non-string key"},
    2**5000,
]
BAD_IDS: list[Any] = ["", "x" * (MAX_ID_LENGTH + 1), "nul\x00", "\udc80lone", 42, None.__class__, ["a"], 1.5]
BAD_TOKENS: list[Any] = [2**64, True, "1", -1, 1.0, None.__class__]
BAD_TTLS: list[Any] = [
    timedelta.max,
    timedelta(days=999_999_999),
    MAX_DURATION + timedelta(seconds=1),
    math.nan,
    math.inf,
    -math.inf,
    0,
    -5,
    timedelta(0),
    True,
    "30",
    [30],
]


def _engine(store: Store, clock: ManualClock) -> Engine:
    return Engine(JobLifecycle, store, clock=clock, owner="worker-1")


def _state(store: Store, entity_id: str) -> tuple[Any, ...]:
    return store.get(entity_id), store.history(entity_id)


def test_bad_ids_keys_and_text_are_refused_on_every_store(any_store: Store, clock: ManualClock) -> None:
    jobs = _engine(any_store, clock)
    jobs.create("j1")
    before = _state(any_store, "j1")
    for bad in BAD_IDS:
        with pytest.raises(InvalidArgument):
            jobs.create(bad)
        with pytest.raises(InvalidArgument):
            jobs.get(bad)
        with pytest.raises(InvalidArgument):
            any_store.get(bad)
        with pytest.raises(InvalidArgument):
            any_store.create(NewEntity(id=bad, kind="job", state="queued"))
        with pytest.raises(InvalidArgument):
            jobs.fire("j1", "start", idempotency_key=bad)
        with pytest.raises(InvalidArgument):
            jobs.fire("j1", "start", owner=bad)
        with pytest.raises(InvalidArgument):
            jobs.create("j2", concurrency_key=bad)
    for bad in ["nul\x00", "\ud800", 7, ["x"]]:
        with pytest.raises(InvalidArgument):
            jobs.fire("j1", "start", reason=bad)
    assert _state(any_store, "j1") == before
    with pytest.raises(UnknownEntity):
        any_store.get("j2")


@pytest.mark.parametrize("event", [["start"], {"start": 1}, 3, None, b"start", "start\x00"])
def test_a_non_string_event_is_refused_not_hashed(any_store: Store, clock: ManualClock, event: Any) -> None:
    jobs = _engine(any_store, clock)
    jobs.create("j1")
    with pytest.raises(FsmError):  # InvalidArgument, or UnknownEvent for a string the table lacks
        jobs.fire("j1", event)
    assert any_store.get("j1").state == "queued"


@pytest.mark.parametrize("owner", [1, math.nan, ["w"], "", "w\x00", "x" * 300, b"w"])
def test_an_ill_typed_engine_owner_is_refused(any_store: Store, owner: Any) -> None:
    with pytest.raises(InvalidArgument):
        Engine(JobLifecycle, any_store, owner=owner)
    with pytest.raises(InvalidArgument):
        Engine(JobLifecycle, any_store, clock="now")  # type: ignore[arg-type]


def test_ill_typed_lease_fields_are_refused(any_store: Store, clock: ManualClock) -> None:
    jobs = _engine(any_store, clock)
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    before = _state(any_store, "j1")
    for token in BAD_TOKENS:
        forged = lease._replace(token=token)
        with pytest.raises(InvalidArgument):
            jobs.renew_lease(forged)
        with pytest.raises(InvalidArgument):
            jobs.release_lease(forged)
        with pytest.raises(InvalidArgument):
            jobs.fire("j1", "exited", lease=forged)
        with pytest.raises(InvalidArgument):
            any_store.renew_lease("j1", owner=lease.owner, token=token, ttl=timedelta(minutes=1), budget=None)
        with pytest.raises(InvalidArgument):
            any_store.release_lease("j1", owner=lease.owner, token=token)
    for bad in [lease._replace(owner=3), lease._replace(entity_id=None), lease._replace(expires_at="soon")]:
        with pytest.raises(InvalidArgument):
            jobs.renew_lease(bad)
    assert _state(any_store, "j1") == before


def test_one_rule_for_a_ttl_everywhere(any_store: Store, clock: ManualClock) -> None:
    jobs = _engine(any_store, clock)
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    before = _state(any_store, "j1")
    for ttl in BAD_TTLS:
        with pytest.raises(InvalidArgument):
            jobs.renew_lease(lease, ttl=ttl)
        with pytest.raises(ConfigError):  # the library's typed error, not pydantic's
            Policy(lease_ttl=ttl)
        with pytest.raises(ConfigError):
            Policy(stale_after=ttl)
        with pytest.raises(ConfigError):
            validated_config({"interval": ttl})
        if isinstance(ttl, timedelta):
            with pytest.raises(InvalidArgument):
                any_store.renew_lease("j1", owner=lease.owner, token=lease.token, ttl=ttl, budget=None)
    assert _state(any_store, "j1") == before
    # what Policy takes, renew_lease takes: a number of seconds
    assert Policy(lease_ttl=300).lease_ttl == timedelta(seconds=300)
    renewed = jobs.renew_lease(lease, ttl=300)
    assert renewed.expires_at == any_store.now() + timedelta(seconds=300)
    assert ReaperConfig(interval=30).interval == timedelta(seconds=30)


@pytest.mark.parametrize("interval", ["nan", "inf", "1e300", "-1", "0"])
def test_the_reaper_cli_refuses_a_bad_interval_without_a_traceback(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reaper", "--db", "memory://", "--once", "--interval", interval]) == 2
    out = capsys.readouterr()
    assert "interval" in out.out + out.err and "Traceback" not in out.out + out.err


def test_data_that_is_not_json_is_refused_the_same_way_everywhere(any_store: Store, clock: ManualClock) -> None:
    pipelines = Engine(PipelineLifecycle, any_store, clock=clock)
    pipelines.create("p1", data={"ok": [1, 2.5, "x", None, True]})
    before = _state(any_store, "p1")
    for i, bad in enumerate(NOT_JSON):
        with pytest.raises(InvalidData):
            pipelines.create(f"n{i}", data={"v": bad})
        with pytest.raises(InvalidData):
            pipelines.fire("p1", "start", data={"v": bad})
        with pytest.raises(InvalidData):
            any_store.create(NewEntity(id=f"n{i}", kind="pipeline", state="queued", data={"v": bad}))
        with pytest.raises(UnknownEntity):
            any_store.get(f"n{i}")
    assert _state(any_store, "p1") == before
    deep_enough = _nested(MAX_JSON_DEPTH - 2)  # with the top-level object: MAX_JSON_DEPTH levels
    fired = pipelines.fire("p1", "start", data={"deep": deep_enough, "pair": (1, 2)})
    assert fired.snapshot.data["pair"] == [1, 2] == fired.record.data["pair"]  # tuples become lists everywhere
    assert any_store.get("p1").data["deep"] == deep_enough


def test_the_cli_parser_still_takes_a_float_interval() -> None:
    from fsm.cli import build_parser

    args = build_parser().parse_args(["reaper", "--interval", "0.5"])
    assert isinstance(args, argparse.Namespace) and args.interval == 0.5


def test_every_settings_field_has_a_default_a_type_checker_sees() -> None:
    """A user's ``mypy --strict`` must accept ``Policy(lease_ttl=...)``: pydantic's
    dataclass transform is read by type checkers, which only see a default given as
    ``Field(default=...)`` or ``Field(default_factory=...)``, not a positional one."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    positional = []
    for module in ("fsm/policy.py", "fsm/reaping/config.py"):
        for node in ast.walk(ast.parse((root / module).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Field":
                keywords = {k.arg for k in node.keywords}
                if node.args or not keywords & {"default", "default_factory"}:
                    positional.append(f"{module}:{node.lineno}")
    assert positional == []
