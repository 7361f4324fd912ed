"""Leases outside transitions: acquire, renew, release (DESIGN section 5).

None of them is a transition: version and history never move.  Each is one guarded
``UPDATE ... RETURNING``; renewal moves ``lease_expires_at`` only, never past the state's
renewal budget (``min(now + ttl, state_entered_at + budget)``, refused once ``now`` reaches
the deadline) and never revives an expired lease (the reaper may be taking over).
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from fsm.errors import LeaseLost, StaleVersion, UnknownEntity
from fsm.limits import check_int, check_lease_args, check_store_ttl
from fsm.records import Snapshot
from stores.sql.core import ATTEMPTS, SqlCore
from stores.sql.rows import snapshot_of


class LeaseOps(SqlCore):
    """``acquire_lease``, ``renew_lease`` and ``release_lease`` of :class:`stores.sql.SqlStore`."""

    def acquire_lease(
        self, entity_id: str, *, owner: str, ttl: timedelta, budget: timedelta | None, expect_version: int
    ) -> Snapshot:
        """See :meth:`stores.Store.acquire_lease`."""
        check_lease_args(entity_id, owner, ttl=check_store_ttl(ttl), budget=budget)
        check_int("expect_version", expect_version)
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "version": expect_version}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            rows = self._run(self._sql.acquire(budget is not None), params)
            if rows:
                return self._attach([snapshot_of(rows[0])])[0]
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            if row.version != expect_version:
                raise StaleVersion(entity_id, expected=expect_version, found=row.version)
            exp = row.lease_expires_at
            if row.lease_owner is not None and exp is not None and exp >= now:
                detail = f"held by {row.lease_owner} until {exp.isoformat()}"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
            if budget is not None and now >= row.state_entered_at + budget:
                detail = f"renewal budget of state {row.state!r} is spent"
                raise LeaseLost(entity_id, expected_token=None, found_token=row.lease_token, owner=owner, detail=detail)
        raise LeaseLost(entity_id, expected_token=None, found_token=None, owner=owner, detail="contended")

    def renew_lease(
        self, entity_id: str, *, owner: str, token: int, ttl: timedelta, budget: timedelta | None
    ) -> Snapshot:
        """See :meth:`stores.Store.renew_lease`."""
        check_lease_args(entity_id, owner, token=check_int("token", token), ttl=check_store_ttl(ttl), budget=budget)
        params: dict[str, Any] = {"id": entity_id, "owner": owner, "token": token}
        params["budget"] = None if budget is None else self._f.interval(budget)
        for _ in range(ATTEMPTS):
            now = self._now()
            self._time_params(params, now, ttl)
            rows = self._run(self._sql.renew(budget is not None), params)
            if rows:
                return self._attach([snapshot_of(rows[0])])[0]
            row, now = self._current(entity_id)
            if row is None or row.deleted:
                raise UnknownEntity(entity_id)
            lost = functools.partial(
                LeaseLost, entity_id, expected_token=token, found_token=row.lease_token, owner=owner
            )
            if row.lease_owner != owner or row.lease_token != token:
                raise lost()
            if row.lease_expires_at is None or row.lease_expires_at < now:
                raise lost(detail="the lease expired before the renewal")
            if budget is not None and now >= row.state_entered_at + budget:
                raise lost(detail=f"renewal budget of state {row.state!r} is spent")
        raise LeaseLost(entity_id, expected_token=token, found_token=None, owner=owner, detail="contended")

    def release_lease(self, entity_id: str, *, owner: str, token: int) -> Snapshot:
        """See :meth:`stores.Store.release_lease`."""
        check_lease_args(entity_id, owner, token=check_int("token", token))
        rows = self._run(self._sql.release, {"id": entity_id, "owner": owner, "token": token})
        if rows:
            return self._attach([snapshot_of(rows[0])])[0]
        row, _ = self._current(entity_id)
        if row is None or row.deleted:
            raise UnknownEntity(entity_id)
        raise LeaseLost(entity_id, expected_token=token, found_token=row.lease_token, owner=owner)


__all__ = ["LeaseOps"]
