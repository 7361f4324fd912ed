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

A connection's transaction holds its signals in one :class:`signals.Held`, whichever
blocks send them: a ``within()`` nested on the same Session or Connection (another engine
of the same store, :func:`stores.sql.joined.joined_sync`) joins the outer block and holds
into the same one, so the signals go out in the order they were sent.
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
    installed once per connection object, alive as long as it is).

    One :class:`signals.Held` per transaction of the connection: every ``within()`` block
    on it until the commit (nested ones, blocks of other engines or stores on the same
    connection, one after another) holds into it, so the signals go out in the order they
    were sent."""

    def __init__(self, connection: sa.Connection) -> None:
        self.held: Held | None = None
        self.marks: list[int] = []
        event.listen(connection, "commit", self._commit)
        event.listen(connection, "rollback", self._rollback)
        event.listen(connection, "savepoint", self._savepoint)
        event.listen(connection, "rollback_savepoint", self._rollback_savepoint)
        event.listen(connection, "release_savepoint", self._release_savepoint)

    def take(self) -> Held:
        """The transaction's :class:`signals.Held`, made on first use."""
        if self.held is None:
            self.held = Held()
        return self.held

    def _commit(self, connection: sa.Connection) -> None:
        held, self.held, self.marks = self.held, None, []
        if held is None or not held.items:
            return
        dbapi = connection.connection.dbapi_connection
        try:
            if dbapi is None:
                raise ConfigError("the connection was invalidated before its commit")
            dbapi.commit()  # the commit itself: the signals follow it, never precede it
        except BaseException:
            held.items.clear()
            raise
        release(held)

    def _rollback(self, connection: sa.Connection) -> None:
        held, self.held, self.marks = self.held, None, []
        if held is not None:
            held.items.clear()

    # SQLAlchemy names a savepoint only after its ``savepoint`` event (the event's name is
    # None), and unwinds savepoints innermost first: the marks are a stack of sizes.

    def _savepoint(self, connection: sa.Connection, name: str | None) -> None:
        self.marks.append(0 if self.held is None else len(self.held.items))

    def _rollback_savepoint(self, connection: sa.Connection, name: str, context: Any) -> None:
        # a savepoint begun before the listeners were (no mark): everything held came after it
        size = self.marks.pop() if self.marks else 0
        if self.held is not None:
            del self.held.items[size:]

    def _release_savepoint(self, connection: sa.Connection, name: str, context: Any) -> None:
        if self.marks:
            self.marks.pop()


_listening: weakref.WeakKeyDictionary[sa.Connection, HeldSignals] = weakref.WeakKeyDictionary()


def held_on(connection: sa.Connection) -> Held:
    """The :class:`signals.Held` of ``connection``'s transaction: sent when it commits,
    dropped on rollback (a rolled-back savepoint drops what was held since it began)."""
    found = _listening.get(connection)
    if found is None:
        found = _listening[connection] = HeldSignals(connection)
    return found.take()


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
