"""The limits every store and the engine enforce alike (I10), in one place.

Part of the data model: it imports only :mod:`fsm.errors` and :mod:`fsm.records`, so the
stores, the engine and the reaper's config all apply the *same* rule, and a value one
store would take is never refused by another (or worse, stored differently):

- ids, keys, owners and names: non-empty ``str`` of at most :data:`MAX_ID_LENGTH`
  characters (the SQL columns are ``VARCHAR(255)``), without NUL (PostgreSQL refuses it)
  and without lone surrogates (they cannot be encoded as UTF-8);
- free text (a reason): ``str`` without NUL or lone surrogates, no length limit;
- entity data: JSON only: objects with string keys, arrays, strings (same rule as free
  text), finite floats, integers of at most :data:`MAX_INT_BITS` bits, booleans and null,
  nested at most :data:`MAX_JSON_DEPTH` deep (which also ends a cycle);
- durations (lease TTLs, renewal budgets, ``stale_after``, the reaper's interval): a
  ``timedelta`` or a finite number of seconds, positive and at most :data:`MAX_DURATION`,
  so that ``now + ttl`` can never overflow a datetime, a timer or a database interval;
- fencing tokens and versions: ``int`` (not ``bool``), ``0 <= n <= MAX_INT64``.

Every check raises :class:`~fsm.errors.InvalidArgument` (a ``ValueError``) naming the
argument, except data, which raises :class:`~fsm.errors.InvalidData`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from fsm.errors import EntityExists, InvalidArgument, InvalidData
from fsm.records import (
    MAX_DEFINITION,
    MAX_PRIORITY,
    MIN_PRIORITY,
    BatchWrite,
    ClaimLimits,
    ClaimRequest,
    ClaimStart,
    Lease,
    NewEntity,
    TimerMode,
    TransitionWrite,
)

MAX_ID_LENGTH = 255
"""Longest id, idempotency key, owner, kind, state or event name (``VARCHAR(255)``)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays in entity data."""
MAX_INT_BITS = 1024
"""Widest integer in entity data (JSON numbers wider than this are not portable)."""
MAX_DURATION = timedelta(days=365 * 100)
"""Longest TTL, budget, ``stale_after`` or interval: a century, far below any overflow."""
MAX_INT64 = 2**63 - 1
"""Largest fencing token or version a ``BIGINT`` column holds."""
MAX_CREATE_MANY = 10_000
"""The most entities one ``create_many`` takes (a bigger batch is the caller's to split)."""


# -- text ------------------------------------------------------------------------------------


def text_problem(value: object, *, limit: int | None = MAX_ID_LENGTH, empty: bool = False) -> str | None:
    """What is wrong with ``value`` as text, or ``None`` when it is fine."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value and not empty:
        return "must be a non-empty string"
    if limit is not None and len(value) > limit:
        return f"must be at most {limit} characters, not {len(value)}"
    if "\x00" in value:
        return "must not contain NUL (\\x00)"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must not contain lone surrogates (it cannot be encoded as UTF-8)"
    return None


def check_id(name: str, value: object) -> str:
    """``value`` if it is a valid id, key, owner or name, else ``InvalidArgument`` naming ``name``.

    The fast path (a short ASCII ``str``) runs only C-level checks: it guards every read
    and write of every store.
    """
    if type(value) is str and value and len(value) <= MAX_ID_LENGTH and value.isascii() and "\x00" not in value:
        return value
    problem = text_problem(value)
    if problem is not None:
        raise InvalidArgument(f"{name} {problem}: {_shown(value)}")
    return str.__str__(value)  # a str subclass or non-ASCII: an exact str


def check_optional_id(name: str, value: object) -> str | None:
    return None if value is None else check_id(name, value)


def check_free_text(name: str, value: object) -> str:
    """``value`` if it is a string without NUL or lone surrogates (any length, may be empty)."""
    problem = text_problem(value, limit=None, empty=True)
    if problem is not None:
        raise InvalidArgument(f"{name} {problem}: {_shown(value)}")
    return str.__str__(value)


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


# -- numbers and durations -----------------------------------------------------------------


def check_int(name: str, value: object, *, low: int = 0, high: int = MAX_INT64) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, not {_shown(value)}")
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, not {value}")
    return int(value)


def duration_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a duration (``timedelta`` or seconds), or ``None``."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        return f"must be a timedelta or a number of seconds, not {_shown(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, not {value}"
    if isinstance(value, timedelta):
        seconds_ok = value > timedelta()
        too_long = value > MAX_DURATION
    else:
        too_long = value > MAX_DURATION.total_seconds()
        # a timedelta counts microseconds: fewer seconds than that round to a zero duration
        seconds_ok = value > 0 and (too_long or timedelta(seconds=value) > timedelta())
    if not seconds_ok:
        return f"must be a positive duration (at least a microsecond), not {_shown(value)}"
    if too_long:
        return f"must be at most {MAX_DURATION.days} days, not {_shown(value)}"
    return None


def as_duration(value: timedelta | float) -> timedelta:
    """A valid duration (see :func:`duration_problem`) as a ``timedelta``."""
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def check_duration(name: str, value: object) -> timedelta:
    """``value`` (a ``timedelta`` or seconds) as a ``timedelta``, or ``InvalidArgument``.

    The one rule for every TTL, budget, ``stale_after`` and interval; ``Policy`` and
    ``ReaperConfig`` apply it too (ISO-8601 strings are parsed there first).
    """
    problem = duration_problem(value)
    if problem is not None:
        raise InvalidArgument(f"{name} {problem}")
    return as_duration(value)  # type: ignore[arg-type]


def check_optional_duration(name: str, value: object) -> timedelta | None:
    return None if value is None else check_duration(name, value)


def check_time(name: str, value: object) -> datetime:
    """``value`` if it is an aware ``datetime``."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{name} must be an aware datetime (tzinfo=UTC), not {_shown(value)}")
    return value


