"""Timed transitions with real processes: racing reapers, a killed reaper, a racing leave.

Every test runs on a SQLite file and on PostgreSQL (tables of its own, a unique prefix);
the reapers are child processes (``fsm reaper`` on the command line, or a script running
``Reaper(...).start()``, or a ``Worker(..., reap=True)``), killed with SIGKILL where the
test says so.  What is asserted is behaviour: each timer fires exactly once, never before
its due time by the store's own times (``timer_since + after`` against the history row's
``at``), never on an entity that left its timed state, and each reaper's log of what it
moved agrees with the history.  No duration is asserted: the waits only bound how long a
test may take before it fails.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import SqlTarget
from process_support import ChildProcess, child_processes  # noqa: F401 - the children fixture

from fsm import Engine
from fsm.reaping.leader import LEADER_KIND, leader_key
from fsm.records import HistoryRecord, Snapshot
from stores import Store

from .proc_lifecycles import AFTER, Timed

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PATIENT = 30.0
"""How long a wait may take before the test fails (never asserted as a duration)."""
INTERVAL_S = 1.0
"""The reapers' interval: a standby checks leadership this often (a leader's loop wakes
sooner, when a timer falls due)."""
LEADER_INTERVAL_S = 10.0
"""The interval of reapers that must keep one leader for a whole test."""
TESTS_DIR = Path(__file__).resolve().parents[1]
"""On the children's path: they import ``test_timers.proc_lifecycles``."""
LIFECYCLE_REF = "test_timers.proc_lifecycles:Timed"
KIND = Timed.kind
ENTITIES = 200

CLI = "import sys; from fsm.cli import main; sys.exit(main(sys.argv[1:]))"
"""``fsm ...`` in a child (the package has no ``__main__``)."""

REAPER = textwrap.dedent(
    f"""
    import logging, signal, sys, threading, time
    from datetime import timedelta

    from fsm.reaping import Reaper, ReaperConfig
    from stores.sql import SqlStore
    from test_timers.proc_lifecycles import Timed

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    url, prefix, leader = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    store = SqlStore(url, table_prefix=prefix, create=False)
    reaper = Reaper(store, [Timed], ReaperConfig(interval=timedelta(seconds={INTERVAL_S}), leader=leader))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    reaper.start()
    while reaper.ticks < 1:
        time.sleep(0.01)
    print(f"reaper {{reaper.owner}} ticked", flush=True)
    stop.wait()
    reaper.stop()
    store.close()
    print("reaper stopped", flush=True)
    """
)
"""A reaper as an application embeds it: ``Reaper(...).start()``, stopped by SIGTERM."""

CANCELLER = textwrap.dedent(
    """
    import json, sys, time
    from datetime import UTC, datetime
    from pathlib import Path

    from fsm import Engine, FsmError
    from stores.sql import SqlStore
    from test_timers.proc_lifecycles import Timed

    url, prefix, plan_path, out_path = sys.argv[1:5]
    store = SqlStore(url, table_prefix=prefix, create=False)
    engine = Engine(Timed, store, owner="canceller")
    offset = (store.now() - datetime.now(UTC)).total_seconds()  # the store's clock minus ours
    print("ready", flush=True)
    plan = Path(plan_path)
    while not plan.exists():
        time.sleep(0.01)
    outcomes = {}
    for entity_id, at in json.loads(plan.read_text()):
        wait = datetime.fromisoformat(at).timestamp() - (time.time() + offset)
        if wait > 0:
            time.sleep(wait)
        try:
            engine.fire(entity_id, "cancel")
            outcomes[entity_id] = "ok"
        except FsmError as err:  # the timer won: the entity is no longer waiting
            outcomes[entity_id] = type(err).__name__
    Path(out_path + ".tmp").write_text(json.dumps(outcomes))
    Path(out_path + ".tmp").rename(out_path)
    store.close()
    """
)
"""Fires ``cancel`` on each entity of the plan at its planned time (the store's clock)."""

