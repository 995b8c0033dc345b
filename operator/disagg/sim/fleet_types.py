"""The fleet simulator's vocabulary: a deployment to simulate, its engines, what a scaling
policy sees of a pool and what it answers (:mod:`disagg.sim.fleet` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from disagg.perf.roofline import EngineShape, NetworkProfile, StepTime, step_time
from disagg.routing.offload import Offload
from disagg.sim.scheduler import Scheduler, Step

Mode = Literal["colocated", "disaggregated"]
PoolName = Literal["prefill", "decode"]


@dataclass
class PoolStats:
    """What a policy sees of one pool at an evaluation."""

    replicas: int
    ready: int
    ttft_p99: float | None
    tpot_p99: float | None
    queue: float
    running: float
    kv_usage: float
    request_rate: float
    prompt_tokens_rate: float
    mean_prompt: float
    mean_output: float
    served_rate: float = 0.0
    """Requests this pool finished per second (what its engines' counters report)."""
    prompt_tokens_served_rate: float = 0.0
    prefill_seconds: float | None = None
    """Mean time a prompt spent in its prefill phase (vLLM's request_prefill_time)."""
    prefill_buckets: tuple[tuple[float, float], ...] = ()
    """The prefill times as a cumulative histogram: (upper bound, count at or below)."""
    tpot_mean: float | None = None
    """Mean time between output tokens, over every token (vLLM's inter-token latency sum
    over its count)."""
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    """The window's TTFTs in vLLM's buckets (what ``ttft_reported`` is read from)."""
    ttft_reported: float | None = None
    """The TTFT p99 as Prometheus reads it from vLLM's buckets (what the operator's policy
    sees; ``ttft_p99`` is the exact one)."""
    tpot_reported: float | None = None
    """The inter-token latency p99 as Prometheus reads it from vLLM's buckets: every gap
    between two tokens is an observation, so long outputs weigh more than in ``tpot_p99``
    (one mean per request)."""
    generation_tokens_rate: float | None = None
    """Output tokens the pool's engines generated per second over the rate window."""
    ttft_done: tuple[tuple[float, float], ...] = ()
    """The TTFTs the pool's engines observed in the window (when each first token was out,
    not when its request arrived, as Prometheus counts them), in vLLM's buckets: what the
    TTFT SLO's error budget counts."""
    tpot_done: tuple[tuple[float, float], ...] = ()
    """The same of each finished request's mean time per output token (vLLM's
    request_time_per_output_token): what the TPOT SLO's error budget counts."""
    span: float = 1.0
    """The seconds the window's counts cover: a count over it is the rate Prometheus reads."""


def pools_of(mode: Mode) -> tuple[PoolName, ...]:
    """The pools a deployment runs: one engine pool colocated, prefill and decode split."""
    return ("decode",) if mode == "colocated" else ("prefill", "decode")


class ScalingPolicy(Protocol):
    """Decides a pool's replica count from its stats (the fleet enforces bounds)."""

    name: str

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int: ...


@dataclass(eq=False)
class Engine:
    """One replica: a scheduler plus its serving state."""

    pool: PoolName
    scheduler: Scheduler
    ready_at: float
    name: str = ""
    busy: bool = False
    draining: bool = False
    removed_at: float | None = None
    outstanding: int = 0
    local_prefills: int = 0
    """Prompts the router offloaded to this decode engine that have no first token yet."""
    run_ends: list[float] = field(default_factory=list)
    """End times of the steps of the decode run in flight."""
    run_id: int = 0
    run_step: Step | None = None


@dataclass
class FleetConfig:
    """A deployment to simulate."""

    mode: Mode
    shape: EngineShape
    """Engine shape of the decode pool (and of colocated replicas)."""
    prefill_shape: EngineShape | None = None
    replicas: dict[PoolName, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})
    bounds: dict[PoolName, tuple[int, int]] = field(
        default_factory=lambda: {"prefill": (1, 64), "decode": (1, 64)}
    )
    budget: dict[PoolName, int] = field(default_factory=lambda: {"prefill": 8192, "decode": 2048})
    max_num_seqs: int = 256
    chunked_prefill: bool = True
    """Colocated engines mix prompt chunks into decode steps; False is vLLM's older
    prefill-first scheduling (DistServe's baseline), where waiting prompts pause all decodes."""
    network: NetworkProfile | None = None
    policy: ScalingPolicy | None = None
    interval: float = 15.0
    window: float = 60.0
    provisioning_delay: float = 120.0
    step_time: StepTime = step_time
    ttft_slo: float = 2.0
    tpot_slo: float = 0.05
    pd_threshold: int = 0
    """Shorter prompts skip the prefill pool, as the router sends them (its
    ``prefillThresholdTokens``)."""
    offload: Offload | None = None
    """The router's conditional disaggregation (:mod:`disagg.routing.offload`); None: off."""
