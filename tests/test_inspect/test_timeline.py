"""The entity timeline's folding of lease renewals (no browser): runs by holder, in time order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fsm.inspect.data import RenewalLog
from fsm.inspect.timeline import RenewalRun, events, timeline
from fsm.records import EffectRecord, HistoryRecord, LeaseRenewal

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
TTL = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def renewal(seconds: float, owner: str = "worker-a", token: int = 1, acquired: bool = False) -> LeaseRenewal:
    return LeaseRenewal(at(seconds), at(seconds) + TTL, owner, token, acquired)


def move(seq: int, seconds: float, event: str, actor: str = "worker", token: int = 1) -> HistoryRecord:
    return HistoryRecord("j1", seq, event, "running", "finalizing", actor, token, None, None, at(seconds))


def test_consecutive_renewals_of_one_lease_fold_into_one_run_and_other_events_split_runs() -> None:
    history = [move(1, 0, "start"), move(2, 100, "exited")]
    effects = [EffectRecord("j1", "gate", "succeeded", 1, 1, {}, at(45))]
    renewals = [renewal(s) for s in (10, 20, 30, 40, 50, 60, 110, 120)]
    renewals += [renewal(130, "worker-b", 2, acquired=True), renewal(140, "worker-b", 2)]
    lines = events(history, effects, None, renewals)
    shape = [
        (type(e).__name__, len(e.renewals) if isinstance(e, RenewalRun) else getattr(e, "seq", None)) for e in lines
    ]
    assert shape == [
        ("HistoryRecord", 1),
        ("RenewalRun", 4),  # 10..40, then the effect at 45 ends the run
        ("EffectRecord", None),
        ("RenewalRun", 2),  # 50, 60
        ("HistoryRecord", 2),
        ("RenewalRun", 2),  # 110, 120
        ("LeaseRenewal", None),  # worker-b takes the lease: its own line
        ("RenewalRun", 1),
    ]


def test_a_run_says_how_often_and_until_when_and_a_lapse_before_a_reaper_move() -> None:
    now = at(600)
    history = [move(1, 0, "start"), move(2, 200, "reclaim", actor="reaper", token=2)]
    html = timeline(now, history, [], None, [renewal(s) for s in (20, 40, 60, 80)])
    assert "renewed 4 times by worker-a" in html
    assert "10:00:20 - 10:01:20 UTC, about every 20s" in html
    assert "then no renewal: the lease lapsed at 10:01:50" in html  # 80 s + TTL, before the reaper's 200 s


def test_owners_are_escaped_and_the_log_note_says_what_was_dropped() -> None:
    hostile = "<script>alert('x')</script>"
    html = timeline(at(100), [], [], None, [renewal(10, hostile), renewal(20, hostile)])
    assert "<script>" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert RenewalLog([renewal(1)], total=1).note() == ""
    assert "the newest 1 of 1234 lease renewals" in RenewalLog([renewal(1)], total=1234).note()
