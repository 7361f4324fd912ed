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
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta

from pydantic import ValidationError

import signals
from fsm.clock import Clock, new_owner_id
from fsm.definition_rules import unreaped_states
from fsm.engine import Engine, announce
from fsm.engine.announce import observed
from fsm.engine.later import PENDING, later_kind
from fsm.engine.parallel import parent_engine, sweep_joins
from fsm.errors import ConfigError, FsmError, GuardRejected, InvalidData, MalformedRow, StoreUnavailable
from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.reaping.config import (
    ReaperConfig,
    ReapPolicy,
    ReapResult,
)
from fsm.reaping.later import DELIVERY_TTL, deliver_due
from fsm.reaping.leader import LeaderLease, leader_key
from fsm.reaping.rules import Rule, plan_rules
from fsm.reaping.ticklog import TickLog
from fsm.reaping.wakeups import notify_moved, wakes_workers
from fsm.records import (
    Actor,
    BatchWrite,
    HistoryRecord,
    LeaseChange,
    Snapshot,
)
from fsm.scheduling import Schedules
from fsm.scheduling.service import SCHEDULE_KIND, active_schedules
from signals import ReaperErrorPayload, ReaperTickPayload
from stores.base import Store

log = logging.getLogger("fsm.reaper")

TIMER_SLACK = 0.005
"""Seconds the loop adds to the earliest timer's wait: a tick that starts a few
milliseconds early would find nothing due and sleep again."""
MIN_SLEEP = 0.01
"""The loop's shortest sleep between ticks (a timer the store reports due at once, but a
guard keeps from firing, must not spin the loop)."""

MOVE_LINE = "%s %s: %s -> %s (%s) [reason=%s, version=%d, token=%d]"
"""The INFO line logged for each entity the reaper moves."""


