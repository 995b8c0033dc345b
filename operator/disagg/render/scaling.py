"""External autoscaling: a KEDA ScaledObject or an HPA per pool, from the same PromQL.

With ``spec.autoscaling.mode: external`` the operator leaves replica counts to these objects.
The SLO is the target: KEDA's Prometheus trigger (or the HPA's external metric, served by
prometheus-adapter under the names below) compares each pool's p99 with its SLO as a
``Value`` target, so the HPA sizes the pool by ``ceil(replicas x p99 / SLO)`` (within its
tolerance), and the spec's speed limits become the HPA ``behavior``.
"""

from __future__ import annotations

from typing import Any

from disagg.api.base import parse_duration
from disagg.api.spec import DisaggregatedModelSpec, Role
from disagg.autoscale.queries import build_queries
from disagg.naming import child_name
from disagg.render.common import Manifest, RenderContext, object_meta

EXTERNAL_METRIC = {"prefill": "disagg_ttft_p99_seconds", "decode": "disagg_tpot_p99_seconds"}


def _behavior(spec: DisaggregatedModelSpec) -> dict[str, Any]:
    a = spec.autoscaling
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": round(parse_duration(a.scale_up.stabilization_window)),
            "policies": [
                {
                    "type": "Pods",
                    "value": a.scale_up.max_step,
                    "periodSeconds": max(1, round(parse_duration(a.scale_up.cooldown))),
                }
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": round(parse_duration(a.scale_down.stabilization_window)),
            "policies": [
                {
                    "type": "Pods",
                    "value": a.scale_down.max_step,
                    "periodSeconds": max(1, round(parse_duration(a.scale_down.cooldown))),
                }
            ],
        },
    }


def _slo(spec: DisaggregatedModelSpec, role: Role) -> float:
    return parse_duration(
        spec.autoscaling.ttft_p99 if role == "prefill" else spec.autoscaling.tpot_p99
    )


def latency_query(ctx: RenderContext, role: Role) -> str:
    """The pool's SLO query, exactly as the builtin autoscaler would run it."""
    spec = ctx.model.spec
    overrides = (
        spec.autoscaling.queries.model_dump(by_alias=True, exclude_none=True)
        if spec.autoscaling.queries
        else {}
    )
    queries = build_queries(
        spec.runtime.backend,
        ctx.namespace,
        ctx.name,
        role,
        parse_duration(spec.autoscaling.window),
        overrides,
    )
    return queries["ttftP99" if role == "prefill" else "tpotP99"]


def render_scaler(ctx: RenderContext, role: Role) -> Manifest:
    """The ScaledObject or HPA of one pool."""
    spec = ctx.model.spec
    pool = spec.pool(role)
    name = child_name(ctx.name, role)
    if spec.autoscaling.external_scaler == "keda":
        return {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": object_meta(ctx, name, role),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicaCount": pool.autoscaling.min_replicas,
                "maxReplicaCount": pool.autoscaling.max_replicas,
                "pollingInterval": max(1, round(parse_duration(spec.autoscaling.interval))),
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(spec)}},
                "triggers": [
                    {
                        "type": "prometheus",
                        # Value: desired = ceil(replicas x p99 / SLO), the HPA's proportional
                        # rule. KEDA's default (AverageValue) would divide the p99 by the SLO
                        # alone, whatever the pool's size.
                        "metricType": "Value",
                        "metadata": {
                            "serverAddress": spec.autoscaling.prometheus_url or ctx.prometheus_url,
                            "query": latency_query(ctx, role),
                            "threshold": f"{_slo(spec, role):g}",
                            "ignoreNullValues": "false",
                        },
                    }
                ],
            },
        }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(ctx, name, role),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": max(1, pool.autoscaling.min_replicas),
            "maxReplicas": pool.autoscaling.max_replicas,
            "behavior": _behavior(spec),
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": EXTERNAL_METRIC[role],
                            "selector": {
                                "matchLabels": {"disagg_model": ctx.name, "disagg_role": role}
                            },
                        },
                        "target": {"type": "Value", "value": f"{round(_slo(spec, role) * 1000)}m"},
                    },
                }
            ],
        },
    }
