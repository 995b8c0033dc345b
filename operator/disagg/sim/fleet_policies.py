"""Scaling policies the fleet simulator can run (pure; the clock is the simulated one).

``SloPolicy`` is the operator's own policy (:mod:`disagg.autoscale.policy`, the real code, not
a copy) fed with the fleet's pool statistics; ``StaticPolicy`` never moves; ``ThresholdPolicy``
is an HPA/KEDA-style utilization target with a tolerance band and a scale-down
stabilization window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from disagg.autoscale.policy import Behavior, PoolMemory, PoolPolicy, Signals, decide_pool
from disagg.sim.fleet import PoolName, PoolStats


@dataclass
class StaticPolicy:
    """Provisioned once, never changed."""

    name: str = "static"

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        return stats.replicas


@dataclass
class SloPolicy:
    """The operator's SLO policy, run on simulated time."""

    policies: dict[PoolName, PoolPolicy]
    behavior: Behavior = field(default_factory=Behavior)
    name: str = "slo (ours)"
    _memory: dict[str, PoolMemory] = field(default_factory=dict)
    _last_scale: dict[str, float] = field(default_factory=dict)

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        latency = stats.ttft_p99 if pool == "prefill" else stats.tpot_p99
        signals = Signals(
            p99=latency,
            request_rate=stats.request_rate,
            queue=stats.queue,
            running=stats.running,
            kv_usage=stats.kv_usage,
            pods_reporting=stats.ready,
            sampled_at=now,
        )
        decision = decide_pool(
            pool, signals, stats.replicas, stats.ready, self.policies[pool], self.behavior,
            self._memory.setdefault(pool, PoolMemory()), self._last_scale.get(pool), now,
        )  # fmt: skip
        if decision.desired != stats.replicas:
            self._last_scale[pool] = now
        return decision.desired


@dataclass
class ThresholdPolicy:
    """HPA-style: replicas = ceil(current * utilization / target), 10% tolerance, slow down."""

    max_num_seqs: int
    target: float = 0.7
    tolerance: float = 0.1
    down_window: float = 300.0
    name: str = "utilization threshold (HPA-like)"
    _recommendations: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        replicas = max(1, stats.replicas)
        slots = replicas * self.max_num_seqs
        utilization = (stats.running + stats.queue) / slots
        ratio = utilization / self.target
        want = stats.replicas if abs(ratio - 1) <= self.tolerance else math.ceil(replicas * ratio)
        history = self._recommendations.setdefault(pool, [])
        history.append((now, want))
        history[:] = [(t, r) for t, r in history if now - t <= self.down_window]
        # Scale down only to the highest recommendation of the stabilization window, as HPA does.
        return max(want, max(r for _, r in history)) if want < stats.replicas else want
