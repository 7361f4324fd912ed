"""DBOS's side of the durable-steps drain, run by DBOS's own interpreter (a venv of its own).

``python dbos_child.py info URL SCHEMA``: DBOS's version (JSON), its system tables made in
``SCHEMA``.  ``python dbos_child.py enqueue URL SCHEMA N``: ``N`` workflows of
:func:`three_steps` on the queue ``bench`` (through ``DBOSClient``, before the clock
starts).  ``python dbos_child.py work URL SCHEMA``: one executor, launched with DBOS's
defaults (its queue polled every second, no concurrency limit); it prints ``ready`` once
launched, registers (and so starts working) the queue at a ``go`` line on its stdin, and
ends at a ``stop`` line (the work benchmark's gates, as for oban's processes).

The workflow is the durable three-step job of the work benchmark: three ``@DBOS.step``
calls, each returning ``{"ok": True}`` (recorded before the workflow goes on), then done.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig

QUEUE = "bench"


def _config(url: str, schema: str) -> DBOSConfig:
    return {
        "name": "fsm-bench",
        "system_database_url": url,
        "dbos_system_schema": schema,
        "log_level": "CRITICAL",  # a capped round stops it mid-workflow: no trace per workflow
    }


@DBOS.step()
def step(i: int) -> dict[str, Any]:
    return {"ok": True}


@DBOS.workflow()
def three_steps() -> None:
    for i in range(3):
        step(i)


def main(argv: list[str]) -> None:
    what, url, schema = argv[1], argv[2], argv[3]
    if what == "enqueue":
        client = DBOSClient(system_database_url=url, dbos_system_schema=schema)
        for _ in range(int(argv[4])):
            client.enqueue({"queue_name": QUEUE, "workflow_name": three_steps.__qualname__})
        client.destroy()
        return
    DBOS(config=_config(url, schema))
    DBOS.launch()  # makes the system tables in SCHEMA
    if what == "info":
        import importlib.metadata

        print(json.dumps({"version": importlib.metadata.version("dbos"), "python": sys.version.split()[0]}))
        DBOS.destroy()
        return
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "go":
            DBOS.register_queue(QUEUE)  # its executor starts taking the queue's workflows
        elif line.strip() == "stop":
            break
    DBOS.destroy(workflow_completion_timeout_sec=0)


if __name__ == "__main__":
    main(sys.argv)
