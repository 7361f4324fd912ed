"""Clocks and owner ids.

Stores and engines read time through a :class:`Clock` so tests can freeze and advance it.
SQL stores take ``now`` from the database server instead, so machines never disagree.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from fsm.errors import ConfigError


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime: ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; thread-safe.

    >>> clock = ManualClock()
    >>> t0 = clock.now(); clock.advance(seconds=30); (clock.now() - t0).total_seconds()
    30.0
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (tzinfo=UTC)")
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | None = None, *, seconds: float = 0) -> datetime:
        """Move the clock forward by ``delta`` and/or ``seconds``; returns the new time."""
        step = (delta or timedelta()) + timedelta(seconds=seconds)
        if step < timedelta():
            raise ValueError("a clock only moves forward")
        with self._lock:
            self._now = self._now + step
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (never backwards), an aware datetime."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise ValueError(f"ManualClock.set needs an aware datetime (tzinfo=UTC), not {when!r}")
        with self._lock:
            if when < self._now:
                raise ValueError("a clock only moves forward")
            self._now = when


def read_clock(clock: Clock) -> datetime:
    """``clock.now()`` under the one rule every store applies to the time it is given: an
    aware ``datetime``, returned in UTC.

    Anything else (``None``, a naive datetime, a string, a number, a bare ``date``) is a
    ``ConfigError`` naming the clock, raised before the store reads or writes anything,
    so a broken clock never stores a time the other stores would refuse or read another way
    (a naive time taken as the session's zone on PostgreSQL, refused by SQLite).
    """
    value = clock.now()
    if value.__class__ is datetime and value.tzinfo is UTC:  # every clock of ours: no work
        return value
    if not isinstance(value, datetime):
        raise ConfigError(
            f"the clock {clock!r} returned {_shown(value)}, not a datetime: now() must return an aware datetime"
        )
    if value.utcoffset() is None:
        raise ConfigError(
            f"the clock {clock!r} returned a naive datetime ({value!r}): now() must return an aware one (tzinfo=UTC)"
        )
    return value.astimezone(UTC)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def new_owner_id(prefix: str = "") -> str:
    """An owner id unique per process run: host, pid and 64 random bits.

    The random part means a restarted process (same host, possibly the same pid) never
    reuses an id, so it cannot mistake an old lease for its own.
    """
    base = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
    return f"{prefix}{base}" if prefix else base


__all__ = ["Clock", "ManualClock", "SystemClock", "new_owner_id", "read_clock"]
