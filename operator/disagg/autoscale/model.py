"""What the SLO policy reads (pure data, no I/O).

:class:`Signals` are one pool's observations from one evaluation; :class:`PoolPolicy` and
:class:`Behavior` are the spec's limits and speed limits. What the policy learns between
evaluations is :class:`~disagg.autoscale.memory.PoolMemory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PoolName = Literal["prefill", "decode"]
"""A phase the policy sizes for: prefill against TTFT, decode against TPOT."""
ScaledPool = Literal["prefill", "decode", "engine"]
"""A pool a decision resizes: a phase's own pool, or the colocated engine pool (both)."""


@dataclass(frozen=True)
class Signals:
    """One pool's observations from one evaluation."""

    p99: float | None
    """TTFT p99 (prefill) or inter-token latency p99 (decode), seconds; None when NaN/absent."""
    request_rate: float | None
    queue: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    pods_reporting: int = 0
    sampled_at: float = 0.0
    prompt_tokens_rate: float | None = None
    """Prompt tokens the pool's engines processed per second."""
    prefill_seconds: float | None = None
    """Mean prefill-phase time of the window's requests (prefill pool), seconds."""
    prefill_buckets: tuple[tuple[float, float], ...] = ()
    """Prefill-phase times as a cumulative histogram: (upper bound, count or rate)."""
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    """Prefill: the TTFT histogram the p99 is read from, as the same kind of histogram (for
    the p99 of the prompts that can meet the SLO, when some cannot at any size)."""
    slo_buckets: tuple[tuple[float, float], ...] = ()
    """The pool's SLO measure as its engines observe each request when it is done with it,
    as the same kind of histogram: TTFT (prefill; the ``ttft_buckets`` histogram), each
    request's mean time per output token (decode). The SLO's error budget counts the
    requests over it."""
    tpot_mean: float | None = None
    """Decode: the mean time between output tokens over the window (the inter-token
    latency's sum over its count), seconds: the step time a running sequence sees."""
    generation_tokens_rate: float | None = None
    """Decode: output tokens the pool's engines generated per second over the window."""


@dataclass(frozen=True)
class PoolPolicy:
    """The spec's limits for one pool."""

    slo: float
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int
    max_num_seqs: int | None = None
    tensor_parallel: int = 1
    decode_batch: float | None = None
    """Sequences one decode replica holds at the TPOT SLO, if a profile says so (a prior:
    what the pool shows overrides it)."""
    step_tokens: int | None = None
    """Prefill: the engines' token budget per step (max-num-batched-tokens) when the spec
    sets it: with it the policy learns what a busy replica computes when its prompts batch
    (PoolMemory.batched_speed)."""
    latency_buckets: tuple[float, ...] | None = None
    """The bounds of the histogram the pool's p99 is read from (the engine's defaults: how
    finely it can tell how far over or under the SLO the pool is); None: vLLM's."""


@dataclass(frozen=True)
class Behavior:
    """Speed limits from spec.autoscaling."""

    up_window: float = 0.0
    up_step: int = 4
    up_cooldown: float = 30.0
    down_window: float = 300.0
    down_step: int = 100
    down_cooldown: float = 120.0
    stale_after: float = 60.0
    window: float = 120.0
    """The queries' rate window: a p99 reflects the last ``window`` seconds."""
    slo_window: float = 672 * 3600.0
    """The SLOs' compliance window, which their error budgets are counted over."""
