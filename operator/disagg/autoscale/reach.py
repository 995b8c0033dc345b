"""What more replicas cannot fix (pure): requests that miss the SLO at any pool size.

A prompt whose prefill alone takes longer than the TTFT SLO on this tensor-parallel degree
misses it however many replicas serve it, and so does a decode step that misses TPOT with
almost nothing batched. This module finds them (in the prefill-time histogram, each prompt
as if computed alone), names the TP degree that would serve them, and says where in the
TTFT histogram the p99 of the prompts that can meet the SLO lies, so that latency still
speaks for those.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from disagg.autoscale import sizing
from disagg.autoscale.memory import PoolMemory
from disagg.autoscale.model import PoolName, PoolPolicy, Signals

UNREACHABLE_REPORT: Final = 0.001
"""Report requests that cannot meet the SLO at any size once they are 0.1% of the traffic."""
UNREACHABLE_MARK: Final = "at any size"
"""Every unreachable message says so: how status tells a new finding from a repeated one."""
REACHABLE_P99_LOWEST: Final = 0.5
"""The lowest quantile of the TTFT histogram read as the p99 of the prompts that can meet the
SLO (where half or more cannot, what is left says little)."""
LONE_SEQUENCES: Final = 2
"""Sequences per decode replica at or below which a missed TPOT is the step itself (or a
stall), not the batch: it says nothing about how many sequences a replica holds."""


def prefill_alone(signals: Signals, memory: PoolMemory) -> tuple[tuple[float, float], ...]:
    """The prefill-time histogram as if each prompt were computed alone.

    Under load a prompt's prefill phase includes the prompts batched into its steps; the
    learned speed says how long the mean prompt takes alone, and every bucket is scaled by
    the same factor (never up). A pool under half busy at that speed, with no queue over
    the rate window, batches little: its histogram is read as it is. Scaled there, by a
    speed that is the best one seen (on shorter prompts, each token is faster), the long
    prompts' times shrank: fewer of them read as out of reach, the p99 of the others was
    read among them, and diurnal long context kept a prefill replica it did not need."""
    rate, tokens, observed = (
        signals.request_rate,
        signals.prompt_tokens_rate,
        signals.prefill_seconds,
    )
    if not memory.prefill_speed or not rate or not tokens or not observed:
        return signals.prefill_buckets
    pods = signals.pods_reporting
    quiet = not signals.queue and not any(waiting for _, waiting, _ in memory.queues)
    if quiet and pods and tokens / pods < sizing.BUSY_SHARE * memory.prefill_speed:
        return signals.prefill_buckets
    alone = min(1.0, tokens / rate / memory.prefill_speed / observed)
    return tuple((bound * alone, count) for bound, count in signals.prefill_buckets)


def unreachable(
    pool: PoolName, signals: Signals, ready: int, policy: PoolPolicy, memory: PoolMemory,
    band: float,
) -> tuple[float, str] | None:  # fmt: skip
    """(share, message) of requests that miss the SLO at any size on this TP degree."""
    tp = policy.tensor_parallel
    if pool == "prefill":
        # Prompts slow only because they were batched with others are a load problem, not
        # this: judge each prompt by its time alone.
        buckets = prefill_alone(signals, memory)
        share = sizing.share_above(buckets, policy.slo)
        if share < UNREACHABLE_REPORT:
            return None
        slowest = sizing.quantile(buckets, 1 - min(share, 0.01) / 10)
        slow = slowest if slowest is not None else policy.slo
        return share, (
            f"{share:.1%} of prompts take longer than the {policy.slo:g}s TTFT SLO in prefill "
            f"alone on TP{tp} (up to {slow:.1f}s), so they miss it {UNREACHABLE_MARK}; "
            f"TP{sizing.tp_to_meet(tp, slow, policy.slo)} would serve them"
        )
    if signals.p99 is None or signals.running is None or ready == 0:
        return None
    if signals.p99 > policy.slo * (1 + band) and signals.running / ready <= LONE_SEQUENCES:
        return 1.0, (
            f"TPOT p99 {signals.p99 * 1000:.0f}ms with at most {LONE_SEQUENCES} sequences per "
            "replica: the "
            f"decode step alone misses the {policy.slo * 1000:g}ms SLO on TP{tp} "
            f"{UNREACHABLE_MARK}; TP{sizing.tp_to_meet(tp, signals.p99, policy.slo)} would meet it"
        )
    return None


def reachable_quantile(unreachable_share: float) -> float | None:
    """The quantile of every prompt's TTFT that is the p99 of those that can meet the SLO,
    when ``unreachable_share`` of them cannot at any size (all of those lie above it: they
    miss the SLO). None where it would read below REACHABLE_P99_LOWEST."""
    q = 1 - (unreachable_share + 0.01 * (1 - unreachable_share))
    return q if q >= REACHABLE_P99_LOWEST else None


def intrinsic_p99(
    pool: PoolName, signals: Signals, memory: PoolMemory, read_in: Sequence[float] = (),
    q: float = 0.99,
) -> float | None:  # fmt: skip
    """Prefill: the 99th percentile (or the ``q`` quantile) of the prompts' own prefill times
    (each as if computed alone), seconds: a TTFT p99 no pool size brings lower. With
    ``read_in``, the TTFT histogram's bounds, as that histogram would read it: its buckets
    are coarser, and one prompt of fifty at 1.1 s alone reads as a p99 of 1.23 s in the
    prefill-time histogram's (1, 1.5] but 1.7 s in vLLM's TTFT bucket (1, 2.5]. None for
    decode, or without a histogram."""
    if pool != "prefill":
        return None
    alone = prefill_alone(signals, memory)
    return sizing.quantile(sizing.rebucket(alone, read_in) if read_in else alone, q)
