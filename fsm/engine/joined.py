"""The caller's transaction, for the engine: its writes joined, its signals held.

:meth:`fsm.Engine.within` (and :meth:`fsm.AsyncEngine.within`) run the store's calls on the
caller's SQLAlchemy connection (the store's ``joined``, :mod:`stores.sql.joined`) and hold
the signals they send (:class:`signals.Held`) until that connection's transaction commits;
a rollback drops them.

SQLAlchemy's connection events say when: ``commit``, ``rollback``, and the savepoint
events (a rolled-back savepoint drops what was held since it began, a released one keeps
it for the outer commit).  SQLAlchemy's ``commit`` event runs just *before* the DBAPI
commit, and a connection has no after-commit event, so the listener commits the DBAPI
connection itself and then sends; SQLAlchemy's own commit that follows finds nothing left
to commit.  A commit that fails raises out of the caller's ``commit()`` and sends nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from fsm.errors import ConfigError
from signals import Held, holding, release


class HeldSignals:
    """The signals held on one SQLAlchemy connection until its commit (listeners
    installed once per connection object, alive as long as it is)."""

    def __init__(self, connection: sa.Connection) -> None:
        self.blocks: list[Held] = []
        self.marks: list[tuple[str, list[int]]] = []
        event.listen(connection, "commit", self._commit)
        event.listen(connection, "rollback", self._rollback)
        event.listen(connection, "savepoint", self._savepoint)
        event.listen(connection, "rollback_savepoint", self._rollback_savepoint)
        event.listen(connection, "release_savepoint", self._release_savepoint)

    def _commit(self, connection: sa.Connection) -> None:
        blocks, self.blocks, self.marks = self.blocks, [], []
        if not any(held.items for held in blocks):
            return
        dbapi = connection.connection.dbapi_connection
        try:
            if dbapi is None:
                raise ConfigError("the connection was invalidated before its commit")
            dbapi.commit()  # the commit itself: the signals follow it, never precede it
        except BaseException:
            for held in blocks:
                held.items.clear()
            raise
        for held in blocks:
            release(held)

    def _rollback(self, connection: sa.Connection) -> None:
        blocks, self.blocks, self.marks = self.blocks, [], []
        for held in blocks:
            held.items.clear()

    def _savepoint(self, connection: sa.Connection, name: str) -> None:
        self.marks.append((name, [len(held.items) for held in self.blocks]))

    def _rollback_savepoint(self, connection: sa.Connection, name: str, context: Any) -> None:
        while self.marks:
            mark, sizes = self.marks.pop()
            for held, size in zip(self.blocks, sizes, strict=False):
                del held.items[size:]
            if mark == name:
                break

    def _release_savepoint(self, connection: sa.Connection, name: str, context: Any) -> None:
        while self.marks:
            mark, _ = self.marks.pop()
            if mark == name:
                break


_listening: weakref.WeakKeyDictionary[sa.Connection, HeldSignals] = weakref.WeakKeyDictionary()


def held_on(connection: sa.Connection) -> Held:
    """A new :class:`signals.Held`, sent when ``connection`` commits, dropped on rollback."""
    found = _listening.get(connection)
    if found is None:
        found = _listening[connection] = HeldSignals(connection)
    held = Held()
    found.blocks.append(held)
    return held


def joining(store: Any, target: Any) -> Any:
    """The store's ``joined`` context manager for ``target``, or ``ConfigError``."""
    joined = getattr(store, "joined", None)
    if joined is None:
        raise ConfigError(
            f"{type(store).__name__} has no SQL transaction to join: within() needs a SQL store "
            "(stores.SqlStore, stores.aio.AsyncSqlStore)"
        )
    return joined(target)


@contextlib.contextmanager
def within(store: Any, target: Any) -> Iterator[None]:
    """:meth:`fsm.Engine.within`."""
    with joining(store, target) as joined, holding(held_on(joined.connection)):
        yield


__all__ = ["HeldSignals", "held_on", "joining", "within"]
