"""Durable work: what protects the *work* around a lifecycle's row (DESIGN section 7).

The row is protected by compare-and-set; the work needs four more parts, all on the
store protocol:

- the lease keeper, which renews a held lease in the background and tells the holder
  when it is lost;
- the effects ledger, which records each side effect's result exactly once per key, so
  that a resumed finalization replays instead of re-running;
- claiming, by which workers take queued and reclaimed entities (they are not handed them);
- the worker, a small runtime of per-state handlers built from the three parts above.
"""
