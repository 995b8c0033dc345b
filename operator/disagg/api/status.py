"""The ``status`` of a DisaggregatedModel: what the operator and the autoscaler observed.

Only the operator writes it. Conditions follow the Kubernetes conventions (type, status,
reason, message, lastTransitionTime, observedGeneration).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.spec import Mode

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


class RouteParentStatus(ApiModel):
    """What one Gateway said of the model's HTTPRoute (its controller's conditions)."""

    gateway: str = Field(description="The Gateway: namespace/name, and /listener if named.")
    accepted: str = Field(
        default="Unknown",
        description="The route's Accepted condition there: True, False, or Unknown until "
        "the Gateway's controller has said.",
    )
    resolved_refs: str = Field(
        default="Unknown", description="The route's ResolvedRefs condition there."
    )
    message: str | None = Field(
        default=None, description="The controller's reason and message when not both True."
    )


class GatewayStatus(ApiModel):
    """The model's HTTPRoute and what each Gateway it names reported (spec.gateway)."""

    route: str | None = Field(
        default=None, description="The HTTPRoute's name (None while it cannot be created)."
    )
    parents: list[RouteParentStatus] = Field(
        default_factory=list,
        max_length=32,
        description="One entry per Gateway in spec.gateway.parentRefs, as its controller "
        "reported in the route's status (read, never written, by the operator).",
    )


class ObservedMetrics(ApiModel):
    """The latest SLO signals the autoscaler read from Prometheus."""

    ttft_p99: str | None = Field(default=None, description="TTFT p99, e.g. 850ms.")
    tpot_p99: str | None = Field(default=None, description="Inter-token latency p99, e.g. 32ms.")
    ttft_p99_seconds: float | None = Field(default=None, ge=0, description="TTFT p99 in seconds.")
    tpot_p99_seconds: float | None = Field(default=None, ge=0, description="TPOT p99 in seconds.")
    request_rate: float | None = Field(default=None, ge=0, description="Requests per second.")
    observed_at: str | None = Field(default=None, description="When these were read (RFC 3339).")


class SloBudget(ApiModel):
    """One SLO's attainment and error budget over the compliance window."""

    requests: int = Field(ge=0, description="Requests the SLO covered in the window so far.")
    missed: int = Field(ge=0, description="Of those, the requests surely over the SLO.")
    missed_at_most: int = Field(
        ge=0,
        description="Those and the requests that may be: the engines' histogram puts them in "
        "the bucket that holds the SLO (the same as missed when the SLO is a bucket bound).",
    )
    attainment: str | None = Field(
        default=None,
        description="The share within the SLO, e.g. 99.42%, or a range when some requests "
        "may have missed it (none counted: absent).",
    )
    remaining: str = Field(
        description="Error budget remaining: the share of the misses the target allows (1% "
        "of the requests for a p99) not yet spent, e.g. 42%, or a range (-10..42%); negative "
        "when overspent."
    )
    remaining_fraction: float = Field(
        allow_inf_nan=False,
        description="The most that remains, as a fraction (1 = untouched): what the requests "
        "that surely missed leave.",
    )
    remaining_fraction_at_least: float = Field(
        allow_inf_nan=False,
        description="The least that remains: what missedAtMost would leave.",
    )
    burn_rate_5m: float | None = Field(
        default=None,
        alias="burnRate5m",
        ge=0,
        allow_inf_nan=False,
        description="Requests that surely missed over the last 5 minutes relative to what the "
        "target allows (1 spends the budget exactly over the window).",
    )
    burn_rate_1h: float | None = Field(
        default=None,
        alias="burnRate1h",
        ge=0,
        allow_inf_nan=False,
        description="The same over the last hour.",
    )
    fast_burn: bool = Field(
        default=False,
        description="Both burn rates at or over fastBurnRate: 2% of the window's budget "
        "going within an hour.",
    )
    fast_burn_rate: float = Field(
        gt=0, allow_inf_nan=False, description="The burn rate a fast burn reaches."
    )


