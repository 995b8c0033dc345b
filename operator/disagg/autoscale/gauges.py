"""The gauges a pool's scale-up can act on before its latency does (pure): the queue and, for
a decode pool, its KV cache and running count. Each is its value over its target, with what
it read, so that a decision a gauge drives names the numbers it acted on."""

from __future__ import annotations

from typing import Final

from disagg.autoscale.decode import KV_USAGE_TARGET
from disagg.autoscale.load import Need
from disagg.autoscale.model import PoolName, PoolPolicy, Signals

QUEUE_PER_REPLICA_TARGET: Final = 2.0
"""Waiting requests per replica a pool without a load estimate tolerates."""
Gauge = tuple[float, str]
"""(value over its target, what it read)."""


def read_gauges(
    pool: PoolName, signals: Signals, policy: PoolPolicy, need: Need | None, replicas: int,
    queue_counts: bool,
) -> tuple[float, list[Gauge]]:  # fmt: skip
    """(the queue's gauge, 0 when it does not count; every gauge that reads something).
    ``replicas`` serve now; ``queue_counts``: the queue is one the pool must drain (not a
    backlog draining into replicas that just arrived, nor requests passing through a
    decode pool whose free KV cache holds them)."""
    gauges: list[Gauge] = []
    queue = signals.queue or 0.0
    if queue and queue_counts:
        if need is not None and need.drain_per_request and need.wait_budget:
            # How long the backlog takes to drain, against what the SLO leaves for waiting.
            drain = queue * need.drain_per_request / replicas
            said = f"{queue:.0f} waiting take {drain:.2f}s to drain, "
            said += f"{need.wait_budget:.2f}s the SLO leaves them"
            gauges.append((drain / need.wait_budget, said))
        else:
            per_replica = queue / replicas
            said = f"{queue:.0f} waiting, {per_replica:.1f} per replica "
            said += f"(at most {QUEUE_PER_REPLICA_TARGET:g})"
            gauges.append((per_replica / QUEUE_PER_REPLICA_TARGET, said))
    queue_gauge = gauges[0][0] if gauges else 0.0
    if pool == "decode" and signals.kv_usage is not None:
        said = f"KV cache {signals.kv_usage:.0%} used (at most {KV_USAGE_TARGET:.0%})"
        gauges.append((signals.kv_usage / KV_USAGE_TARGET, said))
    if pool == "decode" and signals.running is not None and policy.max_num_seqs:
        slots = 0.9 * policy.max_num_seqs
        per_replica = signals.running / replicas
        said = f"{signals.running:.0f} running, {per_replica:.0f} per replica "
        said += f"(at most {slots:.0f}, 90% of maxNumSeqs)"
        gauges.append((per_replica / slots, said))
    return queue_gauge, gauges


def loudest(gauges: list[Gauge]) -> str:
    """What the gauge furthest over its target read."""
    return max(gauges, key=lambda gauge: gauge[0], default=(0.0, "its gauges"))[1]
