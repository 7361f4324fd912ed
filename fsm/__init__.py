"""fsm-lifecycles: explicit lifecycles that a reaper cannot break.

The package face is light on purpose: the data model (records, clock, errors, policy) is
imported eagerly, everything that builds on python-statemachine or on the stores is
imported on first use.  ``stores`` and ``signals`` import ``fsm.records``, which runs this
file first; importing the engine here eagerly would knot the layers into a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fsm._version import __version__ as __version__
from fsm.clock import Clock, ManualClock, SystemClock, new_owner_id
from fsm.coordination import Limits, Rate
from fsm.errors import (
    ActiveDuplicate,
    ChildFailed,
    ConditionFailed,
    ConfigError,
    ConstraintViolated,
    EffectFailed,
    EntityExists,
    EntityMovedOn,
    Fenced,
    FsmError,
    GuardRejected,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidData,
    InvalidDefinition,
    LeaseLost,
    MalformedRow,
    StaleVersion,
    StoreCorrupt,
    StoreUnavailable,
    TransitionNotAllowed,
    UnknownEntity,
    UnknownEvent,
    ValidationFailed,
)
from fsm.policy import Policy, RetryPolicy
from fsm.records import Actor, EffectRecord, FeedEntry, HistoryRecord, Lease, LeaseChange, LeaseRenewal, Snapshot

if TYPE_CHECKING:
    from statemachine import State

    from fsm.aio import AsyncEngine
    from fsm.builders import itself
    from fsm.definition_rules import operator_override
    from fsm.engine import Engine, Fire, FireResult, PruneResult
    from fsm.evolution import DataMigration, Removed, Renamed, Split, check_store, migrate_rows
    from fsm.guards import Guard, GuardContext, guard, validator
    from fsm.lifecycle import Lifecycle, reaper, recovery, retries, starts, worker
    from fsm.lifecycles import JobData, JobLifecycle, PipelineData, PipelineLifecycle
    from fsm.reaping import Reaper, ReaperConfig, ReapPolicy, ReapResult
    from fsm.scheduling import Schedule, Schedules
    from fsm.table import Branch, CompiledTable
    from fsm.work import AsyncLeaseKeeper, HeldLease, Job, LeaseKeeper, Worker

_LAZY = {
    "State": "statemachine",
    "AsyncEngine": "fsm.aio",
    "Engine": "fsm.engine",
    "Fire": "fsm.engine",
    "FireResult": "fsm.engine",
    "PruneResult": "fsm.engine",
    "DataMigration": "fsm.evolution",
    "Removed": "fsm.evolution",
    "Renamed": "fsm.evolution",
    "Split": "fsm.evolution",
    "check_store": "fsm.evolution",
    "migrate_rows": "fsm.evolution",
    "Guard": "fsm.guards",
    "GuardContext": "fsm.guards",
    "guard": "fsm.guards",
    "validator": "fsm.guards",
    "Lifecycle": "fsm.lifecycle",
    "operator_override": "fsm.definition_rules",
    "itself": "fsm.builders",
    "reaper": "fsm.lifecycle",
    "recovery": "fsm.lifecycle",
    "retries": "fsm.lifecycle",
    "starts": "fsm.lifecycle",
    "worker": "fsm.lifecycle",
    "JobData": "fsm.lifecycles",
    "JobLifecycle": "fsm.lifecycles",
    "PipelineData": "fsm.lifecycles",
    "PipelineLifecycle": "fsm.lifecycles",
    "Reaper": "fsm.reaping",
    "ReaperConfig": "fsm.reaping",
    "ReapPolicy": "fsm.reaping",
    "ReapResult": "fsm.reaping",
    "Schedule": "fsm.scheduling",
    "Schedules": "fsm.scheduling",
    "Branch": "fsm.table",
    "CompiledTable": "fsm.table",
    "AsyncLeaseKeeper": "fsm.work",
    "HeldLease": "fsm.work",
    "Job": "fsm.work",
    "LeaseKeeper": "fsm.work",
    "Worker": "fsm.work",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ActiveDuplicate",
    "Actor",
    "AsyncEngine",
    "AsyncLeaseKeeper",
    "Branch",
    "ChildFailed",
    "Clock",
    "CompiledTable",
    "ConditionFailed",
    "ConfigError",
    "ConstraintViolated",
    "DataMigration",
    "EffectFailed",
    "EffectRecord",
    "Engine",
    "EntityExists",
    "EntityMovedOn",
    "FeedEntry",
    "Fenced",
    "Fire",
    "FireResult",
    "FsmError",
    "Guard",
    "GuardContext",
    "GuardRejected",
    "HeldLease",
    "HistoryRecord",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidData",
    "InvalidDefinition",
    "Job",
    "JobData",
    "JobLifecycle",
    "Lease",
    "LeaseChange",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseRenewal",
    "Lifecycle",
    "Limits",
    "MalformedRow",
    "ManualClock",
    "PipelineData",
    "PipelineLifecycle",
    "Policy",
    "PruneResult",
    "Rate",
    "ReapPolicy",
    "ReapResult",
    "Reaper",
    "ReaperConfig",
    "Removed",
    "Renamed",
    "RetryPolicy",
    "Schedule",
    "Schedules",
    "Snapshot",
    "Split",
    "StaleVersion",
    "State",
    "StoreCorrupt",
    "StoreUnavailable",
    "SystemClock",
    "TransitionNotAllowed",
    "UnknownEntity",
    "UnknownEvent",
    "ValidationFailed",
    "Worker",
    "check_store",
    "guard",
    "itself",
    "migrate_rows",
    "new_owner_id",
    "operator_override",
    "reaper",
    "recovery",
    "retries",
    "starts",
    "validator",
    "worker",
]
