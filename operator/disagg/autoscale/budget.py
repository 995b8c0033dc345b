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

The counts come from the engines' own histograms: TTFT per request on the pool that
prefills, each request's mean time per output token on the pool that decodes. A request is
counted when its engine observes it, so one still waiting is not counted yet. A histogram
says for certain only which bucket a request fell in: when the SLO is a bucket bound the
count is exact; otherwise the requests in the bucket that holds the SLO may have missed it
or not, so the ledger keeps both what surely missed and what may have. Interpolating inside
the bucket instead (as ``histogram_quantile`` does) read 84.6% of a chat's requests within
a 12 ms TPOT SLO that 99.9% met, vLLM's 10-25 ms bucket being mostly under the SLO. The
burn rates, and so the fast-burn Warning, read what surely missed: they never page on
requests that may have met the SLO.
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

BOUND_MATCH: Final = 1e-9
"""An SLO this close (relatively) to a bucket bound is on it: ``le="0.05"`` read back."""

Slot = tuple[float, float, float, float]
"""(slot start, requests counted, requests that surely missed the SLO, requests that may
have), oldest first."""


def missed_share(buckets: Sequence[tuple[float, float]], slo: float) -> tuple[float, float] | None:
    """The shares of a cumulative histogram's observations that surely are over ``slo`` and
    that may be (those of the bucket holding it too; the same when it is a bound); None when
    it observed nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    lower = 0.0
    for bound, count in buckets:
        if abs(bound - slo) <= BOUND_MATCH * slo:
            # Rates summed across pods carry float rounding: never a negative share.
            over = max(0.0, 1.0 - count / total)
            return over, over
        if slo < bound:
            return max(0.0, 1.0 - count / total), max(0.0, 1.0 - lower / total)
        lower = count
    return 0.0, 0.0


def counted(
    buckets: Sequence[tuple[float, float]], slo: float, since_last: float | None, window: float
) -> tuple[float, float, float]:
    """(requests, surely missed, maybe missed) an evaluation adds from its histogram of
    bucket rates over the query ``window``, ``since_last`` seconds after the last one that
    counted (None: none has, and the rates overlap requests not seen apart from them, so it
    counts nothing)."""
    shares = missed_share(buckets, slo)
    if shares is None or since_last is None or since_last <= 0:
        return 0.0, 0.0, 0.0
    # After a gap longer than the window the rates describe only the window's requests.
    requests = buckets[-1][1] * min(since_last, window)
    return requests, requests * shares[0], requests * shares[1]


def percent(high: float, digits: int, low: float | None = None) -> str:
    """``42%``, or ``-10..42%`` when the value lies between ``low`` and ``high`` (what status
    and ``disagg simulate`` show of an attainment or a budget the histogram leaves open)."""
    shown = f"{high * 100:.{digits}f}"
    if low is not None and f"{low * 100:.{digits}f}" != shown:
        shown = f"{low * 100:.{digits}f}..{shown}"
    return f"{shown}%"


def coarse_slot(window: float) -> float:
    """The width of the slots before the last hour: whole minutes, COARSE_SLOTS of them."""
    return max(FINE_SLOT, math.ceil(window / COARSE_SLOTS / FINE_SLOT) * FINE_SLOT)


def recorded(
    ledger: Sequence[Slot], now: float, counts: tuple[float, float, float], window: float
) -> list[Slot]:
    """The ledger with ``counts`` (requests, surely and maybe missed) counted at ``now``,
    slots older than the last hour merged into coarse ones and slots that left the window
    dropped."""
    coarse = coarse_slot(window)
    merged: dict[float, list[float]] = {}
    for start, *values in [*ledger, (now, *counts)]:
        if start > now or not any(values):
            continue
        width = FINE_SLOT if now - start < FINE_SPAN else coarse
        key = math.floor(start / width) * width
        if key < now - window:
            continue
        slot = merged.setdefault(key, [0.0, 0.0, 0.0])
        for index, value in enumerate(values):
            slot[index] += value
    return [(key, count, surely, maybe) for key, (count, surely, maybe) in sorted(merged.items())]


@dataclass(frozen=True)
class Budget:
    """One SLO's standing over its compliance window."""

    requests: float
    missed: float
    """Requests that surely missed the SLO."""
    missed_at_most: float
    """Those and the requests that may have (in the histogram bucket holding the SLO)."""
    burn_short: float | None
    """The burn rate over the last SHORT_BURN seconds (None: no request counted in them)."""
    burn_long: float | None
    """The same over the last LONG_BURN seconds."""
    fast_burn_at: float
    """The burn rate both must reach for a fast burn."""

    @property
    def attainment(self) -> float | None:
        """The share within the SLO, at most (the requests that surely missed are out)."""
        return None if self.requests <= 0 else 1.0 - self.missed / self.requests

    @property
    def attainment_at_least(self) -> float | None:
        return None if self.requests <= 0 else 1.0 - self.missed_at_most / self.requests

    @property
    def remaining(self) -> float:
        """The share of the misses the target allows that is left, at most; negative when
        overspent."""
        return self._left(self.missed)

    @property
    def remaining_at_least(self) -> float:
        return self._left(self.missed_at_most)

    def _left(self, missed: float) -> float:
        if self.requests <= 0:
            return 1.0
        return 1.0 - missed / ((1.0 - TARGET) * self.requests)

    @property
    def fast_burn(self) -> bool:
        return all(
            burn is not None and burn >= self.fast_burn_at
            for burn in (self.burn_short, self.burn_long)
        )


def _burn(ledger: Sequence[Slot], now: float, span: float) -> float | None:
    """Misses that surely happened in the last ``span`` over what the target allows."""
    recent = [slot for slot in ledger if slot[0] >= now - span]
    requests = sum(slot[1] for slot in recent)
    return None if requests <= 0 else sum(slot[2] for slot in recent) / requests / (1 - TARGET)


def standing(ledger: Sequence[Slot], now: float, window: float) -> Budget:
    """The SLO's budget over ``window`` as the ledger holds it at ``now``."""
    kept = [slot for slot in ledger if now - window <= slot[0] <= now]
    return Budget(
        requests=sum(slot[1] for slot in kept),
        missed=sum(slot[2] for slot in kept),
        missed_at_most=sum(slot[3] for slot in kept),
        burn_short=_burn(kept, now, SHORT_BURN),
        burn_long=_burn(kept, now, LONG_BURN),
        fast_burn_at=max(1.0, FAST_BURN_SHARE * window / LONG_BURN),
    )
