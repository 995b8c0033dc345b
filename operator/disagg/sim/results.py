"""What a fleet simulation produced: each request's fate and the run's totals (pure)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from disagg.autoscale.sizing import quantile
from disagg.sim.traffic import Request
from disagg.slo import percentile


@dataclass
class Outcome:
    """One request's fate."""

    request: Request
    prefill_started: float | None = None
    """When the engine first scheduled the prompt (vLLM's prefill phase starts here)."""
    prefill_done: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    offloaded: bool = False
    """Prefilled by a decode engine because the prefill pool was backed up."""
    rejected: bool = False
    """Refused on arrival: its prompt and output are longer than the model's context or
    than one engine's KV cache holds (vLLM answers such a request 400, it never waits), so
    it missed both SLOs."""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.request.arrival

    def meets(self, ttft_slo: float, tpot_slo: float) -> bool:
        """Whether the request met both SLOs (a request with no first token did not)."""
        ttft, tpot = self.ttft, self.tpot
        return ttft is not None and tpot is not None and ttft <= ttft_slo and tpot <= tpot_slo

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return 0.0 if self.first_token is not None else None
        return (self.last_token - self.first_token) / (self.tokens - 1)


@dataclass
class Result:
    """What a run produced."""

    outcomes: list[Outcome]
    duration: float
    gpu_seconds: float
    scaling_actions: int
    timeline: list[dict[str, float]]
    scaling_log: list[tuple[float, str, int, int]] = field(default_factory=list)
    """Every resize: (time, pool, replicas before, replicas after)."""
    pool_gpu_seconds: dict[str, float] = field(default_factory=dict)
    """gpu_seconds by pool: which pool's size the GPU-hours went to."""

    def attainment(
        self, ttft_slo: float, tpot_slo: float, start: int = 0
    ) -> tuple[float, float, float]:
        """Fractions of requests (from the ``start``-th arrival on) meeting TTFT, TPOT, and
        both; unfinished requests miss."""
        outcomes = self.outcomes[start:]
        n = max(1, len(outcomes))
        ttft = sum(1 for o in outcomes if o.ttft is not None and o.ttft <= ttft_slo)
        tpot = sum(1 for o in outcomes if o.tpot is not None and o.tpot <= tpot_slo)
        both = sum(1 for o in outcomes if o.meets(ttft_slo, tpot_slo))
        return ttft / n, tpot / n, both / n

    def goodput_per_gpu(self, ttft_slo: float, tpot_slo: float) -> float:
        """Requests per second meeting both SLOs, per GPU (time-averaged)."""
        good = self.attainment(ttft_slo, tpot_slo)[2] * len(self.outcomes)
        gpus = self.gpu_seconds / self.duration if self.duration else 1.0
        return good / self.duration / gpus if self.duration and gpus else 0.0


def latencies(outcomes: Sequence[Outcome], kind: Literal["ttft", "tpot"]) -> list[float]:
    """Every request's TTFT or TPOT; an unfinished request's is infinite (it missed)."""
    values = (o.ttft if kind == "ttft" else o.tpot for o in outcomes)
    return [math.inf if v is None else v for v in values]


def length_stats(lengths: Sequence[int]) -> tuple[float, int]:
    """Mean and p99 of token counts (a trace's prompts or outputs); zeros when empty."""
    p99 = percentile(lengths, 0.99)
    return (sum(lengths) / len(lengths) if lengths else 0.0), int(p99 or 0)


def flaps(log: Sequence[tuple[float, str, int, int]], within: float = 300.0) -> int:
    """Scale-downs undone by a scale-up of the same pool within ``within`` seconds."""
    count = 0
    for index, (at, pool, before, after) in enumerate(log):
        if after >= before:
            continue
        if any(p == pool and b2 < a2 and t <= at + within for t, p, b2, a2 in log[index + 1 :]):
            count += 1
    return count


def prefill_phase_times(outcomes: Sequence[Outcome], disaggregated: bool) -> list[float]:
    """Sorted prefill-phase times (first scheduled to prompt done, as vLLM's
    request_prefill_time measures) of the requests that have one."""
    times = []
    for o in outcomes:
        end = o.prefill_done if disaggregated else o.first_token
        if o.prefill_started is not None and end is not None:
            times.append(end - o.prefill_started)
    return sorted(times)


def reported_p99(
    observations: Sequence[tuple[float, float]], bounds: Sequence[float]
) -> float | None:
    """The p99 Prometheus reports for (value, times observed) pairs: histogram_quantile's
    interpolation over the engines' bucket bounds, not the exact one (between 1 and 2.5 s
    it reads anywhere in the bucket). The policy is run on what the operator would read."""
    ordered = sorted(observations)
    values = [value for value, _ in ordered]
    return quantile(cumulative_histogram(values, bounds, [n for _, n in ordered]), 0.99)


def cumulative_histogram(
    ordered: Sequence[float], bounds: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[tuple[float, float], ...]:
    """Sorted values (each observed ``weights[i]`` times; once without weights) as a
    Prometheus-style cumulative histogram with a +Inf bucket (empty for no values)."""
    if not ordered:
        return ()
    totals = None if weights is None else list(itertools.accumulate(weights))

    def at_or_below(bound: float) -> float:
        seen = bisect.bisect_right(ordered, bound)
        if totals is None:
            return float(seen)
        return totals[seen - 1] if seen else 0.0

    return tuple((bound, at_or_below(bound)) for bound in (*bounds, math.inf))