def check_run_after(value: object) -> datetime | timedelta | None:
    """A due time: ``None`` (at once), an aware ``datetime``, or a delay (a ``timedelta``
    from zero to :data:`MAX_DURATION`), else ``InvalidArgument``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value < timedelta() or value > MAX_DURATION:
            raise InvalidArgument(f"run_after as a delay must be from 0 to {MAX_DURATION.days} days, not {value!r}")
        return value
    if not isinstance(value, datetime):
        raise InvalidArgument(f"run_after must be an aware datetime or a timedelta, not {_shown(value)}")
    when = check_time("run_after", value)
    try:
        when.astimezone(UTC)  # a time no store can spell in UTC is refused here
    except (OverflowError, ValueError):
        raise InvalidArgument(f"run_after {value!r} is out of range") from None
    return when


# -- JSON data -------------------------------------------------------------------------------


class _NotJson(Exception):
    def __init__(self, loc: tuple[str | int, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def json_copy(value: Any, *, lifecycle: str = "store", entity_id: str | None = None) -> Any:
    """A fresh copy of ``value`` made of JSON types only, or ``InvalidData`` saying where it
    is not JSON.

    Tuples become lists and ``str``/``int``/``float`` subclasses their base type, so every
    store keeps exactly what a SQL store would read back.
    """
    try:
        return _copy(value, (), 0)
    except _NotJson as err:
        raise InvalidData(
            lifecycle=lifecycle, entity_id=entity_id, errors=[{"loc": err.loc, "msg": f"not JSON: {err.msg}"}]
        ) from None


def check_json(value: Any, *, lifecycle: str = "store", entity_id: str | None = None) -> None:
    """``InvalidData`` unless ``value`` is JSON (see :func:`json_copy`)."""
    json_copy(value, lifecycle=lifecycle, entity_id=entity_id)


_COLUMN_VALUES = (int, float, bool, datetime, type(None))


def _copy(value: Any, loc: tuple[str | int, ...], depth: int) -> Any:
    cls = value.__class__
    if cls is dict or isinstance(value, Mapping):
        if depth >= MAX_JSON_DEPTH:
            raise _NotJson(loc, f"nested deeper than {MAX_JSON_DEPTH} levels (or a cycle)")
        out: dict[str, Any] = {}
        for given, item in value.items():
            if not isinstance(given, str):
                raise _NotJson((*loc, repr(given)), f"object keys must be strings, not {type(given).__name__}")
            key = given if given.__class__ is str else str.__str__(given)
            problem = text_problem(key, limit=None, empty=True)
            if problem is not None:
                raise _NotJson((*loc, repr(key)), f"key {problem}")
            out[key] = _copy(item, (*loc, key), depth + 1)
        return out
    if cls is list or cls is tuple or isinstance(value, list | tuple):
        if depth >= MAX_JSON_DEPTH:
            raise _NotJson(loc, f"nested deeper than {MAX_JSON_DEPTH} levels (or a cycle)")
        return [_copy(item, (*loc, i), depth + 1) for i, item in enumerate(value)]
    if cls is str or isinstance(value, str):
        problem = text_problem(value, limit=None, empty=True)
        if problem is not None:
            raise _NotJson(loc, f"string {problem}")
        return value if cls is str else str.__str__(value)
    if cls is bool or value is None:
        return value
    if cls is int or (isinstance(value, int) and not isinstance(value, bool)):
        if value.bit_length() > MAX_INT_BITS:
            raise _NotJson(loc, f"integer wider than {MAX_INT_BITS} bits")
        return value if cls is int else int(value)
    if cls is float or isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(loc, f"{value} is not a JSON number")
        return value if cls is float else float(value)
    raise _NotJson(loc, f"{type(value).__name__} is not a JSON type")


# -- what a store receives ------------------------------------------------------------------


def check_new_entity(entity: object) -> NewEntity:
    """Every field of a :class:`NewEntity`, as each store checks it before writing."""
    if not isinstance(entity, NewEntity):
        raise InvalidArgument(f"create takes a NewEntity, not {_shown(entity)}")
    check_id("entity id", entity.id)
    check_id("kind", entity.kind)
    check_id("state", entity.state)
    check_optional_id("concurrency_key", entity.concurrency_key)
    if not isinstance(entity.data, dict):
        raise InvalidData(
            lifecycle=entity.kind, entity_id=entity.id, errors=[{"loc": (), "msg": "data must be a JSON object"}]
        )
    check_json(entity.data, lifecycle=entity.kind, entity_id=entity.id)
    if entity.columns is not None:
        if not isinstance(entity.columns, dict):
            raise InvalidArgument(f"columns must be a dict of column name to value, not {_shown(entity.columns)}")
        for name, value in entity.columns.items():
            check_id("column name", name)
            if isinstance(value, str):
                check_free_text(f"column {name!r}", value)
            elif not isinstance(value, _COLUMN_VALUES) or (isinstance(value, float) and not math.isfinite(value)):
                raise InvalidArgument(
                    f"column {name!r} takes a str, int, float, bool, datetime or None, not {_shown(value)}"
                )
            elif isinstance(value, int) and not isinstance(value, bool):
                check_int(f"column {name!r}", value, low=-MAX_INT64 - 1)
            elif isinstance(value, datetime):
                check_time(f"column {name!r}", value)
    check_run_after(entity.run_after)
    check_priority(entity.priority)
    check_optional_id("parent_id", entity.parent_id)
    if entity.definition is not None:
        check_definition("NewEntity.definition", entity.definition)
    if entity.arm_timer is not True and entity.arm_timer is not False:
        raise InvalidArgument(f"NewEntity.arm_timer must be True or False, not {_shown(entity.arm_timer)}")
    if entity.unique_finals is not None:
        if entity.concurrency_key is None:
            raise InvalidArgument("a create unique while active needs a concurrency_key (the key it is unique by)")
        if not isinstance(entity.unique_finals, tuple) or not 1 <= len(entity.unique_finals) <= 64:
            raise InvalidArgument(
                f"NewEntity.unique_finals must be a tuple of final states, not {_shown(entity.unique_finals)}"
            )
        for state in entity.unique_finals:
            check_id("final state", state)
    return entity


def check_timer_mode(value: object) -> None:
    """A write's ``timer``: a :class:`~fsm.records.TimerMode`."""
    if value.__class__ is not TimerMode:
        raise InvalidArgument(f"a write's timer must be a TimerMode, not {_shown(value)}")


