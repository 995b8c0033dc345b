"""What the policy accepts from outside (pure): signals no engine reports are refused, a
histogram that is not one is dropped, and signals missing, stale or from too few pods are
not read at all.

Signals come from Prometheus through queries a user may override, so any of them can be a
value no engine reports: negative, infinite, a KV-cache usage in percent instead of a
fraction. The policy holds on those (saying which value, where it came from) rather than
scale on them. A prefill-time histogram is repaired where the repair is certain (the same
bound spelled twice, ``le="1"`` and ``le="1.0"`` from engines of two versions, is summed)
and otherwise left out: sizing then assumes every prompt at twice the mean (and the TTFT
histogram's, the p99 alone).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from itertools import pairwise
from typing import Final

from disagg.autoscale.model import Signals

KV_USAGE_MAX: Final = 1.01
"""KV-cache usage is a fraction of the cache; past 1 (with rounding) it is not one."""
_NAMES: Final = {
    "p99": "latency p99",
    "request_rate": "requestRate",
    "queue": "queue",
    "running": "running",
    "kv_usage": "kvUsage",
    "pods_reporting": "podsReporting",
    "sampled_at": "lastSample",
    "prompt_tokens_rate": "promptTokensRate",
    "prefill_seconds": "prefillSeconds",
    "tpot_mean": "tpotMean",
    "generation_tokens_rate": "generationTokensRate",
}


_HISTOGRAMS: Final = ("prefill_buckets", "ttft_buckets", "slo_buckets")


def invalid(signals: Signals) -> str | None:
    """What is wrong with the first value no engine reports (named as in
    ``spec.autoscaling.queries``), or None."""
    for field in fields(Signals):
        value = getattr(signals, field.name)
        if field.name in _HISTOGRAMS or value is None:
            continue
        name = _NAMES[field.name]
        if not math.isfinite(value) or value < 0:
            return f"{name} is {value:g}, not a finite number >= 0"
        if field.name == "kv_usage" and value > KV_USAGE_MAX:
            return f"kvUsage is {value:g}, not a fraction of the KV cache (0-1)"
    return None


def clean_buckets(buckets: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """A cumulative histogram as ascending (bound, count) pairs ending at +Inf, with the same
    bound spelled twice summed; empty when it is not one (a count that is negative, not
    finite, or falls as the bound rises: pods with different bucket layouts)."""
    merged: dict[float, float] = {}
    for bound, count in buckets:
        if math.isnan(bound) or not math.isfinite(count) or count < 0:
            return ()
        merged[bound] = merged.get(bound, 0.0) + count
    pairs = sorted(merged.items())
    if not pairs or not math.isinf(pairs[-1][0]) or pairs[0][0] < 0 or pairs[-1][1] <= 0:
        return ()
    # Rates of counters summed across pods carry float rounding: a hair's fall is not one.
    if any(later < earlier * (1 - 1e-9) for (_, earlier), (_, later) in pairwise(pairs)):
        return ()
    return tuple(pairs)


def accepted(signals: Signals) -> tuple[Signals, str | None]:
    """The signals with their histograms cleaned, and what makes them unusable (or None)."""
    problem = invalid(signals)
    read = (signals.prefill_buckets, signals.ttft_buckets, signals.slo_buckets)
    prefill, ttft, slo = cleaned = tuple(clean_buckets(buckets) for buckets in read)
    if cleaned != read:
        signals = replace(signals, prefill_buckets=prefill, ttft_buckets=ttft, slo_buckets=slo)
    return signals, problem


def unusable(signals: Signals | None, ready: int, now: float, stale_after: float) -> str | None:
    """Why this evaluation's signals cannot be read (missing, older than ``stale_after``,
    from fewer pods than are ready, or without the latency a pool with traffic reports);
    None when they can. No data is never read as idle."""
    if signals is None:
        return "metrics missing"
    if now - signals.sampled_at > stale_after:
        return f"metrics stale ({now - signals.sampled_at:.0f}s old)"
    if signals.pods_reporting < ready:
        return f"metrics from {signals.pods_reporting} of {ready} ready pods"
    if signals.request_rate is None or (signals.p99 is None and signals.request_rate > 0):
        return "latency metrics missing"
    return None
