"""oban's side of the work benchmark's drain, run by a Python 3.12+ interpreter of its own.

oban (the Python port of Oban, ``pip install oban``) needs Python 3.12 or newer, so
:mod:`bench_work` runs this script with the interpreter of a virtual environment made
for it, never in its own process; the script imports oban and the standard library only
(not this project). Two commands:

- ``info SCHEMA``: one JSON line, oban's version, this interpreter's, the name jobs give
  the no-op worker below, and oban's schema installation SQL for the PostgreSQL schema
  ``SCHEMA`` (``oban.schema.install_sql``);
- ``work DSN SCHEMA``: one worker process. ``Oban(pool=Oban.create_pool(DSN), prefix=SCHEMA,
  queues={"default": {"paused": True}})``, everything else at its defaults (the queue's
  limit is the producer's default, 10; pool 1 to 10 connections), run as ``oban start``
  runs it (uvloop, orjson for JSON) but without its per-job log lines. Once started and
  settled it prints ``ready``; ``go`` on stdin resumes the queue on this node (the
  clock's start: the jobs are already queued), ``stop`` (or the end of stdin) stops it
  gracefully (``Oban.stop()``, as ``oban start`` does on SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from typing import Any

from oban import Oban, worker


@worker(queue="default")
class Noop:
    """The no-op job."""

    async def process(self, job: Any) -> None:
        return None


def info(schema: str) -> None:
    from importlib.metadata import version

    from oban.schema import install_sql
    from oban.worker import worker_name

    print(
        json.dumps(
            {
                "version": version("oban"),
                "python": sys.version.split()[0],
                "worker": worker_name(Noop),
                "install": install_sql(schema),
            }
        ),
        flush=True,
    )


async def work(dsn: str, schema: str) -> None:
    pool = await Oban.create_pool(dsn)
    node = f"{socket.gethostname()}.{os.getpid()}"  # oban's default node name, kept to resume this node only
    oban = Oban(pool=pool, prefix=schema, node=node, queues={"default": {"paused": True}})
    await oban.start()
    await asyncio.sleep(0.5)  # its loops settled: listens issued, the first staging done
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    if line.strip() == "go":
        await oban.resume_queue("default", node=node)
        await loop.run_in_executor(None, sys.stdin.readline)
    await oban.stop()
    await pool.close()


def main(argv: list[str]) -> None:
    if argv[:1] == ["info"]:
        info(argv[1])
        return
    import orjson
    import uvloop
    from psycopg.types.json import set_json_dumps, set_json_loads

    set_json_dumps(orjson.dumps)  # as `oban start` does
    set_json_loads(orjson.loads)
    uvloop.run(work(argv[1], argv[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
