"""One autoscaler evaluation, run by the reconcile pass when one is due.

Prometheus in, decisions out: it reads each pool's signals, runs the pure policy and returns
the decided replicas with their record for status. It writes nothing to the model or its
Deployments; the reconcile pass renders the decided replicas into the pool Deployments and
the record into status, so the operator has one writer of each. The one write made here is
advisory: before a scale-down the least-loaded pods get the lowest
``controller.kubernetes.io/pod-deletion-cost``, so the ReplicaSet removes them.

What the policy learns between evaluations (:class:`ScalerState`) lives in memory; losing
it only delays a scale-down or falls back to latency until it is relearned. Cooldowns read
the last scale time from status, so they survive a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from disagg.api.base import format_duration, parse_duration
from disagg.api.resource import DisaggregatedModel
from disagg.api.status import ObservedMetrics
from disagg.autoscale.metrics import MetricsUnavailable, PrometheusSource
from disagg.autoscale.policy import (
    UNREACHABLE_MARK,
    Behavior,
    Decision,
    PoolMemory,
    PoolName,
    PoolPolicy,
    Signals,
    apply_budget,
    decide_pool,
)
from disagg.autoscale.queries import build_queries, pool_selector
from disagg.clock import epoch_of, rfc3339
from disagg.kube.client import KubeClient, KubeError
from disagg.status import ScalingRecord

log = logging.getLogger("disagg.autoscaler")
DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
POOLS: Final[tuple[PoolName, ...]] = ("prefill", "decode")
Obj = dict[str, Any]
SourceFactory = Callable[[str], PrometheusSource]


@dataclass
class ScalerState:
    """One model's autoscaler memory between evaluations."""

    memories: dict[PoolName, PoolMemory] = field(
        default_factory=lambda: {p: PoolMemory() for p in POOLS}
    )
    next_evaluation: float = 0.0
    """When the next evaluation is due (epoch seconds): a pass before then reads no metrics."""
    pending: ScalingRecord | None = None
    """The last evaluation's record until a status write has it."""


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation decided; ``unavailable`` says why it decided nothing."""

    decisions: tuple[Decision, ...] = ()
    signals: Mapping[PoolName, Signals] = field(default_factory=dict)
    unavailable: str | None = None
    at: float = 0.0

    def replicas(self) -> dict[str, int]:
        return {d.pool: d.desired for d in self.decisions}

    def resized(self) -> list[Decision]:
        return [d for d in self.decisions if d.desired != d.current]


def pool_policies(model: DisaggregatedModel) -> dict[PoolName, PoolPolicy]:
    spec = model.spec
    slos = {
        "prefill": parse_duration(spec.autoscaling.ttft_p99),
        "decode": parse_duration(spec.autoscaling.tpot_p99),
    }
    return {
        role: PoolPolicy(
            slo=slos[role],
            min_replicas=spec.pool(role).autoscaling.min_replicas,
            max_replicas=spec.pool(role).autoscaling.max_replicas,
            gpus_per_replica=spec.pool(role).gpus,
            max_num_seqs=spec.pool(role).max_num_seqs,
            tensor_parallel=spec.pool(role).tensor_parallel_size,
        )
        for role in POOLS
    }


def behavior(model: DisaggregatedModel) -> Behavior:
    a = model.spec.autoscaling
    return Behavior(
        up_window=parse_duration(a.scale_up.stabilization_window),
        up_step=a.scale_up.max_step,
        up_cooldown=parse_duration(a.scale_up.cooldown),
        down_window=parse_duration(a.scale_down.stabilization_window),
        down_step=a.scale_down.max_step,
        down_cooldown=parse_duration(a.scale_down.cooldown),
        stale_after=max(30.0, 3 * parse_duration(a.interval)),
        window=parse_duration(a.window),
    )


async def read_signals(
    model: DisaggregatedModel, source: PrometheusSource
) -> dict[PoolName, Signals]:
    a = model.spec.autoscaling
    overrides = a.queries.model_dump(by_alias=True, exclude_none=True) if a.queries else {}
    meta = model.metadata
    result: dict[PoolName, Signals] = {}
    for role in POOLS:
        queries = build_queries(
            model.spec.engine.backend, meta.namespace, meta.name, role,
            parse_duration(a.window), overrides,
        )  # fmt: skip
        result[role] = await source.signals(queries, "ttftP99" if role == "prefill" else "tpotP99")
    return result


async def evaluate(
    model: DisaggregatedModel,
    source: PrometheusSource,
    deployments: Mapping[PoolName, Obj],
    status: Obj,
    state: ScalerState,
    now: float,
) -> Evaluation:
    """Decide both pools' sizes from Prometheus; reads only, never raises for missing data."""
    try:
        signals = await read_signals(model, source)
    except MetricsUnavailable as error:
        return Evaluation(unavailable=str(error), at=now)
    policies = pool_policies(model)
    rules = behavior(model)
    decisions = []
    for role in POOLS:
        deployment = deployments[role]
        decisions.append(
            decide_pool(
                role,
                signals[role],
                int(deployment.get("spec", {}).get("replicas", 1)),
                int(deployment.get("status", {}).get("readyReplicas", 0)),
                policies[role],
                rules,
                state.memories[role],
                epoch_of((status.get(role) or {}).get("lastScaleTime")),
                now,
            )
        )
    budgeted = apply_budget(decisions, policies, model.spec.autoscaling.max_total_gpus)
    return Evaluation(decisions=tuple(budgeted), signals=signals, at=now)


