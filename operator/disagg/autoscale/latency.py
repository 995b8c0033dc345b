"""What a latency p99 read from histogram buckets says for certain (pure).

Prometheus reads a p99 with ``histogram_quantile``, which interpolates linearly inside the
bucket the quantile falls in: the value is exact only at the bucket's bounds. The policy
decides on the band and the bounds these give, not on the interpolated value alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["MIN_TOLERANCE", "surely_over", "surely_under", "tolerance"]

MIN_TOLERANCE: Final = 0.1
"""The narrowest dead band around an SLO, relative to it."""


def tolerance(slo: float, buckets: Sequence[float]) -> float:
    """Relative dead band around the SLO: half the width of the histogram bucket holding it.

    histogram_quantile interpolates linearly inside a bucket, so near an edge small load
    changes move the estimate by up to a bucket's width; deciding inside that band would flap.
    """
    lower = 0.0
    for upper in buckets:
        if slo <= upper:
            return max(MIN_TOLERANCE, (upper - lower) / 2 / slo)
        lower = upper
    return MIN_TOLERANCE


def surely_over(p99: float, buckets: Sequence[float]) -> float:
    """What a p99 read from a histogram says for certain: the lower bound of the bucket it
    falls in.

    Inside a bucket histogram_quantile interpolates by the share of observations above the
    bound, not by how slow they were: with vLLM's TTFT buckets a p99 anywhere from 1 to 2.5 s
    reads between 1 and 2.5 s depending only on how many requests passed 1 s. Sizing on the
    interpolated value grew a pool by half when 1.5% of its prompts took just over a 1 s SLO.
    (Certain for a p99 read from these ``buckets``: they must be the engine's own.)"""
    return max((bound for bound in buckets if bound < p99), default=0.0)


def surely_under(p99: float, buckets: Sequence[float]) -> float:
    """The most a p99 read from a histogram can be: the upper bound of the bucket it falls in
    (itself beyond the last bound).

    A quiet pool must show headroom under its SLO, but inside a bucket the interpolated p99
    cannot: with vLLM's inter-token buckets and a 30 ms SLO, a pool whose every token came
    within 10-25 ms reads 24.9 ms, never the 24 ms that 20% under the SLO asks for."""
    return min((bound for bound in buckets if bound >= p99), default=p99)
