"""A plan as a ready DisaggregatedModel manifest (pure).

A disaggregated plan becomes the two pools with the planned TP degrees, replica counts and
autoscaler bounds. A colocated plan becomes ``mode: colocated`` with the planned engine in
``decode`` (its chunk size as ``maxNumBatchedTokens``) and a one-replica prefill pool of the
same TP that the mode does not run: switching to ``disaggregated`` later is a one-field edit
that starts from a working split. The manifest is validated by the API before it is
returned, so it cannot be invalid.
"""

from __future__ import annotations

import re
from typing import Any

from disagg.api.resource import API_VERSION, KIND, parse_model
from disagg.plan.model import Plan, PlanRequest

RDMA_NETWORKS = frozenset({"ib400", "roce400", "nvlink"})


def duration(seconds: float) -> str:
    """An SLO as a manifest duration: ``250ms``, ``2s``."""
    if seconds < 1:
        return f"{round(seconds * 1000, 3):g}ms"
    return f"{round(seconds, 3):g}s"


def to_manifest(
    result: Plan, request: PlanRequest, name: str | None = None, namespace: str = "default"
) -> dict[str, Any]:
    """The DisaggregatedModel that deploys ``result``."""
    chosen, model = result.chosen, request.model
    served = model.name
    colocated = result.verdict == "colocated"
    pools: dict[str, dict[str, Any]] = {}
    for pool, replicas, tp, budget in (
        ("prefill", chosen.prefill_replicas, chosen.prefill_tp or 1, 8192),
        ("decode", chosen.decode_replicas, chosen.decode_tp, chosen.max_num_batched_tokens),
    ):
        low, high = result.bounds[pool]
        pools[pool] = {
            "replicas": replicas,
            "tensorParallelSize": tp,
            "maxNumBatchedTokens": budget,
            "autoscaling": {"minReplicas": low, "maxReplicas": high},
        }
    pools["decode"]["maxNumSeqs"] = 256
    spec: dict[str, Any] = {
        "model": {"name": model.aliases[0] if model.aliases else model.name, "servedName": served},
        "runtime": {"backend": "vllm", "kvConnector": "nixl"},
        "prefill": pools["prefill"],
        "decode": pools["decode"],
        "network": {"transport": "rdma" if request.network.name in RDMA_NETWORKS else "tcp"},
        "autoscaling": {
            "enabled": True,
            "ttftP99": duration(request.slo.ttft),
            "tpotP99": duration(request.slo.tpot),
        },
    }
    if model.mla_latent_dim is not None:
        spec["model"]["mla"] = True
    if request.max_gpus is not None:
        spec["autoscaling"]["maxTotalGPUs"] = request.max_gpus
    if colocated:
        spec["mode"] = "colocated"
        high = max(1, result.bounds["decode"][1])
        spec["prefill"] = {
            "replicas": 1,
            "tensorParallelSize": chosen.decode_tp,
            "maxNumBatchedTokens": 8192,
            "autoscaling": {"minReplicas": 1, "maxReplicas": high},
        }
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name or _dns_name(served), "namespace": namespace},
        "spec": spec,
    }
    parse_model(manifest)
    return manifest


def _dns_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "model-" + name
    return name[:63].rstrip("-")