def check_new_entities(entities: object) -> list[NewEntity]:
    """A ``create_many`` batch, as each store checks it: a non-empty list or tuple of at most
    :data:`MAX_CREATE_MANY` valid ``NewEntity`` with distinct ids (a repeated id ->
    ``EntityExists``)."""
    if not isinstance(entities, list | tuple):
        raise InvalidArgument(f"create_many takes a list of NewEntity, not {_shown(entities)}")
    if not 1 <= len(entities) <= MAX_CREATE_MANY:
        raise InvalidArgument(f"create_many takes 1 to {MAX_CREATE_MANY} entities, not {len(entities)}")
    seen: set[str] = set()
    for entity in entities:
        check_new_entity(entity)
        if entity.id in seen:
            raise EntityExists(entity.id)
        seen.add(entity.id)
    return list(entities)


def plain_names(*values: object) -> bool:
    """True when every value is a short, non-empty ASCII ``str`` without NUL: the common
    case, decided with a few C-level calls (this guards every transition a store applies);
    anything else takes :func:`check_id`'s full path, which names the bad field."""
    for value in values:
        if value.__class__ is not str or not 0 < len(value) <= MAX_ID_LENGTH:
            return False
    joined = "".join(values)  # type: ignore[arg-type]
    return joined.isascii() and "\x00" not in joined


