"""The fault suite's per-key limit check (L) on made-up logs: it finds an overlap above the
limit, never counts touching holds as one, ends a hold at its lease's deadline when the
``leaving`` line came later, and leaves out holds it cannot bound."""

from __future__ import annotations

from .run import Config, Summary, _limit_problems

Hold = tuple[str, int, float, float | None] | tuple[str, int, float, float | None, float]


def _logs(*holds: Hold) -> dict[str, list[tuple[int, list[str]]]]:
    """``(entity, token, claimed at, leaving at or None[, lease deadline])`` as worker log
    lines (the deadline far off unless given)."""
    logs: dict[str, list[tuple[int, list[str]]]] = {"claim": [], "leaving": []}
    for entity, token, start, end, *until in holds:
        logs["claim"].append((1, [f"{start:.6f}", entity, str(token), "running"]))
        if end is not None:
            deadline = until[0] if until else end + 100.0
            logs["leaving"].append((1, [f"{end:.6f}", entity, str(token), f"{deadline:.6f}"]))
    return logs


def _check(keys: dict[str, str | None], *holds: Hold) -> tuple[list[str], Summary]:
    config = Config(keys=2, per_key=2)
    summary = Summary(config)
    return _limit_problems(config, _logs(*holds), keys, summary), summary


def test_three_overlapping_holds_of_one_key_exceed_a_limit_of_two() -> None:
    keys = {"a": "k", "b": "k", "c": "k"}
    problems, summary = _check(keys, ("a", 1, 1.0, 5.0), ("b", 1, 2.0, 6.0), ("c", 1, 3.0, 4.0))
    assert len(problems) == 1 and problems[0].startswith("L: 3 jobs of k held at once at 3.000000")
    assert summary.most_held == 3 and summary.limited_holds == 3


def test_holds_that_touch_or_belong_to_other_keys_do_not_overlap() -> None:
    keys = {"a": "k", "b": "k", "c": "k", "d": "other"}
    problems, summary = _check(keys, ("a", 1, 1.0, 2.0), ("b", 1, 2.0, 3.0), ("c", 1, 2.5, 4.0), ("d", 1, 2.5, 4.0))
    assert problems == [] and summary.most_held == 2


def test_a_hold_without_its_leaving_line_is_left_out() -> None:
    keys = {"a": "k", "b": "k", "c": "k"}
    problems, summary = _check(keys, ("a", 1, 1.0, None), ("b", 1, 1.5, 5.0), ("c", 1, 2.0, 6.0))
    assert problems == [] and summary.limited_holds == 2


def test_a_later_lease_of_the_same_entity_is_its_own_hold() -> None:
    keys = {"a": "k", "b": "k"}
    # a's first lease left at 2.0; its second lease (token 2) is claimed at 3.0
    problems, _ = _check(keys, ("a", 1, 1.0, 2.0), ("a", 2, 3.0, 4.0), ("b", 1, 1.5, 3.5))
    assert problems == []


def test_a_leaving_line_written_after_its_lease_lapsed_ends_the_hold_at_the_lapse() -> None:
    keys = {"a": "k", "b": "k", "c": "k"}
    # a was paused with its lease until 2.0 and wrote its leaving line at 5.0: b and c
    # took the freed slot after 2.0, so at most two held at once
    problems, summary = _check(keys, ("a", 1, 1.0, 5.0, 2.0), ("b", 1, 1.5, 6.0), ("c", 1, 2.5, 6.0))
    assert problems == [] and summary.most_held == 2
    # the same leaving line with a lease that lasted: three at once from 2.5
    problems, _ = _check(keys, ("a", 1, 1.0, 5.0, 9.0), ("b", 1, 1.5, 6.0), ("c", 1, 2.5, 6.0))
    assert problems and problems[0].startswith("L: 3 jobs of k held at once at 2.500000")
