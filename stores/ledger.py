"""The effects ledger's one algorithm, shared by every store: look up, run, record.

Each store provides the two primitives (``effect`` and ``record_effect``, whose lease
check sits inside the recording statement); :class:`LedgerRun` builds ``run`` on them so
that the memory, SQLite and PostgreSQL stores cannot drift apart in what "run an effect
exactly once" means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm.errors import InvalidArgument, InvalidData, LeaseLost
from fsm.limits import check_id, check_lease, json_copy
from fsm.records import EFFECT_FAILED, EFFECT_SUCCEEDED, PROGRESS_KEY, EffectRecord, Lease, Snapshot


def check_effect_key(key: object) -> str:
    """``key`` if it is a usable effect key; ``fsm:`` keys are the framework's own."""
    key = check_id("effect key", key)
    if key.startswith("fsm:") and key != PROGRESS_KEY:
        raise InvalidArgument(f"effect keys starting with 'fsm:' are reserved, not {key!r}")
    return key


def json_result(result: Any, what: str) -> Any:
    """A JSON copy of ``result`` (the limits of entity data: finite numbers, bounded depth,
    no NUL), else ``InvalidArgument``: the ledger stores JSON."""
    try:
        return json_copy(result, lifecycle="ledger")
    except InvalidData as err:
        raise InvalidArgument(f"{what} must be JSON (or a pydantic model the caller names): {err}") from None


def error_of(err: BaseException) -> dict[str, Any]:
    """How a failed effect's error is recorded."""
    return {"error": {"type": type(err).__name__, "message": str(err)[:2000]}}


def idempotency_key(entity_id: str, key: str) -> str:
    """The key handed to an effect's function: the same for every owner that runs it."""
    return f"{entity_id}:{key}"


class LedgerRun:
    """``run`` on top of a store's ``get``, ``effect`` and ``record_effect``."""

    def get(self, entity_id: str, *, include_deleted: bool = False) -> Snapshot:  # pragma: no cover - provided
        raise NotImplementedError

    def effect(self, entity_id: str, key: str) -> EffectRecord | None:  # pragma: no cover - provided by stores
        raise NotImplementedError

    def record_effect(  # pragma: no cover - provided by stores
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]:
        raise NotImplementedError

    def run(
        self, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool = True
    ) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.Store.run`."""
        check_id("entity id", entity_id)
        check_effect_key(key)
        check_lease(lease)
        if not callable(fn):
            raise InvalidArgument(f"an effect's fn must be callable, not {type(fn).__name__}")
        if not isinstance(retry_failed, bool):
            raise InvalidArgument(f"retry_failed must be a bool, not {type(retry_failed).__name__}")
        recorded = self.effect(entity_id, key)
        if recorded is not None and (recorded.status == EFFECT_SUCCEEDED or not retry_failed):
            return recorded, False
        replace = (EFFECT_FAILED,) if retry_failed else ()
        holder = self.get(entity_id)
        if holder.lease_owner != lease.owner or holder.lease_token != lease.token:
            # seeds/002 BR-2: an actor that no longer owns the entity runs no side effect.
            # The recording statement would refuse its result anyway; refusing before the
            # call spares the external system a run nobody can record (a fenced holder that
            # goes on to its next gate, say).  The race in between stays the recording's.
            raise LeaseLost(
                entity_id,
                expected_token=lease.token,
                found_token=holder.lease_token,
                owner=lease.owner,
                detail=f"effect {key!r} was not run: the lease is no longer the caller's",
            )
        try:
            result = fn(idempotency_key(entity_id, key))
        except Exception as err:
            self.record_effect(
                entity_id,
                key,
                owner=lease.owner,
                token=lease.token,
                status=EFFECT_FAILED,
                result=error_of(err),
                replace=replace,
            )
            raise
        return self.record_effect(
            entity_id,
            key,
            owner=lease.owner,
            token=lease.token,
            status=EFFECT_SUCCEEDED,
            result=json_result(result, f"the result of effect {key!r}"),
            replace=replace,
        )


__all__ = ["LedgerRun", "check_effect_key", "error_of", "idempotency_key", "json_result"]