def check_transition_write(write: object) -> TransitionWrite:
    """Every field of a :class:`TransitionWrite` a store binds, checked up front."""
    if not isinstance(write, TransitionWrite):
        raise InvalidArgument(f"apply takes a TransitionWrite, not {_shown(write)}")
    if not plain_names(write.entity_id, write.event, write.source, write.target, write.actor):
        check_id("entity id", write.entity_id)
        for name in ("event", "source", "target", "actor"):
            check_id(name, getattr(write, name))
    version, token = write.expect_version, write.expect_token
    if not (version.__class__ is int and 0 <= version <= MAX_INT64):
        check_int("expect_version", version)
    if token is not None and not (token.__class__ is int and 0 <= token <= MAX_INT64):
        check_int("expect_token", token)
    optional = [v for v in (write.expect_owner, write.new_owner, write.idempotency_key) if v is not None]
    if optional and not plain_names(*optional):
        check_optional_id("expect_owner", write.expect_owner)
        check_optional_id("new_owner", write.new_owner)
        check_optional_id("idempotency_key", write.idempotency_key)
    if write.reason is not None:
        check_free_text("reason", write.reason)
    check_optional_duration("lease_ttl", write.lease_ttl)
    if write.data is not None:
        if not isinstance(write.data, dict):
            raise InvalidData(
                lifecycle="store", entity_id=write.entity_id, errors=[{"loc": (), "msg": "data must be a JSON object"}]
            )
        check_json(write.data, entity_id=write.entity_id)
    if write.data_patch is not None:
        check_json(write.data_patch, entity_id=write.entity_id)
    if write.run_after is not None:
        check_run_after(write.run_after)
        if not isinstance(write.run_after, timedelta):
            raise InvalidArgument(f"a transition's run_after is a delay (timedelta), not {_shown(write.run_after)}")
    if write.error is not None:
        if not isinstance(write.error, dict):
            raise InvalidArgument(f"a transition's error is a JSON object, not {_shown(write.error)}")
        check_json(write.error, entity_id=write.entity_id)
    if write.timer.__class__ is not TimerMode:
        check_timer_mode(write.timer)
    if write.definition is not None:
        check_definition("TransitionWrite.definition", write.definition)
    if write.memory is not None:
        check_memory(write.memory)
    if write.restart is not False and write.restart is not True:
        raise InvalidArgument(f"a transition's restart is True or False, not {_shown(write.restart)}")
    return write


MAX_MEMORY = 256
"""The most compound states one entity's history memory holds (one per compound state with
a history state: a chart has far fewer)."""


def check_memory(memory: object) -> dict[str, str]:
    """A history memory (``{compound state id: leaf state id}``, :mod:`fsm.history`)."""
    if not isinstance(memory, dict) or len(memory) > MAX_MEMORY:
        raise InvalidArgument(
            f"a history memory is a dict of at most {MAX_MEMORY} state ids to leaf state ids, not {_shown(memory)}"
        )
    for compound, leaf in memory.items():
        check_id("memory state", compound)
        check_id("memory leaf", leaf)
    return memory


