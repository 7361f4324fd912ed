"""The reaper: expires what is dead, never what is alive.

Shaped like River's job rescuer: a validated config with named defaults, ``run_once()``
as the unit of work and of test, candidates in keyset batches, log and continue.

For each lifecycle it derives its *rules* from the compiled table: every reaper branch
(``expire``, ``supersede``, ``reclaim``...), with the store conditions of its guards.  A
rule whose guards all have store conditions runs set-based: the database finds the
candidates (indexed predicates, keyset pages) and moves a page in one statement that
re-checks every condition per row, so a renewal or a completion that lands between the
read and the write wins and is counted as a lost race.  A rule with a guard only Python
can evaluate runs row by row through the engine, with the same compare-and-set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import signals
from fsm.clock import Clock, new_owner_id
from fsm.engine import Engine, announce
from fsm.errors import ConfigError, FsmError, MalformedRow, StoreUnavailable
from fsm.leader import LeaderLease
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.records import (
    Actor,
    BatchWrite,
    Condition,
    HistoryRecord,
    LeaseChange,
    Snapshot,
)
from fsm.table import Branch, branch_conditions, negate_condition
from signals import ReaperErrorPayload, ReaperTickPayload
from stores.base import Store

log = logging.getLogger("fsm.reaping")

DEFAULT_INTERVAL = timedelta(minutes=5)
DEFAULT_BATCH_SIZE = 500


class ReaperConfig(BaseModel):
    """How often and how much the reaper sweeps.  ``enabled=False`` is the kill switch: a
    tick then reads and writes nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval: timedelta = Field(DEFAULT_INTERVAL, description="time between two ticks")
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1, le=100_000, description="candidates per keyset page")
    enabled: bool = Field(True, description="kill switch: off means a tick touches nothing")
    leader: bool = Field(False, description="one reaper at a time: ticks only while holding the leader lease")
    leader_ttl: timedelta | None = Field(None, description="leader lease lifetime (default: 3 x interval)")

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta():
            raise ValueError("interval must be a positive duration")
        return value

    @model_validator(mode="after")
    def _leader_outlives_a_tick(self) -> ReaperConfig:
        if self.leader_ttl is not None and self.leader_ttl <= self.interval:
            raise ValueError(
                f"leader_ttl ({self.leader_ttl}) must exceed interval ({self.interval}), "
                "or a live leader would lose its lease between two ticks"
            )
        return self

    @property
    def effective_leader_ttl(self) -> timedelta:
        return self.leader_ttl or self.interval * 3


