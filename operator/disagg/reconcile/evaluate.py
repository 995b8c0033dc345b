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

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from disagg.api.base import ApiModel, format_duration, parse_duration
from disagg.api.resource import DisaggregatedModel
from disagg.api.spec import Mode, Role
from disagg.api.status import AutoscalerMemory, ObservedMetrics, SloBudget, SloBudgetStatus
from disagg.autoscale.budget import Budget, percent, standing
from disagg.autoscale.combine import apply_budget, colocated
from disagg.autoscale.policy import (
    INVALID_MARK,
    UNREACHABLE_MARK,
    Behavior,
    Decision,
    PoolMemory,
    PoolName,
    PoolPolicy,
    ScaledPool,
    Signals,
    decide_pool,
    share_look_back,
)
from disagg.autoscale.queries import build_queries, pool_selector
from disagg.autoscale.recall import recalled
from disagg.clock import epoch_of, rfc3339
from disagg.kube.client import KubeClient, KubeError
from disagg.naming import RELEARN_ANNOTATION
from disagg.perf.engine_buckets import latency_buckets
from disagg.reconcile.prometheus import MetricsUnavailable, PrometheusSource
from disagg.render.workers import engine_image
from disagg.status import ScalingRecord
from disagg.versions import DEFAULT_IMAGES, DataPlaneImages

log = logging.getLogger("disagg.autoscaler")
DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
POOLS: Final[tuple[PoolName, ...]] = ("prefill", "decode")
IRRELEVANT_TO_SPEED: Final = frozenset({"replicas", "autoscaling", "priorityClassName"})
"""Pool fields that change how many engines run, or their eviction order, not how fast."""
Obj = dict[str, Any]
SourceFactory = Callable[[str | None], PrometheusSource]


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
    mode: Mode = "disaggregated"
    """The mode whose pools the memories describe."""
    saved: AutoscalerMemory | None = None
    """The memories as status keeps them, as of the last evaluation (or as read back)."""
    unreadable: bool = False
    """Status holds a memory that could not be read back: the next write replaces it."""


@dataclass(frozen=True)
class SloReport:
    """One evaluation's SLO counts, for the operator's metrics (and the alerts on them)."""

    window: float
    """The compliance window, seconds (0 when the evaluation read nothing)."""
    counted: Mapping[str, tuple[float, float, float]]
    """By SLO (ttft, tpot): requests counted, surely and at most missed."""
    remaining: Mapping[str, float]
    """By SLO: the most of the error budget that remains (a fraction; negative overspent)."""
    holding: bool
    """Metrics could not be read: replicas are held."""
    targets: Mapping[str, float] = field(default_factory=dict)
    """By SLO: the target, seconds."""
    pools: Mapping[str, PoolReport] = field(default_factory=dict)
    """By scaled pool: its size as this evaluation saw and decided it."""


@dataclass(frozen=True)
class PoolReport:
    """One pool's size, bounds and pressure, as an evaluation saw and decided them."""

    current: int
    desired: int
    ready: int
    min_replicas: int
    max_replicas: int
    pressure: float
    """How far over its SLO the pool is (1.0: at the SLO)."""


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation decided; ``unavailable`` says why it decided nothing."""

    decisions: tuple[Decision, ...] = ()
    signals: Mapping[PoolName, Signals] = field(default_factory=dict)
    unavailable: str | None = None
    at: float = 0.0
    relearning: tuple[PoolName, ...] = ()
    """Phases whose pool's spec changed how fast its engines are: their speed is learned
    again."""
    budgets: Mapping[PoolName, Budget] = field(default_factory=dict)
    """Each phase's SLO budget over the compliance window, counted this evaluation."""
    slo_window: str = ""
    """The compliance window as the spec says it."""
    counted: Mapping[PoolName, tuple[float, float, float]] = field(default_factory=dict)
    """What this evaluation counted against each phase's SLO: requests, surely and at most
    missed."""
    targets: Mapping[PoolName, float] = field(default_factory=dict)
    """Each phase's SLO, seconds."""
    sizes: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    """Each scaled pool's ready replicas and bounds (min, max)."""

    def report(self) -> SloReport:
        """What the operator's own metrics export of this evaluation."""
        pools: dict[str, PoolReport] = {
            d.pool: PoolReport(d.current, d.desired, *self.sizes[d.pool], d.pressure)
            for d in self.decisions
            if d.pool in self.sizes
        }
        return SloReport(
            window=parse_duration(self.slo_window) if self.slo_window else 0.0,
            counted={SLO_NAMES[p].lower(): counts for p, counts in self.counted.items()},
            remaining={SLO_NAMES[p].lower(): b.remaining for p, b in self.budgets.items()},
            holding=self.unavailable is not None,
            targets={SLO_NAMES[p].lower(): slo for p, slo in self.targets.items()},
            pools=pools,
        )

    def replicas(self) -> dict[str, int]:
        return {d.pool: d.desired for d in self.decisions}

    def resized(self) -> list[Decision]:
        return [d for d in self.decisions if d.desired != d.current]