MAX_APPLY_MANY = 1000
"""The most transitions one ``apply_many`` takes."""


def check_transition_writes(writes: object) -> list[TransitionWrite]:
    """An ``apply_many`` batch: a list or tuple of at most :data:`MAX_APPLY_MANY` valid writes."""
    if not isinstance(writes, list | tuple):
        raise InvalidArgument(f"apply_many takes a list of TransitionWrite, not {_shown(writes)}")
    if len(writes) > MAX_APPLY_MANY:
        raise InvalidArgument(f"apply_many takes at most {MAX_APPLY_MANY} writes, not {len(writes)}")
    checked = [check_transition_write(w) for w in writes]
    if any(w.restart for w in checked):  # its batched statement has no restart: apply or apply_group does
        raise InvalidArgument("apply_many does not take a restart write (TransitionWrite.restart): use apply")
    return checked


def check_create_chains(items: object) -> list[tuple[NewEntity, list[TransitionWrite]]]:
    """A ``create_chains`` call: 1 to :data:`MAX_CREATE_MANY` pairs of a new entity and the
    chain of writes its initial state takes (:func:`check_chain`, the first at version 0,
    all of that entity)."""
    if not isinstance(items, list | tuple) or not 1 <= len(items) <= MAX_CREATE_MANY:
        raise InvalidArgument(
            f"create_chains takes a list of 1 to {MAX_CREATE_MANY} (NewEntity, writes) pairs, not {_shown(items)}"
        )
    checked: list[tuple[NewEntity, list[TransitionWrite]]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"create_chains takes (NewEntity, writes) pairs, not {_shown(item)}")
        entity = check_new_entity(item[0])
        rests = isinstance(item[1], list | tuple) and not item[1]  # its guards let it rest where it starts
        writes = [] if rests else check_chain(item[1])
        if any(w.entity_id != entity.id for w in writes) or (writes and writes[0].expect_version != 0):
            raise InvalidArgument(
                f"create_chains: the writes of {entity.id!r} must be its own, the first expecting version 0"
            )
        checked.append((entity, writes))
    seen: set[str] = set()
    for entity, _ in checked:
        if entity.id in seen:
            raise EntityExists(entity.id)
        seen.add(entity.id)
    return checked


MAX_CHAIN_WRITES = 65
"""The most writes one ``apply_chain`` commits: an event and its microsteps (``fsm.chains``)."""


def check_chain(writes: object) -> list[TransitionWrite]:
    """An ``apply_chain`` call: 1 to :data:`MAX_CHAIN_WRITES` valid writes of one entity, each
    expecting the version the one before it leaves (the first's plus one, and so on)."""
    if not isinstance(writes, list | tuple) or not 1 <= len(writes) <= MAX_CHAIN_WRITES:
        raise InvalidArgument(
            f"apply_chain takes a list of 1 to {MAX_CHAIN_WRITES} TransitionWrite, not {_shown(writes)}"
        )
    checked = [check_transition_write(w) for w in writes]
    first = checked[0]
    for n, write in enumerate(checked[1:], 1):
        if write.entity_id != first.entity_id or write.expect_version != first.expect_version + n:
            raise InvalidArgument(
                "apply_chain takes the writes of one entity, each expecting the version the one before it "
                f"leaves: write {n} is for {write.entity_id!r} at version {write.expect_version}"
            )
    keys = [w.idempotency_key for w in checked if w.idempotency_key is not None]
    if len(set(keys)) != len(keys):  # refused before any statement: the second could never land
        raise InvalidArgument("apply_chain: two writes of one chain carry the same idempotency key")
    return checked