WORKER = textwrap.dedent(
    f"""
    import logging, sys
    from datetime import timedelta

    from fsm import Engine
    from fsm.reaping import ReaperConfig
    from fsm.work import Worker
    from stores.sql import SqlStore
    from test_timers.proc_lifecycles import Timed

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    url, prefix = sys.argv[1:3]
    store = SqlStore(url, table_prefix=prefix, create=False)
    worker = Worker(
        Engine(Timed, store, owner="worker"),
        {{"running": lambda job: "finish", "finalizing": lambda job: "succeed"}},
        poll_interval=timedelta(milliseconds=20),
        reap=ReaperConfig(interval=timedelta(seconds={INTERVAL_S})),
    )
    print("ready", flush=True)
    worker.run(install_signals=True)
    store.close()
    """
)
"""A worker that claims (``start``) what is due, with its own embedded reaper."""

MOVE = re.compile(rf"INFO[ :]fsm\.reaper: ?{re.escape(KIND)} (\S+): waiting -> failed \(timeout\)")
"""The INFO line a reaper logs for each timer it fired (``fsm.reaping.service.MOVE_LINE``)."""


# -- children ----------------------------------------------------------------------------------


class Child(ChildProcess):
    """A child process with ``tests/`` on its path; output in ``directory/name.out``/``.err``."""

    def __init__(self, argv: list[str], directory: Path, name: str) -> None:
        self.name = name
        self.out = directory / f"{name}.out"
        self.err = directory / f"{name}.err"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *filter(None, sys.path)])}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=directory, env=env, stdout=out, stderr=err)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def tail(self) -> str:
        return f"--- {self.name} (rc {self.proc.poll()}):\n{self.stdout()[-1500:]}{self.stderr()[-2500:]}"

    def fired(self) -> list[str]:
        """The entities this child's reaper says it timed out, in its log's order."""
        return MOVE.findall(self.stderr())


def cli_reaper(target: SqlTarget, directory: Path, name: str, *, leader: bool, interval: float = INTERVAL_S) -> Child:
    argv = ["-c", CLI, "reaper", "--db", target.url, "--prefix", target.prefix, "--interval", str(interval)]
    argv += ["--lifecycle", LIFECYCLE_REF] + (["--leader"] if leader else [])
    return Child(argv, directory, name)


def reaper_owner(child: Child) -> str:
    """The owner id a reaper child printed when it started (``reaper <owner> on ...``)."""
    found = re.search(r"^reaper (\S+) ", child.stdout(), re.MULTILINE)
    assert found, child.tail()
    return found.group(1)


def wait_for(predicate: Callable[[], object], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + PATIENT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PATIENT} s: {what()}")


def wait_ready(children: Iterable[Child], marker: str) -> None:
    """Wait until each child printed ``marker`` (and fail at once if one exits instead)."""
    for child in children:
        wait_for(functools.partial(_printed_or_exited, child, marker), child.tail)
        assert child.proc.poll() is None, child.tail()


def _printed_or_exited(child: Child, marker: str) -> bool:
    return marker in child.stdout() or child.proc.poll() is not None


def logs(children: Iterable[Child]) -> str:
    return "\n".join(child.tail() for child in children)


# -- the store's view ----------------------------------------------------------------------------


def create_staggered(engine: Engine, batches: int, size: int, pause: float = 0.03) -> dict[str, Snapshot]:
    """``batches`` creates of ``size`` entities a little apart: the timers fall due one
    batch after another, not all at one instant."""
    made: dict[str, Snapshot] = {}
    for _ in range(batches):
        made |= {snap.id: snap for snap in engine.create_many([{}] * size)}
        time.sleep(pause)
    return made


def due(snap: Snapshot) -> datetime:
    """When ``snap``'s timer falls due, by the store's clock."""
    assert snap.timer_since is not None, snap
    return snap.timer_since + AFTER


