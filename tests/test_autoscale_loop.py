"""The autoscaler loop's reporting, against in-memory fakes of the API server and Prometheus:
an SLO no size can meet lands in status once and as one Event, and does not scale."""

from __future__ import annotations

import copy
from typing import Any

from disagg.autoscale.loop import ModelAutoscaler, apply_merge_patch
from disagg.autoscale.metrics import PrometheusSource
from disagg.autoscale.policy import Signals
from disagg.autoscale.queries import Signal

Obj = dict[str, Any]
NOW = 1_000_000.0
SLOW_PROMPTS = ((1.0, 90.0), (2.5, 95.0), (10.0, 100.0), (float("inf"), 100.0))


class FakeApi:
    """The objects the loop reads and the writes it makes."""

    def __init__(self, model: Obj, deployments: dict[str, Obj]) -> None:
        self.model = model
        self.deployments = deployments
        self.applied: list[Obj] = []
        self.status_writes = 0

    async def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        if kind == "DisaggregatedModel":
            return copy.deepcopy(self.model)
        return copy.deepcopy(self.deployments.get(name))

    async def apply(self, obj: Obj, **_: Any) -> Obj:
        self.applied.append(obj)
        return obj

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        return patch

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj:
        self.status_writes += 1
        self.model["status"] = apply_merge_patch(self.model.get("status") or {}, status)
        return self.model


class FakeEvents:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    async def normal(self, body: Obj, reason: str, message: str) -> None:
        self.posted.append(("Normal", reason, message))

    async def warning(self, body: Obj, reason: str, message: str) -> None:
        self.posted.append(("Warning", reason, message))


class FakePrometheus(PrometheusSource):
    """Long prompts on the prefill pool: 6% of them need more than the 3 s SLO alone."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def signals(self, queries: dict[Signal, str], latency: Signal) -> Signals:
        if latency == "ttftP99":
            return Signals(
                p99=6.0, request_rate=0.2, queue=0.0, running=1.0, pods_reporting=2,
                sampled_at=NOW, prompt_tokens_rate=2000.0, prefill_seconds=1.2,
                prefill_buckets=SLOW_PROMPTS,
            )  # fmt: skip
        return Signals(
            p99=0.02, request_rate=0.5, queue=0.0, running=10.0, kv_usage=0.1,
            pods_reporting=1, sampled_at=NOW,
        )  # fmt: skip

    async def vector(self, promql: str, label: str = "pod") -> dict[str, float]:
        return {}


def _model() -> Obj:
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "m", "namespace": "ns", "generation": 3, "resourceVersion": "7"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
            "prefill": {"replicas": 2, "tensorParallelSize": 8},
            "decode": {"replicas": 1, "tensorParallelSize": 8},
            "autoscaling": {"enabled": True, "ttftP99": "3s", "tpotP99": "50ms"},
        },
    }


def _deployment(replicas: int) -> Obj:
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": replicas}}


async def test_an_unreachable_ttft_is_reported_once_and_does_not_add_replicas() -> None:
    api = FakeApi(_model(), {"m-prefill": _deployment(2), "m-decode": _deployment(1)})
    events = FakeEvents()
    scaler = ModelAutoscaler(
        api,  # type: ignore[arg-type]
        events,  # type: ignore[arg-type]
        "ns",
        "m",
        on_change=lambda: None,
        source_factory=FakePrometheus,
        clock=lambda: NOW,
    )
    for _ in range(3):
        assert await scaler.tick() == 15.0
    limited = next(c for c in api.model["status"]["conditions"] if c["type"] == "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "SLOUnreachable")
    assert "prefill:" in limited["message"] and "on TP8" in limited["message"]
    assert "TP32 would serve them" in limited["message"]  # up to 10 s against 3 s
    warnings = [e for e in events.posted if e[1] == "SLOUnreachable"]
    assert len(warnings) == 1, events.posted
    # More replicas cannot help those prompts: the prefill pool is not scaled for them.
    assert not [a for a in api.applied if a["metadata"]["name"] == "m-prefill"], api.applied
