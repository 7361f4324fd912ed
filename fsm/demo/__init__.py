"""``fsm demo``: the whole story of the seeds, with real processes.

- :mod:`fsm.demo.cli`: the command (``register``, ``run``) and its report;
- :mod:`fsm.demo.pipelines`: seeds/000, zombie pipelines on simulated time;
- :mod:`fsm.demo.scenario`: seeds/002 with real worker processes (also used by the tests);
- :mod:`fsm.demo.proc`: the child processes' entry point;
- :mod:`fsm.demo.checks`: the invariants a run can check from the store;
- :mod:`fsm.demo.timeline`: a timeline picture of each job (SVG).
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add ``fsm demo`` to the command line (imported on demand: a child process imports
    :mod:`fsm.demo.proc` without the parent's machinery)."""
    from fsm.demo.cli import register as register_demo

    register_demo(sub)


def run(args: argparse.Namespace) -> int:
    from fsm.demo.cli import run as run_demo

    return run_demo(args)


__all__ = ["register", "run"]
