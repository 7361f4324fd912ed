"""How a stored row becomes a record, and data becomes JSON text.

Decoding runs on every read and write, so it is positional and allocation-light.  A row
that cannot be decoded (broken or non-object JSON, a NULL leaf state, an unreadable
timestamp) raises :class:`~fsm.errors.MalformedRow` naming the entity, never a bare
``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fsm.errors import InvalidData, MalformedRow
from fsm.records import HistoryRecord, Snapshot
from stores.sql.schema import decode_time


def dumps_data(value: Any, entity_id: str) -> str:
    """``value`` as compact JSON text; not JSON-serialisable -> ``InvalidData`` (nothing written)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidData(
            lifecycle="store", entity_id=entity_id, errors=[{"loc": ("data",), "msg": f"not JSON: {err}"}]
        ) from None


_scan: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner (or its Python twin)


_tuple_new = tuple.__new__


def loads_object(text: str) -> Any:
    """``json.loads(text)`` for the compact text the store writes: the C scanner at once,
    without ``loads``' layers; anything else (whitespace around it, bad JSON) goes through
    ``json.loads``, which decodes it or raises its ``ValueError``."""
    if text.__class__ is not str:  # bytes (a BLOB): json.loads decodes them
        return json.loads(text)
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def snapshot_of(row: Sequence[Any]) -> Snapshot:
    """A row (entity columns in Snapshot order) as a Snapshot, or ``MalformedRow``."""
    try:
        state, data, exp, due, since, memory = row[2], row[14], row[6], row[15], row[16], row[20]
        if state is None:
            raise ValueError("no state (leaf state column is NULL)")
        if data.__class__ is str:
            data = {} if data == "{}" else json.loads(data)
        if data.__class__ is not dict:
            raise ValueError(f"data is not a JSON object: {str(data)[:60]!r}")
        # positional: this runs on every read and write
        # and built directly: a NamedTuple's generated __new__ is one more Python call
        return _tuple_new(Snapshot, (
            row[0], row[1], state, row[3], row[4], row[5], None if exp is None else decode_time(exp),
            decode_time(row[7]), decode_time(row[8]), decode_time(row[9]), bool(row[10]), row[11],
            row[12], row[13], data, None if due is None else decode_time(due),
            None if since is None else decode_time(since), row[17], row[18], row[19],
            None if memory is None else memory_of(memory),
        ))  # fmt: skip
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=str(err)) from None


def memory_of(value: Any) -> dict[str, str]:
    """A stored history memory (JSON text, or the driver's object) as a dict of ids."""
    if value.__class__ is str:
        value = json.loads(value)
    if value.__class__ is not dict or not all(k.__class__ is str and v.__class__ is str for k, v in value.items()):
        raise ValueError(f"history memory is not an object of state ids: {str(value)[:60]!r}")
    return value


def history_of(row: Sequence[Any]) -> HistoryRecord:
    """A history row (columns in HistoryRecord order) as a record, or ``MalformedRow``."""
    try:
        data, error = row[10], row[12]
        if data.__class__ is str:
            data = json.loads(data)
        if error.__class__ is str:
            error = json.loads(error)
        return HistoryRecord(
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], decode_time(row[9]), data,
            row[11], error,
        )  # fmt: skip
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRow(str(row[0]), reason=f"history row {row[1]}: {err}") from None


__all__ = ["dumps_data", "history_of", "loads_object", "snapshot_of"]
