"""PromQL of every autoscaling signal, built from the spec (pure).

Engines label their series only with ``model_name`` and ``engine``; which pool a series
belongs to comes from the pod's labels, copied onto the series by the scrape configuration
(the chart's PodMonitor, or the ``relabel_configs`` in the docs):

    __meta_kubernetes_namespace                        -> namespace
    __meta_kubernetes_pod_name                         -> pod
    __meta_kubernetes_pod_label_disagg_dev_model       -> disagg_model
    __meta_kubernetes_pod_label_disagg_dev_role        -> disagg_role

A user can override any query in ``spec.autoscaling.queries``; ``$selector`` and ``$window``
are substituted there as here.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Final, Literal

Signal = Literal[
    "ttftP99", "tpotP99", "queue", "running", "kvUsage", "requestRate", "podsReporting",
    "lastSample", "promptTokensRate", "prefillSeconds", "prefillBuckets", "tpotMean",
    "generationTokensRate", "ttftBuckets", "tpotBuckets",
]  # fmt: skip
SIGNALS: Final[tuple[Signal, ...]] = (
    "ttftP99", "tpotP99", "queue", "running", "kvUsage", "requestRate", "podsReporting",
    "lastSample", "promptTokensRate", "prefillSeconds", "prefillBuckets", "tpotMean",
    "generationTokensRate", "ttftBuckets", "tpotBuckets",
)  # fmt: skip
PREFILL_LOAD: Final[tuple[Signal, ...]] = ("promptTokensRate", "prefillSeconds")
"""What the TTFT-driven pool is sized from besides ``prefillBuckets`` (optional: an engine
without them is sized on latency and its queue)."""
DECODE_LOAD: Final[tuple[Signal, ...]] = ("tpotMean", "generationTokensRate")
"""What the TPOT-driven pool learns its step time and its outputs' trend from (optional)."""


@dataclass(frozen=True)
class MetricNames:
    """An engine's metric names."""

    ttft: str
    itl: str
    waiting: str
    running: str
    kv_usage: str
    requests: str
    prompt_tokens: str
    prefill_time: str | None
    """Histogram of the prefill phase alone (scheduled to first token)."""
    prefill_matcher: str = ""
    """Label matchers that pick the prefill phase out of ``prefill_time`` (SGLang times
    every request stage in one histogram)."""
    generation_tokens: str | None = None
    prompt_lengths: str | None = None
    """Histogram of prompt tokens per request (vLLM always; SGLang with
    ``--collect-tokens-histogram``)."""
    request_tpot: str | None = None
    """Histogram of each request's mean time per output token: what the TPOT SLO's error
    budget counts (the inter-token histogram counts gaps, not requests)."""


VLLM: Final = MetricNames(
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:kv_cache_usage_perc",
    requests="vllm:e2e_request_latency_seconds_count",
    prompt_tokens="vllm:prompt_tokens_total",
    prefill_time="vllm:request_prefill_time_seconds",
    generation_tokens="vllm:generation_tokens_total",
    prompt_lengths="vllm:request_prompt_tokens",
    request_tpot="vllm:request_time_per_output_token_seconds",
)
SGLANG: Final = MetricNames(
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    waiting="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    kv_usage="sglang:token_usage",
    requests="sglang:e2e_request_latency_seconds_count",
    prompt_tokens="sglang:prompt_tokens_total",
    # SGLang 0.5.23 observes "prefill_forward" from a request's first forward to its prefill
    # finishing, chunks included (observability/req_time_stats.py; in upstream/facts.json).
    # The stage names change between SGLang versions; a query override can name another.
    prefill_time="sglang:per_stage_req_latency_seconds",
    prefill_matcher=',stage="prefill_forward"',
    generation_tokens="sglang:generation_tokens_total",
    prompt_lengths="sglang:prompt_tokens_histogram",
    request_tpot="sglang:request_time_per_output_token_seconds",
)

_TEMPLATES: Final[dict[Signal, str]] = {
    "ttftP99": "histogram_quantile(0.99, sum by (le) (rate({ttft}_bucket{{$selector}}[$window])))",
    "ttftBuckets": "sum by (le) (rate({ttft}_bucket{{$selector}}[$window]))",
    "tpotBuckets": "sum by (le) (rate({request_tpot}_bucket{{$selector}}[$window]))",
    "tpotP99": "histogram_quantile(0.99, sum by (le) (rate({itl}_bucket{{$selector}}[$window])))",
    "queue": "sum({waiting}{{$selector}})",
    "running": "sum({running}{{$selector}})",
    "kvUsage": "avg({kv_usage}{{$selector}})",
    "requestRate": "sum(rate({requests}{{$selector}}[$window]))",
    "podsReporting": "count({running}{{$selector}})",
    "lastSample": "max(timestamp({running}{{$selector}}))",
    "promptTokensRate": "sum(rate({prompt_tokens}{{$selector}}[$window]))",
    "prefillSeconds": "sum(rate({prefill_time}_sum{{$selector{prefill_matcher}}}[$window])) / "
    "sum(rate({prefill_time}_count{{$selector{prefill_matcher}}}[$window]))",
    "prefillBuckets": "sum by (le) "
    "(rate({prefill_time}_bucket{{$selector{prefill_matcher}}}[$window]))",
    "tpotMean": "sum(rate({itl}_sum{{$selector}}[$window])) / "
    "sum(rate({itl}_count{{$selector}}[$window]))",
    "generationTokensRate": "sum(rate({generation_tokens}{{$selector}}[$window]))",
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def model_selector(namespace: str, model: str) -> str:
    """The label matchers of every engine series of one model (both pools)."""
    return f'namespace="{_escape(namespace)}",disagg_model="{_escape(model)}"'


def pool_selector(namespace: str, model: str, role: str) -> str:
    """The label matchers of one pool's engine series."""
    return f'{model_selector(namespace, model)},disagg_role="{_escape(role)}"'


def prometheus_duration(seconds: float) -> str:
    """A PromQL range (whole seconds, at least 1s)."""
    return f"{max(1, round(seconds))}s"


def build_queries(
    backend: str, namespace: str, model: str, role: str, window_seconds: float,
    overrides: dict[str, str] | None = None,
) -> dict[Signal, str]:  # fmt: skip
    """Every signal's query for one pool (``prefillBuckets`` and ``ttftBuckets`` are instant
    vectors by ``le``;
    the prefill-time signals are absent for an engine without that histogram)."""
    names = VLLM if backend == "vllm" else SGLANG
    values = {
        "selector": pool_selector(namespace, model, role),
        "window": prometheus_duration(window_seconds),
    }
    missing = [name for name, metric in vars(names).items() if metric is None]
    queries: dict[Signal, str] = {}
    for signal in SIGNALS:
        template = (overrides or {}).get(signal)
        if template is None:
            default = _TEMPLATES[signal]
            if any(f"{{{name}}}" in default for name in missing):
                continue  # this engine does not report it; the policy sizes without it
            template = default.format(**vars(names))
        queries[signal] = Template(template).safe_substitute(values)
    return queries
