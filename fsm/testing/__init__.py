"""fsm.testing: property tests, path coverage and handler tests for your lifecycles.

The modules here build on hypothesis and pytest, test dependencies only: this package
face imports none of them eagerly (its names resolve on first use), so ``import
fsm.testing`` (or anything in fsm's normal import path) never needs hypothesis.

- :func:`lifecycle_machine`: a hypothesis ``RuleBasedStateMachine`` for any Lifecycle
  and store factory (a rule per event, the clock, the reaper, dying, pausing, stalling
  and waking holders, restarts, the effects ledger) checking I1 to I6, I8 and a restore
  round trip after every step; subclass it to add rules and invariants;
- :func:`shortest_paths`, :func:`replay`, :func:`path_cases`: the shortest event path
  to every state and every transition, with the guard values and clock moves each one
  needs, replayed on a real engine as readable pytest cases (XState's model-based
  testing, with a reaper and a clock);
- :class:`TransitionCoverage`: which branches a suite fired and which it never did;
- :mod:`fsm.testing.strategies`: events, entity ids, data fitting a pydantic model,
  lease timings;
- :mod:`fsm.testing.pytest_plugin`: ``pytest_plugins = ["fsm.testing.pytest_plugin"]``
  gives fixtures and the ``FSM_HYPOTHESIS_PROFILE`` profiles (``ci``, ``soak``);
- :class:`HandlerEnvironment`: run a worker handler in a fake job (Temporal's
  ActivityEnvironment idea): progress captured, the lease lost on demand;
- :mod:`fsm.testing.lifecycles` and :mod:`fsm.testing.agreement`: random Lifecycle
  classes and the table/statechart agreement check (import them explicitly).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm.testing.checks import acknowledged_problems, effect_problems, history_problems, restore_problems
    from fsm.testing.coverage import CoverageReport, TransitionCoverage, branch_name
    from fsm.testing.environment import HandlerEnvironment
    from fsm.testing.machine import GuardData, InvariantBroken, LifecycleMachine, lifecycle_machine
    from fsm.testing.paths import Path, Step, path_cases, replay, shortest_paths
    from fsm.testing.stores import MemoryStores, SqlStores, StoreFactory, memory_stores, sqlite_stores
    from fsm.testing.strategies import data_for, data_patches, entity_ids, events, lease_timings

_LAZY = {
    **dict.fromkeys(
        ["acknowledged_problems", "effect_problems", "history_problems", "restore_problems"], "fsm.testing.checks"
    ),
    **dict.fromkeys(["CoverageReport", "TransitionCoverage", "branch_name"], "fsm.testing.coverage"),
    "HandlerEnvironment": "fsm.testing.environment",
    **dict.fromkeys(["GuardData", "InvariantBroken", "LifecycleMachine", "lifecycle_machine"], "fsm.testing.machine"),
    **dict.fromkeys(["Path", "Step", "path_cases", "replay", "shortest_paths"], "fsm.testing.paths"),
    **dict.fromkeys(["data_for", "data_patches", "entity_ids", "events", "lease_timings"], "fsm.testing.strategies"),
    **dict.fromkeys(
        ["MemoryStores", "SqlStores", "StoreFactory", "memory_stores", "sqlite_stores"], "fsm.testing.stores"
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CoverageReport",
    "GuardData",
    "HandlerEnvironment",
    "InvariantBroken",
    "LifecycleMachine",
    "MemoryStores",
    "Path",
    "SqlStores",
    "Step",
    "StoreFactory",
    "TransitionCoverage",
    "acknowledged_problems",
    "branch_name",
    "data_for",
    "data_patches",
    "effect_problems",
    "entity_ids",
    "events",
    "history_problems",
    "lease_timings",
    "lifecycle_machine",
    "memory_stores",
    "path_cases",
    "replay",
    "restore_problems",
    "shortest_paths",
    "sqlite_stores",
]