class SloBudgetStatus(ApiModel):
    """Each SLO's error budget over spec.autoscaling.sloWindow (written by the built-in
    autoscaler at each evaluation)."""

    window: str = Field(description="The compliance window, as in spec.autoscaling.sloWindow.")
    summary: str = Field(
        description="The lower of the two budgets remaining and its SLO, e.g. 42% (TTFT)."
    )
    ttft: SloBudget | None = Field(default=None, description="The TTFT p99 SLO's.")
    tpot: SloBudget | None = Field(default=None, description="The TPOT p99 SLO's.")


MEMORY_HISTORY_MAX_LENGTH = 262144
"""Characters of one pool's history in status: at a 15 s interval it runs to 4-7k (the
trace kinds of bench/policy_seeds.py); an object in etcd may take 1.5 MiB."""


def _learned(description: str) -> Any:
    """A learned value: positive and finite, or absent until the pool has shown it."""
    return Field(default=None, gt=0, allow_inf_nan=False, description=description)


class LearnedCapacity(ApiModel):
    """What the autoscaler learned of one pool from what it served (its sizing reads these)."""

    prefill_tokens_per_second: float | None = _learned(
        "Prefill: prompt tokens per second one replica computes, read cautiously "
        "(what a pool keeps is sized on it)."
    )
    batched_tokens_per_second: float | None = _learned(
        "Prefill: the same counting what batching adds (what a pool orders is sized on it)."
    )
    batched_prompt_tokens: float | None = _learned(
        "Prefill: the mean prompt, in tokens, when the batched speed was read."
    )
    sequences_per_replica: float | None = _learned(
        "Decode: sequences one replica holds at the TPOT SLO (its knee)."
    )
    provisioning_seconds: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="How long the replicas that last became ready took to, each from the "
        "evaluation that first saw it ordered.",
    )
    look_back_seconds: float = Field(
        default=0,
        ge=0,
        allow_inf_nan=False,
        description="The scale-down look-back learned from flaps, surges and bursts' ends "
        "(0: the spec's).",
    )


class PoolMemoryStatus(ApiModel):
    """What the autoscaler remembers of one pool (one phase, for a colocated engine pool)."""

    learned: LearnedCapacity = Field(description="What it learned from what the pool served.")
    shape: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[0-9a-f]+$",
        description="A digest of the spec that sets how fast the pool's engines are (model, "
        "engine, GPUs, TP, batching, flags, placement) when it was learned: when the spec "
        "changes it, the pool's speed is learned again.",
    )
    history: str = Field(
        max_length=MEMORY_HISTORY_MAX_LENGTH,
        description="The recent evaluations its rules read back (recommendations for the "
        "scale-down look-back, arrivals, demand, queue and decode step samples), as JSON "
        "with times in seconds relative to savedAt. Its format may change between "
        "versions; one it cannot read is learned again.",
    )


class AutoscalerMemory(ApiModel):
    """The built-in autoscaler's memory, kept in status so that a restarted operator (or a
    new leader) goes on where the last one left off."""

    mode: Mode = Field(description="The mode whose pools this describes.")
    saved_at: str = Field(description="When it was written (RFC 3339).")
    prefill: PoolMemoryStatus | None = Field(default=None, description="The prefill phase.")
    decode: PoolMemoryStatus | None = Field(default=None, description="The decode phase.")


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
    gateway: GatewayStatus | None = Field(
        default=None, description="The route through the user's Gateway (spec.gateway)."
    )
    metrics: ObservedMetrics = Field(
        default_factory=ObservedMetrics, description="Latest SLO signals from Prometheus."
    )
    slo_budget: SloBudgetStatus | None = Field(
        default=None,
        description="Each SLO's attainment and error budget remaining over the compliance "
        "window (the built-in autoscaler's count).",
    )
    autoscaler_memory: AutoscalerMemory | None = Field(
        default=None,
        description="What the built-in autoscaler learned and remembers of each pool, so a "
        "restart does not start it over (written by the operator).",
    )