class ReapPolicy(BaseModel):
    """One lifecycle's timing as the reaper sees it: the lifecycle's :class:`Policy` plus
    ``max_active``, the longest an entity may stay in one active state.

    The backstop rule is checked here: a live-but-hung holder keeps its lease at most
    renewal budget + lease TTL after entering a state, so ``max_active`` must exceed that
    sum for every active state, or the promise cannot hold and the config is refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    lifecycle: type[Lifecycle]
    policy: Policy
    max_active: timedelta | None = None

    def check_backstop(self) -> list[str]:
        if self.max_active is None:
            return []
        problems = []
        table = self.lifecycle.table
        ttl = self.policy.lease_ttl
        for state in sorted(leased_states(self.lifecycle)):
            budget = self.policy.budget_for(state)
            if budget is None:
                problems.append(
                    f"{self.lifecycle.kind}: state {state!r} has no renewal budget, so a hung holder could keep "
                    f"its lease forever and max_active={self.max_active} cannot hold"
                )
                continue
            # a reclaim re-enters the state with a fresh lease and a fresh budget
            reclaims = (
                self.policy.max_reclaims
                if any(b.source == state == b.target and b.lease_effect is LeaseChange.ACQUIRE for b in table.declared)
                else 0
            )
            worst = (budget + ttl) * (reclaims + 1)
            if self.max_active <= worst:
                spelled = f"({budget} + {ttl})" + (f" x (1 + {reclaims} reclaims)" if reclaims else "")
                problems.append(
                    f"{self.lifecycle.kind}: max_active={self.max_active} must exceed the renewal budget of "
                    f"{state!r} + lease_ttl{' for each entry' if reclaims else ''}: {spelled} = {worst}"
                )
        return problems


def leased_states(lifecycle: type[Lifecycle]) -> set[str]:
    """Non-final states an entity can be in while a lease is held: entered by a transition
    that acquires one, or by one that keeps it from a leased state (a fixed point)."""
    table = lifecycle.table
    leased = {b.target for b in table.declared if b.lease_effect is LeaseChange.ACQUIRE}
    leased |= {b.source for b in table.declared if b.holds_lease}
    while True:
        more = {b.target for b in table.declared if b.source in leased and b.lease_effect is LeaseChange.KEEP}
        if more <= leased:
            return leased - table.finals
        leased |= more


@dataclass
class ReapResult:
    """What one tick did.  ``moved`` counts per ``kind.event`` (``"job.reclaim"``)."""

    moved: Counter[str] = field(default_factory=Counter)
    lost_races: int = 0
    bad_rows: int = 0
    errors: int = 0
    duration_s: float = 0.0
    dry_run: bool = False
    enabled: bool = True
    leading: bool = True
    """False when ``config.leader`` is on and another reaper holds the leader lease."""
    would_move: list[tuple[str, str, str, str]] = field(default_factory=list)
    """In a dry run: ``(kind, entity id, event, target)`` of each row a tick would move."""

    @property
    def total_moved(self) -> int:
        return sum(self.moved.values())

    def counts(self) -> dict[str, int]:
        return {
            **{f"moved.{k}": v for k, v in sorted(self.moved.items())},
            "lost_races": self.lost_races,
            "bad_rows": self.bad_rows,
            "errors": self.errors,
            "would_move": len(self.would_move),
        }

    def summary(self) -> str:
        moved = ", ".join(f"{k}={v}" for k, v in sorted(self.moved.items())) or "nothing"
        head = "dry run, would move" if self.dry_run else "moved"
        if self.dry_run:
            moved = str(len(self.would_move))
        if not self.enabled:
            return "reaper disabled: touched nothing"
        if not self.leading:
            return "standby: another reaper holds the leader lease"
        return (
            f"{head} {moved}; lost races {self.lost_races}; bad rows {self.bad_rows}; "
            f"errors {self.errors}; {self.duration_s * 1000:.1f} ms"
        )


@dataclass(frozen=True)
class Rule:
    """One reaper branch, ready to run: where from, what to fire, what the store checks."""

    engine: Engine
    branch: Branch
    require: tuple[Condition, ...]
    set_based: bool

    @property
    def name(self) -> str:
        return f"{self.engine.kind}.{self.branch.event}"


def plan_rules(engine: Engine) -> list[Rule]:
    """The reaper rules of one lifecycle, in the order the statechart would try them.

    A later branch of the same (state, event) only applies to rows the earlier branches
    refused: the rule adds the negation of what distinguishes the earlier branch (e.g.
    Job ``expire`` running->failed gets ``attempt >= max_attempts``).  When that cannot be
    expressed as a store condition, the rule runs row by row through the engine.
    """
    rules: list[Rule] = []
    table = engine.table
    for leaf in table.leaves:
        for event in table.events:
            earlier: list[tuple[Condition, ...]] = []
            for branch in table.branches_for(leaf, event):
                if branch.actor is not Actor.REAPER:
                    continue
                own = branch_conditions(branch, engine.policy)
                # every guard (cond, or unless on a counter) has a store condition: SQL can run it
                set_based = all(g.condition is not None for g, _ in branch.guards)
                extra: list[Condition] = []
                for previous in earlier:
                    distinct = [c for c in previous if c not in own]
                    negated = negate_condition(distinct[0]) if len(distinct) == 1 else None
                    if negated is None:
                        set_based = False
                    else:
                        extra.append(negated)
                earlier.append(own)
                rules.append(Rule(engine, branch, own + tuple(extra), set_based))
    return rules


class Reaper:
    """Fails or reclaims entities whose holder is gone; never touches a fresh lease (I1).

    ``policies`` maps each lifecycle to reap to its policy (``None``: the lifecycle's own
    default) or is a list of lifecycles; values may be :class:`ReapPolicy` to add
    ``max_active``.  ``run_once()`` is one tick; ``start()``/``stop()`` run ticks on a
    thread every ``config.interval``.  A tick never raises (I9).
    """

    def __init__(
        self,
        store: Store,
        policies: Mapping[type[Lifecycle], Policy | ReapPolicy | None] | Iterable[type[Lifecycle]],
        config: ReaperConfig | Mapping[str, object] | None = None,
        *,
        clock: Clock | None = None,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.config = _validated_config(config)
        self.owner = owner or new_owner_id("reaper:")
        items = policies.items() if isinstance(policies, Mapping) else ((lc, None) for lc in policies)
        reap_policies: list[ReapPolicy] = []
        problems: list[str] = []
        for lifecycle, given in items:
            if not (isinstance(lifecycle, type) and issubclass(lifecycle, Lifecycle) and hasattr(lifecycle, "table")):
                problems.append(f"{lifecycle!r} is not a Lifecycle class")
                continue
            if isinstance(given, ReapPolicy):
                if given.lifecycle is not lifecycle:
                    problems.append(
                        f"the policy given for {lifecycle.__name__} is a ReapPolicy of {given.lifecycle.__name__}"
                    )
                    continue
                rp = given
            else:
                rp = ReapPolicy(lifecycle=lifecycle, policy=given or lifecycle.policy)
            problems += rp.check_backstop()
            reap_policies.append(rp)
        if not reap_policies and not problems:
            problems.append("the reaper needs at least one lifecycle")
        if problems:
            raise ConfigError("invalid reaper config: " + "; ".join(problems), problems=problems)
        self.policies = reap_policies
        self.engines = [
            Engine(rp.lifecycle, store, clock=clock, policy=rp.policy, owner=self.owner) for rp in reap_policies
        ]
        self.rules = [rule for engine in self.engines for rule in plan_rules(engine)]
        self.leader = LeaderLease(store, self.owner, self.config.effective_leader_ttl) if self.config.leader else None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.ticks = 0

    # -- one tick ------------------------------------------------------------------------

    def run_once(self, *, dry_run: bool = False) -> ReapResult:
        """Run one tick: every rule, in keyset pages.  Never raises."""
        result = ReapResult(dry_run=dry_run, enabled=self.config.enabled)
        started = time.perf_counter()
        if self.config.enabled:
            try:
                if self.leader is not None and not dry_run and not self.leader.try_lead():
                    result.leading = False
                    return self._finish(result, started, dry_run)
                for rule in self.rules:
                    self._run_rule(rule, result, dry_run)
            except Exception as err:  # the store failed mid-tick: log, and the next tick runs as scheduled
                result.errors += 1
                log.exception("reaper tick failed")
                self._signal_error(err, None)
        return self._finish(result, started, dry_run)

    def _finish(self, result: ReapResult, started: float, dry_run: bool) -> ReapResult:
        result.duration_s = time.perf_counter() - started
        self.ticks += 1
        counts = result.counts()
        signals.send(
            signals.reaper_tick,
            "reaper",
            lambda: ReaperTickPayload(counts=counts, duration_s=result.duration_s, dry_run=dry_run),
        )
        return result

    def _run_rule(self, rule: Rule, result: ReapResult, dry_run: bool) -> None:
        after: str | None = None
        batch = self.config.batch_size
        branch = rule.branch
        while True:
            page, exhausted = self._page(rule, after, batch, result)
            if not page:
                return
            after = page[-1].id
            if dry_run:  # a row two rules would move is listed once, as the first rule would take it
                listed = {(kind, entity_id) for kind, entity_id, _, _ in result.would_move}
                result.would_move += [
                    (rule.engine.kind, s.id, branch.event, branch.target)
                    for s in page
                    if (rule.engine.kind, s.id) not in listed
                ]
            elif rule.set_based:
                self._move_page(rule, page, result)
            else:
                for snap in page:
                    self._move_one(rule, snap, result)
            if exhausted:
                return

    def _page(self, rule: Rule, after: str | None, limit: int, result: ReapResult) -> tuple[list[Snapshot], bool]:
        """The next keyset page of candidates and whether the rule is exhausted.

        A row that cannot be decoded spoils a page query: the page is then read one row at
        a time up to the bad row, which is counted, logged and stepped over, and the rest
        of the page is read normally again.
        """
        kind, source = rule.engine.kind, rule.branch.source
        found: list[Snapshot] = []
        cursor = after
        while len(found) < limit:
            want = limit - len(found)
            try:
                rows = self.store.candidates(kind, source, rule.require, limit=want, after_id=cursor)
            except MalformedRow:
                try:
                    one = self.store.candidates(kind, source, rule.require, limit=1, after_id=cursor)
                except MalformedRow as err:
                    self._bad_row(err.entity_id, err, result)
                    cursor = err.entity_id
                    continue
                if not one:  # pragma: no cover - the page query just saw a row here
                    return found, True
                found.append(one[0])
                cursor = one[0].id
                continue
            found += rows
            return found, len(rows) < want
        return found, False

    def _batch(self, rule: Rule, ids: tuple[str, ...]) -> BatchWrite:
        branch = rule.branch
        acquires = branch.lease_effect is LeaseChange.ACQUIRE
        return BatchWrite(
            ids=ids,
            kind=rule.engine.kind,
            event=branch.event,
            source=branch.source,
            target=branch.target,
            actor=Actor.REAPER.value,
            require=rule.require,
            lease_change=branch.lease_effect,
            new_owner=self.owner if acquires else None,  # a reclaim hands the lease to this reaper
            lease_ttl=rule.engine.policy.lease_ttl if acquires else None,
            bump_attempt=branch.bump_attempt,
            bump_reclaims=branch.bump_reclaims,
            reason=branch.reason,
        )

    def _move_page(self, rule: Rule, page: list[Snapshot], result: ReapResult) -> None:
        write = self._batch(rule, tuple(s.id for s in page))
        try:
            moved = self.store.apply_batch(write)
        except (StoreUnavailable, ConfigError):
            raise  # not a bad row: the whole tick fails, is logged, and the next one retries
        except (MalformedRow, FsmError, ValueError, TypeError):
            # one bad row spoils a set-based page: redo it row by row and skip the bad one
            log.warning("%s: a page of %d failed; retrying row by row", rule.name, len(page), exc_info=True)
            for snap in page:
                self._move_one(rule, snap, result)
            return
        result.lost_races += len(page) - len(moved)
        for snap, record in moved:
            self._moved(rule, snap, record, result)

    def _move_one(self, rule: Rule, snap: Snapshot, result: ReapResult) -> None:
        branch = rule.branch
        try:
            if rule.set_based:
                one = self._batch(rule, (snap.id,))
                moved = self.store.apply_batch(one)
                if not moved:
                    result.lost_races += 1
                for new, record in moved:
                    self._moved(rule, new, record, result)
                return
            fired = rule.engine.fire(snap.id, branch.event, actor=Actor.REAPER)
        except (StoreUnavailable, ConfigError):
            raise
        except MalformedRow as err:
            self._bad_row(snap.id, err, result)
            return
        except FsmError:
            result.lost_races += 1  # moved, renewed, completed or deleted since the read
            return
        except Exception as err:
            self._bad_row(snap.id, err, result)
            return
        # the engine chose the branch of this event that holds now (maybe not this rule's):
        # the entity moved either way, and the engine sent its signals
        result.moved[rule.name] += 1
        self._log_move(rule, fired.snapshot, fired.record)

    def _moved(self, rule: Rule, snap: Snapshot, record: HistoryRecord, result: ReapResult) -> None:
        result.moved[rule.name] += 1
        self._log_move(rule, snap, record)
        announce(rule.engine.kind, snap, record, rule.branch)

    @staticmethod
    def _log_move(rule: Rule, snap: Snapshot, record: HistoryRecord) -> None:
        log.info(
            "%s %s: %s -> %s (%s) [reason=%s, version=%d, token=%d]",
            rule.engine.kind,
            snap.id,
            record.source,
            record.target,
            record.event,
            record.reason,
            snap.version,
            snap.lease_token,
        )

    def _bad_row(self, entity_id: str, err: BaseException, result: ReapResult) -> None:
        result.bad_rows += 1
        log.error("skipping entity %s: %s", entity_id, err, exc_info=err)
        self._signal_error(err, entity_id)

    @staticmethod
    def _signal_error(err: BaseException, entity_id: str | None) -> None:
        try:
            signals.send(
                signals.reaper_error, "reaper", lambda: ReaperErrorPayload(error=repr(err), entity_id=entity_id)
            )
        except Exception:  # pragma: no cover - signals.send already isolates receivers
            log.exception("reaper_error signal failed")

    # -- on a schedule -------------------------------------------------------------------

    def start(self) -> None:
        """Run ticks every ``config.interval`` on a daemon thread; a second start is a no-op."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            # each loop has its own stop event: a start racing a stop never revives the old loop
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="fsm-reaper", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the schedule promptly (a tick in progress finishes); a second stop is a no-op."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self.leader is not None:
            try:
                self.leader.resign()  # a standby takes over at its next tick, not after the TTL
            except Exception:
                log.exception("could not resign the leader lease; it expires on its own")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self, stop: threading.Event) -> None:
        interval = self.config.interval.total_seconds()
        while not stop.is_set():
            result = self.run_once()
            log.info("reaper tick: %s", result.summary())
            stop.wait(interval)


def _validated_config(config: ReaperConfig | Mapping[str, object] | None) -> ReaperConfig:
    if isinstance(config, ReaperConfig):
        return config
    try:
        return ReaperConfig.model_validate(dict(config or {}))
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise ConfigError("invalid reaper config: " + "; ".join(problems), problems=problems) from None


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_INTERVAL",
    "ReapPolicy",
    "ReapResult",
    "Reaper",
    "ReaperConfig",
    "Rule",
    "plan_rules",
]
