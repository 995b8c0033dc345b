"""The SLO autoscaling policy (pure: no I/O, the clock is an argument).

Each pool is sized on its own signal: prefill on TTFT p99 against ``ttftP99``, decode on
inter-token latency p99 against ``tpotP99``. Load signals that move before latency does push
scale-up early: waiting requests per replica (both), KV-cache usage and running requests
(decode). The rules, each covered by a table-driven test:

* **hold** when metrics are missing, stale, NaN, or come from fewer pods than are ready:
  no data is never read as idle;
* scale **up** fast: as soon as the pool breaches (beyond a tolerance band sized from the
  histogram bucket that holds the SLO, so interpolation noise at a bucket edge cannot flap),
  by up to ``scaleUp.maxStep`` replicas, after ``scaleUp.cooldown``; while replicas of an
  earlier scale-up are still starting, only if the ready replicas' load needs more than that;
* scale **down** slowly: only when the pool would still meet its SLO with one replica fewer,
  when that has been true for the whole ``scaleDown.stabilizationWindow``, one step at a time,
  after ``scaleDown.cooldown``; an idle pool (no requests at all) goes down to its minimum;
* respect min/max and the model's GPU budget; when the budget binds, the pool whose SLO is
  worse gets the GPUs first, and the decision says it was limited.

What persists across restarts lives in status (last scale time); the stabilization history is
an optimization that, when lost, only delays a scale-down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from disagg.perf.buckets import ITL_BUCKETS, TTFT_BUCKETS

Action = Literal["up", "down", "hold"]
PoolName = Literal["prefill", "decode"]

QUEUE_PER_REPLICA_TARGET: Final = 2.0
KV_USAGE_TARGET: Final = 0.85
DOWN_HEADROOM: Final = 0.8
"""Scale down only if the latency with one replica fewer stays under 80% of the SLO."""
MIN_TOLERANCE: Final = 0.1


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


@dataclass(frozen=True)
class PoolPolicy:
    """The spec's limits for one pool."""

    slo: float
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int
    max_num_seqs: int | None = None


@dataclass(frozen=True)
class Behavior:
    """Speed limits from spec.autoscaling."""

    up_window: float = 0.0
    up_step: int = 4
    up_cooldown: float = 30.0
    down_window: float = 300.0
    down_step: int = 1
    down_cooldown: float = 120.0
    stale_after: float = 60.0


@dataclass(frozen=True)
class Decision:
    """What to do with one pool, and why (the reason lands in status and an Event)."""

    pool: PoolName
    current: int
    desired: int
    action: Action
    reason: str
    limited: bool = False
    pressure: float = 0.0
    """How far over its SLO the pool is (1.0 = at the SLO); used to share a GPU budget."""


@dataclass
class PoolMemory:
    """Recent recommendations (time, replicas) of one pool: the stabilization window's input."""

    recommendations: list[tuple[float, int]] = field(default_factory=list)

    def remember(self, now: float, replicas: int, horizon: float) -> None:
        self.recommendations.append((now, replicas))
        self.recommendations = [(t, r) for t, r in self.recommendations if now - t <= horizon]

    def held(
        self, now: float, window: float, *, at_most: int | None = None, at_least: int | None = None
    ) -> bool:
        """Whether the history covers ``window`` and every recommendation in it stayed within
        the bound."""
        if window <= 0:
            return True
        if not self.recommendations or now - self.recommendations[0][0] < window:
            return False
        recent = [r for t, r in self.recommendations if now - t <= window]
        if at_most is not None and any(r > at_most for r in recent):
            return False
        return not (at_least is not None and any(r < at_least for r in recent))


def tolerance(slo: float, buckets: Sequence[float]) -> float:
    """Relative dead band around the SLO: half the width of the histogram bucket holding it.

    histogram_quantile interpolates linearly inside a bucket, so near an edge small load
    changes move the estimate by up to a bucket's width; deciding inside that band would flap.
    """
    lower = 0.0
    for upper in buckets:
        if slo <= upper:
            return max(MIN_TOLERANCE, (upper - lower) / 2 / slo)
        lower = upper
    return MIN_TOLERANCE


def _hold(pool: PoolName, current: int, reason: str) -> Decision:
    return Decision(pool, current, current, "hold", reason)


def _problem(signals: Signals | None, ready: int, now: float, stale_after: float) -> str | None:
    if signals is None:
        return "metrics missing"
    if now - signals.sampled_at > stale_after:
        return f"metrics stale ({now - signals.sampled_at:.0f}s old)"
    if signals.pods_reporting < ready:
        return f"metrics from {signals.pods_reporting} of {ready} ready pods"
    if signals.request_rate is None or (signals.p99 is None and signals.request_rate > 0):
        return "latency metrics missing"
    return None


