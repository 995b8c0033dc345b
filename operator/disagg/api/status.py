"""The ``status`` of a DisaggregatedModel: what the operator and the autoscaler observed.

Only the operator writes it. Conditions follow the Kubernetes conventions (type, status,
reason, message, lastTransitionTime, observedGeneration).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from disagg.api.base import ApiModel

ConditionType = Literal["Ready", "Progressing", "Degraded", "ScalingActive", "ScalingLimited"]
CONDITION_TYPES: tuple[ConditionType, ...] = (
    "Ready",
    "Progressing",
    "Degraded",
    "ScalingActive",
    "ScalingLimited",
)


class Condition(ApiModel):
    """One aspect of the model's state, in the Kubernetes condition format."""

    type: ConditionType = Field(description="Ready, Progressing, Degraded, ScalingActive, ...")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="CamelCase reason, e.g. Unschedulable or MetricsUnavailable.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this condition describes."
    )


class PoolStatus(ApiModel):
    """Observed state of one pool."""

    replicas: int = Field(default=0, ge=0, description="Pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Pods that are ready.")
    desired_replicas: int = Field(default=0, ge=0, description="Pods wanted now.")
    summary: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    last_scale_time: str | None = Field(
        default=None, description="When the autoscaler last changed the pool size."
    )
    last_scale_reason: str | None = Field(
        default=None, description="Why the autoscaler last changed the pool size."
    )


class RouterStatus(ApiModel):
    """Observed state of the router."""

    replicas: int = Field(default=0, ge=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Router pods that are ready.")
    endpoint: str | None = Field(
        default=None, description="In-cluster URL of the OpenAI-compatible API."
    )


class ObservedMetrics(ApiModel):
    """The latest SLO signals the autoscaler read from Prometheus."""

    ttft_p99: str | None = Field(default=None, description="TTFT p99, e.g. 850ms.")
    tpot_p99: str | None = Field(default=None, description="Inter-token latency p99, e.g. 32ms.")
    ttft_p99_seconds: float | None = Field(default=None, ge=0, description="TTFT p99 in seconds.")
    tpot_p99_seconds: float | None = Field(default=None, ge=0, description="TPOT p99 in seconds.")
    request_rate: float | None = Field(default=None, ge=0, description="Requests per second.")
    observed_at: str | None = Field(default=None, description="When these were read (RFC 3339).")


class DisaggregatedModelStatus(ApiModel):
    """What the operator observed; written only by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation last reconciled."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing, Degraded, ScalingActive, ScalingLimited.",
    )
    prefill: PoolStatus | None = Field(
        default=None, description="The prefill pool (mode disaggregated)."
    )
    decode: PoolStatus | None = Field(
        default=None, description="The decode pool (mode disaggregated)."
    )
    engine: PoolStatus | None = Field(
        default=None, description="The engine pool that prefills and decodes (mode colocated)."
    )
    router: RouterStatus = Field(default_factory=RouterStatus, description="The router.")
    metrics: ObservedMetrics = Field(
        default_factory=ObservedMetrics, description="Latest SLO signals from Prometheus."
    )
