"""The project uses its own kit: the built-ins and the README's example lifecycle,
property-tested on the memory store and on SQLite files (restarts reopen the same file).

The ``ci`` profile keeps this within seconds; ``FSM_HYPOTHESIS_PROFILE=soak`` multiplies
the examples (see README, "Testing your lifecycles").
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import settings
from tests_support import README_GUARD_DATA, readme_lifecycle

from fsm import JobLifecycle, PipelineLifecycle
from fsm.testing import lifecycle_machine, memory_stores, sqlite_stores
from fsm.testing.pytest_plugin import examples, profile

Deploy = readme_lifecycle()


@pytest.fixture(autouse=True)
def _quiet_keepers() -> None:
    logging.getLogger("fsm.keeper").setLevel(logging.ERROR)  # lost leases are the point here


CASES = [
    (JobLifecycle, None),
    (PipelineLifecycle, None),
    (Deploy, README_GUARD_DATA),
]


def _run(lifecycle: type, guard_data: object, stores: object, ci_examples: int, steps: int) -> None:
    machine = lifecycle_machine(lifecycle, stores, guard_data=guard_data)  # type: ignore[arg-type]
    test = machine.TestCase
    soak = profile() == "soak"
    test.settings = settings(
        max_examples=examples(ci_examples), stateful_step_count=steps * (2 if soak else 1), deadline=None
    )
    test().runTest()


@pytest.mark.parametrize(("lifecycle", "guard_data"), CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_lifecycle_holds_every_invariant_on_the_memory_store(lifecycle: type, guard_data: object) -> None:
    _run(lifecycle, guard_data, memory_stores(), ci_examples=30, steps=30)


@pytest.mark.parametrize(("lifecycle", "guard_data"), CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_lifecycle_holds_every_invariant_on_sqlite_across_restarts(lifecycle: type, guard_data: object) -> None:
    _run(lifecycle, guard_data, sqlite_stores(), ci_examples=6, steps=25)


class JobMachineWithAUserInvariant(lifecycle_machine(JobLifecycle)):  # type: ignore[misc]
    """Users subclass the machine to add their own rules and invariants."""

    from hypothesis.stateful import invariant, rule

    @rule()
    def nothing_but_a_read(self) -> None:
        self.engine.counts()

    @invariant()
    def each_start_counts_one_attempt(self) -> None:
        # not ``attempt <= Policy.max_attempts``: that bounds the reaper's requeues only, and
        # handler retries (``retry``, counted per state by the RetryPolicy) and operator
        # releases start further attempts by design
        for entity_id in self.entities:
            starts = sum(1 for h in self.store.history(entity_id) if h.event == "start")
            assert self.store.get(entity_id).attempt == starts


def test_a_subclass_adds_rules_and_invariants() -> None:
    test = JobMachineWithAUserInvariant.TestCase
    test.settings = settings(max_examples=examples(10), stateful_step_count=20, deadline=None)
    test().runTest()
