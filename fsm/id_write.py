"""A transition fired by id that the store judges itself: :class:`IdWrite`.

A fire by id used to read the row, judge the branch in Python, then write with the
version compare-and-set: two round trips.  When every branch the event may take for the
actor is decided by the row's state alone (no guard, or ``holds_lease`` with the caller's
lease), the store can judge it inside the write: the statement moves the row only if it
is live, of the lifecycle's kind, in one of ``moves``' sources and (with a lease) held by
the caller, and sets the target its source maps to.  The rows lock makes it atomic: two
such writes on one row never both move it from the same version.

A write that moves nothing is not diagnosed by the store: the engine reads the row then
and judges it as a read-first fire does (:mod:`fsm.engine.by_id`), so the errors are the
read-first path's own.  :meth:`IdWrite.target_for` is the same judgement in Python, for the
memory store and as the specification the SQL follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from fsm.errors import InvalidArgument
from fsm.limits import (
    MAX_INT64,
    check_free_text,
    check_id,
    check_int,
    check_json,
    check_optional_duration,
    check_optional_id,
    check_run_after,
)
from fsm.records import LeaseChange, Snapshot, TimerMode


@dataclass(slots=True)
class IdWrite:
    """One transition by id, its branch chosen by the store from the row's state.

    ``moves``: ``(source, target)`` pairs, one per source leaf the event may leave.
    ``expect_owner``/``expect_token``: the caller's lease, required on the row when given
    (a read-first fire refuses a caller whose lease is not the row's, whatever the branch).
    ``holds``: the branches require holding the lease (the history row then records the
    holder, as a read-first fire's write does).  The other fields are
    :class:`~fsm.records.TransitionWrite`'s.
    """

    entity_id: str
    kind: str
    event: str
    actor: str
    moves: tuple[tuple[str, str], ...]
    expect_owner: str | None = None
    expect_token: int | None = None
    lease_change: LeaseChange = LeaseChange.KEEP
    new_owner: str | None = None
    lease_ttl: timedelta | None = None
    bump_attempt: bool = False
    bump_reclaims: bool = False
    reason: str | None = None
    holds: bool = False
    run_after: timedelta | None = None
    error: dict[str, Any] | None = None
    # what a fire by id never changes, as class attributes: a store reads them as it reads
    # a TransitionWrite's, without a missed lookup per fire
    timer: ClassVar[TimerMode] = TimerMode.KEEP
    definition: ClassVar[None] = None
    memory: ClassVar[None] = None
    restart: ClassVar[bool] = False

    def history_owner(self) -> str | None:
        """Whose lease the history row records: the new owner of a lease taken, else the
        holder where the branch requires holding it (:meth:`TransitionWrite.history_owner`)."""
        if self.lease_change is LeaseChange.ACQUIRE:
            return self.new_owner
        return self.expect_owner if self.holds else None

    def injective(self) -> bool:
        """Whether each target has one source (the source is then known from the target)."""
        targets = [t for _, t in self.moves]
        return len(set(targets)) == len(targets)

    def target_for(self, row: Snapshot) -> str | None:
        """The state this write moves ``row`` to, or ``None`` if the row does not qualify
        (deleted, another kind, not in a source, or not held by the caller)."""
        if row.deleted or row.kind != self.kind:
            return None
        if self.expect_token is not None and (
            row.lease_token != self.expect_token or row.lease_owner != self.expect_owner
        ):
            return None
        state = row.state
        for source, target in self.moves:  # a plain loop: this runs on every fire by id
            if source == state:
                return target
        return None


def check_id_write(write: object) -> IdWrite:
    """Every field of an :class:`IdWrite` a store binds, checked up front (``InvalidArgument``,
    ``InvalidData`` for a non-JSON error)."""
    if not isinstance(write, IdWrite):
        raise InvalidArgument(f"apply_by_id takes an IdWrite, not {type(write).__name__}")
    check_id("entity id", write.entity_id)
    for name in ("kind", "event", "actor"):
        check_id(name, getattr(write, name))
    if not isinstance(write.moves, tuple) or not write.moves:
        raise InvalidArgument("IdWrite.moves must be a non-empty tuple of (source, target) pairs")
    for pair in write.moves:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument("IdWrite.moves must be a non-empty tuple of (source, target) pairs")
        check_id("source", pair[0])
        check_id("target", pair[1])
    if len({s for s, _ in write.moves}) != len(write.moves):
        raise InvalidArgument("IdWrite.moves names a source twice")
    for name in ("expect_owner", "new_owner"):
        check_optional_id(name, getattr(write, name))
    if (write.expect_token is None) is not (write.expect_owner is None):
        raise InvalidArgument("IdWrite: expect_owner and expect_token go together")
    if write.expect_token is not None:
        check_int("expect_token", write.expect_token, high=MAX_INT64)
    if not isinstance(write.lease_change, LeaseChange):
        raise InvalidArgument(f"IdWrite.lease_change must be a LeaseChange, not {write.lease_change!r}")
    for name in ("bump_attempt", "bump_reclaims", "holds"):
        if not isinstance(getattr(write, name), bool):
            raise InvalidArgument(f"IdWrite.{name} must be True or False")
    if write.reason is not None:
        check_free_text("reason", write.reason)
    check_optional_duration("lease_ttl", write.lease_ttl)
    if write.run_after is not None:
        check_run_after(write.run_after)
        if not isinstance(write.run_after, timedelta):
            raise InvalidArgument(f"a transition's run_after is a delay (timedelta), not {write.run_after!r}")
    if write.error is not None:
        if not isinstance(write.error, dict):
            raise InvalidArgument("a transition's error is a JSON object")
        check_json(write.error, entity_id=write.entity_id)
    return write


__all__ = ["IdWrite", "check_id_write"]
