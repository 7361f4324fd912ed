"""How a worker's threads ask their store to plan statements as a long-running worker's.

A SQL store on PostgreSQL plans a statement afresh for its first runs on a connection
(see :meth:`stores.sql.SqlStore.plan_for_work`): a new worker's first claims paid for it.
Each thread of a worker that talks to the store (the claim loop, the batch completer, the
lease keepers) calls :func:`plan_for_work` once when it starts.  Stores without the
method have nothing to do.
"""

from __future__ import annotations

import logging

from fsm.errors import FsmError

log = logging.getLogger("fsm.worker")


def plan_for_work(store: object) -> None:
    """Ask ``store`` to plan this thread's statements for work (a no-op if it cannot)."""
    plan = getattr(store, "plan_for_work", None)
    if plan is None:
        return
    try:
        plan()
    except (FsmError, OSError) as err:  # planning is an optimisation: the work goes on
        log.info("could not plan the store's statements for work: %s", err)


__all__ = ["plan_for_work"]
