"""Many transitions in one transaction (``apply_many``), each fenced by its own guards.

Every write is the store's own guarded ``apply`` (its version, token and conditions
re-checked in its statement), run one after another inside one transaction, so a batch
of outcomes costs one commit instead of one per write.  A write the store refuses
(``StaleVersion``, ``LeaseLost``, ...) is answered in its place and the others go on: a
refused compare-and-set changes no row, so it leaves the transaction usable.  On SQLite
each write runs in a savepoint of the batch's ``BEGIN IMMEDIATE`` (``SqliteWrite``); on
PostgreSQL a batch holding a write with an idempotency key (which may break a unique key,
failing the whole transaction) is applied write by write instead.  If the transaction
itself fails (a dropped connection, an unexpected integrity error), nothing of it is
kept and each write is applied again on its own, so every write still gets its answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fsm.errors import ConditionFailed, Fenced, FsmError, IdempotencyKeyReused, StaleVersion, UnknownEntity
from fsm.limits import check_transition_writes
from fsm.records import HistoryRecord, Snapshot, TransitionWrite
from stores.sql.core import SqlCore, SqliteWrite

log = logging.getLogger("fsm.store")

Applied = tuple[Snapshot, HistoryRecord] | FsmError


REFUSALS = (Fenced, StaleVersion, UnknownEntity, ConditionFailed, IdempotencyKeyReused)
"""What a guarded write answers without failing a statement (its ``WHERE`` matched no row,
or a savepoint kept the reused key's failure to itself): the transaction goes on."""


class _Undone(Exception):
    """A statement of the batch failed: its transaction cannot commit."""


class BatchOps(SqlCore):
    """``apply_many`` of :class:`stores.sql.SqlStore`."""

    def apply_many(self, writes: Sequence[TransitionWrite]) -> list[Applied]:
        """See :meth:`stores.Store.apply_many`."""
        return self.apply_many_checked(check_transition_writes(writes))

    def apply_many_checked(self, writes: Sequence[TransitionWrite]) -> list[Applied]:
        """:meth:`apply_many` of writes already checked (see ``stores.base.unchecked_apply``)."""
        if not writes:
            return []
        apply = self.apply_checked  # type: ignore[attr-defined]
        results: list[Applied] = []

        def one(write: TransitionWrite) -> Applied:
            try:
                applied: tuple[Snapshot, HistoryRecord] = apply(write)
                return applied
            except FsmError as err:
                return err

        slot = self._conns.slot()
        try:
            if self._sqlite:
                with SqliteWrite(slot, "fsm_apply_many"):
                    results = [one(w) for w in writes]
            else:
                if any(w.idempotency_key is not None for w in writes):
                    # a reused key breaks a unique key, which fails the statement and with it
                    # PostgreSQL's transaction before the refusal can be diagnosed: apply
                    # such a batch write by write (the worker's outcomes carry no keys)
                    return [one(w) for w in writes]
                with slot.conn.transaction():
                    results = [one(w) for w in writes]
                    if any(isinstance(r, FsmError) and not isinstance(r, REFUSALS) for r in results):
                        raise _Undone  # a statement failed (not a refusal): the transaction cannot commit
        except Exception as err:  # the transaction is undone: every write again, on its own
            if isinstance(err, (FsmError, _Undone, *self._errors)):
                log.info("batch of %d writes undone (%s); applying them one by one", len(writes), err)
                return [one(w) for w in writes]
            raise
        return results


__all__ = ["REFUSALS", "Applied", "BatchOps"]