class Reaper:
    """Fails or reclaims entities whose holder is gone; never touches a fresh lease (I1).

    ``policies`` maps each lifecycle to reap to its policy (``None``: the lifecycle's own
    default) or is a list of lifecycles; values may be :class:`ReapPolicy` to add
    ``max_active`` (``{JobLifecycle: ReapPolicy(max_active=...)}``: the key names the
    lifecycle), and a list may hold ``ReapPolicy(lifecycle=..., max_active=...)``.  One
    reaper reaps each kind with one lifecycle: two of the same kind are refused.
    ``run_once()`` is one tick; ``start()``/``stop()`` run ticks on a
    thread every ``config.interval``.  A tick never raises (I9).
    """

    def __init__(
        self,
        store: Store,
        policies: Mapping[type[Lifecycle], Policy | ReapPolicy | None] | Iterable[type[Lifecycle] | ReapPolicy],
        config: ReaperConfig | Mapping[str, object] | None = None,
        *,
        clock: Clock | None = None,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.config = validated_config(config)
        self.owner = owner or new_owner_id("reaper:")
        items: Iterable[tuple[object, Policy | ReapPolicy | None]] = (
            policies.items()
            if isinstance(policies, Mapping)
            else ((p.lifecycle, p) if isinstance(p, ReapPolicy) else (p, None) for p in policies)
        )
        reap_policies: list[ReapPolicy] = []
        problems: list[str] = []
        kinds: dict[str, str] = {}
        for lifecycle, given in items:
            if not (isinstance(lifecycle, type) and issubclass(lifecycle, Lifecycle) and hasattr(lifecycle, "table")):
                problems.append(f"{lifecycle!r} is not a Lifecycle class")
                continue
            if lifecycle.kind in kinds:
                # both would reap the same rows, each with its own rules and policy
                problems.append(
                    f"{lifecycle.__name__} and {kinds[lifecycle.kind]} share kind {lifecycle.kind!r}: one reaper "
                    "reaps each kind with one lifecycle (give a subclass its own kind, or pass only one)"
                )
                continue
            kinds[lifecycle.kind] = lifecycle.__name__
            try:
                rp = (given if isinstance(given, ReapPolicy) else ReapPolicy(policy=given)).bind(lifecycle)
            except ValueError as err:
                problems.append(str(err))
                continue
            problems += rp.check_backstop(self.config.interval)
            reap_policies.append(rp)
        # each region of a parallel state is a lifecycle of its own, reaped with its lifecycle's
        # timing (fsm.regions): a region's running is reaped as any running
        copies = [
            rp.model_copy(update={"lifecycle": region})
            for rp in list(reap_policies)
            for regions in rp.bound_lifecycle.regions.values()
            for region in regions.values()
            if region.kind not in kinds
        ]
        for copy in copies:  # each region's own states against the lifecycle's max_active
            problems += copy.check_backstop(self.config.interval)
        reap_policies += copies
        if not reap_policies and not problems:
            problems.append("the reaper needs at least one lifecycle")
        if problems:
            raise ConfigError("invalid reaper config: " + "; ".join(problems), problems=problems)
        self.policies = reap_policies
        self.engines = [
            Engine(rp.bound_lifecycle, store, clock=clock, policy=rp.policy, owner=self.owner) for rp in reap_policies
        ]
        self.rules = [rule for engine in self.engines for rule in plan_rules(engine)]
        self.unreaped: dict[str, tuple[str, ...]] = {
            engine.kind: found for engine in self.engines if (found := unreaped_states(engine.table, engine.policy))
        }
        """Kind -> the states an entity can hold a lease in that no ``lease_stale`` reaper
        transition leaves (:func:`fsm.definition_rules.unreaped_states`): logged once here,
        since this reaper cannot free an entity whose holder dies there."""
        for kind, states in self.unreaped.items():
            log.warning(
                "lifecycle %r: an entity can hold a lease in %s, but no reaper transition frees %s once its "
                "holder dies (a lease_stale one whatever the counters, or a timed one): one whose holder dies "
                "there stays there; declare one (recovery(...), or reaper(state.to(..., cond='lease_stale')))",
                kind,
                ", ".join(repr(s) for s in states),
                "it" if len(states) == 1 else "them",
            )
        self._waking = frozenset(i for i, rule in enumerate(self.rules) if wakes_workers(rule))
        """The rules whose moves a claim takes (by position): a tick that moved rows by one
        of them wakes the lifecycle's workers."""
        if self.config.leader and getattr(store, "binding", None) is not None:
            raise ConfigError(
                "leader=True needs a store with the library's own tables: on a store bound to an application "
                "table the reserved leader row would land in that table; give the leader its own SqlStore"
            )
        ttl = self.config.effective_leader_ttl
        self.leaders: dict[str, LeaderLease] = (
            {
                rp.bound_lifecycle.kind: LeaderLease(store, self.owner, ttl, leader_key(rp.bound_lifecycle.kind))
                for rp in reap_policies
            }
            if self.config.leader
            else {}
        )
        """With ``config.leader``: one leader lease per lifecycle kind this reaper serves.  A
        tick reaps the kinds it leads; another reaper (a worker's, serving only ``job``) leads
        its own kinds, never all of them."""
        self.tick_log: TickLog | None = None
        """Where :meth:`start`'s ticks are recorded (what ``fsm inspect`` shows as the
        reaper's recent ticks), or ``None``: a worker's embedded reaper sets it."""
        # the claim without snapshots, when the store's class offers it (a wrapper that only
        # forwards attributes does not: its own move_candidates is what it means to be called);
        # called as the store's own attribute, so a shared in-memory SQLite store's lock wraps it
        offered = callable(getattr(type(store), "move_candidates_brief", None))
        self._brief: Callable[..., list[HistoryRecord]] | None = store.move_candidates_brief if offered else None  # type: ignore[attr-defined]
        self.timers: dict[str, tuple[tuple[str, timedelta], ...]] = {
            engine.kind: pairs
            for engine in self.engines
            if (pairs := tuple(dict.fromkeys((b.source, b.after) for b in engine.table.timers() if b.after)))
        }
        """Kind -> its timed transitions as ``(leaf state, after)`` pairs: what
        :meth:`next_timer` probes so the loop sleeps until the earliest timer."""
        bound = getattr(store, "binding", None) is not None  # an application's table holds no schedules
        self.schedules = {} if bound else {engine.kind: Schedules(engine) for engine in self.engines}
        """Kind -> its stored schedules: each tick creates the due runs of the kinds it leads."""
        self._led: set[str] | None = None  # the kinds the last tick led (None: no leadership)
        self._thread: threading.Thread | None = None
        self._ending: threading.Thread | None = None  # the loop the last stop() waited for
        self._stop = threading.Event()
        self._nudge = threading.Event()
        self._subscriptions: list[Callable[[], None]] = []
        self._last_takeover = float("-inf")  # when a tick last looked for dead deliverers' requests
        self._lock = threading.Lock()
        self.ticks = 0

    # -- one tick ------------------------------------------------------------------------

    def run_once(self, *, dry_run: bool = False) -> ReapResult:
        """Run one tick: every rule, in keyset pages.  Never raises."""
        result = ReapResult(dry_run=dry_run, enabled=self.config.enabled)
        started = time.perf_counter()
        if self.config.enabled:
            try:
                led = self._lead() if self.leaders and not dry_run else None
                if not dry_run:
                    self._led = led
                if led is not None:
                    result.standby = sorted(set(self.leaders) - led)
                    if not led:
                        result.leading = False
                        return self._finish(result, started, dry_run)
                woken: set[str] = set()  # kinds whose workers can claim what this tick moved
                try:
                    for i, rule in enumerate(self.rules):
                        if led is not None and rule.engine.kind not in led:
                            continue  # another reaper leads this kind
                        before = result.total_moved
                        self._run_rule(rule, result, dry_run)
                        if i in self._waking and result.total_moved > before:
                            woken.add(rule.engine.kind)
                    if not dry_run:
                        self._join_regions(led, result)
                    if not dry_run:
                        self._run_schedules(led, result)
                        self._deliver_later(led, result)
                finally:  # what committed before a failure is claimable too
                    if not dry_run:
                        notify_moved(self.store, woken)
            except StoreUnavailable as err:  # down, or a corrupt file: typed, its message says it all
                result.errors += 1
                log.error("reaper tick failed: %s", err)
                self._signal_error(err, None)
            except Exception as err:  # a bug or an unexpected failure: log the stack; the next tick runs
                result.errors += 1
                log.exception("reaper tick failed")
                self._signal_error(err, None)
        return self._finish(result, started, dry_run)

    def _join_regions(self, led: set[str] | None, result: ReapResult) -> None:
        """Join the entities resting in a parallel state whose regions are all final: a region
        this tick (or an earlier one) moved into a final state, or a join a crash cut off
        between a region's commit and its join (:mod:`fsm.regions`)."""
        parents: dict[str, Engine] = {}
        for engine in self.engines:
            if led is not None and engine.kind not in led:
                continue
            if engine.table.parallel:
                parents[engine.kind] = engine
            elif engine.lifecycle.region_of is not None:  # a region's reaper (a region worker's own) joins too
                parent = parent_engine(engine)
                parents.setdefault(parent.kind, parent)
        for parent in parents.values():
            joined = sweep_joins(parent, self.config.batch_size)
            if joined:
                result.moved[f"{parent.kind}.join"] += joined

    def _run_schedules(self, led: set[str] | None, result: ReapResult) -> None:
        """Create the due runs of the schedules of the kinds this tick leads (one indexed
        read of every lifecycle's schedule rows, then a write per due schedule)."""
        kinds = [kind for kind in self.schedules if led is None or kind in led]
        if not kinds:
            return
        rows = active_schedules(self.store)
        for kind in kinds:
            step = self.schedules[kind].run_due(rows)
            if step.created:
                result.scheduled[kind] += len(step.created)
            result.errors += step.errors

    def _deliver_later(self, led: set[str] | None, result: ReapResult) -> None:
        """Deliver the due delayed fires of the kinds this tick leads (one claim each; the
        requests of a dead deliverer are looked for once per delivery TTL)."""
        now = time.monotonic()
        takeover = now - self._last_takeover >= DELIVERY_TTL.total_seconds()
        if takeover:
            self._last_takeover = now
        for engine in self.engines:
            if led is not None and engine.kind not in led:
                continue
            done = deliver_due(engine, self.owner, limit=self.config.batch_size, takeover=takeover)
            if done.fired:
                result.delayed[f"{engine.kind}.fired"] += len(done.fired)
            if done.dropped:
                result.delayed[f"{engine.kind}.dropped"] += len(done.dropped)

    def next_timer(self) -> float | None:
        """Seconds until the earliest pending timer this reaper fires (of the kinds it
        leads, with leadership), or ``None`` when none is pending or the store cannot tell
        (:class:`stores.base.TimerTimes`).  Timers already due are the next tick's."""
        probe = getattr(self.store, "next_timer", None)
        if probe is None or not self.config.enabled:
            return None
        found: float | None = None
        for kind, pairs in self.timers.items():
            if self._led is not None and kind not in self._led:
                continue  # another reaper leads it, and fires its timers
            try:
                wait = probe(kind, pairs)
            except FsmError as err:  # the loop falls back to its interval; the next probe retries
                log.warning("could not read the next timer of %s: %s", kind, err)
                continue
            if wait is not None and (found is None or wait < found):
                found = wait
        return found

    def sleep_for(self) -> float:
        """How long :meth:`start`'s loop sleeps after a tick: ``config.interval``, or less
        when a timer falls due sooner (plus :data:`TIMER_SLACK`, so the tick finds it due).

        It also never sleeps longer than the shortest delay of a timer it fires: an entity
        entering a timed state during the sleep is due no sooner than that, so the loop
        needs no wake-up to fire it on time."""
        wait = self.config.interval.total_seconds()
        led = self._led
        delays = [a for kind, pairs in self.timers.items() if led is None or kind in led for _, a in pairs]
        if delays:
            wait = min(wait, min(delays).total_seconds())
            pending = self.next_timer()
            if pending is not None:
                wait = min(wait, pending + TIMER_SLACK)
        if self.config.enabled:
            for engine in self.engines:  # the next delayed fire of each kind it leads
                if led is not None and engine.kind not in led:
                    continue
                try:
                    later = self.store.next_due(later_kind(engine.kind), [PENDING])  # type: ignore[attr-defined]
                except (FsmError, AttributeError) as err:
                    log.debug("could not read the next delayed fire of %s: %s", engine.kind, err)
                    later = None
                if later is not None:
                    wait = min(wait, later + TIMER_SLACK)
        if self.config.enabled and self.schedules:
            try:
                run = next(iter(self.schedules.values())).next_due()  # one probe: every kind's schedules
            except FsmError as err:
                log.warning("could not read the next schedule run: %s", err)
                run = None
            if run is not None:
                wait = min(wait, run + TIMER_SLACK)
        return max(MIN_SLEEP, min(wait, threading.TIMEOUT_MAX))

    def _lead(self) -> set[str]:
        """Renew or take the leadership of each kind; the kinds this reaper leads now."""
        return {kind for kind, lease in self.leaders.items() if lease.try_lead()}

    @property
    def leader(self) -> LeaderLease | None:
        """The leader lease of this reaper's only kind (``None`` without ``config.leader``);
        a reaper of several kinds has one per kind in :attr:`leaders`."""
        return next(iter(self.leaders.values()), None) if len(self.leaders) == 1 else None

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
        if rule.set_based and not dry_run:
            self._claim(rule, result)
        # what the claims left: unreadable rows (counted and stepped over), rows another
        # reaper is moving right now (lost races), and every row of a dry run or of a rule
        # only Python can judge
        while True:
            page, exhausted = self._page(rule, after, batch, result)
            if not page:
                return
            after = page[-1].id
            if dry_run:  # a row two rules would move is listed once, as the first rule would take it
                listed = {(kind, entity_id) for kind, entity_id, _, _ in result.would_move}
                if not rule.set_based:  # Python guards the store could not filter: judge them here
                    page = [s for s in page if rule.engine.would_fire(s, branch.event, Actor.REAPER) is not None]
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

    def _claim(self, rule: Rule, result: ReapResult) -> None:
        """Move the rule's candidates a page at a time, each page found and moved by one
        store call (:meth:`stores.Store.move_candidates`), until a page comes back short.

        Concurrent reapers divide the rows this way instead of each reading all of them.
        A page that fails for any reason but an unavailable store is left to the keyset
        path that follows, which moves or skips its rows one by one.
        """
        write = self._batch(rule, ())
        limit = self.config.batch_size
        while True:
            # nobody listening to the transition signals (asked once per page): the page
            # is moved without decoding a snapshot of each row, only its history row
            brief = self._brief is not None and not observed()
            try:
                if brief:
                    assert self._brief is not None
                    records = self._brief(write, limit=limit)
                else:
                    moved = self.store.move_candidates(write, limit=limit)
            except (StoreUnavailable, ConfigError):
                raise
            except (FsmError, ValueError, TypeError):
                log.warning("%s: a claimed page failed; reading the candidates instead", rule.name, exc_info=True)
                return
            if brief:
                self._moved_brief(rule, records, result)
                count = len(records)
            else:
                for snap, record in moved:
                    self._moved(rule, snap, record, result)
                count = len(moved)
            if count < limit:
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
            # a reclaim fences the dead holder (token + 1) and leaves the lease free for a
            # claim until its TTL runs out: the reaper never becomes the owner
            new_owner=None,
            lease_ttl=rule.engine.policy.lease_ttl if acquires else None,
            bump_attempt=branch.bump_attempt,
            bump_reclaims=branch.bump_reclaims,
            reason=branch.reason,
            changes=branch.changes,
            timer=branch.timer,
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
        except (MalformedRow, InvalidData) as err:
            # InvalidData: a row the store reads but cannot write back (its data decodes to
            # something JSON cannot hold): a bad row every tick, not a race lost every tick
            self._bad_row(snap.id, err, result)
            return
        except GuardRejected:
            result.refused += 1  # a guard only Python can judge said no: not a race
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
    def _moved_brief(rule: Rule, records: list[HistoryRecord], result: ReapResult) -> None:
        """A page moved with nobody listening: counted once, one INFO line per entity."""
        if not records:
            return
        result.moved[rule.name] += len(records)
        if not log.isEnabledFor(logging.INFO):
            return
        kind = rule.engine.kind
        for r in records:
            log.info(
                MOVE_LINE,
                kind,
                r.entity_id,
                r.source,
                r.target,
                r.event,
                r.reason,
                r.seq,
                r.lease_token,
                extra=_move_fields(kind, r.entity_id, r, r.lease_token),
            )

    @staticmethod
    def _log_move(rule: Rule, snap: Snapshot, record: HistoryRecord) -> None:
        log.info(
            MOVE_LINE,
            rule.engine.kind,
            snap.id,
            record.source,
            record.target,
            record.event,
            record.reason,
            snap.version,
            snap.lease_token,
            extra=_move_fields(rule.engine.kind, snap.id, record, snap.lease_token),
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
            self._nudge = threading.Event()
            self._listen_for_later(self._nudge)
            self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="fsm-reaper", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop the schedule promptly (a tick in progress finishes); a second stop waits
        for the same loop.  Returns whether the loop has ended: until it has, its thread
        may still be using the store's connections, so the store must not be closed."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                thread = self._ending  # a stop racing another: wait for the same loop
            self._ending = thread
            self._stop.set()
            self._nudge.set()
            for unsubscribe in self._subscriptions:
                unsubscribe()
            self._subscriptions = []
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if not thread.is_alive():
                return True  # the loop resigned on its own way out, on its own connection
        self._resign()
        return thread is None or not thread.is_alive()

    def _resign(self) -> None:
        """Give every leader lease back: a standby takes over at its next tick, not after
        the TTL (done by the loop's thread when it ends, so a stop opens no connection of
        its own on the stopping thread)."""
        for kind, lease in self.leaders.items():
            try:
                lease.resign()
            except Exception:
                log.exception("could not resign the leader lease of %s; it expires on its own", kind)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _listen_for_later(self, nudge: threading.Event) -> None:
        """Wake the loop when a delayed fire is requested (its row's create notifies its
        reserved kind) or a schedule is added, replaced or resumed: one due sooner than the
        loop's sleep is served on time."""
        subscribe = getattr(self.store, "subscribe_work", None)
        if subscribe is None:
            return
        kinds = [later_kind(engine.kind) for engine in self.engines]
        if self.schedules:  # a schedule added or resumed during the sleep
            kinds.append(SCHEDULE_KIND)
        for kind in kinds:
            try:
                self._subscriptions.append(subscribe(kind, nudge.set))
            except FsmError as err:  # the loop still wakes by its own due times
                log.warning("could not listen for %s: %s", kind, err)

    def _loop(self, stop: threading.Event) -> None:
        nudge = self._nudge
        while not stop.is_set():
            result = self.run_once()
            # a tick that did something is INFO; an idle or standby one is DEBUG (every
            # interval of every worker's reaper would otherwise fill the log)
            idle = not result.total_moved and not result.errors and not result.bad_rows
            log.log(logging.DEBUG if idle else logging.INFO, "reaper tick: %s", result.summary())
            if self.tick_log is not None and (result.leading or result.errors):
                self.tick_log.record(result, self.owner)  # never raises: logged instead
            nudge.wait(self.sleep_for())  # a stop, or a delayed fire requested, ends it early
            nudge.clear()
        self._resign()


def _move_fields(kind: str, entity_id: str, record: HistoryRecord, token: int | None) -> dict[str, object]:
    """The ``extra`` fields of a move's INFO line: a reclaim's ``token`` is the one that
    fenced the dead holder; ``owner`` is None (the reaper never becomes the owner)."""
    return {
        "entity": entity_id,
        "kind": kind,
        "owner": None,
        "token": token,
        "event": record.event,
        "source": record.source,
        "target": record.target,
        "reason": record.reason,
        "actor": "reaper",
    }


def validated_config(config: ReaperConfig | Mapping[str, object] | None) -> ReaperConfig:
    """A ``ReaperConfig`` from itself or a mapping; a bad value is a ``ConfigError`` naming it."""
    if isinstance(config, ReaperConfig):
        return config
    try:
        return ReaperConfig.model_validate(dict(config or {}))
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise ConfigError("invalid reaper config: " + "; ".join(problems), problems=problems) from None


__all__ = ["Reaper", "validated_config"]
