"""Durable work with real processes: claims from 8 processes, and seeds/002 end to end.

The child processes are :mod:`fsm.demo.proc` (the demo runs the same code); SIGKILL,
SIGSTOP and SIGCONT are real signals.  Each scenario runs on a SQLite file and on
PostgreSQL (skipped without ``FSM_TEST_POSTGRES_URL``).  Timings are short (a 2 s TTL, a
reaper tick every 0.3 s) but no test asserts a duration: waits have generous timeouts,
and the one bound checked (I2: reclaimed within TTL + interval) allows a 10 s slack for a
loaded machine.  The three seeds/002 scenarios share one stage per database (their six
worker processes start together) to keep the suite fast.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SqlTarget, postgres_url

from fsm import Engine, JobLifecycle
from fsm.demo.checks import broken, check_history, check_story
from fsm.demo.proc import GATES
from fsm.demo.scenario import QUICK, SCENARIOS, JobStory, Stage
from stores.sql import SqlStore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@dataclass
class Run:
    url: str
    prefix: str
    directory: Path
    stories: dict[str, JobStory]

    def store(self) -> SqlStore:
        return SqlStore(self.url, table_prefix=self.prefix, create=False)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def seeds002(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The three seeds/002 scenarios, run once per database with real worker processes."""
    directory = tmp_path_factory.mktemp(f"seeds002-{request.param}")
    if request.param == "sqlite":
        target = SqlTarget("sqlite", f"sqlite:///{directory}/fsm.db", "fsm_")
    else:
        target = SqlTarget("postgres", postgres_url(), f"t{uuid.uuid4().hex[:10]}_")
    stories: dict[str, JobStory] = {}
    try:
        with Stage(target.url, target.prefix, directory / "run", QUICK) as stage:
            stage.prepare(list(SCENARIOS))
            for name, scenario in SCENARIOS.items():
                stories[name] = scenario(stage)
        yield Run(target.url, target.prefix, directory / "run", stories)
    finally:
        target.close()


def gate_counts(story: JobStory) -> dict[str, int]:
    return {gate: story.executed(gate) for gate in GATES}


def assert_no_invariant_broken(run: Run, story: JobStory) -> None:
    store = run.store()
    try:
        snap = store.get(story.job_id)
        findings = check_story(story, QUICK) + check_history(
            story.job_id, store.history(story.job_id), snap.version, JobLifecycle.table.finals
        )
    finally:
        store.close()
    assert not broken(findings), "\n".join(map(str, broken(findings)))


def test_seeds002_slow_but_alive_each_gate_runs_once_and_the_reaper_touches_nothing(seeds002: Run) -> None:
    story = seeds002.stories["slow"]
    assert story.state == "completed"
    assert [r.event for r in story.history] == ["start", "exited", "complete"]  # nothing rolled back or reclaimed
    assert gate_counts(story) == dict.fromkeys(GATES, 1)
    assert all(story.recorded(g) == 1 for g in GATES)
    # the finalization outlasted the TTL many times over: only the keeper's renewals kept it
    finalizing = story.rows("exited")[0].at.timestamp()
    done = story.rows("complete")[0].at.timestamp()
    assert done - finalizing > 3 * QUICK.ttl
    assert len(story.of("renewed")) >= 3
    assert len(story.ticks) >= 5  # the reaper ticked all along, and moved nothing of it
    assert not [r for r in story.history if r.actor == "reaper"]
    assert story.of("claimed", who="slow-worker-b") == []  # the standby found nothing to claim
    assert_no_invariant_broken(seeds002, story)


def test_seeds002_a_killed_finalizer_is_reclaimed_claimed_by_another_process_and_completed_once(
    seeds002: Run,
) -> None:
    story = seeds002.stories["killed"]
    assert story.state == "completed"
    assert [r.event for r in story.history] == ["start", "exited", "reclaim", "complete"]
    reclaim, complete = story.rows("reclaim")[0], story.rows("complete")[0]
    assert reclaim.actor == "reaper" and reclaim.reason == "reclaimed"
    # I2: reclaimed once the lease lapsed, within TTL + interval (and a slack for a loaded machine)
    lapse = story.lapse
    assert lapse is not None and lapse <= reclaim.at.timestamp()
    kill = story.marks[0][0]
    assert reclaim.at.timestamp() - kill <= QUICK.ttl + QUICK.interval + QUICK.slack
    # another worker process claimed it (token + 2: the reclaim fenced the dead holder with + 1)
    assert complete.lease_token == reclaim.lease_token + 1 == story.fenced_token + 2  # type: ignore[operator]
    assert story.of("claimed", who="killed-worker-b")[0]["token"] == complete.lease_token
    # gates 1-2 replayed from the ledger, 3-4 ran under the new owner
    replayed = [e["gate"] for e in story.of("gate-replayed", who="killed-worker-b")]
    assert replayed == list(GATES[:2])
    counts = gate_counts(story)
    assert counts[GATES[0]] == counts[GATES[1]] == 1
    assert sum(counts.values()) <= len(GATES) + len(story.in_flight)
    assert all(story.recorded(g) == 1 for g in GATES)  # one result row per gate
    assert_no_invariant_broken(seeds002, story)


