"""Signals after the commit: the transition's, and a holder's lost lease."""

from __future__ import annotations

import signals
from fsm.errors import Fenced, FsmError
from fsm.records import HistoryRecord, Lease, LeaseChange, Snapshot
from fsm.table import Branch
from signals import LeasePayload, TransitionPayload
from stores.base import Store


def observed() -> bool:
    """Whether any signal :func:`announce` sends has a receiver (the reaper asks once per
    page: nobody listening, it moves the page without building snapshots).  Keep it the
    same as the test at the top of :func:`announce`."""
    return bool(
        signals.transitioned.receivers
        or signals.expired.receivers
        or signals.reclaimed.receivers
        or signals.lease_acquired.receivers
    )


def announce(kind: str, snap: Snapshot, record: HistoryRecord, branch: Branch) -> None:
    """Send the signals of one committed transition (the engine's and the reaper's)."""
    if not (
        signals.transitioned.receivers
        or signals.expired.receivers
        or signals.reclaimed.receivers
        or signals.lease_acquired.receivers
    ):
        return  # nobody listens: an unobserved transition pays nothing for signals

    def transition_payload() -> TransitionPayload:
        return TransitionPayload.of(kind, snap, record)

    signals.send(signals.transitioned, kind, transition_payload)
    if branch.event == "expire":
        signals.send(signals.expired, kind, transition_payload)
    elif branch.event == "reclaim":
        signals.send(signals.reclaimed, kind, transition_payload)
    if branch.lease_effect is LeaseChange.ACQUIRE and snap.lease_owner is not None:  # a reaper's fence takes none
        signals.send(signals.lease_acquired, kind, lambda: LeasePayload.of(kind, snap))


def announce_lease_lost(kind: str, store: Store, lease: Lease, err: Fenced) -> None:
    """Tell ``lease_lost`` receivers that a holder found its lease gone (after the refusal)."""
    if not signals.lease_lost.receivers:
        return
    try:
        snap = store.get(lease.entity_id)
    except FsmError:
        return
    detail = str(err)
    signals.send(signals.lease_lost, kind, lambda: LeasePayload.of(kind, snap, lease=lease, detail=detail))


__all__ = ["announce", "announce_lease_lost", "observed"]
