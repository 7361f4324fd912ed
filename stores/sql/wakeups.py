"""Wake-ups of the SQL store: ``subscribe_work`` and ``notify_work`` (see
:mod:`stores.notices` and :mod:`stores.sql.notify`).

On PostgreSQL a write that makes work claimable carries its ``NOTIFY`` (in the statement
for ``create`` and ``create_many``, a statement of its own after ``release_lease``), and
subscribers hear it through the process's one :class:`~stores.sql.notify.Listener`.  On
SQLite the store calls this process's subscribers after the commit.

``next_due`` (:class:`stores.base.DueTimes`) tells a drained worker when the next row
waiting out its backoff becomes due: one indexed lookup per state on the claim index
(``kind, state, run_after``), the first row after now, so it costs the same whatever
the backlog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from fsm.errors import InvalidArgument
from fsm.limits import check_id, check_timers
from stores.notices import Callback, LocalNotices, channel, local_notices
from stores.sql.core import SqlCore
from stores.sql.notify import listener_for
from stores.sql.schema import decode_time

MAX_DUE_STATES = 32
"""The most states one ``next_due`` looks at (a lifecycle's claimable states are a few)."""


class WakeOps(SqlCore):
    """``subscribe_work`` and ``notify_work`` of :class:`stores.sql.SqlStore`."""

    table_prefix: str
    engine: Any

    def _channel(self, kind: str) -> str:
        return channel(self.table_prefix, kind)

    def _local(self) -> LocalNotices:
        found: LocalNotices | None = getattr(self, "_local_notices", None)
        if found is None:
            url = self.engine.url
            database = url.database or ""
            # an in-memory database is this store's alone; a file is shared by every store on it
            key = f"{url.drivername}:{database}" if database not in ("", ":memory:") else f"memory:{id(self)}"
            found = self._local_notices = local_notices(key)
        return found

    def _conninfo(self) -> str:
        return str(self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False))

    def subscribe_work(self, kind: str, callback: Callback) -> Callable[[], None]:
        """See :meth:`stores.base.WorkNotices.subscribe_work`."""
        check_id("kind", kind)
        if self._sqlite:
            return self._local().subscribe(self._channel(kind), callback)
        return listener_for(self._conninfo()).subscribe(self._channel(kind), callback)

    def notify_work(self, kind: str) -> None:
        """See :meth:`stores.base.WorkNotices.notify_work`."""
        check_id("kind", kind)
        if self._sqlite:
            self._local().notify(self._channel(kind))
        else:
            self._run("SELECT pg_notify(%(ntf)s, '')", {"ntf": self._channel(kind)})

    def next_due(self, kind: str, states: Sequence[str]) -> float | None:
        """See :meth:`stores.base.DueTimes.next_due`."""
        check_id("kind", kind)
        if not isinstance(states, list | tuple) or not 1 <= len(states) <= MAX_DUE_STATES:
            raise InvalidArgument(f"states must be a list of 1 to {MAX_DUE_STATES} state names, not {states!r}")
        for state in states:
            check_id("state", state)
        lay, f, sql = self._sql.L, self._f, self._sql
        due = lay.ref("run_after", "e")
        live = f"{lay.ref('kind', 'e')} = {f.p('kind')} AND NOT {lay.ref('deleted', 'e')}"
        # one ordered range scan per state, stopping at the first row due after now
        firsts = " UNION ALL ".join(
            f"SELECT * FROM (SELECT {due} AS due FROM {sql._indexed('claim')} WHERE {live} "
            f"AND {lay.ref('state', 'e')} = {f.p(f's{i}')} AND {due} > {f.now} ORDER BY {due} LIMIT 1) AS s{i}"
            for i in range(len(states))
        )
        params: dict[str, Any] = {"kind": kind} | {f"s{i}": state for i, state in enumerate(states)}
        now = self._now()
        if now is not None:
            params["now"] = f.time(now)
        rows = self._run(f"SELECT MIN(d.due), {f.now} FROM ({firsts}) AS d", params)
        if not rows or rows[0][0] is None:
            return None
        first: datetime = decode_time(rows[0][0])
        at: datetime = now if now is not None else decode_time(rows[0][1])
        return max(0.0, (first - at).total_seconds())

    def next_timer(self, kind: str, timers: Sequence[tuple[str, timedelta]]) -> float | None:
        """See :meth:`stores.base.TimerTimes.next_timer`."""
        pairs = check_timers(kind, timers)
        lay, f, sql = self._sql.L, self._f, self._sql
        since = lay.ref("timer_since", "e")
        live = f"{lay.ref('kind', 'e')} = {f.p('kind')} AND NOT {lay.ref('deleted', 'e')}"
        # per timer: the first clock in its state that has not run out yet (one range of the
        # timer index), plus the delay; due timers are the reaper's rules' business
        firsts = " UNION ALL ".join(
            f"SELECT * FROM (SELECT {f.col_plus(since, f'a{i}')} AS due FROM {sql._indexed('timer')} WHERE {live} "
            f"AND {lay.ref('state', 'e')} = {f.p(f's{i}')} AND {since} > {f.now_minus(f'c{i}')} "
            f"ORDER BY {since} LIMIT 1) AS s{i}"
            for i in range(len(pairs))
        )
        params: dict[str, Any] = {"kind": kind}
        now = self._now()
        if now is not None:
            params["now"] = f.time(now)
        for i, (state, after) in enumerate(pairs):
            params[f"s{i}"] = state
            params[f"a{i}"] = f.interval(after)
            params[f"c{i}"] = f.offset(now, -after) if self._sqlite else after
        rows = self._run(f"SELECT MIN(d.due), {f.now} FROM ({firsts}) AS d", params)
        if not rows or rows[0][0] is None:
            return None
        first: datetime = decode_time(rows[0][0])
        at: datetime = now if now is not None else decode_time(rows[0][1])
        return max(0.0, (first - at).total_seconds())

    def _with_notify(self, sql: str) -> str:
        """PostgreSQL: ``sql`` (an ``INSERT .. RETURNING``) sending ``NOTIFY`` on
        ``%(ntf)s`` in the same statement, so only its commit wakes anybody."""
        return f"WITH i AS ({sql}) SELECT i.* FROM i, (SELECT pg_notify(%(ntf)s, '')) AS n"

    def _created_notices(self, kinds: set[str], *, sent: str | None) -> None:
        """After a committed create: wake the workers of each of ``kinds`` (SQLite: this
        process's; PostgreSQL: ``NOTIFY``, but for ``sent``, whose statement carried it)."""
        for kind in kinds:
            if self._sqlite:
                self._local().notify(self._channel(kind))
            elif kind != sent:
                self.notify_work(kind)


__all__ = ["WakeOps"]
