"""Every SQL text the store runs, written once per dialect and layout.

The hot path (get, apply, renew) runs on the DBAPI connection (see :mod:`stores.sql.connections`),
so its statements are plain strings with the driver's named parameters, built here at
first use and cached per *shape* (lease change, conditions, data given...), never per
call.  One renderer of conditions serves the single write, the reaper's candidate query
and its batch write, so they cannot disagree on what "stale" means.

Time: ``NOW`` is the database server's ``statement_timestamp()`` on PostgreSQL (the same
instant in every part of one statement), or a bound parameter when the store has a clock
(tests) and always on SQLite (an embedded database: the Python process *is* the server's
machine, and SQLite's own clock has only millisecond text precision).  Interval arithmetic
is SQL on PostgreSQL; on SQLite ``now +/- interval`` is computed in Python and bound, and
``column + interval`` calls ``fsm_ts_add`` (registered on each connection).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from fsm.records import (
    COUNTERS,
    Condition,
    CounterAtLeast,
    CounterBelow,
    HeldBy,
    LeaseChange,
    LeaseStale,
    NewerSibling,
    NoLiveLease,
    Owned,
    TimerDue,
    TimerMode,
    Unclaimed,
)
from stores.sql.binding import Layout
from stores.sql.schema import (
    BORN,
    ENTITY_COLUMNS,
    HISTORY_COLUMNS,
    HISTORY_MOVE_COLUMNS,
    decode_time,
    encode_sqlite_time,
)

ConditionShape = tuple[tuple[type, str | None], ...]

LEAN_COLUMNS = ("version", "lease_owner", "lease_token", "lease_expires_at", "attempt", "reclaims", "run_after")
"""What a transition changes besides state and times (all columns of a lean ``RETURNING``)."""


def condition_shape(require: Sequence[Condition]) -> ConditionShape:
    """What the SQL of ``require`` depends on (types and counters, not the limits)."""
    return tuple((c.__class__, getattr(c, "counter", None)) for c in require)


class Flavor:
    """The dialect-specific bits: parameter syntax, time arithmetic, id lists."""

    name = ""
    least = "LEAST"
    greatest = "GREATEST"
    true = "TRUE"

    def __init__(self, db_clock: bool) -> None:
        self.db_clock = db_clock

    def p(self, name: str) -> str:
        raise NotImplementedError

    @property
    def now(self) -> str:
        raise NotImplementedError

    def now_plus(self, name: str) -> str:
        raise NotImplementedError

    def now_minus(self, name: str) -> str:
        raise NotImplementedError

    def col_plus(self, expr: str, name: str) -> str:
        raise NotImplementedError

    def same(self, expr: str, name: str) -> str:
        """Null-safe equality of ``expr`` and a parameter."""
        raise NotImplementedError

    def json(self, name: str) -> str:
        return self.p(name)

    def in_ids(self, expr: str, name: str) -> str:
        raise NotImplementedError

    def is_object(self, expr: str) -> str:
        """SQL true when the data column holds a JSON object (a row the store can read)."""
        raise NotImplementedError

    # parameter values ---------------------------------------------------------------------

    def time(self, value: datetime) -> Any:
        return value

    def offset(self, now: datetime | None, delta: timedelta) -> Any:
        """The value of a ``now_plus`` parameter (``now_minus`` takes it negated)."""
        return delta

    def interval(self, delta: timedelta) -> Any:
        """The value of a ``col_plus`` parameter."""
        return delta

    def ids(self, ids: Sequence[str]) -> Any:
        return list(ids)


class SqliteFlavor(Flavor):
    name = "sqlite"
    least = "min"
    greatest = "max"
    true = "1"

    def p(self, name: str) -> str:
        return f":{name}"

    @property
    def now(self) -> str:
        return ":now"

    def now_plus(self, name: str) -> str:
        return f":{name}"

    def now_minus(self, name: str) -> str:
        return f":{name}"

    def col_plus(self, expr: str, name: str) -> str:
        return f"fsm_ts_add({expr}, :{name})"

    def same(self, expr: str, name: str) -> str:
        return f"{expr} IS :{name}"

    def in_ids(self, expr: str, name: str) -> str:
        return f"{expr} IN (SELECT value FROM json_each(:{name}))"

    def is_object(self, expr: str) -> str:
        # json_type() raises on malformed JSON; CASE evaluates it only when valid
        return f"CASE WHEN json_valid({expr}) THEN json_type({expr}) END = 'object'"

    def time(self, value: datetime) -> Any:
        return encode_sqlite_time(value)

    def offset(self, now: datetime | None, delta: timedelta) -> Any:
        assert now is not None  # SQLite always has a Python-side now
        return encode_sqlite_time(now + delta)

    def interval(self, delta: timedelta) -> Any:
        return delta // timedelta(microseconds=1)

    def ids(self, ids: Sequence[str]) -> Any:
        return json.dumps(list(ids))


class PostgresFlavor(Flavor):
    name = "postgresql"

    def p(self, name: str) -> str:
        return f"%({name})s"

    @property
    def now(self) -> str:
        return "statement_timestamp()" if self.db_clock else "CAST(%(now)s AS timestamptz)"

    def now_plus(self, name: str) -> str:
        return f"({self.now} + %({name})s)"

    def now_minus(self, name: str) -> str:
        return f"({self.now} - %({name})s)"

    def col_plus(self, expr: str, name: str) -> str:
        return f"({expr} + %({name})s)"

    def same(self, expr: str, name: str) -> str:
        return f"{expr} IS NOT DISTINCT FROM %({name})s"

    def json(self, name: str) -> str:
        return f"CAST(%({name})s AS jsonb)"

    def in_ids(self, expr: str, name: str) -> str:
        return f"{expr} = ANY(%({name})s)"

    def is_object(self, expr: str) -> str:
        return f"jsonb_typeof({expr}) = 'object'"


def sqlite_ts_add(value: str | None, micros: int | None) -> str | None:
    """``fsm_ts_add(ts, us)``: a stored SQLite timestamp plus ``us`` microseconds."""
    if value is None or micros is None:
        return None
    return encode_sqlite_time(decode_time(value) + timedelta(microseconds=micros))


def sqlite_ts_norm(value: object) -> str | None:
    """``fsm_ts(x)``: an application's timestamp text (any ISO-8601 spelling: ``T``, ``Z``,
    an offset, milliseconds) as the canonical UTC text the store compares, or NULL when it
    is not a timestamp (such a row then never looks stale, and reads as MalformedRow)."""
    if not isinstance(value, str):  # an epoch number, a blob: not a timestamp this store reads
        return None
    try:
        return encode_sqlite_time(decode_time(value))
    except Exception:  # a SQL function must never raise: SQLite would fail the whole statement
        return None


class Statements:
    """The SQL of one store: fixed statements as attributes, shaped ones built on demand."""

    def __init__(self, layout: Layout, flavor: Flavor) -> None:
        self.L = layout
        self.f = flavor
        self.pg = flavor.name == "postgresql"
        # lean writes build the new snapshot from the caller's: only on the library's own
        # table, where nothing but the store changes a row without moving its version
        self.lean_ok = layout.binding is None
        lay, f = layout, flavor
        self.E, self.H = lay.entities, lay.history
        c = lay.col
        self.cols_e = self.cols("e")
        # RETURNING: SQLite only takes unqualified names there, PostgreSQL needs the alias
        # when the statement joins the table to itself.
        self.ret = self.cols("e" if self.pg else "")
        self.live = f"e.{c['id']} = {f.p('id')} AND NOT e.{c['deleted']}"
        # writes other than soft_delete also require a readable row: a malformed one is
        # refused (and diagnosed as MalformedRow) instead of moved and then unreadable
        self.readable = f"{self.live} AND {f.is_object('e.' + c['data'])}"
        self.get = f"SELECT {self.cols_e} FROM {self.E} AS e WHERE e.{c['id']} = {f.p('id')}"
        self.diagnose = f"SELECT {self.cols_e}, {f.now} FROM {self.E} AS e WHERE e.{c['id']} = {f.p('id')}"
        self.now_query = f"SELECT {f.now}"
        self.exists = f"SELECT 1 FROM {self.E} AS e WHERE e.{c['id']} = {f.p('id')}"
        hcols = ", ".join(HISTORY_COLUMNS)
        # PostgreSQL: every history insert also writes ``born``, the entity's ``created_at``
        # from the guarded update's RETURNING (the partition key: stores.sql.partitions)
        born = f", {BORN}" if self.pg else ""
        self.hist_cols = hcols + born
        self.hist_move_cols = ", ".join(HISTORY_MOVE_COLUMNS) + born  # a reaper's batch: no owner, no error
        self.history = f"SELECT {hcols} FROM {self.H} WHERE entity_id = {f.p('id')} ORDER BY seq"
        self.find = f"SELECT {hcols} FROM {self.H} WHERE entity_id = {f.p('id')} AND idempotency_key = {f.p('key')}"
        self.sibling = (
            f"SELECT e.{c['deleted']}, {self.condition(NewerSibling(), 'e', 0)} FROM {self.E} AS e "
            f"WHERE e.{c['id']} = {f.p('id')}"
        )
        self.soft_delete = self._update(
            f"{c['deleted']} = {f.true}, {c['updated_at']} = {f.now}", self.live, returning=self.ret
        )
        self.release = self._update(
            f"{c['lease_owner']} = NULL, {c['lease_expires_at']} = NULL",
            f"{self.readable} AND e.{c['lease_owner']} = {f.p('owner')} AND e.{c['lease_token']} = {f.p('token')}",
            returning=self.ret,
        )
        self._shapes: dict[Any, Any] = {}

    # -- pieces ------------------------------------------------------------------------------

    def cols(self, alias: str) -> str:
        """The entity columns in Snapshot order, read through the layout."""
        return ", ".join(f"{self.L.ref(n, alias)} AS {n}" for n in ENTITY_COLUMNS)

    def _update(self, sets: str, where: str, *, returning: str) -> str:
        return f"UPDATE {self.E} AS e SET {sets} WHERE {where} RETURNING {returning}"

    def condition(self, cond: Condition, a: str, i: int) -> str:
        """``cond`` as SQL on the row aliased ``a``; its parameters are suffixed ``i``."""
        lay, f = self.L, self.f
        if isinstance(cond, LeaseStale):
            exp = lay.ref("lease_expires_at", a)
            return f"({exp} < {f.now} OR ({exp} IS NULL AND {self.idle_since(a, i, 'stale')}))"
        if isinstance(cond, NewerSibling):
            s = f"s{i}"
            ca, cs = lay.ref("created_at", a), lay.ref("created_at", s)
            return (
                f"EXISTS (SELECT 1 FROM {self.E} AS {s} WHERE {lay.ref('kind', s)} = {lay.ref('kind', a)}"
                f" AND {lay.ref('concurrency_key', s)} = {lay.ref('concurrency_key', a)}"
                f" AND {lay.ref('state', s)} = {lay.ref('state', a)} AND NOT {lay.ref('deleted', s)}"
                f" AND {cs} >= {ca} AND ({cs} > {ca} OR {lay.ref('id', s)} > {lay.ref('id', a)}))"
            )
        if isinstance(cond, Owned):
            return f"{lay.ref('lease_owner', a)} IS {'NOT NULL' if cond.held else 'NULL'}"
        if isinstance(cond, NoLiveLease):
            return f"({lay.ref('lease_owner', a)} IS NULL OR {lay.ref('lease_expires_at', a)} < {f.now})"
        if isinstance(cond, Unclaimed):
            return f"({lay.ref('lease_owner', a)} IS NULL AND {self.idle_since(a, i, 'wait')})"
        if isinstance(cond, TimerDue):
            return f"{lay.ref('timer_since', a)} <= {f.now_minus(f'tmr{i}')}"
        if isinstance(cond, HeldBy):
            h, c = f"h{i}", lay.col
            return (
                f"EXISTS (SELECT 1 FROM {self.E} AS {h} WHERE {h}.{c['id']} = {f.p(f'hid{i}')} "
                f"AND NOT {h}.{c['deleted']} AND {h}.{c['lease_owner']} = {f.p(f'hown{i}')} "
                f"AND {h}.{c['lease_token']} = {f.p(f'htok{i}')} AND {h}.{c['lease_expires_at']} >= {f.now})"
            )
        if isinstance(cond, CounterBelow | CounterAtLeast):
            if cond.counter not in COUNTERS:
                raise ValueError(f"unknown counter {cond.counter!r}; counters are {', '.join(COUNTERS)}")
            op = "<" if isinstance(cond, CounterBelow) else ">="
            return f"{lay.ref(cond.counter, a)} {op} {f.p(f'lim{i}')}"
        raise TypeError(f"unknown condition {cond!r}")

    def conditions(self, require: Sequence[Condition], a: str) -> str:
        return "".join(f" AND {self.condition(c, a, i)}" for i, c in enumerate(require))

    def condition_params(self, params: dict[str, Any], require: Sequence[Condition], now: datetime | None) -> None:
        f = self.f
        for i, c in enumerate(require):
            if isinstance(c, LeaseStale):
                params[f"stale{i}"] = f.offset(now, -c.stale_after) if f.name == "sqlite" else c.stale_after
            elif isinstance(c, Unclaimed):
                params[f"wait{i}"] = f.offset(now, -c.max_wait) if f.name == "sqlite" else c.max_wait
            elif isinstance(c, TimerDue):
                params[f"tmr{i}"] = f.offset(now, -c.after) if f.name == "sqlite" else c.after
            elif isinstance(c, HeldBy):
                params[f"hid{i}"], params[f"hown{i}"], params[f"htok{i}"] = c.entity_id, c.owner, c.token
            elif isinstance(c, CounterBelow | CounterAtLeast):
                params[f"lim{i}"] = c.limit

    def _move_sets(
        self,
        change: LeaseChange,
        has_ttl: bool,
        bump_attempt: bool,
        bump_reclaims: bool,
        new_data: bool,
        has_due: bool = False,
        timer: TimerMode = TimerMode.KEEP,
        definition: bool = False,
        restart: bool = False,
    ) -> str:
        """SET clause of a transition: new state, version + 1, lease change, counters, times,
        the timer clock when the branch starts or stops it, and (``definition``) the
        definition version the write records (parameter ``defn``); ``restart``: the counters
        back to 0 (a region's row entering its parallel state again)."""
        c, f = self.L.col, self.f
        sets = [f"{c['state']} = {f.p('target')}", f"{c['version']} = e.{c['version']} + 1"]
        if change is LeaseChange.ACQUIRE:
            sets += [
                f"{c['lease_owner']} = {f.p('new_owner')}",
                f"{c['lease_token']} = e.{c['lease_token']} + 1",
                f"{c['lease_expires_at']} = {f.now_plus('ttl') if has_ttl else 'NULL'}",
            ]
        elif change is LeaseChange.CLEAR:
            sets += [f"{c['lease_owner']} = NULL", f"{c['lease_expires_at']} = NULL"]
        sets += [f"{c['state_entered_at']} = {f.now}", f"{c['updated_at']} = {f.now}"]
        sets += self.timer_sets(timer)
        if restart:
            sets += [f"{c['attempt']} = 0", f"{c['reclaims']} = 0"]
        elif bump_attempt:
            sets += [f"{c['attempt']} = e.{c['attempt']} + 1", f"{c['reclaims']} = 0"]
        elif bump_reclaims:
            sets.append(f"{c['reclaims']} = e.{c['reclaims']} + 1")
        if new_data:
            sets.append(f"{c['data']} = {f.json('data')}")
        if has_due:  # a retry: due once its backoff has passed
            sets.append(f"{c['run_after']} = {f.now_plus('due')}")
        else:
            sets.append(self.due_now())
        if definition:
            sets.append(self.definition_set())
        if self.L.status_col is not None:
            sets.append(f"{self.L.status_col} = {f.p('status')}")
        return ", ".join(sets)

    def definition_param(self) -> str:
        """The ``defn`` parameter (a definition version) as an integer expression."""
        return f"CAST({self.f.p('defn')} AS INTEGER)" if self.pg else self.f.p("defn")

    def definition_set(self) -> str:
        """The SET item recording the definition version ``defn`` on the row."""
        return f"{self.L.col['definition']} = {self.definition_param()}"

    def definition_pick(self, a: str) -> str:
        """A claim's filter (`` AND ...``) on the row aliased ``a``: its definition version
        unknown or at most the claimer's ``defn``."""
        col = self.L.ref("definition", a)
        return f" AND ({col} IS NULL OR {col} <= {self.definition_param()})"

    def budget_since(self, entered: str, due: str) -> str:
        """When a state's renewal budget starts counting: entering the state, or, for an
        entity parked in it (a durable sleep or wait), the due time it wakes at (SQL of the
        two column expressions; a NULL due time counts as the entry)."""
        return f"{self.f.greatest}({entered}, COALESCE({due}, {entered}))"

    def idle_since(self, a: str, i: int, name: str) -> str:
        """``updated_at`` and, for a parked entity, its due time both before ``now -
        {name}{i}``: a parked entity is neither dead nor waiting for a worker until due."""
        lay, f = self.L, self.f
        # the column itself, not its fallback: a row an application inserted into a bound
        # table (no due time of ours) is idle by its own updated_at alone
        due = f"{a}.{lay.col['run_after']}" if a else lay.col["run_after"]
        cut = f.now_minus(f"{name}{i}")
        return f"{lay.ref('updated_at', a)} < {cut} AND ({due} IS NULL OR {due} < {cut})"

    def due_now(self) -> str:
        """The SET item of a transition that gives no due time: a due time still ahead (an
        entity parked by a durable wait, moved on by someone else) becomes now, so the entity
        is not left unclaimable until its old wake time; a due time passed is kept (the
        entity keeps its place in the line)."""
        c, f = self.L.col, self.f
        due = f"e.{c['run_after']}"
        return f"{c['run_after']} = CASE WHEN {due} > {f.now} THEN {f.now} ELSE {due} END"

    def timer_sets(self, timer: TimerMode) -> list[str]:
        """The SET item of the timer clock: none when the write keeps it."""
        if timer is TimerMode.KEEP:
            return []
        col = self.L.col["timer_since"]
        return [f"{col} = {self.f.now if timer is TimerMode.ARM else 'NULL'}"]

    # -- shaped statements -----------------------------------------------------------------------

    def apply(
        self,
        change: LeaseChange,
        has_ttl: bool,
        token_check: bool,
        shape: ConditionShape,
        require: Sequence[Condition],
        bump_attempt: bool,
        bump_reclaims: bool,
        new_data: bool,
        lean: bool = False,
        blind: bool = False,
        has_due: bool = False,
        timer: TimerMode = TimerMode.KEEP,
        definition: bool = False,
        memory: bool = False,
        restart: bool = False,
    ) -> tuple[str, ...]:
        """One transition: the guarded ``UPDATE ... RETURNING`` and the history row.

        PostgreSQL: a single statement (the update, then the history row from its
        ``RETURNING``: one round trip).  SQLite: the update, then the history row's
        ``INSERT ... VALUES``, both inside ``BEGIN IMMEDIATE``.  The history row's ``source``
        is the ``source`` parameter: the version compare-and-set proves the row was in it.
        ``lean`` (the caller holds the snapshot it judged, owned tables only) returns only
        what the write changes (:data:`LEAN_COLUMNS`), plus the statement's ``now`` on
        PostgreSQL; otherwise every entity column.  ``blind`` (SQLite, with ``lean``) returns
        nothing: the update also requires the lease holder and token the caller's snapshot
        shows (``bowner``, ``btoken``), so the store knows every column it writes.
        ``definition``: the write also records the definition version ``defn``; ``memory``:
        the history memory ``memory`` (JSON text)."""
        key = (
            "apply",
            change,
            has_ttl,
            token_check,
            shape,
            bump_attempt,
            bump_reclaims,
            new_data,
            lean,
            blind,
            has_due,
            timer,
            definition,
            memory,
            restart,
        )
        found: tuple[str, ...] | None = self._shapes.get(key)
        if found is not None:
            return found
        c, f = self.L.col, self.f
        # SQLite decodes the new row before COMMIT instead (cheaper than a JSON check in SQL);
        # a lean write returns no data: its caller decoded that row at this version
        guard = f"{self.readable if self.pg else self.live} AND e.{c['version']} = {f.p('version')}"
        if self.L.status_col is not None:
            # the application writes its status column without our version: re-check the state
            # too, so a status the application changed since our read is never overwritten
            guard += f" AND {self.L.ref('state', 'e')} = {f.p('source')}"
        if token_check:
            guard += f" AND {f.same('e.' + c['lease_owner'], 'owner')} AND e.{c['lease_token']} = {f.p('token')}"
        if blind:
            guard += f" AND e.{c['lease_token']} = {f.p('btoken')} AND {f.same('e.' + c['lease_owner'], 'bowner')}"
        guard += self.conditions(require, "e")
        sets = self._move_sets(
            change, has_ttl, bump_attempt, bump_reclaims, new_data, has_due, timer, definition, restart
        )
        if memory:
            sets += f", {c['memory']} = {f.json('memory')}"
        hist = f"INSERT INTO {self.H} ({self.hist_cols})"
        common = f"{f.p('event')}, {f.p('source')}, {f.p('target')}, {f.p('actor')}"
        lean_cols = ", ".join(f"e.{c[n]} AS {n}" if self.pg else c[n] for n in LEAN_COLUMNS)
        returning = lean_cols if lean else self.ret
        if self.pg:
            out = "*"
            if lean:  # the history row's ``born``, not returned to the caller
                returning += f", {self.L.ref('created_at', 'e')} AS created_at"
                out = ", ".join(f"u.{n}" for n in LEAN_COLUMNS) + ", u.fsm_now"
            found = (
                f"WITH u AS (UPDATE {self.E} AS e SET {sets} WHERE {guard} RETURNING {returning}, {f.now} AS fsm_now), "
                f"h AS ({hist} SELECT {f.p('id')}, u.version, {common}, u.lease_token, {f.p('reason')}, {f.p('key')}, "
                f"u.fsm_now, {f.json('patch')}, {f.p('howner')}, {f.json('error')}, u.created_at FROM u) "
                f"SELECT {out} FROM u",
            )
        else:
            update = self._update(sets, guard, returning=returning)
            found = (
                update.partition(" RETURNING ")[0] if blind else update,
                f"{hist} VALUES ({f.p('id')}, {f.p('seq')}, {common}, {f.p('htoken')}, {f.p('reason')}, {f.p('key')}, "
                f"{f.now}, {f.p('patch')}, {f.p('howner')}, {f.p('error')})",
            )
        self._shapes[key] = found
        return found

    def create(self, extra: Sequence[str], due: str | None = None, arm: bool = False, unique: bool = False) -> str:
        """Insert at version 0, or nothing when the id exists (``ON CONFLICT DO NOTHING``).

        ``due``: how the due time is given: ``None`` (now), ``"at"`` (the ``due``
        parameter, a time) or ``"in"`` (now plus the ``due`` parameter)."""
        key = ("create", tuple(extra), due, arm, unique)
        found: str | None = self._shapes.get(key)
        if found is not None:
            return found
        c, f = self.L.col, self.f
        names = ["id", "kind", "state", "version", "lease_token", "state_entered_at", "created_at", "updated_at"]
        names += ["deleted", "concurrency_key", "attempt", "reclaims", "data", "run_after"]
        values = [f.p("id"), f.p("kind"), f.p("state"), "0", "0", f.now, f.now, f.now, "FALSE", f.p("ck")]
        values += ["0", "0", f.json("data"), {None: f.now, "at": f.p("due"), "in": f.now_plus("due")}[due]]
        if arm:
            names.append("timer_since")
            values.append(f.now)
        cols = [c[n] for n in names]
        if self.L.status_col is not None:
            cols.append(self.L.status_col)
            values.append(f.p("status"))
        for i, name in enumerate(extra):
            cols.append(name)
            values.append(f.p(f"x{i}"))
        rows = f"VALUES ({', '.join(values)})"
        if unique:  # unique while active: no live entity of the kind and key outside a final state
            rows = f"SELECT {', '.join(values)} WHERE NOT EXISTS ({self.active_duplicate('1')})"
        found = (
            f"INSERT INTO {self.E} AS e ({', '.join(cols)}) {rows} "
            f"ON CONFLICT ({c['id']}) DO NOTHING RETURNING {self.cols('e' if self.pg else '')}"
        )
        self._shapes[key] = found
        return found

    def active_duplicate(self, what: str) -> str:
        """``SELECT {what}`` of the live entities of kind ``:kind`` and concurrency key
        ``:ck`` in a state that is not among ``:finals`` (the siblings index's prefix)."""
        lay, f = self.L, self.f
        # varchar, as the insert's select list takes them (PostgreSQL deduces one type a parameter)
        kind, key = (f"CAST({f.p(n)} AS VARCHAR)" for n in ("kind", "ck"))
        return (
            f"SELECT {what} FROM {self.E} AS u WHERE {lay.ref('kind', 'u')} = {kind} "
            f"AND {lay.ref('concurrency_key', 'u')} = {key} AND NOT {lay.ref('deleted', 'u')} "
            f"AND NOT ({f.in_ids(lay.ref('state', 'u'), 'finals')})"
        )

    def acquire(self, budget: bool) -> str:
        """Take a free or expired lease: token + 1, expiry capped by the state's budget."""
        key = ("acquire", budget)
        found: str | None = self._shapes.get(key)
        if found is None:
            c, f, lay = self.L.col, self.f, self.L
            exp = f"e.{c['lease_expires_at']}"
            expiry = f.now_plus("ttl")
            where = (
                f"{self.readable} AND e.{c['version']} = {f.p('version')} AND "
                f"(e.{c['lease_owner']} IS NULL OR {exp} IS NULL OR {exp} < {f.now})"
            )
            if budget:
                since = self.budget_since(lay.ref("state_entered_at", "e"), lay.ref("run_after", "e"))
                deadline = f.col_plus(since, "budget")
                expiry = f"{f.least}({expiry}, {deadline})"
                where += f" AND {deadline} > {f.now}"
            sets = (
                f"{c['lease_owner']} = {f.p('owner')}, {c['lease_token']} = e.{c['lease_token']} + 1, "
                f"{c['lease_expires_at']} = {expiry}"
            )
            found = self._shapes[key] = self._update(sets, where, returning=self.ret)
        return found

    def renew(self, budget: bool) -> str:
        """Extend a live lease, never shortening it, never past the state's budget."""
        key = ("renew", budget)
        found: str | None = self._shapes.get(key)
        if found is None:
            c, f, lay = self.L.col, self.f, self.L
            exp = f"e.{c['lease_expires_at']}"
            expiry = f.now_plus("ttl")
            where = (
                f"{self.readable} AND e.{c['lease_owner']} = {f.p('owner')} AND e.{c['lease_token']} = {f.p('token')} "
                f"AND {exp} >= {f.now}"
            )
            if budget:
                since = self.budget_since(lay.ref("state_entered_at", "e"), lay.ref("run_after", "e"))
                deadline = f.col_plus(since, "budget")
                expiry = f"{f.least}({expiry}, {deadline})"
                where += f" AND {deadline} > {f.now}"
            sets = f"{c['lease_expires_at']} = {f.greatest}({expiry}, {exp})"
            found = self._shapes[key] = self._update(sets, where, returning=self.ret)
        return found

    def candidates(self, shape: ConditionShape, require: Sequence[Condition], paged: bool) -> str:
        """Live rows of a kind and state meeting ``require``, by id, keyset-paged.

        A ``LeaseStale`` condition splits the query in two index range scans (expired
        leases; lease-less rows idle too long) joined by ``UNION ALL``, so the cost follows
        the stale rows, not the table.
        """
        key = ("candidates", shape, paged)
        found: str | None = self._shapes.get(key)
        if found is not None:
            return found
        lay, f = self.L, self.f
        base = (
            f"{lay.ref('kind', 'e')} = {f.p('kind')} AND {lay.ref('state', 'e')} = {f.p('state')} "
            f"AND NOT {lay.ref('deleted', 'e')}"
        )
        if paged:
            base += f" AND {lay.ref('id', 'e')} > {f.p('after')}"
        stale = next((i for i, c in enumerate(require) if isinstance(c, LeaseStale)), None)
        rest = "".join(f" AND {self.condition(c, 'e', i)}" for i, c in enumerate(require) if i != stale)
        order = f"ORDER BY id LIMIT {f.p('limit')}"
        if stale is None and any(isinstance(c, TimerDue) for c in require):
            # a due timer is a range of the timer index, up to now - after: the cost follows
            # the due rows, not every row waiting in the state
            found = f"SELECT {self.cols_e} FROM {self._indexed('timer')} WHERE {base}{rest} {order}"
        elif stale is None and any(isinstance(c, NewerSibling) for c in require):
            # only rows with a concurrency key can have a newer sibling: the siblings index
            # finds them, so the cost follows the keyed rows, not every running row
            source = self._indexed("siblings")
            keyed = f" AND {lay.ref('concurrency_key', 'e')} IS NOT NULL"
            found = f"SELECT {self.cols_e} FROM {source} WHERE {base}{keyed}{rest} {order}"
        elif stale is None:
            # counter conditions only: the lease index's (kind, state) prefix finds the rows
            source = self._indexed("lease")
            found = f"SELECT {self.cols_e} FROM {source} WHERE {base}{rest} {order}"
        else:
            source = self._indexed("lease")
            exp = lay.ref("lease_expires_at", "e")
            branches = [
                f"{exp} < {f.now}",
                f"{exp} IS NULL AND {self.idle_since('e', stale, 'stale')}",
            ]
            found = (
                "SELECT * FROM ("
                + " UNION ALL ".join(f"SELECT {self.cols_e} FROM {source} WHERE {base} AND {b}{rest}" for b in branches)
                + f") AS c {order}"
            )
        self._shapes[key] = found
        return found

    def _candidate_branches(self, require: Sequence[Condition], what: str, tail: str) -> list[str]:
        """``SELECT {what} ... {tail}`` per index range the candidates of ``require`` come
        from: two for a ``LeaseStale`` (expired leases; lease-less idle rows), one for a
        ``NewerSibling`` (the keyed rows) or counters only (the ``(kind, state)`` prefix)."""
        lay, f = self.L, self.f
        base = (
            f"{lay.ref('kind', 'e')} = {f.p('kind')} AND {lay.ref('state', 'e')} = {f.p('state')} "
            f"AND NOT {lay.ref('deleted', 'e')}"
        )
        stale = next((i for i, c in enumerate(require) if isinstance(c, LeaseStale)), None)
        rest = "".join(f" AND {self.condition(c, 'e', i)}" for i, c in enumerate(require) if i != stale)
        if stale is None and any(isinstance(c, TimerDue) for c in require):
            return [f"SELECT {what} FROM {self._indexed('timer')} WHERE {base}{rest}{tail}"]
        if stale is None and any(isinstance(c, NewerSibling) for c in require):
            keyed = f" AND {lay.ref('concurrency_key', 'e')} IS NOT NULL"
            return [f"SELECT {what} FROM {self._indexed('siblings')} WHERE {base}{keyed}{rest}{tail}"]
        if stale is None:
            return [f"SELECT {what} FROM {self._indexed('lease')} WHERE {base}{rest}{tail}"]
        exp = lay.ref("lease_expires_at", "e")
        branches = [
            f"{exp} < {f.now}",
            f"{exp} IS NULL AND {self.idle_since('e', stale, 'stale')}",
        ]
        return [f"SELECT {what} FROM {self._indexed('lease')} WHERE {base} AND {b}{rest}{tail}" for b in branches]

    def claim(
        self,
        change: LeaseChange,
        has_ttl: bool,
        shape: ConditionShape,
        require: Sequence[Condition],
        bumps: tuple[bool, bool],
        *,
        brief: bool = False,
        set_data: int = 0,
        hits: int | None = None,
        timer: TimerMode = TimerMode.KEEP,
    ) -> tuple[str, ...]:
        """The reaper's claim-and-move: up to ``limit`` candidates found *and* moved by one
        statement, so concurrent reapers divide the stale rows instead of each reading
        all of them.

        The candidates are read in index order (no ``ORDER BY``: a moved row leaves the
        range, so the next claim starts where the rows still are), each index range under
        its own ``LIMIT``, and only readable rows (a JSON object in ``data``) are claimed:
        the reaper finds the others through :meth:`candidates`, counts and skips them.
        PostgreSQL locks the claimed rows with ``FOR UPDATE SKIP LOCKED`` (a row another
        reaper holds is skipped, not waited for; READ COMMITTED re-checks every predicate
        on a row's newest version when it locks it), then updates them by primary key and
        inserts their history rows from the ``RETURNING``, in one statement.  SQLite (one
        writer under ``BEGIN IMMEDIATE``): ``UPDATE ... WHERE id IN (candidates) RETURNING``,
        then the history rows of the moved ids.

        ``set_data`` (PostgreSQL): the statement itself applies that many declared data
        changes (:meth:`set_items`, parameters ``dk0``, ``df0``, ``dv0``, ``dp0``, ``do0``...).
        ``brief``: return only what the history rows need (id, new version, new token, and
        PostgreSQL's ``now``) instead of every column; on SQLite also the text columns the
        write keeps (so a row that is not UTF-8 still fails the claim, as a full one does)
        and, when ``hits`` is not None, a ``hit`` flag: 1 where one of ``hits`` declared
        changes may apply (:meth:`items_hit`; ``hits=0``: every row), so only those rows'
        data is decoded.  PostgreSQL with ``hits=0`` (changes it cannot apply itself)
        returns every row's data."""
        key = ("claim", change, has_ttl, shape, bumps, brief, set_data, hits, timer)
        found: tuple[str, ...] | None = self._shapes.get(key)
        if found is not None:
            return found
        f, c = self.f, self.L.col
        readable = f" AND {f.is_object('e.' + c['data'])}"
        sets = self._move_sets(change, has_ttl, bumps[0], bumps[1], False, timer=timer)
        if set_data:
            assert self.pg, "SQLite applies declared data changes in Python"
            data = f"e.{c['data']}"
            for i in range(set_data):
                data = self.set_items(data, i)
            sets += f", {c['data']} = {data}"
        hist = f"INSERT INTO {self.H} ({self.hist_move_cols})"
        values = f"{f.p('event')}, {f.p('state')}, {f.p('target')}, {f.p('actor')}"
        limit = f" LIMIT {f.p('limit')}"
        if self.pg:
            lock = f"{limit} FOR UPDATE OF e SKIP LOCKED"
            branches = self._candidate_branches(require, f"e.{c['id']} AS id", readable + lock)
            picked = " UNION ALL ".join(f"SELECT id FROM ({b}) AS b{i}" for i, b in enumerate(branches))
            if brief:
                returning = ", ".join(
                    f"{self.L.ref(n, 'e')} AS {n}" for n in ("id", "version", "lease_token", "created_at")
                )
                out = "u.id, u.version, u.lease_token, u.fsm_now"
                if hits is not None:  # changes this statement cannot apply: every row's data
                    assert not hits, "PostgreSQL applies string-valued changes in the statement"
                    returning += f", {self.L.ref('data', 'e')} AS data"
                    out += ", u.data"
            else:
                returning, out = self.ret, "*"
            found = (
                f"WITH c AS MATERIALIZED (SELECT id FROM ({picked}) AS p{limit}), "
                # by primary key from an array: an index probe per claimed row, whatever the
                # planner guesses of the claim's size (a join may hash the whole table)
                f"u AS (UPDATE {self.E} AS e SET {sets} WHERE e.{c['id']} = ANY(ARRAY(SELECT id FROM c)) "
                f"RETURNING {returning}, {f.now} AS fsm_now), "
                f"h AS ({hist} SELECT u.id, u.version, {values}, u.lease_token, {f.p('reason')}, NULL, u.fsm_now, "
                f"NULL, u.created_at FROM u) SELECT {out} FROM u",
            )
        else:
            branches = self._candidate_branches(require, f"e.{c['id']} AS id", readable + limit)
            picked = " UNION ALL ".join(f"SELECT id FROM ({b})" for b in branches)
            if brief:
                kept = ["id", "version", "lease_token", "kind", "created_at", "concurrency_key", "data"]
                if change is LeaseChange.KEEP:
                    kept += ["lease_owner", "lease_expires_at"]
                returning = ", ".join(f"{self.L.ref(n, '')} AS {n}" for n in kept)
                if hits is not None:
                    hit = " OR ".join(self.items_hit(i) for i in range(hits)) or "1"
                    returning += f", CASE WHEN {hit} THEN 1 ELSE 0 END AS hit"
            else:
                returning = self.ret
            found = (
                f"UPDATE {self.E} AS e SET {sets} WHERE e.{c['id']} IN (SELECT id FROM ({picked}){limit}) "
                f"RETURNING {returning}",
                f"{hist} SELECT e.{c['id']}, e.{c['version']}, {values}, e.{c['lease_token']}, {f.p('reason')}, "
                f"NULL, {f.now}, NULL FROM {self.E} AS e WHERE {f.in_ids('e.' + c['id'], 'moved')}",
            )
        self._shapes[key] = found
        return found

    def set_items(self, data: str, i: int) -> str:
        """PostgreSQL: ``data`` (a jsonb expression) with declared change ``i`` applied, as
        :meth:`fsm.records.SetItems.apply` would: every object item of the array
        ``data -> dk{i}`` whose field is a string among the change's ``when`` gets
        ``df{i} = dv{i}`` (jsonb); ``data`` unchanged when no item matches.  Only for
        changes whose ``when`` values are all strings: containment then is exact
        (``dp{i}`` holds one ``[{field: w}]`` per ``w``, for the array; ``do{i}`` one
        ``{field: w}``, for an item), and the array is rebuilt only where an item matches."""
        f = self.f
        k, fld, v = (f"CAST({f.p(f'd{n}{i}')} AS {t})" for n, t in (("k", "text"), ("f", "text"), ("v", "jsonb")))
        in_array, item = f"CAST({f.p(f'dp{i}')} AS jsonb[])", f"CAST({f.p(f'do{i}')} AS jsonb[])"
        x = f"x{i}"
        changed = (
            f"(SELECT jsonb_agg(CASE WHEN {x}.v @> ANY({item}) THEN {x}.v || jsonb_build_object({fld}, {v}) "
            f"ELSE {x}.v END ORDER BY {x}.o) FROM jsonb_array_elements({data} -> {k}) WITH ORDINALITY AS {x}(v, o))"
        )
        return (
            f"CASE WHEN ({data} -> {k}) @> ANY({in_array}) THEN {data} || jsonb_build_object({k}, {changed}) "
            f"ELSE {data} END"
        )

    def items_hit(self, i: int) -> str:
        """SQLite: true when declared change ``i`` applies to the updated row: an object item
        of the JSON array at path ``dk{i}`` whose ``df{i}`` (a path) is text among ``dw{i}``
        (a JSON array).  Exact for string ``when`` values; the change itself is applied in
        Python to the rows it flags."""
        x = f"x{i}"
        # in RETURNING: SQLite takes the table's name there, not its alias
        data = self.L.ref("data", self.E)
        return (
            # a scalar test first: a row without the array needs no table-valued scan
            f"json_type({data}, :dk{i}) = 'array' "
            f"AND EXISTS (SELECT 1 FROM json_each({data}, :dk{i}) AS {x} WHERE {x}.type = 'object' "
            f"AND json_type({x}.value, :df{i}) = 'text' "
            f"AND json_extract({x}.value, :df{i}) IN (SELECT value FROM json_each(:dw{i})))"
        )

    def _indexed(self, index: str) -> str:
        """The entity table for a reaper query.  SQLite with statistics (``ANALYZE``) would
        rather walk the primary key in id order and filter every row, a cost that grows with
        the table; ``INDEXED BY`` pins the reaper index, whose cost grows with the stale rows."""
        if self.pg or not self.L.indexes:
            return f"{self.E} AS e"
        return f"{self.E} AS e INDEXED BY {self.L.indexes[index]}"

    def batch(
        self,
        change: LeaseChange,
        has_ttl: bool,
        shape: ConditionShape,
        require: Sequence[Condition],
        bumps: tuple[bool, bool],
        timer: TimerMode = TimerMode.KEEP,
    ) -> tuple[str, ...]:
        """The reaper's set-based move.  PostgreSQL: one statement that claims the rows
        (``FOR UPDATE SKIP LOCKED``), re-checks every condition in the ``UPDATE`` and
        inserts the history rows from its ``RETURNING``.  SQLite (one writer at a time):
        the ``UPDATE ... RETURNING``, then the history rows of the moved ids."""
        key = ("batch", change, has_ttl, shape, bumps, timer)
        found: tuple[str, ...] | None = self._shapes.get(key)
        if found is not None:
            return found
        lay, f, c = self.L, self.f, self.L.col
        qualifies = (
            f"{f.in_ids('e.' + c['id'], 'ids')} AND {lay.ref('kind', 'e')} = {f.p('kind')} "
            f"AND {lay.ref('state', 'e')} = {f.p('source')} AND NOT {lay.ref('deleted', 'e')} "
            f"AND {f.is_object('e.' + c['data'])}" + self.conditions(require, "e")
        )
        sets = self._move_sets(change, has_ttl, bumps[0], bumps[1], False, timer=timer)
        hist = f"INSERT INTO {self.H} ({self.hist_move_cols})"
        values = f"{f.p('event')}, {f.p('source')}, {f.p('target')}, {f.p('actor')}"
        if self.pg:
            found = (
                f"WITH c AS (SELECT e.{c['id']} AS id FROM {self.E} AS e WHERE {qualifies} "
                f"ORDER BY e.{c['id']} FOR UPDATE OF e SKIP LOCKED), "
                # the claimed rows are locked, and FOR UPDATE re-evaluated ``qualifies`` on their
                # latest version (READ COMMITTED's recheck), so the UPDATE joins by primary key
                # only: repeating the predicates made the planner pick a bitmap scan nested over
                # the CTE, quadratic in the page size (35 ms for 500 rows instead of 3)
                f"u AS (UPDATE {self.E} AS e SET {sets} FROM c WHERE e.{c['id']} = c.id "
                f"RETURNING {self.ret}, {f.now} AS fsm_now), "
                f"h AS ({hist} SELECT u.id, u.version, {values}, u.lease_token, {f.p('reason')}, NULL, u.fsm_now, "
                f"NULL, u.created_at FROM u) SELECT * FROM u",
            )
        else:
            found = (
                self._update(sets, qualifies, returning=self.ret),
                f"{hist} SELECT e.{c['id']}, e.{c['version']}, {values}, e.{c['lease_token']}, {f.p('reason')}, "
                f"NULL, {f.now}, NULL FROM {self.E} AS e WHERE {f.in_ids('e.' + c['id'], 'moved')}",
            )
        self._shapes[key] = found
        return found


__all__ = [
    "LEAN_COLUMNS",
    "ConditionShape",
    "Flavor",
    "PostgresFlavor",
    "SqliteFlavor",
    "Statements",
    "condition_shape",
    "sqlite_ts_add",
]
