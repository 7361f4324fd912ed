"""The claim's gate: which picked rows a claim with limits may take (every store alike).

A store picks candidates in the claim's order, counts what the limits count (live leases
per key and in all, starts in the rate windows) where every claimer sees the same counts
(under the claim's lock or write lock), and asks the gate row by row.  The gate admits a
row while every count it touches stays under its limit, and counts what it admits, so a
claim never takes more than the limits leave, whatever its size.
"""

from __future__ import annotations

from collections.abc import Mapping

from fsm.records import ClaimLimits

ALL = ""
"""The key under which a rate limit counts the starts of the whole lifecycle."""


class ClaimGate:
    """Counts of one claim: live leases and window starts, per key and in all."""

    __slots__ = ("held", "held_all", "limits", "started", "started_all")

    def __init__(
        self,
        limits: ClaimLimits,
        held: Mapping[str, int],
        held_all: int,
        started: Mapping[str, int],
        started_all: int,
    ) -> None:
        self.limits = limits
        self.held = dict(held)
        self.held_all = held_all
        self.started = dict(started)
        self.started_all = started_all

    def full(self) -> bool:
        """Nothing more can be taken (the lifecycle's own limits are reached)."""
        lim = self.limits
        return lim.total is not None and self.held_all >= lim.total

    def full_keys(self) -> list[str]:
        """Keys whose concurrency limit is reached: a pick may step over their rows."""
        cap = self.limits.per_key
        return [] if cap is None else [k for k, n in self.held.items() if n >= cap]

    def admit(self, key: str | None, start: bool) -> bool:
        """Whether a row of ``key`` may be taken (``start``: it starts, and rates count
        it); if so, it is counted."""
        lim = self.limits
        if lim.total is not None and self.held_all >= lim.total:
            return False
        if key is not None and lim.per_key is not None and self.held.get(key, 0) >= lim.per_key:
            return False
        if start:
            if lim.rate is not None and self.started_all >= lim.rate[0]:
                return False
            if key is not None and lim.key_rate is not None and self.started.get(key, 0) >= lim.key_rate[0]:
                return False
            self.started_all += 1
            if key is not None:
                self.started[key] = self.started.get(key, 0) + 1
        self.held_all += 1
        if key is not None:
            self.held[key] = self.held.get(key, 0) + 1
        return True


__all__ = ["ALL", "ClaimGate"]
