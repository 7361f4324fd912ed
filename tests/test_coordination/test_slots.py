"""``Store.slots``: the live leases a limit counts, on every store and face; hostile
arguments get ``InvalidArgument`` and change nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from async_support import every_face  # noqa: F401 - any_store: every store, sync and async faces

from fsm import Engine, InvalidArgument, JobLifecycle, ManualClock
from stores import Store

LEASED = ["finalizing", "running"]


def test_slots_count_live_leases_per_key_and_in_all(any_store: Store, clock: ManualClock) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    for i, key in enumerate(["a", "a", "b", None]):
        jobs.create(f"j{i}", concurrency_key=key)
    assert any_store.slots("job", LEASED) == 0
    jobs.claim(3)  # j0, j1 (key a), j2 (key b)
    assert (any_store.slots("job", LEASED, "a"), any_store.slots("job", LEASED, "b")) == (2, 1)
    assert any_store.slots("job", LEASED) == 3 and any_store.slots("job", LEASED, "c") == 0
    assert any_store.slots("job", ["running"], "a") == 2 and any_store.slots("job", ["finalizing"]) == 0
    clock.advance(JobLifecycle.policy.lease_ttl + timedelta(microseconds=1))  # every lease expired
    assert any_store.slots("job", LEASED) == 0


@pytest.mark.parametrize(
    "args",
    [
        ("", LEASED, None),
        ("jo\x00b", LEASED, None),
        (7, LEASED, None),
        ("job", [], None),
        ("job", "running", None),
        ("job", ["x"] * 65, None),
        ("job", ["run\x00ning"], None),
        ("job", [b"running"], None),
        ("job", ("\udc80",), None),
        ("job", LEASED, ""),
        ("job", LEASED, "a\x00"),
        ("job", LEASED, 5),
        ("job", LEASED, "k" * 256),
    ],
)
def test_hostile_slot_arguments_are_refused_and_change_nothing(
    any_store: Store, clock: ManualClock, args: tuple[Any, Any, Any]
) -> None:
    jobs = Engine(JobLifecycle, any_store, clock=clock)
    jobs.create("j0", concurrency_key="a")
    before = jobs.get("j0")
    with pytest.raises(InvalidArgument):
        any_store.slots(*args)
    assert jobs.get("j0") == before
