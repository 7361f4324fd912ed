"""Leases through the engine: acquire, renew within the state's budget, release."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import timedelta

import signals
from fsm.engine.announce import announce_lease_lost
from fsm.engine.arguments import check_ttl, lease_arg, text
from fsm.engine.reads import EngineReads
from fsm.errors import Fenced, FsmError, InvalidArgument, LeaseLost, TransitionNotAllowed
from fsm.records import Lease, LeaseRenewal, Snapshot
from signals import LeasePayload, RefusedPayload

log = logging.getLogger("fsm.engine")


class EngineLeases(EngineReads):
    """``acquire_lease``, ``renew_lease``, ``release_lease`` and ``renewals``.

    A lease is not a transition: none of these bumps the version or writes history.
    """

    def acquire_lease(self, entity_id: str, *, owner: str | None = None, ttl: timedelta | float | None = None) -> Lease:
        """Take the lease of a non-final entity whose lease is free or expired (token + 1).

        Not a transition: no version bump, no history row.  Raises ``LeaseLost`` when a
        live lease is held by someone else.
        """
        given = check_ttl(ttl)
        if owner is not None:
            text("owner", owner)
        snap = self.get(entity_id)
        if snap.state in self.table.finals:
            raise TransitionNotAllowed(
                entity_id=entity_id,
                event="acquire_lease",
                state=snap.state,
                actor="worker",
                detail=f"{snap.state!r} is final",
            )
        new = self.store.acquire_lease(
            entity_id,
            owner=owner or self.owner,
            ttl=given or self.policy.lease_ttl,
            budget=self.policy.budget_for(snap.state),
            expect_version=snap.version,
        )
        signals.send(signals.lease_acquired, self.kind, lambda: LeasePayload.of(self.kind, new))
        lease = new.lease
        assert lease is not None
        return lease

    def renew_lease(self, lease: Lease, *, ttl: timedelta | float | None = None) -> Lease:
        """Extend a live lease; never past the state's renewal budget.

        ``ttl`` follows the rule of ``Policy.lease_ttl``: a timedelta or seconds, positive,
        finite, at most :data:`fsm.limits.MAX_DURATION`.
        Sends ``lease_renewed`` after the commit.  Raises ``LeaseLost`` (and sends
        ``lease_lost``) when the lease is no longer current: taken over, expired, or out of
        budget.  The holder must stop.
        """
        given = check_ttl(ttl)
        snap = self.get(lease_arg(lease).entity_id)
        try:
            new = self.store.renew_lease(
                lease.entity_id,
                owner=lease.owner,
                token=lease.token,
                ttl=given or self.policy.lease_ttl,
                budget=self.policy.budget_for(snap.state),
            )
        except LeaseLost as err:
            self._lease_lost(lease, err, "renew")
            raise
        renewed = new.lease
        assert renewed is not None
        if signals.lease_renewed.receivers:
            signals.send(signals.lease_renewed, self.kind, lambda: LeasePayload.of(self.kind, new))
        return renewed

    def renew_leases(self, leases: Sequence[Lease]) -> list[Lease | FsmError]:
        """Renew many leases in one transaction (:meth:`Store.renew_leases`), each within
        its state's budget and guarded by its own owner, token and expiry; one answer per
        lease, in order: the renewed :class:`Lease`, or the error :meth:`renew_lease`
        would raise (``LeaseLost``, after ``lease_lost`` is sent).  Reads nothing first:
        the store applies the budget of each entity's state."""
        if not isinstance(leases, list | tuple):
            raise InvalidArgument(f"renew_leases takes a list of Lease, not {type(leases).__name__}")
        for lease in leases:
            lease_arg(lease)
        budgets = tuple(
            (state, budget) for state in self.table.leaves if (budget := self.policy.budget_for(state)) is not None
        )
        answers = self.store.renew_leases(leases, ttl=self.policy.lease_ttl, budgets=budgets)
        results: list[Lease | FsmError] = []
        for lease, answer in zip(leases, answers, strict=True):
            if isinstance(answer, FsmError):
                if isinstance(answer, Fenced):
                    self._lease_lost(lease, answer, "renew")
                results.append(answer)
                continue
            renewed = answer.lease
            if renewed is None:  # pragma: no cover - a renewed row holds its lease
                results.append(
                    LeaseLost(lease.entity_id, expected_token=lease.token, found_token=None, owner=lease.owner)
                )
                continue
            if signals.lease_renewed.receivers:
                signals.send(signals.lease_renewed, self.kind, functools.partial(LeasePayload.of, self.kind, answer))
            results.append(renewed)
        return results

    def release_lease(self, lease: Lease) -> Snapshot:
        """Give a lease up (owner and expiry cleared); raises ``LeaseLost`` if not current."""
        self.get(lease_arg(lease).entity_id)
        try:
            return self.store.release_lease(lease.entity_id, owner=lease.owner, token=lease.token)
        except LeaseLost as err:
            self._lease_lost(lease, err, "release")
            raise

    def renewals(self, entity_id: str) -> list[LeaseRenewal]:
        """The entity's latest lease renewals, oldest first (the newest
        :data:`fsm.records.RENEWALS_KEPT`): when each landed, the expiry it set, the owner
        and token, and ``acquired`` for a lease taken outside a transition (a claim that
        resumes a reclaimed finalizer, :meth:`acquire_lease`).  The store logs them in the
        renewal's own transaction; a refused renewal logs nothing.  Transitions, and the
        leases they take, are in :meth:`history`."""
        self.get(entity_id)
        return self.store.renewals(entity_id)

    def _lease_lost(self, lease: Lease, err: Fenced, operation: str = "fire", event: str | None = None) -> None:
        """The fence refused a write made under ``lease``: log it (INFO, logger
        ``fsm.engine``), send ``write_refused``, then ``lease_lost``.  Off the hot path:
        only a refusal comes here."""
        kind = self.kind
        if log.isEnabledFor(logging.INFO):
            log.info(
                "refused late %s of %s %s by %s (token %d): %s",
                operation,
                kind,
                lease.entity_id,
                lease.owner,
                lease.token,
                err,
                extra={
                    "entity": lease.entity_id,
                    "kind": kind,
                    "owner": lease.owner,
                    "token": lease.token,
                    "operation": operation,
                    "event": event,
                },
            )
        if signals.write_refused.receivers:
            signals.send(
                signals.write_refused,
                kind,
                lambda: RefusedPayload(
                    kind=kind,
                    entity_id=lease.entity_id,
                    owner=lease.owner,
                    token=lease.token,
                    operation=operation,
                    error=type(err).__name__,
                    detail=str(err),
                    event=event,
                ),
            )
        announce_lease_lost(kind, self.store, lease, err)


__all__ = ["EngineLeases"]