def settled(engine: Engine, total: int, states: tuple[str, ...] = ("failed",)) -> bool:
    counts = engine.counts()
    return sum(counts[s] for s in states) == total


def histories(store: Store, ids: Iterable[str]) -> dict[str, list[HistoryRecord]]:
    return {entity_id: store.history(entity_id) for entity_id in ids}


def assert_timed_out_once(
    store: Store, made: dict[str, Snapshot], found: dict[str, list[HistoryRecord]], not_before: datetime | None = None
) -> None:
    """Each entity of ``made`` failed by exactly one ``timeout`` (its only transition), at
    or after its due time by the store's times (and after ``not_before`` when given)."""
    rows = {snap.id: snap for snap in store.entities(KIND, limit=10_000)}
    for entity_id, created in made.items():
        history = found[entity_id]
        assert [(h.event, h.source, h.target, h.actor, h.reason) for h in history] == [
            ("timeout", "waiting", "failed", "reaper", "timed out")
        ], (entity_id, history)
        row = rows[entity_id]
        assert (row.state, row.timer_since) == ("failed", None), row
        fired = history[0].at
        assert fired >= due(created), f"{entity_id} timed out early: at {fired}, due {due(created)}"
        assert fired >= row.created_at + AFTER, (fired, row.created_at)
        if not_before is not None:
            assert fired >= not_before, (entity_id, fired, not_before)


def assert_reapers_agree(reapers: Iterable[Child], timed_out: set[str]) -> None:
    """What the reapers' logs say they fired: every timed-out entity once, in one reaper,
    and nothing else (a reaper never counts a move another one made)."""
    fired = Counter(entity_id for child in reapers for entity_id in child.fired())
    twice = {entity_id: n for entity_id, n in fired.items() if n > 1}
    assert not twice, f"timers the reapers say they fired more than once: {twice}"
    assert set(fired) == timed_out, (
        f"logged but not in the history: {sorted(set(fired) - timed_out)[:10]}; "
        f"in the history but not logged: {sorted(timed_out - set(fired))[:10]}"
    )


def leader_of(store: Store) -> str | None:
    rows = {snap.id: snap.lease_owner for snap in store.entities(LEADER_KIND, limit=100)}
    return rows.get(leader_key(KIND))


# -- 1. three reapers racing -------------------------------------------------------------------


