"""A lifecycle's ``version`` and ``migrations``, checked when the class is created."""

from __future__ import annotations

from typing import Any

import pytest
from statemachine import State

from fsm import DataMigration, InvalidDefinition, JobLifecycle, Lifecycle, Removed, Renamed, Split
from fsm.lifecycle import starts, worker


def _declare(**attrs: Any) -> type[Lifecycle]:
    """A small lifecycle with leaves ``queued``, ``running``, ``finalizing``, ``done``."""
    namespace: dict[str, Any] = {"kind": "small", **attrs}
    namespace["queued"] = queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    namespace["active"] = active
    namespace["done"] = done = State(final=True)
    namespace["start"] = starts(queued.to(active))
    namespace["exited"] = worker(active.running.to(active.finalizing, cond="holds_lease"))
    namespace["complete"] = worker(active.finalizing.to(done, cond="holds_lease"))
    return type(Lifecycle)("Small", (Lifecycle,), namespace)  # type: ignore[no-any-return]


def test_a_lifecycle_is_at_version_one_with_nothing_to_migrate_unless_it_says_so() -> None:
    assert JobLifecycle.version == 1
    assert JobLifecycle.evolution.moves == () and JobLifecycle.evolution.data == ()


def test_moves_chain_through_older_states_to_a_state_of_the_definition() -> None:
    small = _declare(
        version=3,
        migrations=(Renamed("pending", "waiting", since=2), Renamed("waiting", "queued", since=3)),
    )
    known = frozenset(small.table.leaves)
    assert small.evolution.resolve("pending", {}, known)[0] == "queued"
    assert small.evolution.resolve("waiting", {}, known)[0] == "queued"
    with pytest.raises(KeyError):
        small.evolution.resolve("nowhere", {}, known)


def test_data_migrations_apply_only_to_entities_written_before_their_version() -> None:
    def a(d: dict[str, Any]) -> dict[str, Any]:
        return d

    def b(d: dict[str, Any]) -> dict[str, Any]:
        return d

    small = _declare(version=3, migrations=(DataMigration(b, since=3), DataMigration(a, since=2)))
    assert [c.change for c in small.evolution.data_since(None)] == [a, b]
    assert [c.change for c in small.evolution.data_since(2)] == [b]
    assert small.evolution.data_since(3) == []


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"version": 0}, "version must be an integer from 1"),
        ({"version": True}, "version must be an integer from 1"),
        ({"version": "2"}, "version must be an integer from 1"),
        ({"version": 2**31}, "version must be an integer from 1"),
        ({"version": 2, "migrations": Renamed("a", "queued")}, "migrations must be a tuple"),
        ({"version": 2, "migrations": ("a",)}, "declare Renamed, Removed, Split or DataMigration"),
        ({"version": 2, "migrations": (Renamed("old", "nowhere"),)}, "'nowhere' is not a leaf state"),
        ({"version": 2, "migrations": (Renamed("old", "active"),)}, "'active' is not a leaf state"),
        ({"version": 2, "migrations": (Renamed("queued", "running"),)}, "'queued' is still a state"),
        ({"version": 2, "migrations": (Renamed("old", "queued", since=3),)}, "since must be a version from 2"),
        ({"version": 2, "migrations": (Renamed("old", "queued", since=1),)}, "since must be a version from 2"),
        ({"migrations": (Renamed("old", "queued"),)}, "since must be a version from 2"),
        (
            {"version": 2, "migrations": (Renamed("old", "queued"), Removed("old", into="running"))},
            "'old' is migrated twice",
        ),
        ({"version": 2, "migrations": (Split("old", into=("queued",), by=lambda d: "queued"),)}, "at least two"),
        ({"version": 2, "migrations": (Split("old", into=("queued", "running"), by="x"),)}, "callable by="),  # type: ignore[arg-type]
        ({"version": 2, "migrations": (DataMigration("nope"),)}, "needs a callable"),  # type: ignore[arg-type]
        (
            {"version": 2, "migrations": (Renamed("a", "b"), Renamed("b", "a"))},
            "go round in a circle",
        ),
        ({"version": 2, "migrations": (Renamed("", "queued"),)}, "non-empty strings"),
    ],
)
def test_a_broken_declaration_is_refused_at_class_creation(attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidDefinition, match=message):
        _declare(**attrs)


def test_merged_states_are_several_renames_to_one_target() -> None:
    small = _declare(version=2, migrations=(Renamed("waiting", "queued"), Renamed("pending", "queued")))
    known = frozenset(small.table.leaves)
    assert {small.evolution.resolve(s, {}, known)[0] for s in ("waiting", "pending")} == {"queued"}
