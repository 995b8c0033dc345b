"""Each SLO's error budget over its compliance window (pure).

An SRE's ``TTFT p99 <= 1s`` is a promise about a window's requests: at most 1% of them over
1 s. So the autoscaler counts, at every evaluation, the requests each SLO covered and those
that missed it, and keeps the counts in a ledger of time slots across the window
(``spec.autoscaling.sloWindow``): minute slots for the last hour, which the burn rates read,
and a few hundred coarser ones before that, so that status holds a 28-day window in a few
kilobytes. From the ledger come the window's attainment, the budget remaining (the share
of the misses the target allows that has not been spent), and the burn rates over the last
5 minutes and the last hour: misses relative to what the target allows, so that 1 spends
the budget exactly over the window.

The counts come from the engines' own histograms, read as Prometheus reads them: TTFT per
request on the pool that prefills, each request's mean time per output token on the pool
that decodes. Inside the bucket that holds the SLO the share over it is interpolated
linearly (exact when the SLO is a bucket bound); a request is counted when its engine
observes it, so one still waiting is not counted yet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

TARGET: Final = 0.99
"""The SLOs are p99 targets: 99% of the window's requests within them."""
FINE_SLOT: Final = 60.0
FINE_SPAN: Final = 3600.0
"""Minute slots cover the last hour, which the burn rates read."""
COARSE_SLOTS: Final = 480
"""Slots across the rest of the window: 84-minute slots for the default 28 days."""
SHORT_BURN: Final = 300.0
LONG_BURN: Final = 3600.0
FAST_BURN_SHARE: Final = 0.02
"""A fast burn spends this share of the window's budget within LONG_BURN, over both burn
windows (the SRE workbook's page: 2% of a 30-day budget in an hour, a burn rate of 14.4)."""

Slot = tuple[float, float, float]
"""(slot start, requests counted, requests that missed the SLO), oldest first."""


def missed_share(buckets: Sequence[tuple[float, float]], slo: float) -> float | None:
    """The share of a cumulative histogram's observations over ``slo``; None when it
    observed nothing. Observations in the +Inf bucket past the last bound count as misses
    when the SLO lies beyond that bound (their values are unknown)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if slo <= bound:
            within = lower_count
            if math.isfinite(bound) and bound > lower_bound:
                within += (count - lower_count) * (slo - lower_bound) / (bound - lower_bound)
            return min(1.0, max(0.0, 1.0 - within / total))
        lower_bound, lower_count = bound, count
    return 0.0


def counted(
    buckets: Sequence[tuple[float, float]], slo: float, since_last: float | None, window: float
) -> tuple[float, float]:
    """(requests, misses) an evaluation adds from its histogram of bucket rates over the
    query ``window``, ``since_last`` seconds after the last one that counted (None: none
    has, and the rates overlap requests not seen apart from them, so it counts nothing)."""
    share = missed_share(buckets, slo)
    if share is None or since_last is None or since_last <= 0:
        return 0.0, 0.0
    # After a gap longer than the window the rates describe only the window's requests.
    requests = buckets[-1][1] * min(since_last, window)
    return requests, requests * share


def coarse_slot(window: float) -> float:
    """The width of the slots before the last hour: whole minutes, COARSE_SLOTS of them."""
    return max(FINE_SLOT, math.ceil(window / COARSE_SLOTS / FINE_SLOT) * FINE_SLOT)


def recorded(
    ledger: Sequence[Slot], now: float, requests: float, missed: float, window: float
) -> list[Slot]:
    """The ledger with ``requests`` and ``missed`` counted at ``now``, slots older than the
    last hour merged into coarse ones and slots that left the window dropped."""
    coarse = coarse_slot(window)
    merged: dict[float, list[float]] = {}
    for start, count, misses in [*ledger, (now, requests, missed)]:
        if start > now or not (count or misses):
            continue
        width = FINE_SLOT if now - start < FINE_SPAN else coarse
        key = math.floor(start / width) * width
        if key < now - window:
            continue
        slot = merged.setdefault(key, [0.0, 0.0])
        slot[0] += count
        slot[1] += misses
    return [(key, count, misses) for key, (count, misses) in sorted(merged.items())]


@dataclass(frozen=True)
class Budget:
    """One SLO's standing over its compliance window."""

    requests: float
    missed: float
    burn_short: float | None
    """The burn rate over the last SHORT_BURN seconds (None: no request counted in them)."""
    burn_long: float | None
    """The same over the last LONG_BURN seconds."""
    fast_burn_at: float
    """The burn rate both must reach for a fast burn."""

    @property
    def attainment(self) -> float | None:
        return None if self.requests <= 0 else 1.0 - self.missed / self.requests

    @property
    def remaining(self) -> float:
        """The share of the misses the target allows that is left; negative when overspent."""
        if self.requests <= 0:
            return 1.0
        return 1.0 - self.missed / ((1.0 - TARGET) * self.requests)

    @property
    def fast_burn(self) -> bool:
        return all(
            burn is not None and burn >= self.fast_burn_at
            for burn in (self.burn_short, self.burn_long)
        )


def _burn(ledger: Sequence[Slot], now: float, span: float) -> float | None:
    requests = sum(count for start, count, _ in ledger if start >= now - span)
    missed = sum(misses for start, _, misses in ledger if start >= now - span)
    return None if requests <= 0 else missed / requests / (1.0 - TARGET)


def standing(ledger: Sequence[Slot], now: float, window: float) -> Budget:
    """The SLO's budget over ``window`` as the ledger holds it at ``now``."""
    kept = [slot for slot in ledger if now - window <= slot[0] <= now]
    return Budget(
        requests=sum(count for _, count, _ in kept),
        missed=sum(misses for _, _, misses in kept),
        burn_short=_burn(kept, now, SHORT_BURN),
        burn_long=_burn(kept, now, LONG_BURN),
        fast_burn_at=max(1.0, FAST_BURN_SHARE * window / LONG_BURN),
    )
