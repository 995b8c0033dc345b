"""Scaling policies the fleet simulator can run (pure; the clock is the simulated one).

``SloPolicy`` is the operator's own policy (:mod:`disagg.autoscale.policy`, the real code, not
a copy) fed with the fleet's pool statistics; ``StaticPolicy`` never moves; ``ThresholdPolicy``
is an HPA/KEDA-style utilization target with a tolerance band and a scale-down
stabilization window; ``ThroughputPlannerPolicy`` is the throughput-based replica formula
NVIDIA Dynamo's SLA planner publishes, fed with the same latency model as the fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from disagg.autoscale import combine
from disagg.autoscale.policy import (
    Behavior,
    Decision,
    PoolMemory,
    PoolPolicy,
    Signals,
    decide_pool,
    share_look_back,
)
from disagg.perf.capacity import decode_capacity, prefill_seconds
from disagg.perf.roofline import EngineShape, StepTime
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
    colocated: bool = False
    """One engine pool serves both phases (the fleet calls it "decode")."""
    _memory: dict[str, PoolMemory] = field(default_factory=dict)
    _last_scale: dict[str, float] = field(default_factory=dict)

    def memory(self, pool: PoolName) -> PoolMemory:
        """What the policy has learned of a pool so far (its speed, its knee, its history)."""
        return self._memory.setdefault(pool, PoolMemory())

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        share_look_back(self._memory.values())
        if self.colocated:
            # One engine pool serves both phases: sized, as the operator sizes it, for the
            # larger of what its TTFT and its TPOT ask, each phase with its own memory.
            phases = [self._decide(phase, pool, stats, now) for phase in ("prefill", "decode")]
            decision = combine.colocated(*phases)
        else:
            decision = self._decide(pool, pool, stats, now)
        if decision.desired != stats.replicas:
            self._last_scale[pool] = now
        return decision.desired

    def _decide(self, phase: PoolName, pool: PoolName, stats: PoolStats, now: float) -> Decision:
        """One phase's decision, read from the stats of the pool that serves it."""
        # The p99 as the operator reads it: Prometheus' interpolation over vLLM's buckets.
        latency = stats.ttft_reported if phase == "prefill" else stats.tpot_reported
        # What the engines' own counters would report: requests and prompt tokens they
        # finished, not arrivals (the backlog shows in the queue).
        signals = Signals(
            p99=latency,
            request_rate=stats.served_rate,
            prompt_tokens_rate=stats.prompt_tokens_served_rate,
            queue=stats.queue,
            running=stats.running,
            kv_usage=stats.kv_usage,
            pods_reporting=stats.ready,
            sampled_at=now,
            prefill_seconds=stats.prefill_seconds,
            prefill_buckets=stats.prefill_buckets,
            tpot_mean=stats.tpot_mean,
            generation_tokens_rate=stats.generation_tokens_rate,
            # Histograms as Prometheus reads them: bucket rates over the window.
            ttft_buckets=_rates(stats.ttft_buckets, stats.span) if phase == "prefill" else (),
            slo_buckets=_rates(
                stats.ttft_done if phase == "prefill" else stats.tpot_done, stats.span
            ),
        )
        return decide_pool(
            phase, signals, stats.replicas, stats.ready, self.policies[phase], self.behavior,
            self.memory(phase), self._last_scale.get(pool), now,
        )  # fmt: skip


def _rates(counts: tuple[tuple[float, float], ...], span: float) -> tuple[tuple[float, float], ...]:
    return tuple((bound, count / span) for bound, count in counts)


@dataclass
class SchedulePolicy:
    """A replica schedule fixed in advance: (start time, replicas) per pool, ascending.

    Each size is ordered one ``lead`` (the provisioning delay) before its window starts, so
    it serves from the window's first second; a smaller size takes over at its window's start.
    """

    schedule: dict[PoolName, list[tuple[float, int]]]
    lead: float
    name: str = "oracle (hindsight schedule)"

    def at(self, pool: PoolName, t: float) -> int:
        entries = self.schedule[pool]
        current = entries[0][1]
        for start, replicas in entries:
            if start > t:
                break
            current = replicas
        return current

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        return max(self.at(pool, now), self.at(pool, now + self.lead))


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


@dataclass
class ThroughputPlannerPolicy:
    """Dynamo's throughput planner: replicas = demand / one engine's SLO-bound capacity.

    Every ``interval`` (Dynamo's default 180 s) it takes the observed request rate and mean
    lengths as the next interval's prediction (last value), then:
    prefill: one prompt of the mean length takes ``wt``; an engine serves ``1/wt`` req/s and
    ``ceil(wt / TTFT target)`` engines are the SLA floor; decode: the largest batch whose step
    fits the ITL target and the KV cache serves ``B / (osl * step)`` req/s (Little's law).
    """

    step_time: StepTime
    shapes: dict[PoolName, EngineShape]
    kv_capacity: dict[PoolName, int]
    ttft_target: float
    itl_target: float
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    interval: float = 180.0
    colocated: bool = False
    """One pool does both phases (Dynamo's agg mode): an engine's time per request is its
    prompt's prefill plus its share of the decode steps."""
    name: str = "throughput planner (Dynamo-like)"
    _last: dict[str, tuple[float, int]] = field(default_factory=dict)

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        last = self._last.get(pool)
        if last is not None and now - last[0] < self.interval:
            return last[1]
        if stats.request_rate <= 0:
            want = stats.replicas
        elif pool == "prefill":
            want = self._prefill(stats)
        else:
            want = self._decode(stats)
        self._last[pool] = (now, want)
        return want

    def _prefill(self, stats: PoolStats) -> int:
        wall = self._prefill_wall(stats, "prefill")
        floor = math.ceil(wall / self.ttft_target) if wall > self.ttft_target else 1
        return max(math.ceil(stats.request_rate * wall), floor, 1)

    def _prefill_wall(self, stats: PoolStats, pool: PoolName) -> float:
        isl = max(1, round(stats.mean_prompt))
        return prefill_seconds(self.step_time, self.shapes[pool], isl, self.max_num_batched_tokens)

    def _decode(self, stats: PoolStats) -> int:
        osl = max(1.0, stats.mean_output)
        capacity = decode_capacity(
            self.step_time,
            self.shapes["decode"],
            stats.mean_prompt,
            osl,
            self.itl_target,
            self.kv_capacity["decode"],
            self.max_num_seqs,
        )
        seconds_per_request = capacity.seconds_per_request(osl)
        if self.colocated:
            seconds_per_request += self._prefill_wall(stats, "decode")
        return max(math.ceil(stats.request_rate * seconds_per_request), 1)
