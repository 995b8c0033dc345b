"""The operator's own Prometheus metrics and its health endpoints."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class OperatorMetrics:
    """Reconcile counts, errors, durations, API writes and leadership."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series: noise
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "disagg_operator_reconcile_total",
            "Reconcile passes by result.",
            ["result"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "disagg_operator_reconcile_duration_seconds",
            "Time of one reconcile pass.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.writes = Counter(
            "disagg_operator_kube_writes_total",
            "Mutating Kubernetes API calls.",
            ["kind", "verb"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "disagg_operator_leader", "1 while this replica leads.", registry=self.registry
        )
        self.queue = Gauge(
            "disagg_operator_queue_depth", "Models waiting or reconciling.", registry=self.registry
        )

    def count_write(self, kind: str, verb: str) -> None:
        self.writes.labels(kind=kind, verb=verb).inc()


async def serve(
    metrics: OperatorMetrics, host: str, port: int, ready: Callable[[], bool]
) -> web.AppRunner:
    """Serve /metrics, /healthz (the event loop answers) and /readyz (watching, API reachable)."""

    async def metrics_view(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not ready")

    app = web.Application()
    app.add_routes(
        [
            web.get("/metrics", metrics_view),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
