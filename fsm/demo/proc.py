"""The child processes of the seeds/002 scenarios: ``fsm.demo.proc``.

Started through :mod:`multiprocessing` (:func:`child_main`) or as ``python -m
fsm.demo.proc '<json>'``.  Real processes, so that SIGKILL, SIGSTOP and SIGCONT are real signals and the store is
shared the way it is in production (SQLite file or PostgreSQL).  Two roles:

- ``worker``: an :class:`fsm.work.Worker` with a handler for ``running`` (the agent: it
  exits at once) and ``finalizing`` (four gates, each an effect of the ledger that sleeps
  and appends a line to ``gates.log``, so that executions are counted from outside).
  With ``stubborn``, a worker fenced in a gate goes on writing with its old lease
  (another gate, progress, ``complete``, a renewal) to show that every such write is
  refused.  It runs until SIGTERM (graceful stop).
- ``claimer``: claims in a loop, with random limits, until nothing is left, and writes
  what it got (id, token) to ``claims-<name>.json``.

Everything a child sees is appended to ``events.jsonl`` (one JSON object a line, with
the wall-clock time ``t``), which the parent reads for its progress line, its checks and
the timeline.  A child exits by itself when its parent is gone or its deadline passes,
so an interrupted demo leaves no process behind.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Collection, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from fsm.coordination import Limits
from fsm.engine import Engine
from fsm.errors import Fenced, FsmError
from fsm.lifecycles import GateResult, JobLifecycle
from fsm.policy import Policy
from fsm.records import Lease, Snapshot
from fsm.work import Job, Worker
from stores.sql import SqlStore

GATES = ("security", "merge-gate", "coverage", "image-freshness")
"""The edge gates of ``deploy-staging -> deploy`` in seeds/002, in order."""

EVENTS = "events.jsonl"
GATE_LOG = "gates.log"


class Log:
    """Appends events (one short JSON line each, written with one ``write`` on a file
    opened for appending, so lines of concurrent processes do not interleave)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / EVENTS
        self.gates = directory / GATE_LOG
        self.name = name
        self.pid = os.getpid()
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "ev": ev, "who": self.name, "pid": self.pid, **fields}) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)

    def gate(self, job: str, gate: str, token: int) -> None:
        """One execution of a gate, counted from outside: ``time job gate who pid token``."""
        line = f"{time.time():.3f} {job} {gate} {self.name} {self.pid} {token}\n"
        with self._lock, open(self.gates, "a", encoding="utf-8") as f:
            f.write(line)


class ObservedEngine(Engine):
    """An engine that logs its claims and every renewal (and refusal) to the event log,
    for the timeline: the keeper calls ``renew_lease`` on the engine it was given."""

    log: Log

    def claim(
        self,
        limit: int = 1,
        *,
        owner: str | None = None,
        into: Collection[str] | None = None,
        limits: Limits | None = None,
    ) -> list[Snapshot]:
        claimed = super().claim(limit, owner=owner, into=into, limits=limits)
        for snap in claimed:
            expires = snap.lease_expires_at.timestamp() if snap.lease_expires_at else None
            self.log("claimed", job=snap.id, token=snap.lease_token, state=snap.state, expires=expires)
        return claimed

    def renew_lease(self, lease: Lease, *, ttl: timedelta | float | None = None) -> Lease:
        try:
            new = super().renew_lease(lease, ttl=ttl)
        except Fenced as err:
            self.log("refused", job=lease.entity_id, token=lease.token, what="renewal", error=type(err).__name__)
            raise
        self.log("renewed", job=lease.entity_id, token=new.token, expires=new.expires_at.timestamp())
        return new

    def renew_leases(self, leases: Sequence[Lease]) -> list[Lease | FsmError]:
        """The worker's one keeper renews every lease at once: each answer logged as above."""
        answers = super().renew_leases(leases)
        for lease, answer in zip(leases, answers, strict=True):
            if isinstance(answer, Lease):
                self.log("renewed", job=lease.entity_id, token=answer.token, expires=answer.expires_at.timestamp())
            elif isinstance(answer, Fenced):
                what = type(answer).__name__
                self.log("refused", job=lease.entity_id, token=lease.token, what="renewal", error=what)
        return answers


def policy_of(cfg: dict[str, Any]) -> Policy:
    """The scenario's policy, as the parent chose it (short TTLs: seconds, not minutes)."""
    budget = timedelta(seconds=cfg["budget"])
    return Policy(
        lease_ttl=timedelta(seconds=cfg["ttl"]),
        renewal_budget={"running": budget, "finalizing": budget},
        max_reclaims=cfg["max_reclaims"],
    )


def watchdog(parent: int | None, deadline: float, log: Log) -> None:
    """Exit when the parent is gone or the deadline passed: no orphan outlives a demo."""
    parent = os.getppid() if parent is None else parent
    while True:
        time.sleep(0.2)
        if os.getppid() != parent or time.time() > deadline:
            log("exit", reason="orphaned" if os.getppid() != parent else "deadline")
            os._exit(3)


def wait_for(path: str | None) -> None:
    """Wait for the parent's go (a file appearing)."""
    while path is not None and not os.path.exists(path):
        time.sleep(0.02)