@pytest.mark.parametrize("leader", [False, True], ids=["free-for-all", "leader"])
def test_three_reaper_processes_fire_every_timer_exactly_once_and_never_early(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child], leader: bool
) -> None:
    store = sql_target.store()  # creates the tables: the CLI reaper opens the store without creating any
    engine = Engine(Timed, store, owner="test")
    # with a leader: a long interval, so its lease (3 intervals) outlives any stall of the
    # machine and one process leads throughout (its loop still wakes for every timer)
    interval = LEADER_INTERVAL_S if leader else INTERVAL_S
    reapers = [cli_reaper(sql_target, tmp_path, f"reaper{i}", leader=leader, interval=interval) for i in range(3)]
    children += reapers
    wait_ready(reapers, "tick 1 ")

    made = create_staggered(engine, batches=20, size=ENTITIES // 20)
    assert len(made) == ENTITIES
    wait_for(lambda: settled(engine, ENTITIES), lambda: f"{engine.counts()}\n{logs(reapers)}")
    owners = {reaper_owner(child) for child in reapers}
    if leader:
        assert leader_of(store) in owners, logs(reapers)
    for child in reapers:
        child.stop()
    assert [child.proc.returncode for child in reapers] == [0, 0, 0], logs(reapers)

    assert_timed_out_once(store, made, histories(store, made))
    assert_reapers_agree(reapers, set(made))
    if leader:  # only the leader fired; the standbys moved nothing
        assert sum(1 for child in reapers if child.fired()) == 1, logs(reapers)
        assert leader_of(store) is None  # it resigned on its way out


# -- 2. a reaper killed before the timers are due, another started after -------------------------


@pytest.mark.parametrize("leader", [False, True], ids=["free-for-all", "leader"])
def test_timers_pending_when_the_reaper_is_killed_fire_once_after_a_restart(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child], leader: bool
) -> None:
    store = sql_target.store()
    engine = Engine(Timed, store, owner="test")
    first = cli_reaper(sql_target, tmp_path, "first", leader=leader)
    children.append(first)
    wait_ready([first], "tick 1 ")
    if leader:
        wait_for(lambda: leader_of(store) == reaper_owner(first), lambda: logs([first]))

    made = create_staggered(engine, batches=4, size=ENTITIES // 4, pause=0.0)
    first.kill()  # SIGKILL: a leader keeps its lease until it runs out
    killed_at = store.now()
    earliest = min(due(snap) for snap in made.values())
    assert killed_at < earliest, f"the machine stalled: the kill came at {killed_at}, past the first due {earliest}"
    assert first.fired() == []

    latest = max(due(snap) for snap in made.values())
    wait_for(lambda: store.now() > latest, lambda: f"the store's clock never passed {latest}")
    # every timer is due, and nobody fired one: the only reaper is dead
    assert engine.counts()["waiting"] == ENTITIES
    assert all(h == [] for h in histories(store, made).values())

    restarted_at = store.now()
    second = cli_reaper(sql_target, tmp_path, "second", leader=leader)
    children.append(second)
    wait_for(lambda: settled(engine, ENTITIES), lambda: f"{engine.counts()}\n{logs([first, second])}")
    if leader:  # it took over the dead leader's lease (after it ran out) to fire them
        assert leader_of(store) == reaper_owner(second), logs([second])
    second.stop()
    assert (first.proc.returncode, second.proc.returncode) == (-signal.SIGKILL, 0), logs([first, second])

    assert_timed_out_once(store, made, histories(store, made), not_before=restarted_at)
    assert_reapers_agree([first, second], set(made))


# -- 3. the leaving transition racing the timer ----------------------------------------------------


def test_a_cancel_racing_the_timer_wins_or_loses_whole(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    """Three ``Reaper(...).start()`` processes and a process firing ``cancel`` on each
    entity within a few tens of milliseconds of its due time: each entity is cancelled or
    timed out, never both, and the canceller's answer agrees with the history."""
    store = sql_target.store()
    engine = Engine(Timed, store, owner="test")
    reapers = [Child(["-c", REAPER, sql_target.url, sql_target.prefix, "0"], tmp_path, f"reaper{i}") for i in range(3)]
    plan_path, out_path = tmp_path / "plan.json", tmp_path / "cancelled.json"
    canceller = Child(
        ["-c", CANCELLER, sql_target.url, sql_target.prefix, str(plan_path), str(out_path)], tmp_path, "c"
    )
    children += [*reapers, canceller]
    wait_ready(reapers, "ticked")
    wait_ready([canceller], "ready")

    made = create_staggered(engine, batches=20, size=ENTITIES // 20)
    jitter = random.Random(20240611)
    plan = sorted(
        ((entity_id, due(snap) + timedelta(milliseconds=jitter.uniform(-40, 40))) for entity_id, snap in made.items()),
        key=lambda item: item[1],
    )
    (tmp_path / "plan.tmp").write_text(json.dumps([(entity_id, at.isoformat()) for entity_id, at in plan]))
    (tmp_path / "plan.tmp").rename(plan_path)

    everyone = [*reapers, canceller]
    wait_for(lambda: out_path.exists() or canceller.proc.poll() is not None, lambda: logs(everyone))
    assert out_path.exists(), logs(everyone)
    wait_for(lambda: settled(engine, ENTITIES), lambda: f"{engine.counts()}\n{logs(everyone)}")
    for child in everyone:
        child.stop()
    assert [child.proc.returncode for child in everyone] == [0, 0, 0, 0], logs(everyone)

    answers: dict[str, str] = json.loads(out_path.read_text())
    found = histories(store, made)
    events = {entity_id: [h.event for h in history] for entity_id, history in found.items()}
    cancelled = {entity_id for entity_id, e in events.items() if e == ["cancel"]}
    timed_out = {entity_id for entity_id, e in events.items() if e == ["timeout"]}
    both_or_neither = {entity_id: e for entity_id, e in events.items() if entity_id not in cancelled | timed_out}
    assert not both_or_neither, f"entities without exactly one of cancel and timeout: {both_or_neither}"
    assert {entity_id for entity_id, answer in answers.items() if answer == "ok"} == cancelled
    refusals = Counter(answer for answer in answers.values() if answer != "ok")
    # a cancel that lost found the entity failed (TransitionNotAllowed), or read it waiting and
    # lost the compare-and-set to the timer (StaleVersion: a fire by id on a timed chart reads
    # first); either way a refusal wrote nothing
    assert set(refusals) <= {"TransitionNotAllowed", "StaleVersion"}, refusals
    assert_timed_out_once(store, {i: made[i] for i in timed_out}, found)
    assert_reapers_agree(reapers, timed_out)
    print(f"cancelled {len(cancelled)}, timed out {len(timed_out)} of {ENTITIES}")


def test_a_workers_claim_racing_the_timer_wins_or_loses_whole(
    sql_target: SqlTarget, tmp_path: Path, children: list[Child]
) -> None:
    """Entities a claim may take from their due time on (``run_after`` = the timer), a
    worker with its own reaper and two ``fsm reaper`` processes: each entity is started
    (and then completed) or timed out, never both, never started before it was due."""
    store = sql_target.store()
    engine = Engine(Timed, store, owner="test")
    reapers = [cli_reaper(sql_target, tmp_path, f"reaper{i}", leader=False) for i in range(2)]
    worker = Child(["-c", WORKER, sql_target.url, sql_target.prefix], tmp_path, "worker")
    everyone = [*reapers, worker]
    children += everyone
    wait_ready(reapers, "tick 1 ")
    wait_ready([worker], "ready")
    # the worker leads its kind's reaping before the timers are due: its reaper races too
    wait_for(lambda: leader_of(store) == "worker", lambda: logs(everyone))

    made: dict[str, Snapshot] = {}
    for _ in range(ENTITIES):
        snap = engine.create(run_after=AFTER)
        assert snap.run_after == due(snap), snap  # claimable exactly when its timer falls due
        made[snap.id] = snap
    wait_for(lambda: settled(engine, ENTITIES, ("failed", "done")), lambda: f"{engine.counts()}\n{logs(everyone)}")
    for child in everyone:
        child.stop()
    assert [child.proc.returncode for child in everyone] == [0, 0, 0], logs(everyone)

    found = histories(store, made)
    events = {entity_id: [h.event for h in history] for entity_id, history in found.items()}
    started = {entity_id for entity_id, e in events.items() if e == ["start", "finish", "succeed"]}
    timed_out = {entity_id for entity_id, e in events.items() if e == ["timeout"]}
    both_or_neither = {entity_id: e for entity_id, e in events.items() if entity_id not in started | timed_out}
    assert not both_or_neither, f"entities without exactly one of start and timeout: {both_or_neither}"
    for entity_id in started:
        claimed = found[entity_id][0]
        assert claimed.at >= due(made[entity_id]), (entity_id, claimed, made[entity_id])
        assert claimed.owner == "worker", claimed
    rows = {snap.id: snap.state for snap in store.entities(KIND, limit=10_000)}
    assert {rows[i] for i in started} <= {"done"} and {rows[i] for i in timed_out} <= {"failed"}
    assert_timed_out_once(store, {i: made[i] for i in timed_out}, found)
    assert_reapers_agree(everyone, timed_out)
    print(f"started {len(started)}, timed out {len(timed_out)} of {ENTITIES}")
