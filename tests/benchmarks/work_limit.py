"""The limit of our own writes: a hand-written psycopg worker issuing the library's statements.

:func:`capture` runs the shipped ``fsm.Worker`` on one job in this process with psycopg's
``Cursor.execute`` watched, and keeps what it sent: the claim (its text and parameters)
and the two outcome batches, ``exited`` and ``complete`` (their text, and one row of
their JSON parameter as a template).  :func:`limit_child` replays them in a worker
process of its own: claim up to the shipped worker's concurrency, one ``exited`` batch
over every claimed row, one ``complete`` batch.  The same tables, the same statements
(every version, owner and token guard, every history row), the same batching and the
same session settings, with nothing in Python but the loop and the parameters: what
the shipped worker would cost if the library's own Python took no time at all.  The
statements are captured afresh at each run, so the limit follows the library's SQL.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

ROW_ID, ROW_VERSION, ROW_OWNER, ROW_TOKEN, ROW_HOLDER = 0, 1, 2, 3, 14
"""Where a batch row (``stores.sql.batches``: one JSON array per write) holds the entity's
id, its version, the lease owner and token its guard expects, and the history's owner."""


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def capture(url: str, prefix: str) -> dict[str, Any]:
    """The statements the shipped worker sends for one job, by what they do."""
    import psycopg

    from fsm import Engine, JobLifecycle
    from fsm.work import Worker
    from stores.sql import SqlStore

    seen: list[tuple[str, Any]] = []
    original = psycopg.Cursor.execute

    def watched(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(query, str):
            seen.append((query, params))
        return original(self, query, params, **kw)

    store = SqlStore(url, table_prefix=prefix, create=False)
    engine = Engine(JobLifecycle, store)
    (job,) = engine.create_many([{}])
    worker = Worker(engine, {"running": lambda job: "exited", "finalizing": lambda job: "complete"})
    psycopg.Cursor.execute = watched  # type: ignore[method-assign]
    try:
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while engine.get(job.id).state != "completed":
            if time.monotonic() > deadline:
                raise RuntimeError("the capture's job did not complete within 30 s")
            time.sleep(0.01)
        worker.stop()
        thread.join(30)
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]
        store.close()
    claims = [(q, p) for q, p in seen if "SKIP LOCKED" in q and isinstance(p, dict) and "owner" in p]
    batches = {}
    for q, p in seen:
        if "jsonb_array_elements" in q and isinstance(p, dict) and "rows" in p:
            (row,) = json.loads(p["rows"])
            batches.setdefault(row[9], (q, row))  # the event of the write
    if not claims or set(batches) < {"exited", "complete"}:
        raise RuntimeError(f"the shipped worker's statements were not seen: {len(claims)} claims, {sorted(batches)}")
    claim_sql, claim_params = claims[0]
    return {"claim": (claim_sql, dict(claim_params)), "exited": batches["exited"], "complete": batches["complete"]}


def limit_child(url: str, statements: dict[str, Any], ready: Any, go: Any, stop: Any, concurrency: int) -> None:
    """One hand-written worker process: claim, ``exited`` batch, ``complete`` batch."""
    import os

    import psycopg

    from stores.sql.parsed import cursor_factory

    # psycopg parses a statement over 4 kB at every run; the library's connections parse
    # each of theirs once (stores.sql.parsed), and so does this hand-written worker
    conn = psycopg.connect(_plain(url), autocommit=True, cursor_factory=cursor_factory() or psycopg.Cursor)
    conn.execute("SET TIME ZONE 'UTC'")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    owner = f"limit:{os.getpid()}"
    claim_sql, claim_params = statements["claim"]
    claim_params = {**claim_params, "owner": owner, "limit": concurrency}
    exited_sql, exited_row = statements["exited"]
    complete_sql, complete_row = statements["complete"]
    cur = conn.cursor()
    ready.put(os.getpid())
    go.wait()
    columns: dict[str, int] | None = None
    while not stop.is_set():
        cur.execute(claim_sql, claim_params)
        rows = cur.fetchall()
        if not rows:
            time.sleep(0.005)
            continue
        if columns is None:
            columns = {d.name: i for i, d in enumerate(cur.description or ())}
        at_id, at_version, at_token = columns["id"], columns["version"], columns["lease_token"]
        held = [(r[at_id], r[at_version], r[at_token]) for r in rows]
        for sql, template, bump in ((exited_sql, exited_row, 0), (complete_sql, complete_row, 1)):
            batch = []
            for entity_id, version, token in held:
                row = list(template)
                row[ROW_ID], row[ROW_VERSION], row[ROW_TOKEN] = entity_id, version + bump, token
                row[ROW_OWNER] = row[ROW_HOLDER] = owner
                batch.append(row)
            cur.execute(sql, {"rows": json.dumps(batch)})
            cur.fetchall()
    conn.close()


__all__ = ["capture", "limit_child"]
