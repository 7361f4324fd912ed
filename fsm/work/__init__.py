"""Durable work: what protects the *work* around a lifecycle's row (DESIGN section 7).

The row is protected by compare-and-set; the work needs four more parts, all on the
store protocol:

- the lease keeper (``keeper``), which renews a held lease in the background and tells
  the holder when it is lost, and the worker's one keeper for all its leases
  (``keepers``: one thread, one renewal transaction a round);
- the effects ledger (``Engine.run`` on the stores' ``run``), which records each side
  effect's result exactly once per key, so that a resumed finalization replays instead
  of re-running;
- claiming (``Engine.claim`` on the stores' ``claim``), by which workers take queued and
  reclaimed entities (they are not handed them);
- the worker (``worker``), a small runtime of per-state handlers built from the three
  parts above; its handlers' outcomes share transactions through the batch completer
  (``completer``), each still fenced on its own, and it wakes on ``NOTIFY`` (``wakeups``).
"""

from __future__ import annotations

from fsm.work.children import ChildResult
from fsm.work.completer import BatchCompleter
from fsm.work.keeper import AsyncLeaseKeeper, HeldLease, KeepResult, LeaseKeeper
from fsm.work.keepers import LeaseKeepers
from fsm.work.waits import Parked
from fsm.work.worker import Job, Worker, WorkerStats

__all__ = [
    "AsyncLeaseKeeper",
    "BatchCompleter",
    "ChildResult",
    "HeldLease",
    "Job",
    "KeepResult",
    "LeaseKeeper",
    "LeaseKeepers",
    "Parked",
    "Worker",
    "WorkerStats",
]
