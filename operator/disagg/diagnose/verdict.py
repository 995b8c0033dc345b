"""What hurts a model's inter-token latency, decided from its timeline (pure).

The decision order the product rests on starts here: before chunking or splitting, confirm
that TPOT p99 spikes are phase interference (they line up with prompt work entering the
batch while nothing queues) and not overload (a queue that builds, latency high everywhere).

- **overload**: requests queue in at least a quarter of the steps while TTFT misses its SLO
  there, or TPOT p99 misses its SLO even in the calmest quarter of the steps, or the KV cache
  is full while requests wait;
- **healthy**: TPOT p99 meets its SLO in at least 95% of the steps (TTFT misses are listed,
  they are the prefill pool's size, the autoscaler's business; spikes within the SLO too);
- **interference**: TPOT p99 spikes (at least ``SPIKE_FACTOR`` times the calm value and half
  the SLO) in at least two steps, and in those steps prompts arrive at least twice as fast,
  in tokens per second, as in the other steps;
- **inconclusive**: TPOT misses its SLO in more steps than that, for neither reason above;
- **not-enough-data**: fewer than ``MIN_STEPS`` steps carried tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Final, Literal

from disagg.diagnose.series import Step, Timeline
from disagg.slo import Slo, percentile

Verdict = Literal["interference", "overload", "healthy", "inconclusive", "not-enough-data"]
MIN_STEPS: Final = 6
CALM_QUANTILE: Final = 0.25
"""The calm TPOT is this quantile of the steps: robust to spikes in up to 3/4 of them."""
SPIKE_FACTOR: Final = 3.0
PROMPT_FACTOR: Final = 2.0
QUEUED_SHARE: Final = 0.25
HEALTHY_SHARE: Final = 0.95
KV_FULL: Final = 0.95


@dataclass(frozen=True)
class Finding:
    """A verdict and the numbers behind it."""

    verdict: Verdict
    summary: str
    evidence: tuple[str, ...] = ()
    spikes: tuple[Step, ...] = ()
    """The steps whose TPOT p99 spiked (the correlated windows, for interference)."""
    overloaded_role: str | None = None
    numbers: dict[str, float | int | None] = field(default_factory=dict)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _slope_per_minute(steps: Sequence[Step]) -> float:
    """Least-squares growth of the waiting queue, requests per minute."""
    if len(steps) < 2:
        return 0.0
    xs = [s.at for s in steps]
    ys = [s.waiting for s in steps]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return 60 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def _correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mean_x) ** 2 for x in xs))
    sy = math.sqrt(sum((y - mean_y) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


def _overload(timeline: Timeline, live: Sequence[Step], calm: float, slo: Slo) -> Finding | None:
    queued = [s for s in live if s.waiting >= max(2.0, 0.5 * s.running)]
    slow_first = [s for s in queued if s.ttft_p99 is not None and s.ttft_p99 > slo.ttft]
    kv_full = [s for s in live if (s.kv_usage or 0.0) >= KV_FULL and s.waiting > 0]
    growth = _slope_per_minute(live)
    numbers: dict[str, float | int | None] = {
        "queuedSteps": len(queued), "steps": len(live), "queueGrowthPerMinute": round(growth, 2),
        "maxWaiting": max(s.waiting for s in live), "calmTpotP99": calm,
    }  # fmt: skip
    evidence = [
        f"requests waited in {len(queued)} of {len(live)} steps (at most "
        f"{max(s.waiting for s in live):.0f}); the queue grew by {growth:.1f} requests/min",
    ]
    decode_queued = sum(s.decode_waiting for s in queued)
    if len(queued) >= QUEUED_SHARE * len(live) and len(slow_first) >= len(queued) / 2:
        role = (
            timeline.decoding_role
            if decode_queued >= sum(s.waiting for s in queued) / 2
            else timeline.prompt_role
        )
        ttfts = [s.ttft_p99 for s in slow_first if s.ttft_p99 is not None]
        evidence.append(
            f"TTFT p99 missed its {slo.ttft:g} s SLO in {len(slow_first)} of those steps "
            f"(up to {max(ttfts):.1f} s)"
        )
        summary = f"overload: requests queue in the {role} pool and every latency rises"
        return Finding("overload", summary, tuple(evidence), (), role, numbers)
    if calm > slo.tpot:
        evidence.append(
            f"TPOT p99 is {_ms(calm)} even in the calmest quarter of the steps, over its "
            f"{_ms(slo.tpot)} SLO: every decode step is slow, not only some"
        )
        summary = f"overload: the {timeline.decoding_role} pool decodes too many sequences"
        return Finding("overload", summary, tuple(evidence), (), timeline.decoding_role, numbers)
    if len(kv_full) >= QUEUED_SHARE * len(live):
        evidence.append(
            f"the KV cache was at least {KV_FULL:.0%} full with requests waiting in "
            f"{len(kv_full)} steps"
        )
        summary = f"overload: the {timeline.decoding_role} pool's KV cache is full"
        return Finding("overload", summary, tuple(evidence), (), timeline.decoding_role, numbers)
    return None


def diagnose(timeline: Timeline | None, slo: Slo) -> Finding:
    """The verdict for one model's timeline."""
    if timeline is None:
        return Finding(
            "not-enough-data",
            "no engine series of a decoding pool: check the model and namespace, and that "
            "Prometheus keeps the disagg_model and disagg_role labels (see the scrape config)",
        )
    live = [s for s in timeline.steps if s.tpot_p99 is not None]
    if len(live) < MIN_STEPS:
        return Finding(
            "not-enough-data",
            f"only {len(live)} steps carried generated tokens (at least {MIN_STEPS} needed): "
            "widen --since or wait for traffic",
            numbers={"steps": len(live)},
        )
    tpots = [s.tpot_p99 for s in live if s.tpot_p99 is not None]
    calm = percentile(tpots, CALM_QUANTILE) or 0.0
    overload = _overload(timeline, live, calm, slo)
    if overload is not None:
        return overload

    threshold = max(SPIKE_FACTOR * calm, slo.tpot / 2)
    spikes = [s for s in live if s.tpot_p99 is not None and s.tpot_p99 >= threshold]
    others = [s for s in live if s not in spikes]
    missed = sum(t > slo.tpot for t in tpots)
    ttft_missed = sum(s.ttft_p99 is not None and s.ttft_p99 > slo.ttft for s in live)
    prompts_in_spikes = median(s.prompt_tokens for s in spikes) if spikes else 0.0
    prompts_elsewhere = median(s.prompt_tokens for s in others) if others else 0.0
    r = _correlation(tpots, [s.prompt_tokens for s in live])
    numbers: dict[str, float | int | None] = {
        "steps": len(live), "calmTpotP99": calm, "spikeSteps": len(spikes),
        "peakTpotP99": max(tpots), "tpotMissedSteps": missed, "ttftMissedSteps": ttft_missed,
        "promptTokensPerSecondInSpikes": round(prompts_in_spikes, 1),
        "promptTokensPerSecondElsewhere": round(prompts_elsewhere, 1),
        "correlation": None if r is None else round(r, 3),
    }  # fmt: skip
    evidence = [
        f"TPOT p99 is {_ms(calm)} in calm steps and peaks at {_ms(max(tpots))} "
        f"(SLO {_ms(slo.tpot)}); it missed the SLO in {missed} of {len(live)} steps",
    ]
    if ttft_missed:
        evidence.append(f"TTFT p99 missed its {slo.ttft:g} s SLO in {ttft_missed} steps")
    coincide = prompts_in_spikes >= PROMPT_FACTOR * max(prompts_elsewhere, 1.0)
    if len(spikes) >= 2:
        evidence.append(
            f"in the {len(spikes)} steps where TPOT p99 spiked (>= {_ms(threshold)}), prompts "
            f"arrived at {prompts_in_spikes:.0f} tokens/s against {prompts_elsewhere:.0f} "
            f"elsewhere"
            + ("" if r is None else f"; correlation of TPOT with prompt tokens/s {r:.2f}")
        )
    interference = len(spikes) >= 2 and coincide
    if missed <= (1 - HEALTHY_SHARE) * len(live):
        summary = "healthy: TPOT p99 meets its SLO" + (
            " (prompts lift it, but within the SLO)" if interference else ""
        )
        if ttft_missed:
            summary += "; TTFT misses are the prompt pool's size"
        return Finding("healthy", summary, tuple(evidence), tuple(spikes), None, numbers)
    if interference:
        where = (
            "prompts prefilled in the same engines stall decoding"
            if timeline.mode == "colocated"
            else "prompts the decode pool prefills itself stall its decoding"
        )
        summary = f"phase interference: TPOT p99 spikes when long prompts arrive; {where}"
        return Finding("interference", summary, tuple(evidence), tuple(spikes), None, numbers)
    summary = "inconclusive: TPOT misses its SLO, but not with prompt load and not with queueing"
    return Finding("inconclusive", summary, tuple(evidence), tuple(spikes), None, numbers)
