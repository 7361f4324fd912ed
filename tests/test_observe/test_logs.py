"""Log lines of claims, handler outcomes, reclaims and fenced refusals, with structured fields."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from tests_support import guide_text

from fsm import Engine, Fenced, JobLifecycle, ManualClock
from fsm.observe import LOGGERS
from fsm.reaping import Reaper
from fsm.work import Job, Worker
from stores import MemoryStore

FIELDS = ("entity", "kind", "owner", "token")


@contextlib.contextmanager
def at_info(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """INFO on each of the library's loggers (another test may have set one's level)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(caplog.at_level(logging.INFO))
        for name in LOGGERS:
            stack.enter_context(caplog.at_level(logging.INFO, logger=name))
        yield


def records(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno == level]


def test_a_claim_a_reclaim_and_a_fenced_refusal_are_logged_with_entity_kind_owner_and_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    engine = Engine(JobLifecycle, store, clock=clock, owner="w1")
    engine.create("j1")
    with at_info(caplog):
        (snap,) = engine.claim()
        assert snap.lease is not None
        engine.fire("j1", "exited", lease=snap.lease)
        clock.advance(timedelta(minutes=3))
        Reaper(store, [JobLifecycle], clock=clock).run_once()
        with pytest.raises(Fenced):
            engine.fire("j1", "complete", lease=snap.lease)
    (claim,) = records(caplog, "fsm.engine", logging.INFO)[:1]
    assert "claimed job j1" in claim.getMessage()
    assert [getattr(claim, f) for f in FIELDS] == ["j1", "job", "w1", 1]
    (reclaim,) = [r for r in records(caplog, "fsm.reaper", logging.INFO) if getattr(r, "event", None) == "reclaim"]
    assert [getattr(reclaim, f) for f in FIELDS] == ["j1", "job", None, 2]
    (refused,) = [r for r in records(caplog, "fsm.engine", logging.INFO) if "refused late fire" in r.getMessage()]
    assert [getattr(refused, f) for f in FIELDS] == ["j1", "job", "w1", 1]
    assert refused.event == "complete"  # type: ignore[attr-defined]


def test_the_worker_logs_completions_failures_and_a_fenced_holder_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    # no retries: "bad" fails at its first error (a retried error is an INFO line, "retry")
    engine = Engine(JobLifecycle, store, owner="w1", policy=JobLifecycle.policy.replace(default_retry=None))
    for entity in ("ok", "bad", "fenced"):
        engine.create(entity)

    def run_agent(job: Job) -> str:
        if job.id == "bad":
            raise RuntimeError("agent crashed")
        if job.id == "fenced":
            engine.release_lease(job.held.lease)  # another holder takes the entity over
            engine.acquire_lease("fenced", owner="w2")
        return "exited"

    with (
        at_info(caplog),
        Worker(engine, {"running": run_agent}, poll_interval=timedelta(milliseconds=10)) as worker,
    ):
        for _ in range(500):
            worker.run_once()
            if worker.stats.claimed >= 3 and worker.running == 0:
                break
            threading.Event().wait(0.01)
    done = {
        r.entity: r  # type: ignore[attr-defined]
        for r in records(caplog, "fsm.worker", logging.INFO)
        if getattr(r, "state", None) == "running"  # after exited, the finalizer's lease is given back
    }
    assert done["ok"].outcome == "completed" and done["ok"].event == "exited"  # type: ignore[attr-defined]
    assert [getattr(done["ok"], f) for f in FIELDS[1:3]] == ["job", "w1"]
    (failed,) = records(caplog, "fsm.worker", logging.ERROR)
    assert failed.entity == "bad" and failed.outcome == "failed" and failed.exc_info  # type: ignore[attr-defined]
    (warned,) = records(caplog, "fsm.worker", logging.WARNING)
    assert warned.entity == "fenced" and warned.outcome == "fenced"  # type: ignore[attr-defined]
    assert isinstance(warned.token, int)  # type: ignore[attr-defined]


def test_every_logger_named_in_the_docs_is_one_the_library_uses() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sources = "".join(p.read_text() for folder in ("fsm", "signals", "stores") for p in (root / folder).rglob("*.py"))
    for name in LOGGERS:
        assert f'getLogger("{name}")' in sources, name
    readme = guide_text()
    for name in LOGGERS:
        assert f"`{name}`" in readme, name
