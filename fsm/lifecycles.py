"""The built-in lifecycles: worked examples of DESIGN section 3.

Both share ``queued -> active{running -> finalizing} -> completed | failed``.

- :class:`PipelineLifecycle` (seeds/000): a CI/CD pipeline with steps, fed by webhooks.
  A lost webhook leaves it running; the reaper expires it once idle for ``stale_after``,
  and supersedes older running pipelines of the same concurrency key.
- :class:`JobLifecycle` (seeds/002): an agent run followed by side-effecting gates.  The
  worker holds a lease from ``start``; a finalizer that stops renewing is reclaimed (a new
  owner, token + 1) and only expired once its reclaims are spent.  Nothing leaves
  ``finalizing`` while its lease is fresh.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from statemachine import State

from fsm.definition_rules import operator_override
from fsm.lifecycle import Lifecycle, reaper, recovery, retries, starts, worker
from fsm.policy import Policy
from fsm.records import LeaseChange, SetItems

StepStatus = Literal["queued", "running", "completed", "failed", "skipped"]


class PipelineStep(BaseModel):
    """One step of a pipeline, with its own status (the dashboard shows them)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    status: StepStatus = "queued"


class PipelineData(BaseModel):
    """Data of a pipeline entity."""

    model_config = ConfigDict(extra="allow")

    steps: list[PipelineStep] = Field(default_factory=list)


FAIL_RUNNING_STEPS = SetItems(key="steps", field="status", when=("running",), value="failed")
"""A failed pipeline's running steps fail with it (seeds/000: a dashboard must not show
live steps in a dead pipeline); declared on the reaper's ``expire`` and ``supersede``, and
on the operator's ``cancel``."""

RESET_STEPS = SetItems(key="steps", field="status", when=("running", "completed", "failed", "skipped"), value="queued")
"""A pipeline retried as a new entity (``resubmit``) starts with every step queued again."""


class PipelineLifecycle(Lifecycle):
    """A CI/CD pipeline (seeds/000); reasons recorded: ``expired``, ``duplicate``, and an
    operator's ``cancelled`` (``cancel``, from queued or running, never from a finalizer
    that may be deploying) and retry (``resubmit``: the first transition of a new pipeline
    that retries a failed one, :mod:`fsm.inspect.retry`).  No lease to release: a running
    pipeline holds none, and a released finalizer would wait for a finisher nobody sends."""

    kind = "pipeline"
    data_model = PipelineData
    policy = Policy(
        stale_after=timedelta(minutes=60),
        lease_ttl=timedelta(minutes=2),
        renewal_budget={"finalizing": timedelta(hours=2)},
    )

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing), lease=LeaseChange.ACQUIRE)
    succeed = worker(active.finalizing.to(completed, cond="holds_lease"))
    fail = worker(active.finalizing.to(failed, cond="holds_lease")) | worker(active.running.to(failed))
    expire = reaper(
        active.running.to(failed, cond="lease_stale"), reason="expired", changes=[FAIL_RUNNING_STEPS]
    ) | reaper(active.finalizing.to(failed, cond="lease_stale"), reason="expired", changes=[FAIL_RUNNING_STEPS])
    supersede = reaper(active.running.to(failed, cond="superseded"), reason="duplicate", changes=[FAIL_RUNNING_STEPS])
    cancel = operator_override(
        queued.to(failed) | active.running.to(failed), reason="cancelled", changes=[FAIL_RUNNING_STEPS]
    )
    resubmit = operator_override(queued.to.itself(), reason="retry", changes=[RESET_STEPS])  # type: ignore[no-untyped-call]


class GateResult(BaseModel):
    """The outcome of one side-effecting gate (security, merge-gate, coverage...)."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["passed", "failed"]
    detail: str | None = None


class JobData(BaseModel):
    """Data of a job entity: the agent's exit code and the gates' results."""

    model_config = ConfigDict(extra="allow")

    exit_code: int | None = None
    gates: dict[str, GateResult] = Field(default_factory=dict)


class JobLifecycle(Lifecycle):
    """An agent job (seeds/002); reasons recorded: ``expired``, ``reclaimed``,
    ``unclaimed`` (the waiting backstop), ``error`` (a handler's attempts spent).

    A handler error retries (``retry``: running back to the queue, a finalizer back to
    itself, each due after its backoff) under the policy's :class:`~fsm.policy.RetryPolicy`;
    a dead holder is requeued or reclaimed (:func:`~fsm.lifecycle.recovery`).

    Operator overrides (``fsm inspect --allow-actions``): ``cancel`` fails a queued or
    running job (its holder is fenced); ``release`` takes the lease from its holder (fenced
    too) and gives the work back: a running job to the queue, a finalizer to the next
    claim, which resumes it and replays its recorded effects, as after a reclaim.  A live
    finalizer is never cancelled: its side-effecting gates may be half done, and failing
    it is the split outcome seeds/002 is about; release it, or let its gates fail it.
    ``resubmit`` is the first transition of a new job that retries a failed one
    (:mod:`fsm.inspect.retry`)."""

    kind = "job"
    data_model = JobData
    policy = Policy(
        lease_ttl=timedelta(minutes=2),
        renewal_budget={"running": timedelta(hours=6), "finalizing": timedelta(hours=2)},
        max_attempts=3,
        max_reclaims=2,
    )

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = starts(queued.to(active))
    exited = worker(active.running.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(completed, cond="holds_lease"))
    fail = worker(active.finalizing.to(failed, cond="holds_lease")) | worker(
        active.running.to(failed, cond="holds_lease")
    )
    retry = retries(queued=queued, running=active.running, finalizing=active.finalizing)
    expire, reclaim = recovery(queued=queued, running=active.running, finalizing=active.finalizing, failed=failed)
    cancel = operator_override(queued.to(failed) | active.running.to(failed), reason="cancelled")
    release = operator_override(
        active.running.to(queued) | active.finalizing.to.itself(),  # type: ignore[no-untyped-call]
        lease=LeaseChange.CLEAR,
        reason="released",
    )
    resubmit = operator_override(queued.to.itself(), reason="retry")  # type: ignore[no-untyped-call]


__all__ = [
    "FAIL_RUNNING_STEPS",
    "RESET_STEPS",
    "GateResult",
    "JobData",
    "JobLifecycle",
    "PipelineData",
    "PipelineLifecycle",
    "PipelineStep",
]