def worker_main(cfg: dict[str, Any], log: Log) -> int:
    store = SqlStore(cfg["url"], table_prefix=cfg["prefix"], create=False)
    engine = ObservedEngine(JobLifecycle, store, policy=policy_of(cfg), owner=cfg["name"])
    engine.log = log
    seconds: dict[str, float] = cfg["gate_seconds"]
    stubborn: bool = cfg.get("stubborn", False)

    def run_agent(job: Job) -> tuple[str, dict[str, int]]:
        log("agent", job=job.id, token=job.held.lease.token)
        return "exited", {"exit_code": 0}

    def finalize(job: Job) -> None:
        token = job.held.lease.token
        previous = job.previous_progress()
        if previous is not None:
            log("resumed", job=job.id, token=token, progress=previous)
        results: dict[str, GateResult] = {}  # JobData.gates: each gate's result, run or replayed
        for index, gate in enumerate(GATES):
            job.progress({"gate": gate})
            ran: list[bool] = []

            def call(key: str, gate: str = gate, ran: list[bool] = ran) -> GateResult:
                ran.append(True)
                log.gate(job.id, gate, token)
                log("gate-start", job=job.id, gate=gate, token=token)
                time.sleep(seconds[gate])
                return GateResult(status="passed", detail=f"{gate} by {cfg['name']}")

            try:
                results[gate] = job.run(gate, call, model=GateResult)
            except Fenced as err:
                what = f"result of {gate}" if ran else f"run of {gate}"
                log("refused", job=job.id, token=token, what=what, error=type(err).__name__, gate=gate)
                if stubborn:
                    insist(engine, job, index, log)
                raise
            log("gate-done" if ran else "gate-replayed", job=job.id, gate=gate, token=token)
        # the recorded results go into the job's data with the transition that ends it, so the
        # row itself says what its gates found (`fsm show`, the inspector), not only the ledger
        job.fire("complete", data={"gates": {g: r.model_dump(exclude_none=True) for g, r in results.items()}})
        log("fired", job=job.id, token=token, event="complete")

    worker = Worker(
        engine,
        {"running": run_agent, "finalizing": finalize},
        concurrency=1,
        poll_interval=timedelta(seconds=cfg.get("poll", 0.05)),
        grace=timedelta(seconds=1),
    )
    log("ready")
    wait_for(cfg.get("go"))
    log("go")
    stats = worker.run()  # until SIGTERM: stop claiming, finish or release
    log("exit", reason="stopped", claimed=stats.claimed, fenced=stats.fenced, failed=stats.failed)
    store.close()
    return 0


def insist(engine: Engine, job: Job, index: int, log: Log) -> None:
    """What a holder that ignores its fencing would do next, each with its old lease.

    Every one must be refused (``Fenced``); one that is accepted is logged as such and
    breaks the demo's I3 check."""
    lease = job.held.lease
    attempts: list[tuple[str, Any]] = []
    if index + 1 < len(GATES):
        nxt = GATES[index + 1]

        def late_gate(key: str, gate: str = nxt) -> dict[str, str]:
            log.gate(job.id, gate, lease.token)  # counted if it ever ran: it must not
            return {"status": "passed", "detail": "late"}

        attempts.append((f"run of {nxt}", lambda: engine.run(job.id, nxt, late_gate, lease)))
    attempts += [
        ("progress", lambda: engine.record_progress(lease, {"gate": "late"})),
        ("complete", lambda: engine.fire(job.id, "complete", lease=lease)),
        ("renewal", lambda: engine.renew_lease(lease)),
    ]
    for what, attempt in attempts:
        try:
            attempt()
        except Fenced as err:
            if what != "renewal":  # the observed engine logs refused renewals itself
                log("refused", job=job.id, token=lease.token, what=what, error=type(err).__name__)
        except FsmError as err:
            log("error", job=job.id, token=lease.token, what=what, error=f"{type(err).__name__}: {err}")
        else:
            log("accepted", job=job.id, token=lease.token, what=what)
    log("insisted", job=job.id, token=lease.token)


def claimer_main(cfg: dict[str, Any], log: Log) -> int:
    store = SqlStore(cfg["url"], table_prefix=cfg["prefix"], create=False)
    engine = Engine(JobLifecycle, store, policy=policy_of(cfg), owner=cfg["name"])
    rng = random.Random(cfg["name"])
    log("ready")
    wait_for(cfg.get("go"))
    claimed: list[tuple[str, int, str]] = []
    empty = 0
    while empty < cfg.get("empty_polls", 5):
        try:
            got = engine.claim(rng.randint(1, 4))
        except FsmError as err:  # a busy SQLite file: the claim wrote nothing, try again
            log("error", what="claim", error=f"{type(err).__name__}: {err}")
            got = []
        claimed += [(s.id, s.lease_token, s.state) for s in got]
        empty = 0 if got else empty + 1
        # a pause after each claim, as a worker would take to start its work, so that
        # the claimers really overlap instead of the first one draining the queue alone
        time.sleep(cfg.get("pause", 0.02) if got else 0.03)
    out = Path(cfg["dir"]) / f"claims-{cfg['name']}.json"
    out.write_text(json.dumps(claimed))
    log("exit", reason="drained", claimed=len(claimed))
    store.close()
    return 0


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    log = Log(Path(cfg["dir"]), cfg["name"])
    threading.Thread(target=watchdog, args=(cfg["parent"], cfg["deadline"], log), daemon=True).start()
    role = cfg["role"]
    if role == "worker":
        return worker_main(cfg, log)
    if role == "claimer":
        return claimer_main(cfg, log)
    raise SystemExit(f"unknown role {role!r}")


def child_main(cfg_json: str, output: str) -> None:
    """The entry point of a child started by :mod:`multiprocessing`: its output (warnings,
    a traceback) goes to ``output``; its exit code is ``main``'s."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own stream
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    raise SystemExit(main([cfg_json]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
