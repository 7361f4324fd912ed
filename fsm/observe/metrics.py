"""The instruments, made once per :class:`~fsm.observe.Instrumentation` from its meter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsm.observe import attributes as a

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, Meter

# seconds: claims wait from milliseconds to hours; handlers and effects run as long
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class Instruments:
    """Every metric the library records (names in :mod:`fsm.observe.attributes`)."""

    def __init__(self, meter: Meter) -> None:
        self.transitions: Counter = meter.create_counter(
            a.TRANSITIONS, unit="{transition}", description="Committed transitions by kind, event and actor."
        )
        self.claimed: Counter = meter.create_counter(
            a.CLAIMED, unit="{message}", description="Entities claimed by workers (messaging: a claim consumes)."
        )
        self.claim_latency: Histogram = meter.create_histogram(
            a.CLAIM_LATENCY,
            unit="s",
            description="From an entity's due time to its claim (run_after, else creation for a first start, "
            "else the time a resumed entity entered its state).",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )
        self.process_duration: Histogram = meter.create_histogram(
            a.PROCESS_DURATION,
            unit="s",
            description="Worker handler durations, with their outcome.",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )
        self.effect_duration: Histogram = meter.create_histogram(
            a.EFFECT_DURATION,
            unit="s",
            description="Effect runs through the ledger (a replayed result included), with their outcome.",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )
        self.renewals: Counter = meter.create_counter(
            a.RENEWALS, unit="{renewal}", description="Committed lease renewals."
        )
        self.lapses: Counter = meter.create_counter(
            a.LAPSES, unit="{lease}", description="Leases a holder found lost (refused, lapsed or given up)."
        )
        self.retries: Counter = meter.create_counter(
            a.RETRIES,
            unit="{retry}",
            description="Handler errors a worker retries (its entity due again after the backoff), by kind, "
            "state and error type; the retry's own transition is counted in fsm.transitions too.",
        )
        self.refused: Counter = meter.create_counter(
            a.REFUSED, unit="{write}", description="Late writes the fence refused, by operation."
        )
        self.reaper_moves: Counter = meter.create_counter(
            a.REAPER_MOVES, unit="{entity}", description="Entities the reaper moved, by kind and event."
        )
        self.reaper_lost_races: Counter = meter.create_counter(
            a.REAPER_LOST_RACES, unit="{entity}", description="Candidates that moved, renewed or finished first."
        )
        self.reaper_bad_rows: Counter = meter.create_counter(
            a.REAPER_BAD_ROWS, unit="{row}", description="Rows the reaper could not read or write back, skipped."
        )
        self.reaper_tick_duration: Histogram = meter.create_histogram(
            a.REAPER_TICK_DURATION,
            unit="s",
            description="Duration of each reaper tick.",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )


__all__ = ["Instruments"]
