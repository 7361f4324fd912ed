"""A reaper says, when it starts, which states of its lifecycles an entity can hold a lease
in that no ``lease_stale`` reaper transition leaves: a holder that dies there leaves a
zombie the reaper can never free."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from statemachine import State

from fsm import JobLifecycle, Lifecycle, PipelineLifecycle, reaper, recovery, starts, worker
from fsm.definition_rules import unreaped_states
from fsm.reaping import Reaper
from stores.memory import MemoryStore


class Inserted(Lifecycle):
    """A release that added a ``testing`` step between ``running`` and ``finalizing``, and
    forgot to reap it."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        testing = State()
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    tested = worker(active.running.to(active.testing, cond="holds_lease"))
    finish = worker(active.testing.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire, reclaim = recovery(queued=queued, running=active.running, finalizing=active.finalizing, failed=failed)


class LastAttempt(Lifecycle):
    """Its only rule on ``running`` needs an attempt left: the last holder to die stays."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    give_up = reaper(active.finalizing.to(failed, cond="lease_stale"))
    expire = reaper(active.running.to(queued, cond=["lease_stale", "owned", "attempts_left"]))


class Timed(Lifecycle):
    """Its only rule on ``running`` is a timer: the reaper frees it whoever holds it."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    finish = worker(active.running.to(active.finalizing, cond="holds_lease"))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    give_up = reaper(active.finalizing.to(failed, cond="lease_stale"))
    timeout = reaper(active.running.to(failed), after=timedelta(minutes=5))


def test_a_rule_that_needs_an_attempt_left_does_not_free_the_last_one_and_a_timer_does() -> None:
    assert unreaped_states(LastAttempt.table) == ("running",)
    assert unreaped_states(Timed.table) == ()


def test_the_built_in_lifecycles_reap_every_leased_state() -> None:
    assert unreaped_states(JobLifecycle.table) == ()
    assert unreaped_states(PipelineLifecycle.table) == ()


def test_a_leased_state_no_reaper_rule_leaves_is_named_when_the_reaper_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert unreaped_states(Inserted.table) == ("testing",)
    with caplog.at_level(logging.WARNING, logger="fsm.reaper"):
        reaper = Reaper(MemoryStore(), [Inserted, JobLifecycle])
    assert reaper.unreaped == {"inserted": ("testing",)}
    (said,) = [r.getMessage() for r in caplog.records if "stays there" in r.getMessage()]
    assert "'inserted'" in said and "'testing'" in said and "recovery(" in said
