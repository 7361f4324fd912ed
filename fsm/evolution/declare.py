"""What a lifecycle declares about its own past: its version and what became of old states.

A lifecycle is code that changes while entities stored under its previous release are
still in the store.  It says so with two class attributes::

    class Build(Lifecycle):
        version = 2
        migrations = (
            Renamed("building", "compiling"),         # since version 2
            Removed("legacy", into="queued"),
            Split("waiting", into=("approved", "queued"), by=lambda data: ...),
            DataMigration(add_owner, name="owner from the request"),
        )

The declarations are checked when the class is created (a target the definition lacks is
an :class:`~fsm.errors.InvalidDefinition`), so a broken migration never reaches a store;
:func:`fsm.evolution.migrate_rows` carries them out and :func:`fsm.evolution.check_store`
says what a store still holds that the definition cannot read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm.errors import InvalidDefinition

MAX_DEFINITION_VERSION = 2**31 - 1
"""The largest definition version a store records (a 32-bit integer column)."""

StateRule = Callable[[Mapping[str, Any]], str]
"""Chooses the new state of one entity from its data (:class:`Split`)."""
DataRule = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns one entity's old data into data of the new definition (:class:`DataMigration`)."""


@dataclass(frozen=True, slots=True)
class Renamed:
    """State ``old`` is now called ``new``: its entities move there as they are.

    Several ``Renamed`` with one ``new`` merge states.  ``since``: the definition version
    that made the change (default: the lifecycle's ``version``)."""

    old: str
    new: str
    since: int | None = None

    def target(self, data: Mapping[str, Any]) -> str:
        return self.new

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.old,)

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.new,)

    def describe(self) -> str:
        return f"{self.old!r} renamed {self.new!r}"


@dataclass(frozen=True, slots=True)
class Removed:
    """State ``old`` is gone; the entities still in it move ``into`` another state."""

    old: str
    into: str
    since: int | None = None

    def target(self, data: Mapping[str, Any]) -> str:
        return self.into

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.old,)

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.into,)

    def describe(self) -> str:
        return f"{self.old!r} removed, its entities moved to {self.into!r}"


@dataclass(frozen=True, slots=True)
class Split:
    """State ``old`` became several: ``by(data)`` names which of ``into`` each entity goes to.

    A rule that raises, or names a state not in ``into``, leaves that entity where it is
    and is reported (the migration goes on with the others)."""

    old: str
    into: tuple[str, ...]
    by: StateRule
    since: int | None = None

    def target(self, data: Mapping[str, Any]) -> str:
        chosen = self.by(data)
        if chosen not in self.into:
            raise ValueError(f"the split of {self.old!r} chose {chosen!r}, not one of {list(self.into)}")
        return chosen

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.old,)

    @property
    def targets(self) -> tuple[str, ...]:
        return self.into

    def describe(self) -> str:
        return f"{self.old!r} split into {', '.join(repr(s) for s in self.into)}"


@dataclass(frozen=True, slots=True)
class DataMigration:
    """Data written under an older definition, rewritten for this one: ``change(data)``
    returns the new data (validated by the lifecycle's data model before it is written).

    Applied once to each entity last written under a version older than ``since``; the
    entity then records ``since`` or newer, so a migration run again never applies it twice."""

    change: DataRule
    name: str = ""
    since: int | None = None

    def describe(self) -> str:
        return f"data: {self.name or getattr(self.change, '__name__', 'change')}"


StateMove = Renamed | Removed | Split
Declaration = StateMove | DataMigration


@dataclass(frozen=True)
class Migrations:
    """A lifecycle's checked declarations, in the order they apply (by ``since``, then as declared)."""

    version: int
    moves: tuple[tuple[int, StateMove], ...] = ()
    data: tuple[tuple[int, DataMigration], ...] = ()
    by_source: dict[str, tuple[int, StateMove]] = field(default_factory=dict)

    def resolve(self, state: str, data: Mapping[str, Any], known: frozenset[str]) -> tuple[str, list[StateMove]]:
        """Where an entity in ``state`` belongs under this definition, following moves
        through intermediate states (``a`` renamed ``b`` in v2, ``b`` renamed ``c`` in v3);
        the state itself when the definition has it.  ``KeyError``: no move covers it."""
        taken: list[StateMove] = []
        while state not in known:
            _, move = self.by_source[state]
            taken.append(move)
            state = move.target(data)
        return state, taken

    def data_since(self, written: int | None) -> list[DataMigration]:
        """The data changes an entity last written under ``written`` still needs."""
        floor = 0 if written is None else written
        return [change for since, change in self.data if since > floor]

    @staticmethod
    def migrated_data(data: Mapping[str, Any], changes: Iterable[DataMigration]) -> dict[str, Any]:
        """``data`` after ``changes`` in order (each given a copy); what a change raises
        propagates, and a change that returns no dict is a ``TypeError`` naming it."""
        out = dict(data)
        for change in changes:
            out = change.change(dict(out))
            if not isinstance(out, dict):
                raise TypeError(f"{change.describe()} returned {type(out).__name__}, not a dict")
        return out


