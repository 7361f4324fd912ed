"""The reaper: the maintenance service that fails dead work and never touches live work.

- ``config``: the validated config with named defaults, per-lifecycle policies, the result
  of a tick and the backstop check;
- ``rules``: the reaper's rules, derived from each lifecycle's compiled table;
- ``leader``: the optional leader lease (one reaper at a time);
- ``service``: :class:`Reaper`, whose ``run_once()`` is the unit of work and of test;
- ``cli``: ``fsm reaper``.

The package is named ``reaping`` rather than ``reaper`` because ``fsm.reaper`` is the
public decorator that marks a reaper transition; a subpackage of that name would replace
it on the ``fsm`` package the moment it was imported.
"""

from __future__ import annotations

from fsm.reaping.config import DEFAULT_BATCH_SIZE, DEFAULT_INTERVAL, ReaperConfig, ReapPolicy, ReapResult
from fsm.reaping.rules import Rule, plan_rules
from fsm.reaping.service import Reaper, validated_config

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_INTERVAL",
    "ReapPolicy",
    "ReapResult",
    "Reaper",
    "ReaperConfig",
    "Rule",
    "plan_rules",
    "validated_config",
]
