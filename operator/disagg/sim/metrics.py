"""The engine simulator's Prometheus metrics: vLLM's names, types, labels and buckets.

Latencies are in simulated seconds (wall time divided by the time scale), so they compare
directly with real-world SLOs whatever ``--time-scale`` is. One series is the simulator's
own, not vLLM's: ``disagg_sim_host_lag_seconds``, how late the host woke the engine's loop.
Another is ``disagg_sim_inter_token_seconds``: the same gaps as vLLM's inter-token histogram in
millisecond buckets, whose p99 a bench or the demo can read without vLLM's 10 ms -> 25 ms
bucket edge turning a 10% rise of a 10 ms decode step into a doubled p99.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from disagg.perf.buckets import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    SIM_MAX_MODEL_LEN,
    TTFT_BUCKETS,
    length_buckets,
)

LABELS: Final = ("model_name", "engine")
NIXL_BYTES_BUCKETS: Final = tuple(2 ** (10 + i) for i in range(1, 25, 2))
"""vLLM's: 2 KiB to 8 GiB, a power of four apart (modelled bytes, not the scaled ones sent)."""
NIXL_XFER_TIME_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    5.0,
)
"""vLLM 0.33's for ``nixl_xfer_time_seconds`` (its list without the first bound, as there)."""
HOST_LAG_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
FINE_ITL_BUCKETS: Final = (
    *(ms / 1000 for ms in range(1, 31)),
    0.035, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip


class EngineMetrics:
    """One registry per simulated engine, labelled like a vLLM DP rank 0."""

    def __init__(
        self, model_name: str, custom_buckets: Mapping[str, Sequence[float]] | None = None
    ) -> None:
        # vLLM's --custom-histogram-buckets replaces a family's bounds in every histogram of it.
        custom = custom_buckets or {}
        ttft_bounds = tuple(custom.get("time_to_first_token", TTFT_BUCKETS))
        itl_bounds = tuple(custom.get("inter_token_latency", ITL_BUCKETS))
        self.registry = CollectorRegistry()
        r = self.registry
        self.labels = {"model_name": model_name, "engine": "0"}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=ttft_bounds,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=itl_bounds,
            registry=r,
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            LABELS,
            buckets=itl_bounds,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_lengths = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            LABELS,
            buckets=length_buckets(SIM_MAX_MODEL_LEN),
            registry=r,
        )
        self.fine_itl = Histogram(
            "disagg_sim_inter_token_seconds",
            "Inter-token latency in millisecond buckets (the simulator's own series).",
            LABELS,
            buckets=FINE_ITL_BUCKETS,
            registry=r,
        )
        self.host_lag = Histogram(
            "disagg_sim_host_lag_seconds",
            "Wall seconds the host woke the engine loop later than its step ended.",
            buckets=HOST_LAG_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            LABELS,
            registry=r,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            LABELS,
            registry=r,
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            LABELS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            LABELS,
            registry=r,
        )
        self.nixl_bytes = Histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            LABELS,
            buckets=NIXL_BYTES_BUCKETS,
            registry=r,
        )
        self.nixl_xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            LABELS,
            buckets=NIXL_XFER_TIME_BUCKETS,
            registry=r,
        )
        self._prefix_seen = (0, 0)
        for metric in (
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.nixl_bytes,
            self.nixl_xfer_time,
            self.running,
            self.waiting,
            self.kv_usage,
            self.prompt_tokens,
            self.generation_tokens,
        ):
            metric.labels(**self.labels)

    def observe_prefix_cache(self, queries: int, hits: int) -> None:
        """Bring the counters up to the scheduler's running totals."""
        seen_queries, seen_hits = self._prefix_seen
        if queries > seen_queries:
            self.prefix_cache_queries.labels(**self.labels).inc(queries - seen_queries)
        if hits > seen_hits:
            self.prefix_cache_hits.labels(**self.labels).inc(hits - seen_hits)
        self._prefix_seen = (queries, hits)

    def observe_gauges(self, running: int, waiting: int, usage: float) -> None:
        self.running.labels(**self.labels).set(running)
        self.waiting.labels(**self.labels).set(waiting)
        self.kv_usage.labels(**self.labels).set(usage)
