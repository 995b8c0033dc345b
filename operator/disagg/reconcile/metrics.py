"""The operator's own Prometheus metrics and its health endpoints.

Besides its own work (reconciles, API writes, leadership), the operator exports what the
built-in autoscaler counts of each model's SLOs: the requests each SLO covered and those
that missed it, as counters, so that burn rates over any window are a PromQL ``rate()``
away (the chart's PrometheusRule pages on them), the window, the targets and the budget
remaining; and of each pool it scales, the replicas it decided and those ready, its bounds,
how far over its SLO it is, and each resize (the chart's dashboards and alerts read them).
Only the leader evaluates, so only its counters move; summed across replicas they count
each request once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final

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

from disagg.reconcile.evaluate import SloReport

SLO_LABELS: Final = ["model_namespace", "model", "slo"]
"""Not `namespace`: the scrape sets that one to the operator pod's."""
SLOS: Final = ("ttft", "tpot")
POOL_LABELS: Final = ["model_namespace", "model", "pool"]


class OperatorMetrics:
    """Reconcile counts, errors, durations, API writes and leadership."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series: noise
        self.registry = CollectorRegistry()
        self._pools: dict[tuple[str, str], set[str]] = {}
        """The pools each model's series were last exported for."""
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
        self.slo_requests = Counter(
            "disagg_slo_requests",
            "Requests an SLO covered, as the autoscaler counted them from the engines.",
            SLO_LABELS,
            registry=self.registry,
        )
        self.slo_missed = Counter(
            "disagg_slo_missed",
            "Of those, the requests that surely missed the SLO.",
            SLO_LABELS,
            registry=self.registry,
        )
        self.slo_missed_at_most = Counter(
            "disagg_slo_missed_at_most",
            "Those and the requests that may have (in the histogram bucket holding the SLO).",
            SLO_LABELS,
            registry=self.registry,
        )
        self.slo_remaining = Gauge(
            "disagg_slo_budget_remaining",
            "The most of the SLO's error budget that remains over its window (1: untouched; "
            "negative: overspent).",
            SLO_LABELS,
            registry=self.registry,
        )
        self.slo_window = Gauge(
            "disagg_slo_window_seconds",
            "The SLOs' compliance window (spec.autoscaling.sloWindow).",
            ["model_namespace", "model"],
            registry=self.registry,
        )
        self.holding = Gauge(
            "disagg_autoscaler_metrics_unavailable",
            "1 while the autoscaler holds a model's replicas because it cannot read its metrics.",
            ["model_namespace", "model"],
            registry=self.registry,
        )

        self.slo_target = Gauge(
            "disagg_slo_target_seconds",
            "The SLO's p99 target (spec.autoscaling.ttftP99 and tpotP99).",
            SLO_LABELS,
            registry=self.registry,
        )
        self.pool_replicas = Gauge(
            "disagg_pool_replicas",
            "A pool's replicas: desired (what the autoscaler decided at its last evaluation) "
            "and ready.",
            [*POOL_LABELS, "state"],
            registry=self.registry,
        )
        self.pool_bounds = Gauge(
            "disagg_pool_replica_bounds",
            "A pool's autoscaling bounds (minReplicas, maxReplicas).",
            [*POOL_LABELS, "bound"],
            registry=self.registry,
        )
        self.pool_pressure = Gauge(
            "disagg_pool_slo_pressure",
            "How far a pool is over its SLO at the last evaluation (1: at it), by the p99 its "
            "engines report or its load gauges, whichever is higher.",
            POOL_LABELS,
            registry=self.registry,
        )
        self.scalings = Counter(
            "disagg_autoscaler_scalings",
            "Resizes the autoscaler decided, by pool and direction.",
            [*POOL_LABELS, "direction"],
            registry=self.registry,
        )

    def count_write(self, kind: str, verb: str) -> None:
        self.writes.labels(kind=kind, verb=verb).inc()

    def observe_slo(self, namespace: str, model: str, report: SloReport) -> None:
        """Export what one evaluation counted of a model's SLOs."""
        self.holding.labels(namespace, model).set(1 if report.holding else 0)
        if report.window:
            self.slo_window.labels(namespace, model).set(report.window)
        for slo, (requests, missed, at_most) in report.counted.items():
            self.slo_requests.labels(namespace, model, slo).inc(requests)
            self.slo_missed.labels(namespace, model, slo).inc(missed)
            self.slo_missed_at_most.labels(namespace, model, slo).inc(at_most)
        for slo, remaining in report.remaining.items():
            self.slo_remaining.labels(namespace, model, slo).set(remaining)
        for slo, target in report.targets.items():
            self.slo_target.labels(namespace, model, slo).set(target)
        for pool, size in report.pools.items():
            self.pool_replicas.labels(namespace, model, pool, "desired").set(size.desired)
            self.pool_replicas.labels(namespace, model, pool, "ready").set(size.ready)
            self.pool_bounds.labels(namespace, model, pool, "min").set(size.min_replicas)
            self.pool_bounds.labels(namespace, model, pool, "max").set(size.max_replicas)
            self.pool_pressure.labels(namespace, model, pool).set(size.pressure)
            if size.desired != size.current:
                direction = "up" if size.desired > size.current else "down"
                self.scalings.labels(namespace, model, pool, direction).inc()
        for gone in self._pools.get((namespace, model), set()) - set(report.pools):
            self._forget_pool(namespace, model, gone)
        if report.pools:
            self._pools[(namespace, model)] = set(report.pools)

    def forget_slo(self, namespace: str, model: str) -> None:
        """Drop a model's SLO and pool series: it is gone, or nothing counts its SLOs any
        more."""
        for metric in (self.holding, self.slo_window):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, model)
        for slo in SLOS:
            for counted in (self.slo_requests, self.slo_missed, self.slo_missed_at_most,
                            self.slo_remaining, self.slo_target):  # fmt: skip
                with contextlib.suppress(KeyError):
                    counted.remove(namespace, model, slo)
        for pool in self._pools.pop((namespace, model), set()):
            self._forget_pool(namespace, model, pool)

    def _forget_pool(self, namespace: str, model: str, pool: str) -> None:
        """A pool that is no longer scaled (a mode switch replaced it, or the model went)."""
        labelled = [
            (self.pool_replicas, ("desired", "ready")),
            (self.pool_bounds, ("min", "max")),
            (self.scalings, ("up", "down")),
        ]
        for metric, values in labelled:
            for value in values:
                with contextlib.suppress(KeyError):
                    metric.remove(namespace, model, pool, value)
        with contextlib.suppress(KeyError):
            self.pool_pressure.remove(namespace, model, pool)


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
