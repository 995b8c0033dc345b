"""Closed-form engine capacity from the latency model (pure), as Dynamo's planner computes it.

A prefill engine serves one prompt of ``isl`` tokens (chunked by the token budget) in
``prefill_seconds``; a decode engine runs the largest batch whose step still meets the
inter-token target, and by Little's law serves ``batch / (osl * step)`` requests per second.
The fleet simulator's Dynamo-like policy sizes pools with these, and the planner starts its
searches from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.perf.roofline import EngineShape, PrefillChunk, StepTime


def prefill_seconds(step_time: StepTime, shape: EngineShape, isl: int, budget: int) -> float:
    """Wall time of one prompt alone, computed in chunks of at most ``budget`` tokens."""
    total, done = 0.0, 0
    while done < isl:
        n = min(isl - done, max(1, budget))
        total += step_time(shape, [PrefillChunk(n, done)], [])
        done += n
    return total


@dataclass(frozen=True)
class DecodeCapacity:
    """The largest batch meeting the inter-token target, its step time, and requests/s."""

    batch: int
    step: float
    requests_per_second: float

    def seconds_per_request(self, osl: float) -> float:
        """Engine time one request of ``osl`` output tokens takes: its share of the steps."""
        return osl * self.step / self.batch


def decode_capacity(
    step_time: StepTime,
    shape: EngineShape,
    isl: float,
    osl: float,
    itl_target: float,
    kv_capacity: int,
    max_num_seqs: int,
) -> DecodeCapacity:
    """Binary search of the batch size at the mean context ``isl + osl/2`` (Dynamo's choice)."""
    context = max(1, round(isl + osl / 2))
    limit = max(1, min(kv_capacity // context, max_num_seqs))
    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if step_time(shape, [], [context] * middle) <= itl_target:
            low = middle
        else:
            high = middle - 1
    step = step_time(shape, [], [context] * low)
    return DecodeCapacity(low, step, low / (max(1.0, osl) * step))
