"""Lifecycles of the coordination tests that a command line loads by reference."""

from __future__ import annotations

from fsm import JobLifecycle, Limits


class KeyedJob(JobLifecycle):
    """A job with at most one live lease per concurrency key."""

    kind = "keyed-job"
    limits = Limits(per_key=1)


class FewJob(JobLifecycle):
    """A job with at most two live leases in all."""

    kind = "few-job"
    limits = Limits(total=2)
