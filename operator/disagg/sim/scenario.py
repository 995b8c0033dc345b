"""A fleet simulation described by plain values, and its summary (pure).

``disagg simulate`` and the benchmarks describe a run as a :class:`Scenario` (model, GPUs,
mode, pools, traffic shape, policy, SLOs), build the fleet and the request stream from it,
and summarize the result the same way: goodput per GPU, attainment, latency percentiles,
GPU-hours, scaling actions, and latency over time against the SLOs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from disagg.api.router import RouterSpec
from disagg.autoscale.policy import Behavior, PoolPolicy
from disagg.perf.fitted import latency_model
from disagg.perf.profiles import gpu_profile, model_profile
from disagg.perf.roofline import NETWORKS, EngineShape, StepTime, kv_capacity_tokens
from disagg.routing.offload import Offload
from disagg.sim.fleet import FleetConfig, Mode, ScalingPolicy
from disagg.sim.fleet_policies import (
    SloPolicy,
    StaticPolicy,
    ThresholdPolicy,
    ThroughputPlannerPolicy,
)
from disagg.sim.results import Outcome, Result, latencies
from disagg.sim.traffic import (
    WORKLOADS,
    RateShape,
    Request,
    burst,
    diurnal,
    generate,
    steady,
    step,
)
from disagg.slo import percentile

POLICIES: Final = ("ours", "static", "threshold", "dynamo")
ROUTER: Final = RouterSpec()
"""The router as a model's spec configures it by default."""
SHAPES: Final = ("steady", "diurnal", "burst", "step")


@dataclass(frozen=True)
class Scenario:
    """Everything one simulated run depends on."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    network: str = "ib400"
    mode: Mode = "disaggregated"
    prefill_tp: int = 1
    decode_tp: int = 1
    prefill_replicas: int = 1
    decode_replicas: int = 1
    max_replicas: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    workload: str = "chat"
    rate: float = 4.0
    duration: float = 1800.0
    shape: str = "steady"
    policy: str = "ours"
    provisioning_delay: float = 120.0
    interval: float = 15.0
    ttft: float = 2.0
    tpot: float = 0.05
    seed: int = 0
    latency: str = "roofline"
    dynamo_interval: float = 180.0
    pd_threshold: int = ROUTER.prefill_threshold_tokens
    offload_max_tokens: int = ROUTER.prefill_offload.max_prompt_tokens
    offload_wait_fraction: float = ROUTER.prefill_offload.wait_fraction
    offload_per_decode: int = ROUTER.prefill_offload.per_decode_engine

    def shapes(self) -> tuple[EngineShape, EngineShape]:
        """(prefill, decode) engine shapes; raises KeyError naming an unknown profile."""
        model, gpu = model_profile(self.model), gpu_profile(self.gpu)
        return EngineShape(model, gpu, self.prefill_tp), EngineShape(model, gpu, self.decode_tp)

    def step_time(self) -> StepTime:
        return latency_model(self.latency)


def rate_shape(scenario: Scenario) -> RateShape:
    """Steady; one day compressed into the run; a 5x burst in the middle fifth; or a 3x step
    at a third of the run."""
    length = scenario.duration
    shapes: dict[str, RateShape] = {
        "steady": steady,
        "diurnal": diurnal(length),
        "burst": burst(length * 0.4, length * 0.2, 5.0),
        "step": step(length / 3, 3.0),
    }
    if scenario.shape not in shapes:
        raise KeyError(f"unknown traffic shape {scenario.shape!r}; known: {', '.join(SHAPES)}")
    return shapes[scenario.shape]


def requests_for(scenario: Scenario) -> list[Request]:
    if scenario.workload not in WORKLOADS:
        known = ", ".join(sorted(WORKLOADS))
        raise KeyError(f"unknown workload {scenario.workload!r}; known: {known}")
    return generate(
        scenario.workload, scenario.rate, scenario.duration, scenario.seed, rate_shape(scenario)
    )


def build_policy(scenario: Scenario, config: FleetConfig) -> ScalingPolicy:
    """One of POLICIES, configured from the scenario's SLOs and bounds."""
    prefill, decode = scenario.shapes()
    if scenario.policy == "static":
        return StaticPolicy()
    if scenario.policy == "threshold":
        return ThresholdPolicy(max_num_seqs=scenario.max_num_seqs)
    if scenario.policy == "dynamo":
        return ThroughputPlannerPolicy(
            step_time=config.step_time,
            shapes={"prefill": prefill, "decode": decode},
            kv_capacity={
                "prefill": kv_capacity_tokens(prefill),
                "decode": kv_capacity_tokens(decode),
            },
            ttft_target=scenario.ttft,
            itl_target=scenario.tpot,
            max_num_seqs=scenario.max_num_seqs,
            max_num_batched_tokens=config.budget["prefill"],
            interval=scenario.dynamo_interval,
            colocated=scenario.mode == "colocated",
        )
    if scenario.policy == "ours":
        high = scenario.max_replicas
        colocated = scenario.mode == "colocated"
        return SloPolicy(
            {
                "prefill": PoolPolicy(
                    scenario.ttft, 1, high, scenario.prefill_tp,
                    tensor_parallel=scenario.prefill_tp,
                    # Colocated steps also carry decodes: the budget overstates the room.
                    step_tokens=None if colocated else config.budget["prefill"],
                ),
                "decode": PoolPolicy(
                    scenario.tpot, 1, high, scenario.decode_tp, scenario.max_num_seqs,
                    tensor_parallel=scenario.decode_tp,
                ),
            },
            Behavior(window=config.window),
            colocated=colocated,
        )  # fmt: skip
    raise KeyError(f"unknown policy {scenario.policy!r}; known: {', '.join(POLICIES)}")


