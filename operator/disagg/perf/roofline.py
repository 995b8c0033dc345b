"""Roofline-with-efficiency iteration times: why prefill stalls decode.

One engine step runs every scheduled token at once. Its time is a fixed overhead plus the
larger of compute time (FLOPs at the phase's MFU) and memory time (weights plus KV read at
the TP degree's MBU), plus tensor-parallel all-reduces. A decode-only step is memory-bound
(weights are read once for a whole batch); a step that also carries a prefill chunk is
compute-bound and can be tens of times longer, and every decode request in that step waits
for it: that is the inter-token latency spike disaggregation removes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from disagg.perf.profiles import GpuProfile, ModelProfile

ALLREDUCE_LATENCY: Final = 10e-6


@dataclass(frozen=True)
class PrefillChunk:
    """Part of a prompt computed in one step: new tokens on top of already cached ones."""

    new_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class EngineShape:
    """One engine instance: a model on ``tp`` GPUs of one type."""

    model: ModelProfile
    gpu: GpuProfile
    tp: int = 1
    kv_bytes_per_element: int = 2
    prefill_overhead: float = 0.005
    decode_overhead: float = 0.003
    memory_utilization: float = 0.9

    @cached_property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_bytes_per_element)

    @cached_property
    def decode_terms(self) -> tuple[float, float, float, float, float, float]:
        """FLOPs per sequence, FLOPs per context token, bytes read per step and per context
        token, and the compute and memory rates: a decode-only step's time in closed form."""
        model, gpu, tp = self.model, self.gpu, self.tp
        return (
            2 * model.active_params,
            4 * model.layers * model.attention_width,
            model.weight_bytes,
            self.kv_bytes_per_token,
            tp * gpu.peak_flops * gpu.mfu_decode,
            tp * gpu.hbm_bandwidth * gpu.mbu(tp),
        )


StepTime = Callable[[EngineShape, Sequence[PrefillChunk], Sequence[int]], float]
"""A latency model: seconds of one engine step (:func:`step_time`, or fitted coefficients)."""


def _allreduce(shape: EngineShape, tokens: int) -> float:
    tp = shape.tp
    if tp <= 1 or tokens == 0:
        return 0.0
    payload = tokens * shape.model.hidden * 2
    per_layer = ALLREDUCE_LATENCY + 2 * (tp - 1) / tp * payload / shape.gpu.nvlink_bandwidth
    return 2 * shape.model.layers * per_layer


def step_time(
    shape: EngineShape, chunks: Sequence[PrefillChunk], decode_contexts: Sequence[int]
) -> float:
    """Seconds of one engine step with these prefill chunks and decoding requests."""
    if not chunks:
        return _decode_step_time(shape, decode_contexts) if decode_contexts else 0.0
    model, gpu, tp = shape.model, shape.gpu, shape.tp
    d, layers = model.attention_width, model.layers
    new_tokens = sum(c.new_tokens for c in chunks)
    batch = len(decode_contexts)
    context = sum(decode_contexts)
    flops = 2 * model.active_params * (new_tokens + batch)
    flops += layers * sum(
        2 * d * c.new_tokens**2 + 4 * d * c.new_tokens * c.cached_tokens for c in chunks
    )
    flops += 4 * layers * d * context
    kv = shape.kv_bytes_per_token
    read = model.weight_bytes + kv * (sum(c.new_tokens + c.cached_tokens for c in chunks) + context)
    mfu = gpu.mfu_prefill if chunks else gpu.mfu_decode
    compute = flops / (tp * gpu.peak_flops * mfu)
    memory = read / (tp * gpu.hbm_bandwidth * gpu.mbu(tp))
    overhead = shape.prefill_overhead if chunks else shape.decode_overhead
    return overhead + max(compute, memory) + _allreduce(shape, new_tokens + batch)


def _decode_step_time(shape: EngineShape, contexts: Sequence[int]) -> float:
    """The decode-only case of :func:`step_time`, which the fleet simulator runs most."""
    return decode_step_time(shape, len(contexts), sum(contexts))


def decode_step_time(shape: EngineShape, batch: int, context: int) -> float:
    """A decode-only step of ``batch`` sequences holding ``context`` tokens in all: all the
    roofline needs of them, so a run of steps is timed without summing the batch each step."""
    per_sequence, per_context, weights, kv, flop_rate, byte_rate = shape.decode_terms
    compute = (per_sequence * batch + per_context * context) / flop_rate
    memory = (weights + kv * context) / byte_rate
    return shape.decode_overhead + max(compute, memory) + _allreduce(shape, batch)


def kv_capacity_tokens(shape: EngineShape) -> int:
    """Tokens of KV cache one engine can hold after its weights (and 10% headroom)."""
    free = shape.tp * shape.gpu.hbm_bytes * shape.memory_utilization - shape.model.weight_bytes
    return max(0, int(free / shape.kv_bytes_per_token))


@dataclass(frozen=True)
class NetworkProfile:
    """The link a KV cache crosses from a prefill to a decode engine."""

    name: str
    bandwidth: float
    """Effective bytes/s of one transfer."""
    latency: float
    """Fixed cost of one transfer (handshake, descriptor posting)."""


NETWORKS: Final[dict[str, NetworkProfile]] = {
    n.name: n
    for n in (
        NetworkProfile("nvlink", 400e9, 0.0005),
        NetworkProfile("ib400", 45e9, 0.002),
        NetworkProfile("roce400", 45e9, 0.003),
        NetworkProfile("eth100", 11e9, 0.003),
        NetworkProfile("tcp", 2e9, 0.005),
    )
}


def transfer_time(
    shape: EngineShape, tokens: int, network: NetworkProfile, rails: int = 1
) -> float:
    """Seconds to move the KV cache of ``tokens`` prompt tokens over ``rails`` parallel links."""
    payload = tokens * shape.kv_bytes_per_token
    return network.latency + payload / (network.bandwidth * max(1, rails))
