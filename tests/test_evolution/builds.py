"""Two releases of one lifecycle, as an application would ship them.

Version 1: ``queued -> active{building -> finalizing} -> completed | failed``.
Version 2 renames ``building`` to ``compiling``, inserts ``testing`` after it, and gives
the data a new field with a default (old rows read with it) and one that a data
migration fills in from the old data.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from statemachine import State

from fsm import DataMigration, Lifecycle, Policy, Renamed
from fsm.lifecycle import reaper, recovery, retries, starts, worker

POLICY = Policy(lease_ttl=timedelta(seconds=1), max_attempts=5, max_reclaims=3)
"""A lease of a second, so a killed worker's builds come back within a short test; enough
attempts that none fails on the way."""


class BuildData(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = "linux"
    steps: list[str] = []


class BuildV1(Lifecycle):
    kind = "build"
    data_model = BuildData
    policy = POLICY

    queued = State(initial=True)

    class active(State.Compound):
        building = State(initial=True)
        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    exited = worker(active.building.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(completed, cond="holds_lease"))
    fail = worker(active.finalizing.to(failed, cond="holds_lease"))
    retry = retries(queued=queued, running=active.building, finalizing=active.finalizing)
    expire, reclaim = recovery(queued=queued, running=active.building, finalizing=active.finalizing, failed=failed)


class BuildDataV2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = "linux"
    steps: list[str] = []
    platform: str = "x86_64"
    """New in version 2, with a default: rows written by version 1 read with it."""
    label: str
    """New in version 2, required: the data migration derives it from the target."""


def add_label(data: dict[str, Any]) -> dict[str, Any]:
    """Idempotent, as a data migration should be: a version-2 worker may already have
    written the field into a build that was created under version 1."""
    if data.get("label"):
        return data
    return {**data, "label": f"build for {data.get('target', 'linux')}"}


class BuildV2(Lifecycle):
    kind = "build"
    data_model = BuildDataV2
    policy = POLICY
    version = 2
    migrations = (Renamed("building", "compiling"), DataMigration(add_label, name="label from target"))

    queued = State(initial=True)

    class active(State.Compound):
        compiling = State(initial=True)
        testing = State()
        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    compiled = worker(active.compiling.to(active.testing, cond="holds_lease"))
    exited = worker(active.testing.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(completed, cond="holds_lease"))
    fail = worker(active.finalizing.to(failed, cond="holds_lease"))
    retry = retries(queued=queued, running=active.compiling, finalizing=active.finalizing)
    expire, reclaim = recovery(queued=queued, running=active.compiling, finalizing=active.finalizing, failed=failed)
    # the inserted state is work a holder does, as compiling is: a holder that dies in it (or
    # whose lease lapses under load) is requeued, or failed once its attempts are spent;
    # without these its builds would rest in `testing` for ever
    expire_testing = reaper(
        active.testing.to(queued, cond=["lease_stale", "owned", "attempts_left"]), reason="expired"
    ) | reaper(active.testing.to(failed, cond=["lease_stale", "owned"]), reason="expired")


class BuildV2Undeclared(BuildV2):
    """Version 2 as first written: the rename without its migration, nor the new data
    fields (what ``fsm check`` catches).  A subclass may change these, not the states."""

    data_model = BuildData
    migrations = ()
