"""The effects ledger's one algorithm, shared by every store: look up, run, record.

Each store provides the two primitives (``effect`` and ``record_effect``, whose lease
check sits inside the recording statement); :class:`LedgerRun` builds ``run`` on them so
that the memory, SQLite and PostgreSQL stores cannot drift apart in what "run an effect
exactly once" means.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from fsm.errors import FsmError, InvalidArgument, InvalidData, LeaseLost, MalformedRow
from fsm.limits import check_effect_args, check_id, check_lease, json_copy
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

    def holders_and_effects(self, pairs: Sequence[tuple[str, str]]) -> list[HolderAndEffect | FsmError]:
        """:meth:`holder_and_effect` of each ``(entity_id, key)`` pair, in order; an item
        that fails is answered with its own error (``UnknownEntity``, ``InvalidArgument``)
        and the others still are.  One read each here; the SQL stores answer all in one
        statement (a worker's batch of handlers' steps).  At most :data:`MAX_LEDGER_BATCH`
        pairs; not a list or tuple of them -> ``InvalidArgument``."""
        check_ledger_batch(pairs, "holders_and_effects takes a list of (entity_id, key) pairs")
        found: list[HolderAndEffect | FsmError] = []
        for pair in pairs:
            try:
                entity_id, key = ledger_pair(pair)
                found.append(self.holder_and_effect(entity_id, key))
            except FsmError as err:
                found.append(err)
        return found

    def record_effects(self, writes: Sequence[EffectWrite]) -> list[tuple[EffectRecord, bool] | FsmError]:
        """:meth:`record_effect` of each :class:`EffectWrite`, in order, each checked under its
        own lease in its recording statement; an item that fails is answered with its own
        error (``LeaseLost``, ``UnknownEntity``, ``InvalidArgument``) and nothing of it is
        written, the others still are.  One statement each here; PostgreSQL writes every
        new record in one.  At most :data:`MAX_LEDGER_BATCH` writes; not a list or tuple of
        them -> ``InvalidArgument``."""
        check_ledger_batch(writes, "record_effects takes a list of EffectWrite")
        done: list[tuple[EffectRecord, bool] | FsmError] = []
        for write in writes:
            try:
                done.append(record_one(self, effect_write(write)))
            except FsmError as err:
                done.append(err)
        return done

    def run(
        self, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool = True
    ) -> tuple[EffectRecord, bool]:
        """See :meth:`stores.Store.run`."""
        check_run_args(entity_id, key, fn, lease, retry_failed)
        return run_effect(self, entity_id, key, fn, lease, retry_failed=retry_failed)


HolderAndEffect = tuple[tuple[str | None, int], EffectRecord | None]
"""The live entity's lease holder ``(owner, token)`` and a recorded effect (or ``None``)."""

MAX_LEDGER_BATCH = 1000
"""The most items one ``holders_and_effects`` or ``record_effects`` call takes."""


class EffectWrite(NamedTuple):
    """One :meth:`LedgerRun.record_effects` item: :meth:`stores.Store.record_effect`'s arguments."""

    entity_id: str
    key: str
    owner: str
    token: int
    status: str
    result: Any
    replace: tuple[str, ...] = ()


class Ledger(Protocol):
    """What :func:`run_effect` asks of a ledger: a store, or a worker's batch completer that
    hands the asks to the store in batches."""

    def holder_and_effect(self, entity_id: str, key: str) -> HolderAndEffect: ...

    def record_effect(
        self,
        entity_id: str,
        key: str,
        *,
        owner: str,
        token: int,
        status: str,
        result: Any,
        replace: tuple[str, ...] = (),
    ) -> tuple[EffectRecord, bool]: ...


def check_ledger_batch(items: object, what: str) -> None:
    if not isinstance(items, list | tuple):
        raise InvalidArgument(f"{what}, not {type(items).__name__}")
    if len(items) > MAX_LEDGER_BATCH:
        raise InvalidArgument(f"{what}: at most {MAX_LEDGER_BATCH}, not {len(items)}")


def ledger_pair(pair: object) -> tuple[str, str]:
    """A checked ``(entity_id, key)`` pair of :meth:`LedgerRun.holders_and_effects`."""
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise InvalidArgument(f"an (entity_id, key) pair is a tuple of two, not {type(pair).__name__}")
    return check_id("entity id", pair[0]), check_effect_key(pair[1])


def effect_write(write: object) -> EffectWrite:
    """A checked :class:`EffectWrite` (its arguments as ``record_effect`` checks them)."""
    if not isinstance(write, EffectWrite):
        raise InvalidArgument(f"record_effects takes EffectWrite items, not {type(write).__name__}")
    check_effect_args(write.entity_id, write.key, write.owner, write.token, write.status)
    check_effect_key(write.key, steps=True)
    if not isinstance(write.replace, tuple) or not all(isinstance(s, str) for s in write.replace):
        raise InvalidArgument(f"replace must be a tuple of statuses, not {write.replace!r}")
    return write


def record_one(ledger: Ledger, write: EffectWrite) -> tuple[EffectRecord, bool]:
    """``write`` recorded by ``ledger.record_effect`` alone."""
    return ledger.record_effect(
        write.entity_id,
        write.key,
        owner=write.owner,
        token=write.token,
        status=write.status,
        result=write.result,
        replace=write.replace,
    )


def check_run_args(entity_id: object, key: object, fn: object, lease: object, retry_failed: object) -> None:
    """``run``'s arguments, checked before anything is read or called."""
    check_id("entity id", entity_id)
    check_effect_key(key)
    check_lease(lease)
    if not callable(fn):
        raise InvalidArgument(f"an effect's fn must be callable, not {type(fn).__name__}")
    if not isinstance(retry_failed, bool):
        raise InvalidArgument(f"retry_failed must be a bool, not {type(retry_failed).__name__}")


def run_effect(
    ledger: Ledger, entity_id: str, key: str, fn: Callable[[str], Any], lease: Lease, *, retry_failed: bool
) -> tuple[EffectRecord, bool]:
    """The ledger's algorithm on checked arguments (:func:`check_run_args`): ask for the
    holder and the record, run, record under the lease (see :meth:`stores.Store.run`)."""
    # seeds/002 BR-2: an actor that no longer owns the entity runs no side effect, and is
    # not told a recorded one is its success either: a fenced holder replaying a key the
    # new owner has since recorded learns it lost the work, as ``fire`` tells it.  The
    # recording statement would refuse its result anyway; refusing before the call
    # spares the external system a run nobody can record.  The race in between stays
    # the recording's.
    (owner, token), recorded = ledger.holder_and_effect(entity_id, key)
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
        ledger.record_effect(
            entity_id,
            key,
            owner=lease.owner,
            token=lease.token,
            status=EFFECT_FAILED,
            result=error_of(err),
            replace=replace,
        )
        raise
    return ledger.record_effect(
        entity_id,
        key,
        owner=lease.owner,
        token=lease.token,
        status=EFFECT_SUCCEEDED,
        result=json_result(result, f"the result of effect {key!r}"),
        replace=replace,
    )


__all__ = [
    "MAX_LEDGER_BATCH",
    "EffectWrite",
    "HolderAndEffect",
    "Ledger",
    "LedgerRun",
    "appended_log",
    "check_effect_key",
    "check_run_args",
    "error_of",
    "idempotency_key",
    "json_result",
    "message_key",
    "message_result",
    "record_one",
    "renewal_entry",
    "renewal_time",
    "renewals_of",
    "run_effect",
]