def recalled_state(
    saved: object, model: DisaggregatedModel, now: float
) -> tuple[ScalerState, list[str]]:
    """A model's autoscaler state from the memory its status kept (``saved``), and what of
    that could not be read (that pool learns again, and the next status write replaces it)."""
    mode = model.spec.mode
    recall = recalled(saved, mode, POOLS, now)
    state = ScalerState(
        memories=recall.memories, mode=mode, saved=recall.kept, unreadable=bool(recall.problems)
    )
    return state, recall.problems


def pool_shape(
    model: DisaggregatedModel, phase: PoolName, images: DataPlaneImages = DEFAULT_IMAGES
) -> str:
    """A digest of what sets how fast the engines serving ``phase`` are: the model, the
    engine and the image in force, the pool's GPUs, TP, batching, flags and placement; not
    its replica counts. Fields left at their defaults are left out, so an operator release
    that adds one does not make every pool learn again. The RELEARN_ANNOTATION's value, when
    set, is part of it: what changed outside the spec is said by changing it."""
    spec = model.spec
    role = _pool_of(model, phase)

    def wire(part: ApiModel) -> dict[str, Any]:
        return part.model_dump(by_alias=True, exclude_defaults=True, mode="json")

    pool = {k: v for k, v in wire(spec.pool(role)).items() if k not in IRRELEVANT_TO_SPEED}
    engine = {k: v for k, v in wire(spec.runtime).items() if k != "imagePullPolicy"}
    shape = {"model": wire(spec.model), "engine": engine, "image": engine_image(spec, images),
             "role": role, "pool": pool}  # fmt: skip
    relearn = model.metadata.annotations.get(RELEARN_ANNOTATION)
    if relearn is not None:
        shape["relearn"] = relearn
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def _colocated(model: DisaggregatedModel) -> bool:
    return model.spec.mode == "colocated"


def _pool_of(model: DisaggregatedModel, phase: PoolName) -> Role:
    """The pool whose replicas serve a phase: its own, or the colocated engine pool."""
    return "engine" if _colocated(model) else phase


def pool_policies(model: DisaggregatedModel) -> dict[PoolName, PoolPolicy]:
    """Each phase's SLO and the bounds of the pool that serves it."""
    spec = model.spec
    slos = {
        "prefill": parse_duration(spec.autoscaling.ttft_p99),
        "decode": parse_duration(spec.autoscaling.tpot_p99),
    }
    policies: dict[PoolName, PoolPolicy] = {}
    for phase in POOLS:
        pool = spec.pool(_pool_of(model, phase))
        # The buckets its p99 is read from: the engine's, or the ones extraArgs set.
        buckets = latency_buckets(
            spec.runtime.backend, [*spec.runtime.extra_args, *pool.extra_args]
        )
        policies[phase] = PoolPolicy(
            slo=slos[phase],
            min_replicas=pool.autoscaling.min_replicas,
            max_replicas=pool.autoscaling.max_replicas,
            gpus_per_replica=pool.gpus,
            max_num_seqs=pool.max_num_seqs,
            tensor_parallel=pool.tensor_parallel_size,
            latency_buckets=buckets[phase],
            # A colocated engine's steps also carry decodes: the budget overstates the room.
            step_tokens=(
                pool.max_num_batched_tokens
                if phase == "prefill" and not _colocated(model)
                else None
            ),
        )
    return policies


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
        slo_window=parse_duration(a.slo_window),
    )


