"""Hypothesis strategies for a lifecycle: events, entity ids, data that fits its model,
and lease timings around the edges that matter (a third of the TTL, the TTL itself, one
second either side of it, ``stale_after``, the reaper's interval)."""

from __future__ import annotations

import types
import typing
from datetime import timedelta
from typing import Any, Literal, Union, get_args, get_origin

from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from fsm.lifecycle import Lifecycle
from fsm.policy import Policy
from fsm.records import Actor

_TEXT = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
"""Stores refuse NUL and lone surrogates in JSON text."""
_JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(_TEXT, max_size=8)


def events(lifecycle: type[Lifecycle], actor: Actor | None = None) -> st.SearchStrategy[str]:
    """Every event of the lifecycle (those with a branch for ``actor``, when given)."""
    table = lifecycle.table
    names = [e for e in table.events if actor is None or any(b.actor is actor and b.event == e for b in table.declared)]
    return st.sampled_from(names)


def entity_ids(prefix: str = "e", count: int = 3) -> st.SearchStrategy[str]:
    """A few ids, so that workers and reapers meet on the same entities often."""
    return st.sampled_from([f"{prefix}{i}" for i in range(count)])


def _for_annotation(annotation: Any, depth: int) -> st.SearchStrategy[Any]:
    if annotation is Any or annotation is object:
        return _JSON_LEAF
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return data_for(annotation, depth=depth + 1)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of([_for_annotation(a, depth) for a in args])
    if origin is typing.Annotated:
        return _for_annotation(args[0], depth)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        inner = _for_annotation(args[0], depth + 1) if args else _JSON_LEAF
        return st.lists(inner, max_size=0 if depth > 2 else 3)
    if origin is dict or annotation is dict:
        inner = _for_annotation(args[1], depth + 1) if len(args) == 2 else _JSON_LEAF
        return st.dictionaries(st.text(_TEXT, min_size=1, max_size=6), inner, max_size=0 if depth > 2 else 3)
    if annotation is type(None):
        return st.none()
    for python_type, strategy in (
        (bool, st.booleans()),
        (int, st.integers(-(2**31), 2**31)),
        (float, st.floats(allow_nan=False, allow_infinity=False, width=32)),
        (str, st.text(_TEXT, min_size=1, max_size=8)),
    ):
        if annotation is python_type:
            return strategy
    return _JSON_LEAF


def data_for(model: type[BaseModel], *, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """JSON data (a dict) that ``model`` accepts: built from its fields' annotations,
    optional fields left out at random, and checked with ``model_validate`` (a field with
    constraints hypothesis cannot see is retried, never handed over invalid)."""
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        strategy = _for_annotation(field.annotation, depth)
        (required if field.is_required() else optional)[key] = strategy

    def valid(data: dict[str, Any]) -> bool:
        try:
            model.model_validate(data)
        except ValidationError:
            return False
        return True

    def dumped(data: dict[str, Any]) -> dict[str, Any]:
        return model.model_validate(data).model_dump(mode="json", by_alias=True)

    return st.fixed_dictionaries(required, optional=optional).filter(valid).map(dumped)


def data_patches(model: type[BaseModel] | None) -> st.SearchStrategy[dict[str, Any] | None]:
    """A patch for ``fire(data=...)``: ``None``, or some top-level keys of valid data."""
    if model is None:
        return st.none() | st.dictionaries(st.sampled_from(["note", "step"]), _JSON_LEAF, max_size=2)
    return st.none() | data_for(model).flatmap(
        lambda full: (
            st.sets(st.sampled_from(sorted(full)), max_size=len(full)).map(lambda keys: {k: full[k] for k in keys})
            if full
            else st.just({})
        )
    )


def lease_timings(policy: Policy, interval: timedelta | None = None) -> st.SearchStrategy[timedelta]:
    """Clock moves around the edges: a keeper period, the TTL and a second either side of
    it, ``stale_after`` and past it, a reaper interval, and small steps."""
    ttl, second = policy.lease_ttl, timedelta(seconds=1)
    edges = [second, ttl / 3, ttl - second, ttl, ttl + second, policy.stale_after + second, ttl * 3]
    if interval is not None:
        edges += [interval, interval + second]
    return st.sampled_from(sorted(set(edges)))


__all__ = ["data_for", "data_patches", "entity_ids", "events", "lease_timings"]
