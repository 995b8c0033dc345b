"""The range queries `disagg diagnose` runs, and their answers lined up step by step (pure).

Every query groups by ``disagg_role``, the pool label the scrape configuration copies from the
pod (see ``autoscale/queries.py``), so one query per signal covers both pools and tells which
pools exist. The pool that decodes is ``decode`` (or ``engine``, a colocated pool); the pool
that takes prompts is ``prefill`` when it served any, else the decoding pool itself: that is
a colocated deployment, whatever its pools are called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from disagg.autoscale.queries import (
    SGLANG,
    VLLM,
    MetricNames,
    model_selector,
    pool_selector,
    prometheus_duration,
)

Series = Literal[
    "tpotP99", "ttftP99", "promptTokensRate", "promptsRate", "waiting", "running", "kvUsage",
    "pods",
]  # fmt: skip
Mode = Literal["disaggregated", "colocated"]
DECODING_ROLES: Final = ("engine", "decode")
"""Roles whose engines generate tokens, in the order they are looked for."""

_TEMPLATES: Final[dict[Series, str]] = {
    "tpotP99": "histogram_quantile(0.99, sum by (disagg_role, le) "
    "(rate({itl}_bucket{{{selector}}}[{window}])))",
    "ttftP99": "histogram_quantile(0.99, sum by (disagg_role, le) "
    "(rate({ttft}_bucket{{{selector}}}[{window}])))",
    "promptTokensRate": "sum by (disagg_role) (rate({prompt_tokens}{{{selector}}}[{window}]))",
    "promptsRate": "sum by (disagg_role) (rate({requests}{{{selector}}}[{window}]))",
    "waiting": "sum by (disagg_role) ({waiting}{{{selector}}})",
    "running": "sum by (disagg_role) ({running}{{{selector}}})",
    "kvUsage": "avg by (disagg_role) ({kv_usage}{{{selector}}})",
    "pods": "count by (disagg_role) ({running}{{{selector}}})",
}


def metric_names(backend: str) -> MetricNames:
    return VLLM if backend == "vllm" else SGLANG


def range_queries(
    backend: str, namespace: str, model: str, window_seconds: float
) -> dict[Series, str]:
    """One range query per signal, each grouped by pool."""
    names = metric_names(backend)
    values = dict(
        vars(names), selector=model_selector(namespace, model),
        window=prometheus_duration(window_seconds),
    )  # fmt: skip
    return {series: template.format(**values) for series, template in _TEMPLATES.items()}


def traffic_queries(
    backend: str, namespace: str, model: str, decoding_role: str, since_seconds: float
) -> dict[str, str]:
    """Instant queries of the traffic's shape over the whole range, from the pool that
    finishes every request (the decoding pool, whichever pool prefilled it): requests/s, mean
    output length, and the prompt-length mix (mean and quantiles from the engine's
    prompt-length histogram when it exports one; the mean from the token counter)."""
    names = metric_names(backend)
    decodes = pool_selector(namespace, model, decoding_role)
    since = prometheus_duration(since_seconds)

    def increase(metric: str, selector: str) -> str:
        return f"sum(increase({metric}{{{selector}}}[{since}]))"

    queries = {
        "rate": f"{increase(names.requests, decodes)} / {since_seconds:g}",
        "meanPrompt": f"{increase(names.prompt_tokens, decodes)} / "
        f"{increase(names.requests, decodes)}",
    }
    if names.generation_tokens is not None:
        queries["meanOutput"] = (
            f"{increase(names.generation_tokens, decodes)} / {increase(names.requests, decodes)}"
        )
    if names.prompt_lengths is not None:
        buckets = f"sum by (le) (increase({names.prompt_lengths}_bucket{{{decodes}}}[{since}]))"
        for label, q in (("p50Prompt", 0.5), ("p90Prompt", 0.9), ("p99Prompt", 0.99)):
            queries[label] = f"histogram_quantile({q}, {buckets})"
    return queries


RoleSeries = dict[str, dict[Series, dict[float, float]]]
"""role -> signal -> {step time: value}; steps without a finite value are absent."""


def by_role(answers: Mapping[Series, Sequence[Mapping[str, Any]]]) -> RoleSeries:
    """Prometheus range answers (``matrix`` results) split by pool."""
    series: RoleSeries = {}
    for signal, result in answers.items():
        for item in result:
            role = str(item.get("metric", {}).get("disagg_role", ""))
            points = series.setdefault(role, {}).setdefault(signal, {})
            for stamp, raw in item.get("values", []):
                value = float(raw)
                if math.isfinite(value):
                    points[float(stamp)] = value
    return series


@dataclass(frozen=True)
class Step:
    """One evaluation step of the model: the decoding pool's view, prompts where they land."""

    at: float
    tpot_p99: float | None
    """Inter-token latency p99 of the pool that decodes (seconds); None: no tokens."""
    ttft_p99: float | None
    """Time-to-first-token p99 of the pool that takes prompts."""
    prompt_tokens: float
    """Prompt tokens per second that pool processed."""
    prompts: float
    """Requests per second it finished."""
    waiting: float
    """Requests waiting in every pool."""
    decode_waiting: float
    """... of which in the decoding pool."""
    running: float
    """Requests running in the decoding pool."""
    kv_usage: float | None
    """The decoding pool's mean KV-cache usage, 0..1."""
    decode_pods: int
    prompt_pods: int

    @property
    def mean_prompt(self) -> float | None:
        return self.prompt_tokens / self.prompts if self.prompts > 0 else None


@dataclass(frozen=True)
class Timeline:
    """The model's steps, with which pools play which part."""

    mode: Mode
    decoding_role: str
    prompt_role: str
    roles: tuple[str, ...]
    steps: tuple[Step, ...]


def _served_prompts(signals: Mapping[Series, dict[float, float]]) -> bool:
    return any(v > 0 for v in signals.get("promptTokensRate", {}).values())


def timeline(series: RoleSeries) -> Timeline | None:
    """The steps of a model, or None when no pool decodes (nothing to diagnose)."""
    decoding = next((role for role in DECODING_ROLES if role in series), None)
    if decoding is None:
        return None
    prefill = series.get("prefill", {})
    prompt_role = "prefill" if _served_prompts(prefill) else decoding
    decoder, prompter = series[decoding], series[prompt_role]
    stamps = sorted(set(decoder.get("running", {})) | set(decoder.get("tpotP99", {})))

    def value(signals: Mapping[Series, dict[float, float]], name: Series, at: float) -> float:
        return signals.get(name, {}).get(at, 0.0)

    steps = tuple(
        Step(
            at=at,
            tpot_p99=decoder.get("tpotP99", {}).get(at),
            ttft_p99=prompter.get("ttftP99", {}).get(at),
            prompt_tokens=value(prompter, "promptTokensRate", at),
            prompts=value(prompter, "promptsRate", at),
            waiting=sum(value(signals, "waiting", at) for signals in series.values()),
            decode_waiting=value(decoder, "waiting", at),
            running=value(decoder, "running", at),
            kv_usage=decoder.get("kvUsage", {}).get(at),
            decode_pods=round(value(decoder, "pods", at)),
            prompt_pods=round(value(prompter, "pods", at)),
        )
        for at in stamps
    )
    mode: Mode = "disaggregated" if prompt_role != decoding else "colocated"
    return Timeline(mode, decoding, prompt_role, tuple(sorted(series)), steps)