async def read_signals(
    model: DisaggregatedModel, source: PrometheusSource
) -> dict[PoolName, Signals]:
    a = model.spec.autoscaling
    overrides = a.queries.model_dump(by_alias=True, exclude_none=True) if a.queries else {}
    meta = model.metadata
    result: dict[PoolName, Signals] = {}
    for phase in POOLS:
        queries = build_queries(
            model.spec.runtime.backend, meta.namespace, meta.name, _pool_of(model, phase),
            parse_duration(a.window), overrides,
        )  # fmt: skip
        result[phase] = await source.signals(
            queries, "ttftP99" if phase == "prefill" else "tpotP99"
        )
    return result


async def evaluate(
    model: DisaggregatedModel,
    source: PrometheusSource,
    deployments: Mapping[Role, Obj],
    status: Obj,
    state: ScalerState,
    now: float,
    images: DataPlaneImages = DEFAULT_IMAGES,
) -> Evaluation:
    """Decide the pools' sizes from Prometheus (``deployments`` by role); reads only, never
    raises for missing data. A colocated engine pool is sized for both phases, each with its
    own memory, and gets the larger size."""
    # Said as soon as the spec or the annotation changes, metrics or not.
    relearning = tuple(p for p in POOLS if state.memories[p].reshape(pool_shape(model, p, images)))
    try:
        signals = await read_signals(model, source)
    except MetricsUnavailable as error:
        return Evaluation(
            unavailable=str(error), at=now, relearning=relearning,
            slo_window=model.spec.autoscaling.slo_window,
        )  # fmt: skip
    policies = pool_policies(model)
    rules = behavior(model)
    share_look_back(state.memories.values())
    decisions = []
    for phase in POOLS:
        pool = _pool_of(model, phase)
        deployment = deployments[pool]
        decisions.append(
            decide_pool(
                phase,
                signals[phase],
                int(deployment.get("spec", {}).get("replicas", 1)),
                int(deployment.get("status", {}).get("readyReplicas", 0)),
                policies[phase],
                rules,
                state.memories[phase],
                epoch_of((status.get(pool) or {}).get("lastScaleTime")),
                now,
            )
        )
    per_phase = tuple(decisions)
    scoped: dict[ScaledPool, PoolPolicy]
    if _colocated(model):
        decisions, scoped = [colocated(*decisions)], {"engine": policies["decode"]}
    else:
        scoped = {"prefill": policies["prefill"], "decode": policies["decode"]}
    budgeted = apply_budget(decisions, scoped, model.spec.autoscaling.max_total_gpus)
    budgets = {p: standing(state.memories[p].ledger, now, rules.slo_window) for p in POOLS}
    counted = {phase: d.counted for phase, d in zip(POOLS, per_phase, strict=True)}
    sizes: dict[str, tuple[int, int, int]] = {
        pool: (
            int(deployments[pool].get("status", {}).get("readyReplicas", 0)),
            policy.min_replicas,
            policy.max_replicas,
        )
        for pool, policy in scoped.items()
    }
    return Evaluation(
        decisions=tuple(budgeted), signals=signals, at=now, relearning=relearning,
        budgets=budgets, slo_window=model.spec.autoscaling.slo_window, counted=counted,
        targets={phase: policies[phase].slo for phase in POOLS}, sizes=sizes,
    )  # fmt: skip


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


def _slo_budget(budget: Budget) -> SloBudget:
    attainment, at_least = budget.attainment, budget.attainment_at_least
    return SloBudget(
        requests=round(budget.requests),
        missed=round(budget.missed),
        missed_at_most=round(budget.missed_at_most),
        # Two decimals: 99.00% and 98.95% are a met and a missed p99.
        attainment=None if attainment is None else percent(attainment, 2, at_least),
        remaining=percent(budget.remaining, 0, budget.remaining_at_least),
        remaining_fraction=round(budget.remaining, 4),
        remaining_fraction_at_least=round(budget.remaining_at_least, 4),
        burn_rate_5m=None if budget.burn_short is None else round(budget.burn_short, 2),
        burn_rate_1h=None if budget.burn_long is None else round(budget.burn_long, 2),
        fast_burn=budget.fast_burn,
        fast_burn_rate=round(budget.fast_burn_at, 2),
    )


SLO_NAMES: Final[dict[PoolName, str]] = {"prefill": "TTFT", "decode": "TPOT"}


