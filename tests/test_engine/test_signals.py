"""Signals: sent after the commit, typed payloads with the full snapshot, failing receivers isolated."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import signals
from fsm import Engine, Fenced, LeaseLost, ManualClock
from signals import LeasePayload, TransitionPayload


@pytest.fixture
def received() -> Iterator[list[tuple[str, str, Any]]]:
    got: list[tuple[str, str, Any]] = []
    hooks = []
    for name in ("transitioned", "expired", "reclaimed", "lease_acquired", "lease_renewed", "lease_lost"):
        sig = getattr(signals, name)

        def hook(sender: str, payload: Any, _name: str = name) -> None:
            got.append((_name, sender, payload))

        sig.connect(hook)
        hooks.append((sig, hook))
    yield got
    for sig, hook in hooks:
        sig.disconnect(hook)


def test_every_signal_is_documented_in_one_namespace() -> None:
    names = {
        "transitioned",
        "expired",
        "reclaimed",
        "lease_acquired",
        "lease_renewed",
        "lease_lost",
        "effect_recorded",
        "reaper_tick",
        "reaper_error",
    }
    assert names <= set(signals.namespace)
    for name in names:
        assert signals.namespace[name].__doc__, name


def test_transitioned_carries_the_committed_snapshot_with_its_steps(
    pipelines: Engine, clock: ManualClock, received: list[tuple[str, str, Any]]
) -> None:
    committed: list[int] = []

    def check_commit(sender: str, payload: TransitionPayload) -> None:
        # sent after the commit: the store already shows what the payload reports
        committed.append(pipelines.store.get(payload.snapshot.id).version)

    signals.transitioned.connect(check_commit)
    try:
        pipelines.create("p1", data={"steps": [{"name": "build", "status": "running"}]})
        pipelines.fire("p1", "start")
        clock.advance(timedelta(minutes=61))
        pipelines.fire("p1", "expire", actor="reaper")
    finally:
        signals.transitioned.disconnect(check_commit)
    assert committed == [1, 2]
    kinds = [(name, sender) for name, sender, _ in received]
    assert kinds == [("transitioned", "pipeline"), ("transitioned", "pipeline"), ("expired", "pipeline")]
    payload = received[-1][2]
    assert isinstance(payload, TransitionPayload)
    assert payload.snapshot.state == "failed" and payload.record.reason == "expired"
    as_json = json.loads(payload.model_dump_json())
    assert as_json["snapshot"]["data"]["steps"] == [{"name": "build", "status": "failed"}]  # expire fails it


def test_lease_signals_on_acquire_reclaim_and_lost_renewal(
    jobs: Engine, clock: ManualClock, received: list[tuple[str, str, Any]]
) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    jobs.fire("j1", "exited", lease=lease)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "reclaim", actor="reaper")
    with pytest.raises(LeaseLost):
        jobs.renew_lease(lease)
    (claimed,) = jobs.claim(owner="rescuer")
    names = [name for name, _, _ in received]
    assert names == [
        "transitioned",
        "lease_acquired",
        "transitioned",
        "transitioned",
        "reclaimed",  # the reaper fences: no lease is acquired by it
        "lease_lost",
        "lease_acquired",  # the claim
    ]
    reclaimed = received[4][2]
    assert isinstance(reclaimed, TransitionPayload) and reclaimed.snapshot.lease_owner is None
    assert reclaimed.snapshot.lease_token == lease.token + 1
    acquired = received[-1][2]
    assert isinstance(acquired, LeasePayload) and acquired.owner == "rescuer" and acquired.token == lease.token + 2
    lost = received[-2][2]
    assert isinstance(lost, LeasePayload) and lost.token == lease.token and lost.owner == lease.owner


def test_a_receiver_that_raises_is_logged_and_changes_nothing(
    pipelines: Engine, caplog: pytest.LogCaptureFixture, received: list[tuple[str, str, Any]]
) -> None:
    def broken(sender: str, payload: Any) -> None:
        raise RuntimeError("websocket down")

    signals.transitioned.connect(broken)
    try:
        pipelines.create("p1")
        with caplog.at_level(logging.ERROR, logger="fsm.signals"):
            result = pipelines.fire("p1", "start")
    finally:
        signals.transitioned.disconnect(broken)
    assert result.state == "running" and pipelines.get("p1").version == 1
    assert any("websocket down" in (r.exc_text or "") for r in caplog.records)
    assert [name for name, _, _ in received] == ["transitioned"]  # the other receiver still ran


def test_no_payload_is_built_when_nobody_listens(pipelines: Engine) -> None:
    built: list[int] = []
    assert signals.send(signals.expired, "pipeline", lambda: built.append(1)) == 0
    assert built == []


def test_a_payload_that_cannot_be_built_is_logged_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    def receiver(sender: str, payload: Any) -> None:
        raise AssertionError("must not be called without a payload")

    def broken() -> Any:
        raise ValueError("cannot serialise")

    signals.transitioned.connect(receiver)
    try:
        with caplog.at_level(logging.ERROR, logger="fsm.signals"):
            assert signals.send(signals.transitioned, "job", broken) == 1
    finally:
        signals.transitioned.disconnect(receiver)
    assert "could not be built" in caplog.text


def test_lease_lost_is_sent_when_a_fenced_off_holder_fires_or_releases(
    jobs: Engine, clock: ManualClock, received: list[tuple[str, str, Any]]
) -> None:
    jobs.create("j1")
    old = jobs.fire("j1", "start").lease
    assert old is not None
    jobs.fire("j1", "exited", lease=old)
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))
    jobs.fire("j1", "reclaim", actor="reaper")
    jobs.claim(owner="rescuer")
    received.clear()
    with pytest.raises(Fenced):
        jobs.fire("j1", "complete", lease=old)
    with pytest.raises(LeaseLost):
        jobs.release_lease(old)
    assert [name for name, _, _ in received] == ["lease_lost", "lease_lost"]
    payload = received[0][2]
    assert (
        isinstance(payload, LeasePayload) and payload.token == old.token and payload.snapshot.lease_owner == "rescuer"
    )


def test_lease_renewed_is_sent_after_each_renewal_with_the_new_expiry_and_never_for_a_refused_one(
    jobs: Engine, clock: ManualClock, received: list[tuple[str, str, Any]]
) -> None:
    jobs.create("j1")
    lease = jobs.fire("j1", "start").lease
    assert lease is not None
    received.clear()
    clock.advance(seconds=5)
    renewed = jobs.renew_lease(lease)
    assert renewed.expires_at > lease.expires_at
    assert [(name, sender) for name, sender, _ in received] == [("lease_renewed", "job")]
    payload = received[0][2]
    assert isinstance(payload, LeasePayload)
    assert (payload.entity_id, payload.owner, payload.token) == ("j1", lease.owner, lease.token)
    assert payload.lease is not None and payload.lease.expires_at == renewed.expires_at
    assert payload.snapshot is not None and payload.snapshot.lease_expires_at == renewed.expires_at
    assert jobs.get("j1").lease_expires_at == renewed.expires_at  # sent after the commit
    received.clear()
    clock.advance(jobs.policy.lease_ttl + timedelta(seconds=1))  # lapsed: the renewal is refused
    with pytest.raises(LeaseLost):
        jobs.renew_lease(renewed)
    assert [name for name, _, _ in received] == ["lease_lost"]


def test_payload_models_mirror_every_field_of_the_records_they_carry() -> None:
    """A field added to a record must reach the JSON a bridge forwards, not be dropped."""
    from fsm.records import HistoryRecord, Lease, Snapshot
    from signals import HistoryModel, LeaseModel, SnapshotModel

    for model, record in ((SnapshotModel, Snapshot), (HistoryModel, HistoryRecord), (LeaseModel, Lease)):
        assert tuple(model.model_fields) == record._fields, model.__name__
