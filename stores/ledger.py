"""The effects ledger's one algorithm, shared by every store: look up, run, record.

Each store provides the two primitives (``effect`` and ``record_effect``, whose lease
check sits inside the recording statement); :class:`LedgerRun` builds ``run`` on them so
that the memory, SQLite and PostgreSQL stores cannot drift apart in what "run an effect
exactly once" means.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fsm.errors import InvalidArgument, InvalidData, LeaseLost, MalformedRow
from fsm.limits import check_id, check_lease, json_copy
from fsm.records import (
    EFFECT_FAILED,
    EFFECT_SUCCEEDED,
    MESSAGE_KEY_PREFIX,
    PROGRESS_KEY,
    RENEWALS_KEPT,
    RESERVED_KEY_PREFIX,
    STEP_KEY_PREFIX,
    EffectRecord,
    Lease,
    LeaseRenewal,
    Snapshot,
)


def check_effect_key(key: object, *, steps: bool = False) -> str:
    """``key`` if it is a usable effect key; ``fsm:`` keys are the framework's own (``steps``:
    a handler's durable step rows, ``fsm:step:...``, which ``record_effect`` takes)."""
    key = check_id("effect key", key)
    if steps and key.startswith(STEP_KEY_PREFIX):
        return key
    if key.startswith(RESERVED_KEY_PREFIX) and key != PROGRESS_KEY:
        raise InvalidArgument(f"effect keys starting with {RESERVED_KEY_PREFIX!r} are reserved, not {key!r}")
    return key


def message_key(name: str, key: str) -> str:
    """The ledger key of message ``name`` sent with idempotency key ``key``."""
    return f"{MESSAGE_KEY_PREFIX}{name}:{key}"


def message_result(name: str, key: str, payload: Any) -> dict[str, Any]:
    """What a message's ledger row holds."""
    return {"name": name, "key": key, "payload": payload}


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


# -- the lease-renewal log (a reserved ledger row, fsm.records.RENEWALS_KEY) ------------------


def renewal_time(when: datetime) -> str:
    """How a renewal log entry spells a time: fixed-width UTC ISO-8601 (as SQLite stores it)."""
    return when.astimezone(UTC).isoformat(" ", "microseconds")


def renewal_entry(snap: Snapshot, at: datetime, *, acquired: bool) -> dict[str, Any]:
    """The log entry of a renewal (or an acquisition) that left the lease as ``snap`` holds it."""
    assert snap.lease_owner is not None and snap.lease_expires_at is not None
    entry: dict[str, Any] = {
        "at": renewal_time(at),
        "expires_at": renewal_time(snap.lease_expires_at),
        "owner": snap.lease_owner,
        "token": snap.lease_token,
    }
    if acquired:
        entry["acquired"] = True
    return entry


def appended_log(log: Any, entry: dict[str, Any]) -> list[Any]:
    """``log`` with ``entry`` appended, the oldest dropped beyond :data:`RENEWALS_KEPT`
    (a log that is not a list is started afresh, as the SQL stores do)."""
    kept = log[-(RENEWALS_KEPT - 1) :] if isinstance(log, list) else []
    return [*kept, entry]


def _stored_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"a time must be text, not {type(value).__name__}")
    when = datetime.fromisoformat(value)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def renewals_of(entity_id: str, record: EffectRecord | None) -> list[LeaseRenewal]:
    """The renewals a log row holds, oldest first; ``MalformedRow`` naming the entity when
    the row cannot be read (the renewals are the store's, so a bad one is a damaged row)."""
    if record is None:
        return []
    log = record.result
    try:
        if not isinstance(log, list):
            raise TypeError(f"the log is {type(log).__name__}, not a list")
        found = []
        for entry in log:
            owner, token, acquired = entry["owner"], entry["token"], entry.get("acquired", False)
            if not isinstance(owner, str) or type(token) is not int or not isinstance(acquired, bool):
                raise TypeError(f"entry {entry!r} has ill-typed fields")
            at, expires_at = _stored_time(entry["at"]), _stored_time(entry["expires_at"])
            found.append(LeaseRenewal(at, expires_at, owner, token, acquired))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise MalformedRow(entity_id, reason=f"lease renewal log: {err}") from None
    return found


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

    def holder_and_effect(self, entity_id: str, key: str) -> tuple[tuple[str | None, int], EffectRecord | None]:
        """The live entity's lease holder ``(owner, token)`` and its recorded effect under
        ``key`` (``None``: none yet); ``UnknownEntity`` when there is no live entity.  Two
        reads here; a store that can answer both in one read overrides it (``run`` asks it
        before every effect)."""
        check_effect_key(key)  # the ledger's keys, as ``run`` takes them (not the framework's own)
        holder = self.get(entity_id)
        return (holder.lease_owner, holder.lease_token), self.effect(entity_id, key)

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
        # seeds/002 BR-2: an actor that no longer owns the entity runs no side effect, and is
        # not told a recorded one is its success either: a fenced holder replaying a key the
        # new owner has since recorded learns it lost the work, as ``fire`` tells it.  The
        # recording statement would refuse its result anyway; refusing before the call
        # spares the external system a run nobody can record.  The race in between stays
        # the recording's.
        (owner, token), recorded = self.holder_and_effect(entity_id, key)
        if owner != lease.owner or token != lease.token:
            raise LeaseLost(
                entity_id,
                expected_token=lease.token,
                found_token=token,
                owner=lease.owner,
                detail=f"effect {key!r} was not run nor replayed: the lease is no longer the caller's",
            )
        if recorded is not None and (recorded.status == EFFECT_SUCCEEDED or not retry_failed):
            return recorded, False
        replace = (EFFECT_FAILED,) if retry_failed else ()
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


__all__ = [
    "LedgerRun",
    "appended_log",
    "check_effect_key",
    "error_of",
    "idempotency_key",
    "json_result",
    "message_key",
    "message_result",
    "renewal_entry",
    "renewal_time",
    "renewals_of",
]