def check_group(writes: object, creates: object) -> tuple[list[TransitionWrite], list[NewEntity]]:
    """An ``apply_group`` call: at most :data:`MAX_CHAIN_WRITES` valid writes (of any
    entities, each judged on its own version) and at most :data:`MAX_CREATE_MANY` new
    entities, distinct, none of them one a write is for; one of either at least."""
    if not isinstance(writes, list | tuple) or len(writes) > MAX_CHAIN_WRITES:
        raise InvalidArgument(
            f"apply_group takes a list of at most {MAX_CHAIN_WRITES} TransitionWrite, not {_shown(writes)}"
        )
    if not isinstance(creates, list | tuple) or len(creates) > MAX_CREATE_MANY:
        raise InvalidArgument(f"apply_group takes a list of at most {MAX_CREATE_MANY} NewEntity, not {_shown(creates)}")
    if not writes and not creates:
        raise InvalidArgument("apply_group takes at least one write or one new entity")
    checked = [check_transition_write(w) for w in writes]
    made = [check_new_entity(e) for e in creates]
    seen: set[str] = set()
    for entity in made:
        if entity.id in seen:
            raise EntityExists(entity.id)
        seen.add(entity.id)
    if any(w.entity_id in seen for w in checked):
        raise InvalidArgument("apply_group: a write is for an entity the same call creates")
    keys = [(w.entity_id, w.idempotency_key) for w in checked if w.idempotency_key is not None]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("apply_group: two writes of one entity carry the same idempotency key")
    return checked, made


def check_renewals(leases: object, ttl: object, budgets: object) -> list[Lease]:
    """A ``renew_leases`` call: at most :data:`MAX_APPLY_MANY` leases, a store TTL, and
    ``(state, budget)`` pairs."""
    if not isinstance(leases, list | tuple) or len(leases) > MAX_APPLY_MANY:
        raise InvalidArgument(f"renew_leases takes a list of at most {MAX_APPLY_MANY} leases")
    for lease in leases:
        if not isinstance(lease, Lease):
            raise InvalidArgument(f"renew_leases takes Lease items, not {_shown(lease)}")
        check_lease_args(lease.entity_id, lease.owner, token=check_int("token", lease.token))
    check_store_ttl(ttl)
    if not isinstance(budgets, tuple):
        raise InvalidArgument(f"budgets must be a tuple of (state, timedelta), not {_shown(budgets)}")
    for pair in budgets:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"budgets must be a tuple of (state, timedelta), not {_shown(pair)}")
        check_id("state", pair[0])
        check_lease_args("x", "x", budget=pair[1])
    return list(leases)


def check_batch_write(batch: object) -> BatchWrite:
    """Every field of a :class:`BatchWrite` a store binds, checked up front."""
    if not isinstance(batch, BatchWrite):
        raise InvalidArgument(f"apply_batch takes a BatchWrite, not {_shown(batch)}")
    if not isinstance(batch.ids, tuple | list):
        raise InvalidArgument(f"BatchWrite.ids must be a tuple of ids, not {_shown(batch.ids)}")
    for entity_id in batch.ids:
        check_id("entity id", entity_id)
    for name in ("kind", "event", "source", "target", "actor"):
        check_id(name, getattr(batch, name))
    check_optional_id("new_owner", batch.new_owner)
    if batch.reason is not None:
        check_free_text("reason", batch.reason)
    check_optional_duration("lease_ttl", batch.lease_ttl)
    check_timer_mode(batch.timer)
    return batch


def check_lease_args(
    entity_id: object, owner: object, *, token: object = None, ttl: object = None, budget: object = None
) -> None:
    """The arguments of a store's ``acquire_lease``/``renew_lease`` (pass ``ttl``) and
    ``release_lease`` (no ``ttl``)."""
    check_id("entity id", entity_id)
    check_id("owner", owner)
    if token is not None:
        check_int("token", token)
    if ttl is not None:
        check_store_ttl(ttl)
    check_optional_duration("budget", budget)
    if budget is not None and not isinstance(budget, timedelta):
        raise InvalidArgument(f"a store takes budget as a timedelta, not {_shown(budget)}")


def check_store_ttl(ttl: object) -> timedelta:
    """A store's (required) ``ttl``: a valid duration given as a ``timedelta``."""
    if not isinstance(ttl, timedelta):
        raise InvalidArgument(f"a store takes ttl as a timedelta, not {_shown(ttl)}")
    return check_duration("ttl", ttl)