def decide_pool(
    pool: PoolName,
    signals: Signals | None,
    current: int,
    ready: int,
    policy: PoolPolicy,
    behavior: Behavior,
    memory: PoolMemory,
    last_scale: float | None,
    now: float,
) -> Decision:
    """The decision for one pool (before the GPU budget)."""
    clamped = max(policy.min_replicas, min(policy.max_replicas, current))
    if clamped != current:
        action: Action = "up" if clamped > current else "down"
        return Decision(
            pool,
            current,
            clamped,
            action,
            f"outside bounds {policy.min_replicas}..{policy.max_replicas}",
        )
    problem = _problem(signals, ready, now, behavior.stale_after)
    if problem is not None or signals is None:
        return _hold(pool, current, f"holding: {problem}")
    label = "TTFT" if pool == "prefill" else "TPOT"
    buckets = TTFT_BUCKETS if pool == "prefill" else ITL_BUCKETS
    band = tolerance(policy.slo, buckets)
    idle = signals.request_rate == 0 and not signals.queue and not signals.running
    latency = 0.0 if idle or signals.p99 is None else signals.p99 / policy.slo
    load = [latency]
    # Per-replica load is measured on the replicas that serve: starting ones carry none yet.
    replicas = max(1, min(current, ready))
    if signals.queue:
        load.append(signals.queue / replicas / QUEUE_PER_REPLICA_TARGET)
    if pool == "decode" and signals.kv_usage is not None:
        load.append(signals.kv_usage / KV_USAGE_TARGET)
    if pool == "decode" and signals.running is not None and policy.max_num_seqs:
        load.append(signals.running / replicas / (0.9 * policy.max_num_seqs))
    pressure = max(load)
    # The dead band protects against histogram interpolation; load gauges are not histograms.
    breach = latency > 1 + band or any(x > 1 + MIN_TOLERANCE for x in load[1:])
    since = math.inf if last_scale is None else now - last_scale
    observed = (
        "idle"
        if idle
        else f"{label} p99 {signals.p99 * 1000:.0f}ms vs SLO {policy.slo * 1000:.0f}ms"
        if signals.p99 is not None
        else "no latency yet"
    )

    horizon = 2 * max(behavior.up_window, behavior.down_window) + 60
    starting = current - ready
    if breach and current < policy.max_replicas:
        want = max(current + 1, math.ceil(current * min(pressure, 2.0)))
        if starting > 0:
            # A scale-up is still loading the model. The load it was meant for is measured on
            # the ready replicas; asking again before they start would stack a second step on
            # the first (minutes of provisioning make that a large overshoot).
            want = math.ceil(replicas * min(pressure, 2.0))
            if want <= current:
                memory.remember(now, current, horizon)
                return Decision(
                    pool,
                    current,
                    current,
                    "hold",
                    f"waiting for {starting} starting replica(s) ({observed})",
                    pressure=pressure,
                )
        desired = min(policy.max_replicas, current + behavior.up_step, want)
        memory.remember(now, desired, horizon)
        if since < behavior.up_cooldown:
            return Decision(
                pool,
                current,
                current,
                "hold",
                f"in scale-up cooldown ({observed})",
                pressure=pressure,
            )
        if not memory.held(now, behavior.up_window, at_least=current + 1):
            return Decision(
                pool,
                current,
                current,
                "hold",
                f"stabilizing scale-up ({observed})",
                pressure=pressure,
            )
        driver = observed if latency >= pressure else f"load ahead of latency ({observed})"
        return Decision(pool, current, desired, "up", f"scale up: {driver}", pressure=pressure)

    # With one replica fewer the same load lands on n-1 replicas.
    fewer = max(1, current - 1)
    after = pressure * current / fewer if current > 1 else pressure
    can_shrink = current > policy.min_replicas and (idle or after < DOWN_HEADROOM)
    target = policy.min_replicas if idle else max(policy.min_replicas, current - behavior.down_step)
    memory.remember(now, target if can_shrink else current, horizon)
    if not can_shrink:
        return Decision(
            pool, current, current, "hold", f"within SLO ({observed})", pressure=pressure
        )
    if since < behavior.down_cooldown:
        return Decision(
            pool,
            current,
            current,
            "hold",
            f"in scale-down cooldown ({observed})",
            pressure=pressure,
        )
    if not memory.held(now, behavior.down_window, at_most=current - 1):
        return Decision(
            pool,
            current,
            current,
            "hold",
            f"stabilizing scale-down ({observed})",
            pressure=pressure,
        )
    desired = max(target, current - behavior.down_step)
    return Decision(pool, current, desired, "down", f"scale down: {observed}", pressure=pressure)


def apply_budget(
    decisions: Sequence[Decision], policies: dict[PoolName, PoolPolicy], budget: int | None
) -> list[Decision]:
    """Fit both pools into the GPU budget, the pool further over its SLO first."""
    if budget is None:
        return list(decisions)
    gpus = {d.pool: policies[d.pool].gpus_per_replica for d in decisions}
    if sum(d.desired * gpus[d.pool] for d in decisions) <= budget:
        return list(decisions)
    floor = {
        d.pool: max(policies[d.pool].min_replicas, min(d.current, d.desired)) for d in decisions
    }
    left = budget - sum(floor[d.pool] * gpus[d.pool] for d in decisions)
    result = {d.pool: d for d in decisions}
    for decision in sorted(decisions, key=lambda d: d.pressure, reverse=True):
        extra_wanted = decision.desired - floor[decision.pool]
        extra = max(0, min(extra_wanted, left // gpus[decision.pool]))
        left -= extra * gpus[decision.pool]
        granted = floor[decision.pool] + extra
        if granted < decision.desired:
            action: Action = (
                "up"
                if granted > decision.current
                else "down"
                if granted < decision.current
                else "hold"
            )
            result[decision.pool] = replace(
                decision,
                desired=granted,
                action=action,
                limited=True,
                reason=f"{decision.reason}; limited by the GPU budget of {budget}",
            )
    return [result[d.pool] for d in decisions]