def check_migrations(name: str, version: object, declared: object, leaves: Iterable[str]) -> Migrations:
    """The lifecycle's declarations, checked against its definition; ``InvalidDefinition`` otherwise."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_DEFINITION_VERSION:
        raise InvalidDefinition(
            f"{name}: version must be an integer from 1 to {MAX_DEFINITION_VERSION}, not {version!r}"
        )
    if not isinstance(declared, tuple | list):
        raise InvalidDefinition(
            f"{name}: migrations must be a tuple of Renamed, Removed, Split and DataMigration, "
            f"not {type(declared).__name__}"
        )
    known = frozenset(leaves)
    moves: list[tuple[int, StateMove]] = []
    data: list[tuple[int, DataMigration]] = []
    by_source: dict[str, tuple[int, StateMove]] = {}
    for item in declared:
        if not isinstance(item, Renamed | Removed | Split | DataMigration):
            raise InvalidDefinition(
                f"{name}: migrations holds {item!r}; declare Renamed, Removed, Split or DataMigration (fsm.evolution)"
            )
        since = version if item.since is None else item.since
        if isinstance(since, bool) or not isinstance(since, int) or not 2 <= since <= version:
            raise InvalidDefinition(
                f"{name}: {item.describe()}: since must be a version from 2 to this definition's {version}, "
                f"not {since!r} (version 1 has no past to migrate from)"
            )
        if isinstance(item, DataMigration):
            if not callable(item.change):
                raise InvalidDefinition(f"{name}: DataMigration needs a callable, not {item.change!r}")
            data.append((since, item))
            continue
        _check_move(name, item, known)
        for source in item.sources:
            if source in by_source:
                raise InvalidDefinition(
                    f"{name}: state {source!r} is migrated twice ({by_source[source][1].describe()})"
                )
            by_source[source] = (since, item)
        moves.append((since, item))
    migrations = Migrations(
        version,
        tuple(sorted(moves, key=lambda m: m[0])),
        tuple(sorted(data, key=lambda m: m[0])),
        by_source,
    )
    for source in by_source:  # every chain ends in a state of this definition, and never loops
        _follow(name, source, migrations, known)
    return migrations


def _check_move(name: str, move: StateMove, known: frozenset[str]) -> None:
    names = [*move.sources, *move.targets]
    if not all(isinstance(s, str) and s for s in names):
        raise InvalidDefinition(f"{name}: a migration names states by non-empty strings, not {names!r}")
    if move.old in known:
        raise InvalidDefinition(
            f"{name}: {move.describe()}, but {move.old!r} is still a state of this definition: "
            "a migration moves entities out of states the definition no longer has"
        )
    if isinstance(move, Split):
        if not isinstance(move.into, tuple) or len(move.into) < 2:
            raise InvalidDefinition(f"{name}: Split({move.old!r}) needs a tuple of at least two states in into=")
        if not callable(move.by):
            raise InvalidDefinition(f"{name}: Split({move.old!r}) needs a callable by=, not {move.by!r}")


def _follow(name: str, source: str, migrations: Migrations, known: frozenset[str]) -> None:
    seen = {source}
    frontier = [source]
    while frontier:
        state = frontier.pop()
        _, move = migrations.by_source[state]
        for target in move.targets:
            if target in known:
                continue
            if target not in migrations.by_source:
                raise InvalidDefinition(
                    f"{name}: {move.describe()}, but {target!r} is not a leaf state of this definition "
                    "(nor an older state migrated on)"
                )
            if target in seen:
                raise InvalidDefinition(f"{name}: the migrations of {source!r} go round in a circle through {target!r}")
            seen.add(target)
            frontier.append(target)


__all__ = [
    "MAX_DEFINITION_VERSION",
    "DataMigration",
    "DataRule",
    "Declaration",
    "Migrations",
    "Removed",
    "Renamed",
    "Split",
    "StateMove",
    "StateRule",
    "check_migrations",
]