def check_page(kind: object, state: object, limit: object, after_id: object) -> None:
    """The arguments of a store's ``candidates``."""
    check_id("kind", kind)
    check_id("state", state)
    check_int("limit", limit, low=1, high=1_000_000)
    check_optional_id("after_id", after_id)


def check_effect_args(entity_id: object, key: object, owner: object, token: object, status: object) -> None:
    """The arguments of a store's ``record_effect`` (the result is checked as JSON apart)."""
    check_id("entity id", entity_id)
    check_id("effect key", key)
    check_id("owner", owner)
    check_int("token", token)
    check_id("status", status)


def check_lease(lease: object) -> Lease:
    """A :class:`Lease` whose fields are of the types the stores hold."""
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"expected a Lease, not {_shown(lease)}")
    check_id("lease entity id", lease.entity_id)
    check_id("lease owner", lease.owner)
    check_int("lease token", lease.token)
    check_time("lease expires_at", lease.expires_at)
    return lease


def check_claim_request(request: object) -> ClaimRequest:
    """A store's ``claim`` request: names, a bounded limit, a TTL, budgets."""
    if not isinstance(request, ClaimRequest):
        raise InvalidArgument(f"claim takes a ClaimRequest, not {_shown(request)}")
    check_id("kind", request.kind)
    check_id("owner", request.owner)
    check_int("limit", request.limit, low=1, high=100_000)
    check_store_ttl(request.ttl)
    for start in request.starts:
        if not isinstance(start, ClaimStart):
            raise InvalidArgument(f"claim starts must be ClaimStart, not {_shown(start)}")
        for name in ("source", "target", "event"):
            check_id(f"start {name}", getattr(start, name))
        check_timer_mode(start.timer)
    for state in request.resumes:
        check_id("resume state", state)
    for state, budget in request.budgets:
        check_id("budget state", state)
        check_store_duration("budget", budget)
    if request.limits is not None:
        check_claim_limits(request.limits)
    if request.starve_after is not None:
        check_store_duration("starve_after", request.starve_after)
    if request.definition is not None:
        check_definition("ClaimRequest.definition", request.definition)
    return request


def check_store_duration(name: str, value: object) -> timedelta:
    """A duration a store computes with: a ``timedelta`` (seconds are the engine's to turn
    into one), valid as :func:`check_duration` says."""
    if not isinstance(value, timedelta):
        raise InvalidArgument(f"a store takes {name} as a timedelta, not {_shown(value)}")
    return check_duration(name, value)


MAX_LIMIT = 1_000_000
"""The largest concurrency limit or rate count."""


def check_claim_limits(limits: object) -> ClaimLimits:
    """A claim's limits: positive counts, durations, and the states a slot is held in."""
    if not isinstance(limits, ClaimLimits):
        raise InvalidArgument(f"claim limits must be ClaimLimits, not {_shown(limits)}")
    if not isinstance(limits.leased, tuple) or not 1 <= len(limits.leased) <= 64:
        raise InvalidArgument(f"limits.leased must be a tuple of 1 to 64 state names, not {_shown(limits.leased)}")
    for state in limits.leased:
        check_id("leased state", state)
    for name in ("per_key", "total"):
        value = getattr(limits, name)
        if value is not None:
            check_int(f"limits.{name}", value, low=1, high=MAX_LIMIT)
    for name in ("rate", "key_rate"):
        value = getattr(limits, name)
        if value is not None:
            if not isinstance(value, tuple) or len(value) != 2:
                raise InvalidArgument(f"limits.{name} must be (count, period), not {_shown(value)}")
            check_int(f"limits.{name} count", value[0], low=1, high=MAX_LIMIT)
            check_store_duration(f"limits.{name} period", value[1])
    return limits


def check_children_args(parent_id: object, limit: object, after_id: object) -> None:
    """``Store.children``'s arguments: an id, a page size, a keyset id."""
    check_id("parent_id", parent_id)
    check_int("limit", limit, low=1, high=10_000)
    check_optional_id("after_id", after_id)


def check_slots_args(kind: object, leased: object, key: object) -> None:
    """``Store.slots``'s arguments: a kind, 1 to 64 state names, an optional key."""
    check_id("kind", kind)
    if isinstance(leased, str) or not isinstance(leased, list | tuple) or not 1 <= len(leased) <= 64:
        raise InvalidArgument(f"leased must be a list of 1 to 64 state names, not {_shown(leased)}")
    for state in leased:
        check_id("leased state", state)
    check_optional_id("key", key)


