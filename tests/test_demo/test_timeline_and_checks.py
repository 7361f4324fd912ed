"""The demo's timeline picture and invariant checks, on hand-made stories (no processes)."""

from __future__ import annotations

from datetime import UTC, datetime
from xml.etree import ElementTree

from fsm.demo.checks import broken, check_history, check_story
from fsm.demo.proc import GATES
from fsm.demo.scenario import QUICK, JobStory
from fsm.demo.timeline import timeline_svg
from fsm.records import EffectRecord, HistoryRecord

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_800_000_000.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, UTC)


def row(seq: int, event: str, source: str, target: str, actor: str, token: int, t: float) -> HistoryRecord:
    reason = "reclaimed" if event == "reclaim" else None
    return HistoryRecord("j", seq, event, source, target, actor, token, reason, None, at(t))


def story(job_id: str = "job-1", *, reclaim_at: float = 2.0, late_record: bool = False) -> JobStory:
    """A killed finalizer: token 1 dies after gate 2, the reaper reclaims (2), a worker claims (3)."""
    history = [
        row(1, "start", "queued", "running", "worker", 1, 0.1),
        row(2, "exited", "running", "finalizing", "worker", 1, 0.2),
        row(3, "reclaim", "finalizing", "finalizing", "reaper", 2, reclaim_at),
        row(4, "complete", "finalizing", "completed", "worker", 3, 3.5),
    ]
    tokens = {GATES[0]: 1, GATES[1]: 1, GATES[2]: 3, GATES[3]: 3}
    done = {GATES[0]: 0.5, GATES[1]: 1.0, GATES[2]: 2.8, GATES[3]: 3.2}  # killed at 1.2 s
    effects = [
        EffectRecord("j", g, "succeeded", 1 if late_record and g == GATES[2] else tok, 1, {}, at(done[g]))
        for g, tok in tokens.items()
    ]
    executions = [(T0 + done[g] - 0.2, g, "w-a" if tok == 1 else "w-b", tok) for g, tok in tokens.items()]
    events = [
        {"t": T0 + 0.1, "ev": "claimed", "who": "w-a", "job": job_id, "token": 1, "expires": T0 + 1.1},
        {"t": T0 + 0.4, "ev": "renewed", "who": "w-a", "job": job_id, "token": 1, "expires": T0 + 1.4},
        {"t": T0 + 0.3, "ev": "gate-start", "who": "w-a", "job": job_id, "gate": GATES[0], "token": 1},
        {"t": T0 + 2.1, "ev": "claimed", "who": "w-b", "job": job_id, "token": 3, "expires": T0 + 3.1},
        {"t": T0 + 2.2, "ev": "gate-replayed", "who": "w-b", "job": job_id, "gate": GATES[0], "token": 3},
    ]
    return JobStory(
        name="killed",
        title='a <killed> & "escaped" finalizer',
        job_id=job_id,
        t0=T0,
        t_end=T0 + 4.0,
        state="completed",
        history=history,
        effects=effects,
        executions=executions,
        events=events,
        ticks=[(T0 + 0.2 * i, {}) for i in range(20)],
        workers={"w-a": 10, "w-b": 11},
        marks=[(T0 + 1.2, "SIGKILL", "w-a")],
        in_flight=[],
        fenced_token=1,
    )


def test_the_timeline_is_well_formed_svg_with_every_text_escaped() -> None:
    job_id = "job-<1>&'\""
    root = ElementTree.fromstring(timeline_svg(story(job_id)))
    assert root.tag == f"{SVG}svg"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert f'a <killed> & "escaped" finalizer: {job_id}' in texts
    assert "SIGKILL" in texts and "reclaim (t2)" in texts
    assert len(list(root.iter(f"{SVG}polygon"))) == 1  # one reaper move


def test_the_checks_pass_a_clean_story_and_name_what_broke() -> None:
    assert not broken(check_story(story(), QUICK))
    early = broken(check_story(story(reclaim_at=1.0), QUICK))  # reclaimed while the lease was fresh
    assert [f.invariant for f in early] == ["I1"]
    late = broken(check_story(story(late_record=True), QUICK))  # the fenced token recorded after the kill
    assert [f.invariant for f in late] == ["I3"]
    gap = [row(1, "start", "queued", "running", "worker", 1, 0), row(3, "complete", "running", "completed", "w", 1, 1)]
    assert [f.invariant for f in broken(check_history("j", gap, 3, {"completed"}))] == ["I6"]
