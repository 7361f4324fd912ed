"""The reaper's tick log: a history row per live tick on a reserved entity, never raising."""

from __future__ import annotations

from fsm import ManualClock, ReapResult
from fsm.reaping.ticklog import TICKS_ID, TICKS_KIND, TickLog
from stores import MemoryStore


def test_each_live_tick_is_one_history_row_with_its_counts() -> None:
    store = MemoryStore(ManualClock())
    log = TickLog(store)
    first = ReapResult(lost_races=1, duration_s=0.002)
    first.moved["job.expire"] = 3
    assert log.record(first, "reaper:a")
    assert log.record(ReapResult(errors=1, bad_rows=2), "reaper:b")
    assert not log.record(ReapResult(dry_run=True), "reaper:a")  # dry runs move nothing: not recorded
    snap = store.get(TICKS_ID)
    assert (snap.kind, snap.version) == (TICKS_KIND, 2)
    rows = store.history(TICKS_ID)
    assert [r.data["owner"] for r in rows] == ["reaper:a", "reaper:b"]  # type: ignore[index]
    assert rows[0].data == {
        "owner": "reaper:a",
        "moved": {"job.expire": 3},
        "lost_races": 1,
        "refused": 0,
        "bad_rows": 0,
        "errors": 0,
        "duration_ms": 2.0,
        "leading": True,
        "standby": [],
        "enabled": True,
        "scheduled": {},
        "delayed": {},
    }
    assert rows[1].reason == "moved 0, 1 errors"


def test_a_store_failure_is_logged_not_raised() -> None:
    class Down(MemoryStore):
        def get(self, entity_id: str, *, include_deleted: bool = False):  # type: ignore[no-untyped-def]
            from fsm import StoreUnavailable

            raise StoreUnavailable("database unavailable")

    assert not TickLog(Down()).record(ReapResult(), "reaper:a")


def test_the_tick_log_keeps_a_bounded_window_of_the_newest_ticks(tmp_path: object) -> None:
    """On memory and SQLite: past ``keep`` rows, every TRIM_EVERY-th tick cuts the oldest."""
    import pytest

    from fsm import ConfigError
    from fsm.reaping.ticklog import TRIM_EVERY
    from stores import SqlStore

    for store in (MemoryStore(ManualClock()), SqlStore(f"sqlite:///{tmp_path}/ticks.db")):
        log = TickLog(store, keep=150)
        for _ in range(TRIM_EVERY * 3 - 1):  # 299 ticks: trimmed at 200 (to 150), not at 100 (< keep)
            assert log.record(ReapResult(), "reaper:a")
        seqs = [r.seq for r in store.history(TICKS_ID)]
        assert seqs == list(range(51, 300))  # 150 kept at tick 200, then 99 more
        assert log.record(ReapResult(), "reaper:a")  # tick 300: back to the newest 150
        assert [r.seq for r in store.history(TICKS_ID)] == list(range(151, 301))
        assert store.get(TICKS_ID).version == 300
        for bad in (0, -1, True, "150", 10**9):
            with pytest.raises(ConfigError):
                TickLog(store, keep=bad)  # type: ignore[arg-type]