def check_definition(name: str, value: object) -> int:
    """A lifecycle definition version a store records: an ``int`` (not a ``bool``) from 1
    to :data:`~fsm.records.MAX_DEFINITION` (the column is a 32-bit integer)."""
    return check_int(name, value, low=1, high=MAX_DEFINITION)


def check_priority(value: object) -> int:
    """A claim priority: an ``int`` from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`."""
    return check_int("priority", value, low=MIN_PRIORITY, high=MAX_PRIORITY)


MAX_MESSAGE_NAME = 64
MAX_MESSAGE_KEY = 160
"""A message's name and idempotency key: its ledger key ``fsm:msg:{name}:{key}`` fits 255."""


def check_park_args(entity_id: object, owner: object, token: object, until: object) -> datetime:
    """The arguments of a store's ``park``: an entity, the holder's lease, an aware time."""
    check_lease_args(entity_id, owner, token=token)
    when = check_time("until", until)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidArgument(f"until {until!r} is out of range") from None


def check_message_args(entity_id: object, name: object, key: object) -> None:
    """The arguments of a store's ``send_message`` (the payload is checked as JSON apart):
    a message name without ``:`` of at most 64 characters, a key of at most 160."""
    check_id("entity id", entity_id)
    check_id("message name", name)
    check_id("message idempotency key", key)
    assert isinstance(name, str) and isinstance(key, str)
    if len(name) > MAX_MESSAGE_NAME or ":" in name:
        raise InvalidArgument(
            f"a message name has at most {MAX_MESSAGE_NAME} characters and no ':', not {_shown(name)}"
        )
    if len(key) > MAX_MESSAGE_KEY:
        raise InvalidArgument(f"a message idempotency key has at most {MAX_MESSAGE_KEY} characters")


MAX_TIMERS = 64
"""The most ``(state, after)`` pairs one ``next_timer`` looks at."""


def check_timers(kind: object, timers: object) -> list[tuple[str, timedelta]]:
    """The arguments of a store's ``next_timer``: a kind and 1 to :data:`MAX_TIMERS`
    ``(state, after)`` pairs, ``after`` a positive ``timedelta``."""
    check_id("kind", kind)
    if not isinstance(timers, list | tuple) or not 1 <= len(timers) <= MAX_TIMERS:
        raise InvalidArgument(f"timers must be a list of 1 to {MAX_TIMERS} (state, after) pairs, not {_shown(timers)}")
    found: list[tuple[str, timedelta]] = []
    for pair in timers:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[1], timedelta):
            raise InvalidArgument(f"timers must be (state, timedelta) pairs, not {_shown(pair)}")
        found.append((check_id("state", pair[0]), check_duration("after", pair[1])))
    return found


def check_listing(kind: object, state: object, limit: object, after_id: object) -> None:
    """The arguments of a store's ``entities`` (``state`` optional)."""
    check_id("kind", kind)
    check_optional_id("state", state)
    check_int("limit", limit, low=1, high=1_000_000)
    check_optional_id("after_id", after_id)


__all__ = [
    "MAX_APPLY_MANY",
    "MAX_CHAIN_WRITES",
    "MAX_CREATE_MANY",
    "MAX_DURATION",
    "MAX_ID_LENGTH",
    "MAX_INT64",
    "MAX_INT_BITS",
    "MAX_JSON_DEPTH",
    "as_duration",
    "check_batch_write",
    "check_chain",
    "check_claim_request",
    "check_definition",
    "check_duration",
    "check_effect_args",
    "check_free_text",
    "check_id",
    "check_int",
    "check_json",
    "check_lease",
    "check_lease_args",
    "check_listing",
    "check_new_entities",
    "check_new_entity",
    "check_optional_duration",
    "check_optional_id",
    "check_page",
    "check_renewals",
    "check_store_ttl",
    "check_time",
    "check_transition_write",
    "check_transition_writes",
    "duration_problem",
    "json_copy",
    "plain_names",
    "text_problem",
]