def budget_status(budgets: Mapping[PoolName, Budget], window: str) -> SloBudgetStatus | None:
    """How the SLOs' budgets read in status (pure); None before any was counted."""
    if not budgets:
        return None
    lowest = min(budgets, key=lambda phase: budgets[phase].remaining_at_least)
    return SloBudgetStatus(
        window=window,
        summary=f"{percent(budgets[lowest].remaining, 0, budgets[lowest].remaining_at_least)} "
        f"({SLO_NAMES[lowest]})",
        ttft=_slo_budget(budgets["prefill"]) if "prefill" in budgets else None,
        tpot=_slo_budget(budgets["decode"]) if "decode" in budgets else None,
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
        budget=budget_status(evaluation.budgets, evaluation.slo_window),
    )  # fmt: skip


def fast_burn_events(evaluation: Evaluation, previous_budget: object) -> list[Obj]:
    """A Warning when an SLO's budget starts burning fast (``previous_budget``: status's
    ``sloBudget`` before this evaluation; one Event per burn, not one per evaluation)."""
    before = previous_budget if isinstance(previous_budget, dict) else {}
    events = []
    for phase, budget in evaluation.budgets.items():
        name = SLO_NAMES[phase]
        was = before.get(name.lower())
        if not budget.fast_burn or (isinstance(was, dict) and was.get("fastBurn") is True):
            continue
        message = (
            f"{name} p99 SLO: error budget burning {budget.burn_long or 0:.1f}x over the last "
            f"hour and {budget.burn_short or 0:.1f}x over 5 minutes (at {budget.fast_burn_at:g}x "
            f"2% of the {evaluation.slo_window} window's budget goes in an hour); "
            f"{percent(budget.remaining, 0)} of it remains"
        )
        events.append({"type": "Warning", "reason": "SLOBudgetFastBurn", "message": message})
    return events


def evaluation_events(
    evaluation: Evaluation, previous_conditions: list[Obj], previous_budget: object = None
) -> list[Obj]:
    """The Events an evaluation posts: one per resize, and a Warning the first time metrics
    go missing, an SLO becomes unreachable or its error budget starts burning fast (pure;
    ``type``, ``reason``, ``message``)."""
    before = {c.get("type"): c for c in previous_conditions}
    learning = []
    if evaluation.relearning:
        pools = " and ".join(evaluation.relearning)
        learning.append({"type": "Normal", "reason": "LearningAgain", "message": (
            f"{pools}: what sets how fast the engines are changed (the model, engine, "
            f"GPUs, TP, batching, flags or placement, or the {RELEARN_ANNOTATION} "
            "annotation): their speed is learned again"
        )})  # fmt: skip
    if evaluation.unavailable is not None:
        if before.get("ScalingActive", {}).get("reason") == "MetricsUnavailable":
            return learning
        message = f"holding replicas: {evaluation.unavailable}"
        return [{"type": "Warning", "reason": "MetricsUnavailable", "message": message}, *learning]
    events = [
        {
            "type": "Normal",
            "reason": "ScaledUp" if d.desired > d.current else "ScaledDown",
            "message": f"{d.pool} {d.current} -> {d.desired}: {d.reason}",
        }
        for d in evaluation.resized()
    ]
    events.extend(learning)
    events.extend(fast_burn_events(evaluation, previous_budget))
    unreachable = [f"{d.pool}: {d.unreachable}" for d in evaluation.decisions if d.unreachable]
    if unreachable and UNREACHABLE_MARK not in str(
        before.get("ScalingLimited", {}).get("message", "")
    ):
        events.append(
            {"type": "Warning", "reason": "SLOUnreachable", "message": "; ".join(unreachable)}
        )
    # A query that reports what no engine does (a KV usage in percent) holds its pool on
    # every evaluation: said once, until the condition no longer holds it.
    invalid = [f"{d.pool}: {d.invalid}" for d in evaluation.decisions if d.invalid]
    if invalid and INVALID_MARK not in str(before.get("ScalingActive", {}).get("message", "")):
        message = "holding replicas: " + "; ".join(invalid) + " (see spec.autoscaling.queries)"
        events.append({"type": "Warning", "reason": "MetricsInvalid", "message": message})
    return events


async def mark_cheapest(
    client: KubeClient, model: DisaggregatedModel, pool: ScaledPool, source: PrometheusSource
) -> None:
    """Give the pool's least-loaded pods the lowest deletion cost (best effort)."""
    running = (
        "vllm:num_requests_running"
        if model.spec.runtime.backend == "vllm"
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
