"""The engine's durable-work operations: claim, the effects ledger, listing, progress.

Each is a store-protocol operation plus what only the engine knows: which transitions
start an entity and which states a holder resumes (from the compiled table), the data
model a recorded result is validated against, and the signals to send after the commit.
The keeper and the worker (:mod:`fsm.work`, a layer above) are built on these; the
engine never builds them (``fsm.work.LeaseKeeper(engine, lease)`` does).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

import signals
from fsm.coordination import Limits
from fsm.engine.arguments import actor_arg, check_arguments, event_arg, lease_arg, text
from fsm.engine.later import (
    DROPPED,
    FIRED,
    Delayed,
    check_due,
    later_kind,
    new_delayed,
    same_request,
)
from fsm.engine.leases import EngineLeases
from fsm.errors import (
    ConfigError,
    EffectFailed,
    EntityExists,
    Fenced,
    InvalidArgument,
    InvalidData,
    LeaseLost,
    UnknownEntity,
    UnknownEvent,
)
from fsm.limits import check_id, check_message_args
from fsm.records import (
    EFFECT_FAILED,
    EFFECT_PROGRESS,
    PROGRESS_KEY,
    RESERVED_KEY_PREFIX,
    Actor,
    ClaimLimits,
    ClaimRequest,
    ClaimStart,
    EffectRecord,
    Lease,
    LeaseChange,
    Snapshot,
)
from fsm.table import CompiledTable
from signals import EffectPayload, LeasePayload
from stores.ledger import Ledger, check_run_args, run_effect

M = TypeVar("M", bound=BaseModel)

MAX_CLAIM = 1000

log = logging.getLogger("fsm.engine")


def claim_plan(
    table: CompiledTable, *, into: frozenset[str] | None = None
) -> tuple[tuple[ClaimStart, ...], tuple[str, ...]]:
    """What a claim may take, read off the table.

    Starts: every unguarded worker transition that takes the lease (``queued -> running``
    of a job).  Resumes: every state whose work needs the lease holder (a worker branch
    out of it requires ``holds_lease``): an entity there with no lease owner was reclaimed
    by the reaper, or released by a stopping worker, and waits for a new holder.
    ``into``: only the starts whose target and the resumes whose state is one of these.
    """
    starts: dict[str, ClaimStart] = {}
    resumes: list[str] = []
    for branch in table.declared:
        if branch.actor is not Actor.WORKER:
            continue
        if branch.lease_effect is LeaseChange.ACQUIRE and not branch.guards and branch.source not in starts:
            starts[branch.source] = ClaimStart(
                branch.source, branch.target, branch.event, branch.bump_attempt, branch.timer
            )
        if branch.holds_lease and branch.source not in resumes and branch.source not in table.finals:
            resumes.append(branch.source)
    chosen = tuple(s for s in starts.values() if into is None or s.target in into)
    return chosen, tuple(r for r in resumes if r not in starts and (into is None or r in into))


_LEASED: dict[int, tuple[str, ...]] = {}


def leased_states(table: CompiledTable) -> tuple[str, ...]:
    """The states a lease is held in, where a limit counts its slots: where a claim leaves
    an entity, and every non-final state a worker branch reaches from one of those without
    giving the lease back (a job's ``running`` and ``finalizing``)."""
    found = _LEASED.get(id(table))
    if found is not None:
        return found
    starts, resumes = claim_plan(table)
    held = {s.target for s in starts} | set(resumes)
    grown = True
    while grown:
        grown = False
        for branch in table.declared:
            if (
                branch.actor is Actor.WORKER
                and branch.lease_effect is not LeaseChange.CLEAR
                and branch.source in held
                and branch.target not in held
                and branch.target not in table.finals
            ):
                held.add(branch.target)
                grown = True
    found = _LEASED[id(table)] = tuple(sorted(held))
    return found


def _log_claims(kind: str, claimed: list[Snapshot]) -> None:
    """One INFO line per claimed entity, its lease's owner and token as ``extra`` fields."""
    for snap in claimed:
        log.info(
            "claimed %s %s in %s by %s (token %d, attempt %d)",
            kind,
            snap.id,
            snap.state,
            snap.lease_owner,
            snap.lease_token,
            snap.attempt,
            extra={
                "entity": snap.id,
                "kind": kind,
                "owner": snap.lease_owner,
                "token": snap.lease_token,
                "state": snap.state,
                "attempt": snap.attempt,
            },
        )


class EngineWork(EngineLeases):
    """``claim``, ``run``, ``effects``, ``progress``, ``entities`` and ``counts``."""

    def _claim_into(self, into: object) -> frozenset[str] | None:
        """``claim(into=...)`` checked: ``None``, or a collection of this lifecycle's leaf states."""
        if into is None:
            return None
        if isinstance(into, str | bytes) or not isinstance(into, Collection):
            raise InvalidArgument(f"into must be a collection of state names, not {type(into).__name__}")
        unknown = [repr(s)[:80] for s in into if not isinstance(s, str) or s not in self.table.leaves]
        if unknown:
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InvalidArgument(f"into names no leaf state of {self.kind!r}: {', '.join(unknown[:5])}{more}")
        return frozenset(into)

    def claim(
        self,
        limit: int = 1,
        *,
        owner: str | None = None,
        into: Collection[str] | None = None,
        limits: Limits | None = None,
    ) -> list[Snapshot]:
        """Take up to ``limit`` of the oldest claimable entities of this lifecycle.

        Queued entities are started (their lease-taking transition fires, token + 1);
        entities waiting for a new holder (reclaimed finalizers) get a new lease, token + 1,
        without a transition.  Concurrent claimers, in any process on any machine, never
        take the same entity.  Each returned snapshot carries the caller's ``lease``.

        ``into``: only claims that leave the entity in one of these states (a worker
        passes the states it has handlers for, so it never holds work it cannot do);
        ``None``: every claim the lifecycle allows.

        ``limits``: the concurrency and rate limits to keep (:class:`fsm.Limits`), instead of
        the lifecycle's own ``limits``.  Claims take higher priorities first, then the
        longest due.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
            raise InvalidArgument(f"limit must be an integer from 1 to {MAX_CLAIM}, not {limit!r}")
        starts, resumes = claim_plan(self.table, into=self._claim_into(into))
        if not starts and not resumes:
            what = "no transition takes the lease" if into is None else f"no claim leaves an entity in {sorted(into)}"
            raise InvalidArgument(f"lifecycle {self.kind!r} has nothing to claim: {what}")
        request = ClaimRequest(
            kind=self.kind,
            owner=self.owner if owner is None else text("owner", owner),
            limit=limit,
            ttl=self.policy.lease_ttl,
            starts=starts,
            resumes=resumes,
            budgets=tuple(
                (state, budget) for state in self.table.leaves if (budget := self.policy.budget_for(state)) is not None
            ),
            limits=self._claim_limits(limits),
            starve_after=self._starve_after(limits),
            definition=self.lifecycle.version,
        )
        claimed = self.store.claim(request)
        if claimed and log.isEnabledFor(logging.INFO):
            _log_claims(self.kind, claimed)
        if claimed and signals.lease_acquired.receivers:
            for snap in claimed:
                signals.send(signals.lease_acquired, self.kind, functools.partial(LeasePayload.of, self.kind, snap))
        return claimed

    def _limits(self, given: Limits | None) -> Limits | None:
        if given is None:
            return self.lifecycle.limits
        if not isinstance(given, Limits):
            raise InvalidArgument(f"limits must be an fsm.Limits, not {type(given).__name__}")
        return given

    def _claim_limits(self, given: Limits | None) -> ClaimLimits | None:
        limits = self._limits(given)
        return None if limits is None else limits.for_claim(leased_states(self.table))

    def _starve_after(self, given: Limits | None) -> timedelta | None:
        limits = self._limits(given)
        return None if limits is None else limits.starve_after

    def waiting_for_worker(self, entity: Snapshot | str) -> bool:
        """Whether the entity waits for a worker to claim it: in a state a claim starts from
        (queued), or in one a claim resumes with no lease owner (reclaimed after its holder
        died, released by a stopping worker, or retried).  Such an entity is never failed
        for waiting, only by the lifecycle's ``max_wait`` backstop; ``run_after`` says when
        it became due.  The inspector flags the same rows."""
        snap = self.get(entity) if isinstance(entity, str) else entity
        starts, resumes = claim_plan(self.table)
        if any(s.source == snap.state for s in starts):
            return True
        return snap.state in resumes and snap.lease_owner is None

    def run(
        self,
        entity_id: str,
        key: str,
        fn: Callable[[str], Any],
        lease: Lease,
        *,
        model: type[M] | None = None,
        retry_failed: bool = True,
    ) -> Any:
        """Run a side effect under ``lease`` and record its result exactly once (I4).

        A recorded result is returned without calling ``fn``.  Otherwise
        ``fn(idempotency_key)`` runs (the key, ``"{entity_id}:{key}"``, is the same for
        every owner: hand it to the external system so that it can deduplicate too) and its
        result is recorded only if ``lease`` is still current, checked in the recording
        statement; a holder that lost its lease gets ``LeaseLost`` and records nothing.

        ``model``: the result is a pydantic model, stored as JSON and validated again on
        replay.  A failure is recorded with its error and re-raised; a later ``run`` retries
        it unless ``retry_failed=False``, which raises ``EffectFailed`` instead.
        ``effect_recorded`` is sent after the commit.
        """
        self.get(text("entity_id", entity_id))
        return self._run_held(entity_id, key, fn, lease, model=model, retry_failed=retry_failed)

    def _run_held(
        self,
        entity_id: str,
        key: str,
        fn: Callable[[str], Any],
        lease: Lease,
        *,
        model: type[M] | None = None,
        retry_failed: bool = True,
        ledger: Ledger | None = None,
    ) -> Any:
        """:meth:`run` for a caller that holds the entity already (a worker's job, its
        snapshot read by this engine): no read of the row first, the store's own read of the
        holder and the ledger (one statement on SQL) answers for both.  ``ledger``: who
        answers the ledger's asks instead of the store (a worker's batch completer, which
        hands them to the store with other handlers' asks)."""
        lease_arg(lease)
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, not {fn!r}")

        def call(idempotency_key: str) -> Any:
            result = fn(idempotency_key)
            if model is not None:
                if not isinstance(result, model):
                    raise InvalidArgument(f"effect {key!r} must return a {model.__name__}, not {result!r}")
                return result.model_dump(mode="json")
            return result

        try:
            if ledger is None:
                record, executed = self.store.run(entity_id, key, call, lease, retry_failed=retry_failed)
            else:
                check_run_args(entity_id, key, call, lease, retry_failed)
                record, executed = run_effect(ledger, entity_id, key, call, lease, retry_failed=retry_failed)
        except Fenced as err:
            if isinstance(err, LeaseLost):
                self._lease_lost(lease, err, "effect", key)
            raise
        except Exception:
            self._announce_effect(entity_id, key, lease, None)  # the failure, if it was recorded
            raise
        if executed:
            self._announce_effect(entity_id, key, lease, record)
        if record.status == EFFECT_FAILED:
            raise EffectFailed(entity_id, key=key, error=record.result)
        if model is not None:
            try:
                return model.model_validate(record.result)
            except ValidationError as err:
                raise InvalidData(
                    lifecycle=self.kind, entity_id=entity_id, errors=[dict(e) for e in err.errors()]
                ) from None
        return record.result

    def _announce_effect(self, entity_id: str, key: str, lease: Lease, record: EffectRecord | None) -> None:
        """``effect_recorded`` for what this holder recorded: ``record`` when the call
        returned it, else (a failure that raised) the ledger row, read only if anyone listens."""
        if not signals.effect_recorded.receivers:
            return
        recorded = record if record is not None else self.store.effect(entity_id, key)
        if recorded is None or recorded.lease_token != lease.token:
            return  # nothing of this holder's was recorded
        signals.send(
            signals.effect_recorded,
            self.kind,
            lambda: EffectPayload(entity_id=entity_id, key=key, lease_token=lease.token, result=recorded.result),
        )

    def send(self, entity_id: str, name: str, payload: Any = None, *, idempotency_key: str) -> bool:
        """Send message ``name`` (with a JSON ``payload``) to the entity, once per
        ``idempotency_key``: a handler's ``job.wait_for(name)`` receives it, whether it was
        sent before the wait or during it, and a parked entity is woken at once (its
        workers are told: ``NOTIFY`` on PostgreSQL).  Returns ``True`` when this call
        recorded it, ``False`` when that key was sent before (nothing changes).  Messages
        are kept in the entity's ledger; one sent after a wait timed out is there for the
        next wait on that name."""
        check_message_args(text("entity_id", entity_id), name, idempotency_key)
        self.get(entity_id)  # of this lifecycle: UnknownEntity otherwise
        send = getattr(self.store, "send_message", None)
        if send is None:
            raise InvalidArgument(f"store {type(self.store).__name__} has no durable waits (send_message)")
        _, created = send(entity_id, name, idempotency_key, payload)
        return bool(created)

    def fire_later(
        self,
        entity_id: str,
        event: str,
        *,
        after: timedelta | float | None = None,
        at: datetime | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        data: Mapping[str, Any] | None = None,
        actor: Actor | str = Actor.WORKER,
    ) -> Delayed:
        """Fire ``event`` on the entity later: ``after`` a delay or ``at`` a time.  The
        request is stored (one per ``idempotency_key``: the same request again returns it,
        another under the same key is ``IdempotencyKeyReused``); when it is due, the
        lifecycle's reaper fires it if the chart still allows it, else drops it with the
        refusal as its recorded reason (:mod:`fsm.engine.later`; both fenced).  An event
        that needs the caller's lease (``holds_lease``) cannot be fired later: it would be
        refused.  An event declared with python-statemachine's ``delay=`` is fired this way
        only, after its declared delay unless ``after`` or ``at`` says otherwise (when it is
        due it fires if the chart allows it, as python-statemachine processes it then, and is
        dropped with the refusal otherwise).  Returns the :class:`~fsm.engine.later.Delayed`
        request."""
        if event_arg(event) not in self.table.events and not self.table.knows(check_id("event", event)):
            raise UnknownEvent(event, lifecycle=self.kind, known=list(self.table.events))
        who = actor_arg(actor) if not isinstance(actor, Actor) else actor
        check_arguments(reason, idempotency_key, data)
        self.get(text("entity_id", entity_id))  # of this lifecycle: UnknownEntity otherwise
        if getattr(self.store, "binding", None) is not None:
            raise ConfigError(
                "delayed fires need a store with the library's own tables: on a store bound to an application "
                "table their rows would land in that table"
            )
        declared = self.lifecycle.delays.get(event)
        if after is None and at is None and declared is not None:
            after = declared  # an event declared with delay=: python-statemachine's own delay
        due = check_due(after, at, self.clock.now())
        wanted = new_delayed(
            self.kind,
            entity_id,
            event,
            due,
            key=idempotency_key,
            actor=who,
            reason=reason,
            data=None if data is None else dict(data),
        )
        try:
            row = self.store.create(wanted)
        except EntityExists:
            row = self.store.get(wanted.id)
            same_request(row, wanted, compare_due=at is not None)
        return Delayed.of(row)

    def delayed(self, delayed_id: str) -> Delayed:
        """A delayed fire's request as stored now (``UnknownEntity`` when there is none);
        ``outcome`` is the reason its delivery recorded."""
        row = self.store.get(text("delayed_id", delayed_id))
        if row.kind != later_kind(self.kind):
            raise UnknownEntity(delayed_id, kind=later_kind(self.kind), found_kind=row.kind)
        history = self.store.history(row.id) if row.state in (FIRED, DROPPED) else []
        return Delayed.of(row, history[-1].reason if history else None)

    def effects(self, entity_id: str) -> list[EffectRecord]:
        """The entity's recorded effects (the framework's own rows, its keeper's progress
        and the lease renewal log, left out)."""
        self.get(entity_id)
        return [e for e in self.store.effects(entity_id) if not e.key.startswith(RESERVED_KEY_PREFIX)]

    def progress(self, entity_id: str) -> Any:
        """The progress details the last holder's keeper recorded with a renewal, or None."""
        self.get(entity_id)
        row = self.store.effect(entity_id, PROGRESS_KEY)
        return None if row is None else row.result

    def record_progress(self, lease: Lease, details: Any) -> None:
        """Record progress details under ``lease`` (as a Temporal heartbeat carries them);
        the next owner reads them with :meth:`progress`.  Fenced like any holder write."""
        lease_arg(lease)
        self.store.record_effect(
            lease.entity_id,
            PROGRESS_KEY,
            owner=lease.owner,
            token=lease.token,
            status=EFFECT_PROGRESS,
            result=details,
            replace=(EFFECT_PROGRESS,),
        )

    def entities(self, *, state: str | None = None, limit: int = 100, after_id: str | None = None) -> list[Snapshot]:
        """Entities of this lifecycle by id, keyset-paged (``after_id``), optionally in one state."""
        if state is not None and check_id("state", state) not in self.table.configurations:
            raise InvalidArgument(f"{self.kind} has no leaf state {state!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArgument(f"limit must be an integer from 1 to 10000, not {limit!r}")
        return self.store.entities(self.kind, state=state, limit=limit, after_id=after_id)

    def counts(self) -> dict[str, int]:
        """How many entities of this lifecycle are in each leaf state (every leaf listed)."""
        found = self.store.count_states(self.kind)
        return {leaf: found.get(leaf, 0) for leaf in self.table.leaves} | found


__all__ = ["MAX_CLAIM", "EngineWork", "claim_plan"]
