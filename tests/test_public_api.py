"""The public API, pinned: a name added or removed is a decision, not an accident."""

from __future__ import annotations

import subprocess
import sys

import fsm
import signals
import stores

FSM_API = {
    "Actor",
    "DataMigration",
    "Removed",
    "Renamed",
    "Split",
    "check_store",
    "migrate_rows",
    "AsyncEngine",
    "AsyncLeaseKeeper",
    "Branch",
    "ChildFailed",
    "Clock",
    "CompiledTable",
    "ConditionFailed",
    "ConfigError",
    "ConstraintViolated",
    "EffectFailed",
    "EffectRecord",
    "Engine",
    "ActiveDuplicate",
    "EntityExists",
    "EntityMovedOn",
    "Fenced",
    "FeedEntry",
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
    "Schedule",
    "Schedules",
    "RetryPolicy",
    "Snapshot",
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
    "guard",
    "itself",
    "new_owner_id",
    "operator_override",
    "reaper",
    "recovery",
    "retries",
    "starts",
    "validator",
    "worker",
}


def test_fsm_exports_exactly_the_pinned_names_and_each_resolves() -> None:
    assert set(fsm.__all__) == FSM_API
    for name in fsm.__all__:
        assert getattr(fsm, name) is not None, name


def test_stores_and_signals_export_their_pinned_names() -> None:
    assert set(stores.__all__) >= {"Store", "MemoryStore"}
    assert {
        "transitioned",
        "expired",
        "reclaimed",
        "lease_acquired",
        "lease_renewed",
        "lease_lost",
        "effect_recorded",
        "reaper_tick",
        "reaper_error",
        "write_refused",
        "handled",
        "namespace",
        "TransitionPayload",
        "RefusedPayload",
        "HandledPayload",
    } <= set(signals.__all__)


def test_every_error_derives_from_fsm_error() -> None:
    from fsm import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.FsmError)


def test_importing_stores_first_does_not_pull_in_the_engine() -> None:
    code = "import stores, sys; bad = [m for m in ('fsm.engine', 'fsm.lifecycle') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_worker_and_reaper_helpers_are_not_shadowed_by_submodules() -> None:
    import fsm.reaping  # importing every submodule must keep the helpers intact

    assert callable(fsm.reaper) and callable(fsm.worker)


def test_the_work_package_exports_exactly_its_pinned_names() -> None:
    import fsm.work

    assert set(fsm.work.__all__) == {
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
    }
    assert all(getattr(fsm.work, name) is not None for name in fsm.work.__all__)


def test_the_testing_kit_exports_exactly_its_pinned_names() -> None:
    import fsm.testing

    assert set(fsm.testing.__all__) == {
        "CoverageReport", "GuardData", "HandlerEnvironment", "InvariantBroken", "LifecycleMachine", "MemoryStores",
        "Path", "SqlStores", "Step", "StoreFactory", "TransitionCoverage", "acknowledged_problems", "branch_name",
        "data_for", "data_patches", "effect_problems", "entity_ids", "events", "history_problems", "lease_timings",
        "lifecycle_machine", "memory_stores", "path_cases", "replay", "restore_problems", "shortest_paths",
        "sqlite_stores",
    }  # fmt: skip


def test_importing_fsm_does_not_import_hypothesis() -> None:
    code = "import fsm, fsm.engine, fsm.work, fsm.reaping, stores, sys; print('hypothesis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_core_runs_without_the_asyncio_extra() -> None:
    """greenlet comes with the asyncio extra only: the engine, the workers, the stores and
    the CLI must import without it (a plain ``pip install`` has none)."""
    code = (
        "import sys; sys.modules['greenlet'] = None\n"
        "import fsm, fsm.engine, fsm.work, fsm.work.completer, fsm.reaping, fsm.cli, stores, stores.sql\n"
        "fsm.cli.build_parser(); print('greenlet' in sys.modules and sys.modules['greenlet'] is not None)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_async_faces_export_their_pinned_names() -> None:
    import fsm.aio
    import stores.aio

    assert set(fsm.aio.__all__) == {"AsyncEngine", "AsyncJob", "AsyncWorker"}
    assert set(stores.aio.__all__) == {
        "AsyncFace",
        "AsyncMemoryStore",
        "AsyncSqlStore",
        "AsyncStore",
        "BridgeStore",
        "open_async_store",
    }
    for name in stores.aio.__all__:
        assert getattr(stores.aio, name) is not None, name


def test_the_observe_package_exports_its_pinned_names_and_imports_no_opentelemetry() -> None:
    import fsm.observe

    assert set(fsm.observe.__all__) == {
        "LOGGERS",
        "Instrumentation",
        "MetricsServer",
        "active",
        "instrument",
        "serve_metrics",
        "uninstrument",
    }
    code = "import fsm, fsm.observe, fsm.engine, fsm.work, fsm.reaping, sys; print('opentelemetry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_evolution_package_exports_exactly_its_pinned_names() -> None:
    import fsm.evolution

    assert set(fsm.evolution.__all__) == {
        "MAX_DEFINITION_VERSION",
        "CheckReport",
        "DataMigration",
        "MigrationReport",
        "Migrations",
        "Removed",
        "Renamed",
        "Split",
        "check_store",
        "migrate_rows",
    }
    for name in fsm.evolution.__all__:
        assert getattr(fsm.evolution, name) is not None
