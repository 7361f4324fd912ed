"""The reaper's wake-ups: a tick that made work claimable tells the workers at once.

A requeue (a dead holder's ``running`` job back to ``queued``) and a reclaim (a dead
holder's finalizer left without a lease for the next claim) make rows claimable that no
create announced: without a word, a drained worker would find them only at its next poll.
After a tick that moved rows into a state a claim takes, the reaper calls the store's
``notify_work`` for each such lifecycle (:class:`stores.base.WorkNotices`: PostgreSQL's
``NOTIFY``, after the moves committed; SQLite and memory: this process's workers).  A
wake-up is a hint: one that fails is logged and the workers' polls still find the rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fsm.engine.work import claim_plan
from fsm.errors import FsmError
from fsm.reaping.rules import Rule

log = logging.getLogger("fsm.reaper")


def wakes_workers(rule: Rule) -> bool:
    """Whether a row moved by ``rule`` lands where a claim takes it (queued to start, or a
    state a claim resumes without a lease owner)."""
    starts, resumes = claim_plan(rule.engine.table)
    target = rule.branch.target
    return any(s.source == target for s in starts) or target in resumes


def notify_moved(store: object, kinds: Iterable[str]) -> None:
    """Wake the workers of each of ``kinds`` (a store without notices: nothing to do)."""
    notify = getattr(store, "notify_work", None)
    if notify is None:
        return
    for kind in sorted(set(kinds)):
        try:
            notify(kind)
        except (FsmError, OSError) as err:  # the moves stand; the workers' polls find them
            log.warning("could not wake the workers of %s after a reaper tick: %s", kind, err)


__all__ = ["notify_moved", "wakes_workers"]