def test_seeds002_a_paused_finalizers_writes_after_resuming_are_all_refused(seeds002: Run) -> None:
    story = seeds002.stories["paused"]
    assert story.state == "completed"
    assert [r.event for r in story.history] == ["start", "exited", "reclaim", "complete"]
    old = story.fenced_token
    stopped = story.marks[0][0]
    refused = story.of("refused", who="paused-worker-a")
    whats = {e["what"] for e in refused}
    # its gate's late result, the next gate, progress, complete and its keeper's renewal
    assert {f"result of {GATES[1]}", f"run of {GATES[2]}", "progress", "complete", "renewal"} <= whats
    assert {e["error"] for e in refused} <= {"LeaseLost", "EntityMovedOn"}
    assert story.of("accepted") == []
    # nothing it did after resuming was recorded: no effect, no history row, no execution
    assert all(e.lease_token != old for e in story.effects if e.key != GATES[0])
    assert [r.event for r in story.history if r.lease_token == old] == ["start", "exited"]
    assert all(t < stopped for t, _, who, token in story.executions if token == old)
    assert not [t for t, gate, who, token in story.executions if token == old and gate == GATES[2]]
    # its in-flight gate ran twice (at least once, recorded once), under the new owner's token
    assert gate_counts(story)[GATES[1]] == 2 and story.recorded(GATES[1]) == 1
    store = seeds002.store()
    try:
        progress = Engine(JobLifecycle, store).progress(story.job_id)
        effect = store.effect(story.job_id, GATES[1])
    finally:
        store.close()
    assert effect is not None and effect.lease_token == story.history[-1].lease_token
    assert progress != {"gate": "late"}
    assert_no_invariant_broken(seeds002, story)


# -- claim with 8 processes -----------------------------------------------------------------


def test_claims_from_8_processes_take_every_entity_exactly_once_per_token(
    sql_target: SqlTarget, tmp_path: Path
) -> None:
    """Queued jobs (started by the claim) and reclaimed finalizers (resumed by it), claimed
    by 8 processes at once: each exactly once, with the token the store holds."""
    directory = tmp_path / "run"
    with Stage(sql_target.url, sql_target.prefix, directory, QUICK) as stage:
        stage._stop.set()  # no reaper ticks here: this test reclaims by hand
        engine = stage.engine
        queued = [f"q{i:03d}" for i in range(80)]
        resumed = [f"r{i:03d}" for i in range(20)]
        for entity_id in resumed:  # finalizers whose holder died, reclaimed by the reaper
            engine.create(entity_id)
        for snap in engine.claim(len(resumed), owner="dead"):
            assert snap.lease is not None
            engine.fire(snap.id, "exited", lease=snap.lease)
        for entity_id in queued:
            engine.create(entity_id)
        time.sleep(QUICK.ttl + 0.1)
        moved = stage.reaper.run_once()
        assert moved.moved["job.reclaim"] == len(resumed)
        go = directory / "go"
        claimers = [stage.spawn("claimer", f"claimer-{i}", go=str(go)) for i in range(8)]
        stage.wait_until(lambda: all(stage.ready(c) for c in claimers), "claimers start")
        go.touch()
        for child in claimers:
            assert child.wait(QUICK.timeout) == 0, child.output.read_text()
        got: list[tuple[str, int, str, str]] = []
        for child in claimers:
            rows = json.loads((directory / f"claims-{child.name}.json").read_text())
            got += [(entity_id, token, state, child.name) for entity_id, token, state in rows]
        per_entity = Counter(entity_id for entity_id, *_ in got)
        assert set(per_entity) == set(queued) | set(resumed)
        assert max(per_entity.values()) == 1, [e for e, n in per_entity.items() if n > 1]
        assert len({who for *_, who in got}) > 1  # the claims really were spread over processes
        for entity_id, token, state, who in got:
            snap = engine.get(entity_id)
            assert (snap.lease_owner, snap.lease_token) == (who, token)
            if entity_id in queued:
                assert token == 1 and state == "running"
                assert [(r.event, r.lease_token) for r in engine.history(entity_id)] == [("start", 1)]
            else:
                assert token == 3 and state == "finalizing"  # dead holder 1, reclaim 2, claim 3
        counts = engine.counts()
        assert counts["queued"] == 0  # nothing claimable left behind
        assert not [s for s in engine.entities(state="finalizing", limit=1000) if s.lease_owner is None]
        assert engine.claim(10, owner="late") == []