def _metrics(signals: Mapping[PoolName, Signals], at: float) -> ObservedMetrics:
    ttft, tpot = signals["prefill"].p99, signals["decode"].p99
    rate = signals["decode"].request_rate
    return ObservedMetrics(
        ttft_p99=format_duration(ttft) if ttft is not None else None,
        tpot_p99=format_duration(tpot) if tpot is not None else None,
        ttft_p99_seconds=round(ttft, 6) if ttft is not None else None,
        tpot_p99_seconds=round(tpot, 6) if tpot is not None else None,
        request_rate=round(rate, 4) if rate is not None else None,
        observed_at=rfc3339(at),
    )


def scaling_record(evaluation: Evaluation) -> ScalingRecord:
    """How an evaluation reads in status (pure)."""
    if evaluation.unavailable is not None:
        return ScalingRecord(
            active=("False", "MetricsUnavailable", f"holding replicas: {evaluation.unavailable}")
        )
    decisions = evaluation.decisions
    limited = [d.reason for d in decisions if d.limited]
    unreachable = [f"{d.pool}: {d.unreachable}" for d in decisions if d.unreachable]
    reason = "GpuBudget" if limited else "SLOUnreachable" if unreachable else "WithinLimits"
    return ScalingRecord(
        active=("True", "SLOTracking", "; ".join(f"{d.pool}: {d.reason}" for d in decisions)),
        limited=("True" if limited or unreachable else "False", reason,
                 "; ".join(limited + unreachable)),
        scaled={d.pool: d.reason for d in evaluation.resized()},
        metrics=_metrics(evaluation.signals, evaluation.at),
    )  # fmt: skip


def evaluation_events(evaluation: Evaluation, previous_conditions: list[Obj]) -> list[Obj]:
    """The Events an evaluation posts: one per resize, and a Warning the first time metrics
    go missing or an SLO becomes unreachable (pure; ``type``, ``reason``, ``message``)."""
    before = {c.get("type"): c for c in previous_conditions}
    if evaluation.unavailable is not None:
        if before.get("ScalingActive", {}).get("reason") == "MetricsUnavailable":
            return []
        message = f"holding replicas: {evaluation.unavailable}"
        return [{"type": "Warning", "reason": "MetricsUnavailable", "message": message}]
    events = [
        {
            "type": "Normal",
            "reason": "ScaledUp" if d.desired > d.current else "ScaledDown",
            "message": f"{d.pool} {d.current} -> {d.desired}: {d.reason}",
        }
        for d in evaluation.resized()
    ]
    unreachable = [f"{d.pool}: {d.unreachable}" for d in evaluation.decisions if d.unreachable]
    if unreachable and UNREACHABLE_MARK not in str(
        before.get("ScalingLimited", {}).get("message", "")
    ):
        events.append(
            {"type": "Warning", "reason": "SLOUnreachable", "message": "; ".join(unreachable)}
        )
    return events


async def mark_cheapest(
    client: KubeClient, model: DisaggregatedModel, pool: PoolName, source: PrometheusSource
) -> None:
    """Give the pool's least-loaded pods the lowest deletion cost (best effort)."""
    running = (
        "vllm:num_requests_running"
        if model.spec.engine.backend == "vllm"
        else "sglang:num_running_reqs"
    )
    namespace = model.metadata.namespace
    selector = pool_selector(namespace, model.metadata.name, pool)
    try:
        per_pod = await source.vector(f"sum by (pod) ({running}{{{selector}}})")
    except MetricsUnavailable:
        return
    for pod, load in per_pod.items():
        cost = str(int(min(load, 1_000_000)))
        try:
            await client.patch(
                "Pod", namespace, pod, {"metadata": {"annotations": {DELETION_COST: cost}}}
            )
        except KubeError as error:
            log.info("Pod %s/%s not annotated: %s", namespace, pod, error)
