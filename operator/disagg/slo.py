"""The latency SLO a report judges against, and the one percentile every report computes (pure).

``disagg plan``, ``disagg diagnose``, the simulators and the demo's report all speak of a TTFT
and a TPOT target and of the 99th percentile of what requests saw; they share these two
definitions so that "p99" means the same number everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Slo:
    """Latency targets (seconds) and the fraction of requests that must meet both."""

    ttft: float
    tpot: float
    attainment: float = 0.99
    """The SLOs are p99s, so 99% of requests by default (DistServe's experiments use 90%)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1): the smallest value at least a ``q`` share
    of the values are no larger than; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
