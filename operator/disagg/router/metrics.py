"""The router's own metrics: user-facing latency, paths taken, per-backend load."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from disagg.perf.buckets import ITL_BUCKETS, TTFT_BUCKETS
from disagg.router.endpoints import Endpoint

PATHS: Final = (
    "disaggregated", "skipped", "local-prefill", "offloaded", "fallback", "colocated", "rejected",
)  # fmt: skip
"""The values of ``disagg_router_requests_total``'s ``path`` label (docs/troubleshooting.md
says what each means)."""


class RouterMetrics:
    """Histograms of what the client sees, and counters of how requests were served."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram(
            "disagg_router_time_to_first_token_seconds",
            "Time to first token as the client sees it.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "disagg_router_inter_token_latency_seconds",
            "Gap between streamed events as the client sees it.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.prefill_seconds = Histogram(
            "disagg_router_prefill_seconds",
            "Duration of the prefill step.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "disagg_router_requests_total",
            "Requests by path and HTTP status.",
            ["path", "code"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "disagg_router_upstream_failures_total",
            "Failed calls to engines.",
            ["role"],
            registry=r,
        )
        self.client_timeouts = Counter(
            "disagg_router_client_timeouts_total",
            "Client connections cut off for sending too slowly, by what was late.",
            ["phase"],
            registry=r,
        )
        for phase in ("headers", "body"):
            self.client_timeouts.labels(phase=phase)
        self.in_flight = Gauge(
            "disagg_router_backend_in_flight",
            "Requests in flight per engine.",
            ["role", "endpoint"],
            registry=r,
        )

    @contextmanager
    def track(self, endpoint: Endpoint, role: str) -> Iterator[None]:
        """Count a request as in flight on an endpoint while the block runs."""
        gauge = self.in_flight.labels(role=role, endpoint=endpoint.url)
        endpoint.in_flight += 1
        gauge.inc()
        try:
            yield
        finally:
            endpoint.in_flight -= 1
            gauge.dec()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