def build(scenario: Scenario) -> FleetConfig:
    """The fleet of a scenario, with its policy."""
    if scenario.network not in NETWORKS:
        known = ", ".join(sorted(NETWORKS))
        raise KeyError(f"unknown network {scenario.network!r}; known: {known}")
    prefill, decode = scenario.shapes()
    colocated = scenario.mode == "colocated"
    config = FleetConfig(
        scenario.mode,
        decode,
        prefill_shape=prefill,
        replicas={
            "prefill": 0 if colocated else scenario.prefill_replicas,
            "decode": scenario.decode_replicas,
        },
        bounds={"prefill": (1, scenario.max_replicas), "decode": (1, scenario.max_replicas)},
        budget={
            "prefill": max(8192, scenario.max_num_batched_tokens),
            "decode": scenario.max_num_batched_tokens,
        },
        max_num_seqs=scenario.max_num_seqs,
        network=NETWORKS[scenario.network],
        interval=scenario.interval,
        provisioning_delay=scenario.provisioning_delay,
        step_time=scenario.step_time(),
        ttft_slo=scenario.ttft,
        tpot_slo=scenario.tpot,
        pd_threshold=scenario.pd_threshold,
        offload=(
            Offload(
                scenario.offload_max_tokens,
                scenario.offload_wait_fraction * scenario.ttft,
                scenario.offload_per_decode,
            )
            if scenario.offload_max_tokens > 0
            else None
        ),
    )
    config.policy = build_policy(scenario, config)
    return config


@dataclass
class Summary:
    """What a run is judged by."""

    values: dict[str, Any] = field(default_factory=dict)
    latency: list[dict[str, float | None]] = field(default_factory=list)
    """Per interval of arrival: request rate and p99 TTFT/TPOT of the requests that arrived."""


def summarize(scenario: Scenario, result: Result, bucket: float = 60.0) -> Summary:
    """Goodput per GPU, attainment, percentiles, GPU-hours, actions, latency over time."""
    ttft_att, tpot_att, both = result.attainment(scenario.ttft, scenario.tpot)
    outcomes = result.outcomes
    ttfts, tpots = latencies(outcomes, "ttft"), latencies(outcomes, "tpot")
    gpus = result.gpu_seconds / result.duration if result.duration else 0.0
    values = {
        "scenario": scenario.__dict__,
        "requests": len(outcomes),
        "finished": sum(1 for o in outcomes if o.tokens >= o.request.output_tokens),
        "rejected": sum(1 for o in outcomes if o.rejected),
        "durationSeconds": round(result.duration, 1),
        "gpuHours": round(result.gpu_seconds / 3600, 3),
        "gpuHoursByPool": {
            pool: round(seconds / 3600, 3) for pool, seconds in result.pool_gpu_seconds.items()
        },
        "meanGpus": round(gpus, 2),
        "scalingActions": result.scaling_actions,
        "attainment": {"ttft": ttft_att, "tpot": tpot_att, "both": both},
        "goodput": round(both * len(outcomes) / result.duration, 4) if result.duration else 0,
        "goodputPerGpu": round(result.goodput_per_gpu(scenario.ttft, scenario.tpot), 4),
        "ttft": _percentiles(ttfts),
        "tpot": _percentiles(tpots),
        "peakReplicas": {
            pool: max((int(s.get(f"{pool}_replicas", 0)) for s in result.timeline), default=0)
            for pool in ("prefill", "decode")
        },
    }
    groups: dict[int, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(int(outcome.request.arrival // bucket), []).append(outcome)
    latency = [
        {
            "t": index * bucket,
            "rate": len(group) / bucket,
            "ttft_p99": _finite(percentile(latencies(group, "ttft"), 0.99)),
            "tpot_p99": _finite(percentile(latencies(group, "tpot"), 0.99)),
        }
        for index, group in sorted(groups.items())
    ]
    return Summary(values, latency)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": _finite(percentile(values, q / 100)) for q in (50, 90, 99)}


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else round(value, 5)
