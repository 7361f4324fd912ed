"""A brief claim applies a declared change to every row the full claim does,
whatever the key and field names (SQLite's hit filter matches JSON path labels against
the stored text, where a backslash, a control character or an escaped non-ASCII letter
is spelled differently from the name)."""

from __future__ import annotations

from typing import Any

import pytest
from async_support import every_face  # noqa: F401
from test_store_contract import STALE_AFTER, _brief_claim, new, step

from fsm import ManualClock
from fsm.records import BatchWrite, LeaseChange, LeaseStale, SetItems, apply_changes
from stores import Store


@pytest.mark.parametrize("key, field", [("st\\eps", "status"), ("steps", "sta\tus"), ("a\nb", "c\\d")])
def test_a_brief_claim_applies_a_change_whose_names_json_escapes(
    any_store: Store, clock: ManualClock, key: str, field: str
) -> None:
    brief = _brief_claim(any_store)
    data: dict[str, Any] = {key: [{field: "running"}, {field: "done"}]}
    any_store.apply(step(new(any_store, "p0", data=data), "start", "running"))
    clock.advance(STALE_AFTER * 2)
    change = SetItems(key, field, ("running",), "failed")
    claim = BatchWrite((), "job", "expire", "running", "failed", "reaper", (LeaseStale(STALE_AFTER),),
                       LeaseChange.CLEAR, reason="expired", changes=(change,))  # fmt: skip
    assert len(brief(claim, limit=10)) == 1
    assert any_store.get("p0").data == apply_changes((change,), data)
