"""One leader at a time per lifecycle: a lease on a reserved row, for reapers that should
not overlap.

Reapers are correct without it (every move re-checks its rule in the statement, and
PostgreSQL claims rows with ``FOR UPDATE SKIP LOCKED``); a leader only saves the others
the work.  Leadership is per lifecycle kind (:func:`leader_key`): a worker's embedded
reaper leading ``job`` never makes a pipeline reaper beside it a standby, so every kind
with reaper rules has exactly one leader at a time, whichever set of kinds each reaper
serves.  Each reserved row is an ordinary entity of kind ``fsm.leader`` that no lifecycle
queries, and leadership is an ordinary lease on it: the leader renews it at every tick, a
standby takes it over once it expires, and a takeover bumps the fencing token.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from fsm.errors import EntityExists, LeaseLost, StaleVersion, UnknownEntity
from fsm.records import NewEntity, Snapshot
from stores.base import Store

LEADER_KIND = "fsm.leader"
DEFAULT_LEADER_KEY = "fsm-reaper-leader"
"""The prefix of every leader row's id (``fsm-reaper-leader:job``)."""


def leader_key(kind: str) -> str:
    """The id of the reserved row whose lease is the leadership of ``kind``'s reaping."""
    return f"{DEFAULT_LEADER_KEY}:{kind}"


class LeaderLease:
    """Leadership of ``key`` for ``owner``, held for ``ttl`` after each successful call."""

    def __init__(self, store: Store, owner: str, ttl: timedelta, key: str = DEFAULT_LEADER_KEY) -> None:
        if ttl <= timedelta():
            raise ValueError("a leader lease needs a positive ttl")
        self.store = store
        self.owner = owner
        self.ttl = ttl
        self.key = key
        self.token: int | None = None

    def try_lead(self) -> bool:
        """Renew leadership, or take it if nobody holds a live lease; False on standby."""
        if self.token is not None:
            try:
                self.store.renew_lease(self.key, owner=self.owner, token=self.token, ttl=self.ttl, budget=None)
                return True
            except LeaseLost:
                self.token = None  # expired or taken over: compete again like anybody else
        row = self._row()
        try:
            taken = self.store.acquire_lease(
                self.key, owner=self.owner, ttl=self.ttl, budget=None, expect_version=row.version
            )
        except (LeaseLost, StaleVersion):
            return False
        self.token = taken.lease_token
        return True

    def resign(self) -> None:
        """Give leadership up now, so a standby need not wait for the lease to expire."""
        if self.token is None:
            return
        with contextlib.suppress(LeaseLost, UnknownEntity):
            self.store.release_lease(self.key, owner=self.owner, token=self.token)
        self.token = None

    def _row(self) -> Snapshot:
        try:
            return self.store.get(self.key)
        except UnknownEntity:
            try:
                return self.store.create(NewEntity(id=self.key, kind=LEADER_KIND, state="leading"))
            except EntityExists:
                return self.store.get(self.key)


__all__ = ["DEFAULT_LEADER_KEY", "LEADER_KIND", "LeaderLease", "leader_key"]
