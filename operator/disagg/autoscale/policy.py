"""The SLO autoscaling policy (pure: no I/O, the clock is an argument).

Each pool is sized on its own SLO: prefill against ``ttftP99``, decode against ``tpotP99``,
from two kinds of evidence. **Load** says how big the pool must be now
(:mod:`disagg.autoscale.sizing`: prefill from arrivals and the engines' own prefill times
through Erlang C; decode from running sequences and a per-replica batch learned online),
with headroom for how fast the rate grew over one provisioning delay. **Latency** (TTFT
p99, inter-token p99) and load gauges (waiting requests per replica, KV-cache usage,
running requests) catch what the load model misses. The rules, each covered by a test:

* **hold** when metrics are missing, stale, NaN, or come from fewer pods than are ready:
  no data is never read as idle;
* scale **up** fast: as soon as the pool breaches (beyond a tolerance band sized from the
  histogram bucket that holds the SLO, so interpolation noise at a bucket edge cannot flap),
  by up to ``scaleUp.maxStep`` replicas, after ``scaleUp.cooldown``; while replicas of an
  earlier scale-up are still starting, only if the ready replicas' load needs more than that;
* scale **down** in proportion, to the largest size recommended during the whole
  ``scaleDown.stabilizationWindow`` (longer, up to 4x, for a pool whose scale-downs were
  undone within 5 minutes: bursts that come back are learned), at most ``scaleDown.maxStep``
  at a time, after ``scaleDown.cooldown``, only while latency holds 20% under the SLO; without a
  load estimate, only when one replica fewer would still meet the SLO; an idle pool (no
  requests at all) goes down to its minimum;
* **unreachable**: prompts whose prefill alone exceeds the TTFT SLO (or a decode step that
  misses TPOT with almost nothing batched) miss at any size; they do not drive scaling, and
  the decision says which share of requests it is and which TP degree would serve them;
* respect min/max and the model's GPU budget; when the budget binds, the pool whose SLO is
  worse gets the GPUs first, and the decision says it was limited.

What persists across restarts lives in status (last scale time); the stabilization history,
the rate history and the learned decode batch are optimizations that, when lost, only delay
a scale-down or fall back to latency feedback until they are learned again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from disagg.autoscale import sizing
from disagg.perf.buckets import ITL_BUCKETS, TTFT_BUCKETS

Action = Literal["up", "down", "hold"]
PoolName = Literal["prefill", "decode"]

QUEUE_PER_REPLICA_TARGET: Final = 2.0
KV_USAGE_TARGET: Final = 0.85
DOWN_HEADROOM: Final = 0.8
"""Scale down only if the latency with one replica fewer stays under 80% of the SLO."""
MIN_TOLERANCE: Final = 0.1
UNREACHABLE_REPORT: Final = 0.001
"""Report requests that cannot meet the SLO at any size once they are 0.1% of the traffic."""
UNREACHABLE_P99: Final = 0.01
"""At 1% they alone put the p99 over the SLO: latency stops driving that pool."""
UNREACHABLE_MARK: Final = "at any size"
"""Every unreachable message says so: how status tells a new finding from a repeated one."""
FLAP_SECONDS: Final = 300.0
MAX_DOWN_WINDOW_FACTOR: Final = 4
HISTORY: Final = 1800.0
"""Seconds of request-rate history kept for the growth headroom."""
DEFAULT_PROVISIONING: Final = 120.0


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
    unreachable: str | None = None
    """Why some requests miss the SLO at any size, when they do (for status and an Event)."""
    unreachable_share: float = 0.0


@dataclass
class PoolMemory:
    """Recent recommendations (time, replicas) of one pool: the stabilization window's input."""

    recommendations: list[tuple[float, int]] = field(default_factory=list)
    demand: list[tuple[float, float]] = field(default_factory=list)
    """(time, demand): requests/s reaching a prefill pool, sequences held by a decode pool;
    how fast it moves over one provisioning delay sets the headroom."""
    batch: float | None = None
    """Decode: sequences per replica at the TPOT SLO, learned from what the pool served."""
    prefill_speed: float | None = None
    """Prefill: prompt tokens per second one replica computes, learned from what it served."""
    provisioning: float = DEFAULT_PROVISIONING
    """How long new replicas took to become ready, as last measured."""
    starting_since: float | None = None
    ready_at: float | None = None
    """When the replicas of the last scale-up all became ready."""
    last_queue: tuple[float, float] | None = None
    """(time, waiting requests) at the previous evaluation: how fast the backlog grows."""
    last_down: float | None = None
    """When the pool was last scaled down."""
    down_window: float = 0.0
    """The scale-down look-back learned from flaps: longer than the spec's when load that
    was scaled away came back within FLAP_SECONDS."""

    def remember(self, now: float, replicas: int, horizon: float) -> None:
        self.recommendations.append((now, replicas))
        self.recommendations = [(t, r) for t, r in self.recommendations if now - t <= horizon]

    def track(self, now: float, demand: float | None, current: int, ready: int) -> None:
        """Record the demand and how long starting replicas take to become ready."""
        if demand is not None:
            self.demand.append((now, demand))
            self.demand = [(t, d) for t, d in self.demand if now - t <= HISTORY]
        if current > ready and self.starting_since is None:
            self.starting_since = now
        elif current <= ready and self.starting_since is not None:
            self.provisioning = max(1.0, now - self.starting_since)
            self.starting_since = None
            self.ready_at = now

    def queue_growth(self, now: float, queue: float | None) -> float:
        """Waiting requests added per second since the previous evaluation (0 if shrinking)."""
        previous, self.last_queue = self.last_queue, (now, queue or 0.0)
        if previous is None or now <= previous[0]:
            return 0.0
        return max(0.0, ((queue or 0.0) - previous[1]) / (now - previous[0]))

    def scaled(self, now: float, up: bool, configured: float) -> None:
        """Note a resize; a scale-up soon after a scale-down doubles the look-back."""
        if not up:
            self.last_down = now
        elif self.last_down is not None and now - self.last_down <= FLAP_SECONDS:
            base = max(configured, self.down_window)
            self.down_window = min(MAX_DOWN_WINDOW_FACTOR * configured, 2 * base)
            self.last_down = None

    def window_max(self, now: float, window: float) -> int | None:
        """The largest recommendation of the last ``window`` seconds; None until the history
        covers the window."""
        if not self.recommendations:
            return None
        if window > 0 and now - self.recommendations[0][0] < window:
            return None
        return max(r for t, r in self.recommendations if now - t <= window)

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


@dataclass(frozen=True)
class Need:
    """What the load alone asks of a pool, and the numbers that say so."""

    replicas: int
    why: str
    drain_per_request: float | None = None
    """Prefill: seconds of one replica's time a waiting prompt costs."""
    wait_budget: float | None = None
    """Prefill: seconds the TTFT SLO leaves a prompt for waiting."""


def feed_forward(
    pool: PoolName, signals: Signals, policy: PoolPolicy, memory: PoolMemory, growing: float,
    ready: int, behavior_window: float,
) -> Need | None:  # fmt: skip
    """Replicas the observed load needs with headroom (None when the load cannot be sized:
    no prefill times yet, or no decode batch learned or given). ``growing`` is how many
    waiting requests were added per second since the last evaluation."""
    rate = signals.request_rate or 0.0
    headroom = sizing.headroom(memory.demand, memory.provisioning, rate * behavior_window)
    if pool == "prefill":
        speed = memory.prefill_speed
        observed = signals.prefill_seconds
        if speed is None or not observed or not rate or not signals.prompt_tokens_rate:
            return None
        mean_prompt = signals.prompt_tokens_rate / rate
        service = mean_prompt / speed
        # Prefill times observed under load include the prompts batched with them; the
        # histogram is scaled to one prompt alone by the same factor as the mean.
        alone = min(1.0, service / observed)
        buckets = tuple((bound * alone, count) for bound, count in signals.prefill_buckets)
        # Engines count what they finished; under saturation arrivals also fill the queue.
        arrivals = (rate + growing) * headroom + (signals.queue or 0.0) / sizing.DRAIN_SECONDS
        budgets = sizing.wait_budgets(policy.slo, buckets, service)
        n = sizing.prefill_replicas(arrivals, service, budgets, policy.max_replicas + 1)
        typical = max(budgets, key=lambda b: b[0])[1] if budgets else 0.0
        why = (
            f"{rate + growing:.2f} req/s x {headroom:.2f} headroom, {mean_prompt:.0f}-token "
            f"prompts at {speed:.0f} tokens/s per replica, most may wait {typical:.2f}s"
        )
        return Need(n, why, service, typical)
    batch, bound = decode_batch(signals, policy, memory, ready)
    if batch is None or signals.running is None:
        return None  # sequences unknown: the gauges and latency decide
    sequences = ((signals.running or 0.0) + (signals.queue or 0.0)) * headroom
    n = sizing.decode_replicas(sequences, batch)
    return Need(
        n, f"{sequences:.0f} sequences (x {headroom:.2f} headroom) at {batch:.0f} each ({bound})"
    )


def decode_batch(
    signals: Signals, policy: PoolPolicy, memory: PoolMemory, ready: int
) -> tuple[float | None, str]:
    """Sequences one decode replica can hold, and what bounds it: the TPOT knee learned or
    given, the engine's max-num-seqs, or its KV cache at the usage target."""
    limits: list[tuple[float, str]] = []
    learned = memory.batch or policy.decode_batch
    if learned is not None:
        limits.append((learned, "TPOT"))
    if policy.max_num_seqs:
        limits.append((0.9 * policy.max_num_seqs, "max-num-seqs"))
    running, usage = signals.running, signals.kv_usage
    if running and usage and ready and usage > 0.05:
        limits.append((running / ready * KV_USAGE_TARGET / usage, "KV cache"))
    if not limits:
        return None, ""
    return min(limits)


def unreachable(
    pool: PoolName, signals: Signals, ready: int, policy: PoolPolicy, band: float
) -> tuple[float, str] | None:
    """(share, message) of requests that miss the SLO at any size on this TP degree."""
    tp = policy.tensor_parallel
    if pool == "prefill":
        share = sizing.share_above(signals.prefill_buckets, policy.slo)
        if share < UNREACHABLE_REPORT:
            return None
        slowest = sizing.quantile(signals.prefill_buckets, 1 - min(share, 0.01) / 10)
        slow = slowest if slowest is not None else policy.slo
        return share, (
            f"{share:.1%} of prompts take longer than the {policy.slo:g}s TTFT SLO in prefill "
            f"alone on TP{tp} (up to {slow:.1f}s), so they miss it {UNREACHABLE_MARK}; "
            f"TP{sizing.tp_to_meet(tp, slow, policy.slo)} would serve them"
        )
    if signals.p99 is None or signals.running is None or ready == 0:
        return None
    if signals.p99 > policy.slo * (1 + band) and signals.running / ready <= 2:
        return 1.0, (
            f"TPOT p99 {signals.p99 * 1000:.0f}ms with at most 2 sequences per replica: the "
            f"decode step alone misses the {policy.slo * 1000:g}ms SLO on TP{tp} "
            f"{UNREACHABLE_MARK}; TP{sizing.tp_to_meet(tp, signals.p99, policy.slo)} would meet it"
        )
    return None


def _learn(
    pool: PoolName, signals: Signals, current: int, ready: int, since: float,
    policy: PoolPolicy, behavior: Behavior, memory: PoolMemory, band: float,
) -> None:  # fmt: skip
    """Update the prefill speed and the decode batch from what the pool served."""
    if pool == "prefill":
        memory.prefill_speed = sizing.learn_prefill_speed(
            memory.prefill_speed,
            signals.prompt_tokens_rate,
            signals.request_rate,
            signals.prefill_seconds,
            ready,
        )
        return
    settled = current == ready and since > behavior.window
    if pool != "decode" or not settled or signals.p99 is None or not signals.running:
        return
    memory.batch = sizing.learn_batch(
        memory.batch or policy.decode_batch, signals.running / ready, signals.p99, policy.slo, band
    )


def pool_demand(pool: PoolName, signals: Signals, growing: float) -> float | None:
    """What a pool's headroom trend follows: prompt tokens per second reaching a prefill pool
    (a wave of long prompts moves it at a constant request rate), sequences a decode pool
    holds."""
    if pool == "decode":
        return None if signals.running is None else signals.running + (signals.queue or 0.0)
    rate, tokens = signals.request_rate, signals.prompt_tokens_rate
    if not rate or tokens is None:
        return rate
    return tokens + growing * tokens / rate


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
    band = tolerance(policy.slo, TTFT_BUCKETS if pool == "prefill" else ITL_BUCKETS)
    idle = signals.request_rate == 0 and not signals.queue and not signals.running
    latency = 0.0 if idle or signals.p99 is None else signals.p99 / policy.slo
    since = math.inf if last_scale is None else now - last_scale
    growing = memory.queue_growth(signals.sampled_at, signals.queue)
    memory.track(now, pool_demand(pool, signals, growing), current, ready)
    _learn(pool, signals, current, ready, since, policy, behavior, memory, band)
    # Per-replica load is measured on the replicas that serve: starting ones carry none yet.
    replicas = max(1, min(current, ready))
    # For one window after a scale-up's replicas arrive, the p99 still describes the smaller
    # pool, and the backlog it left drains: scaling again on them would scale twice for one
    # load (a backlog that still grows counts).
    fresh = memory.ready_at is not None and now - memory.ready_at < behavior.window
    need = (
        None
        if idle
        else feed_forward(pool, signals, policy, memory, growing, ready, behavior.window)
    )
    gauges = []
    if signals.queue and not (fresh and growing <= 0):
        if need is not None and need.drain_per_request and need.wait_budget:
            # How long the backlog takes to drain, against what the SLO leaves for waiting.
            drain = signals.queue * need.drain_per_request / replicas
            gauges.append(drain / need.wait_budget)
        else:
            gauges.append(signals.queue / replicas / QUEUE_PER_REPLICA_TARGET)
    queue_gauge = gauges[0] if gauges else 0.0
    if pool == "decode" and signals.kv_usage is not None:
        gauges.append(signals.kv_usage / KV_USAGE_TARGET)
    if pool == "decode" and signals.running is not None and policy.max_num_seqs:
        gauges.append(signals.running / replicas / (0.9 * policy.max_num_seqs))
    slow = None if idle else unreachable(pool, signals, ready, policy, band)
    # Requests that miss at any size put the p99 over the SLO on their own once they are 1%:
    # then the p99 says nothing about the pool's size, and load alone decides.
    latency_counts = slow is None or slow[0] < UNREACHABLE_P99
    latency_counts = latency_counts and not (fresh and latency > 1 + band)
    pressure = max([latency if latency_counts else 0.0, *gauges])
    # The load estimate already holds the queue, the KV cache and the batch limits; the gauges
    # drive on their own only where there is no estimate (nothing learned yet), except a
    # queue that is long and still growing: work is arriving that the estimate has not seen
    # (longer prompts than the ones finished so far).
    queue_breach = growing > 0 and queue_gauge > 1 + MIN_TOLERANCE
    # With a load estimate, a p99 over the SLO while the backlog drains describes the past.
    draining = need is not None and signals.queue is not None and growing <= 0
    latency_counts = latency_counts and not (draining and latency > 1 + band)
    gauge_breach = queue_breach or (need is None and any(x > 1 + MIN_TOLERANCE for x in gauges))
    breach = (latency_counts and latency > 1 + band) or gauge_breach
    pressure = max([latency if latency_counts else 0.0, *gauges])
    observed = (
        "idle"
        if idle
        else f"{label} p99 {signals.p99 * 1000:.0f}ms vs SLO {policy.slo * 1000:.0f}ms"
        if signals.p99 is not None
        else "no latency yet"
    )
    note = {"unreachable": slow[1] if slow else None, "unreachable_share": slow[0] if slow else 0}

    def decision(desired: int, action: Action, reason: str) -> Decision:
        if desired != current:
            memory.scaled(now, desired > current, behavior.down_window)
        return Decision(pool, current, desired, action, reason, pressure=pressure, **note)  # type: ignore[arg-type]

    down_window = max(behavior.down_window, memory.down_window)
    horizon = 2 * max(behavior.up_window, down_window) + 60
    starting = current - ready
    feedback = 0
    if breach:
        # While a scale-up is still loading the model, the load it was meant for is measured
        # on the ready replicas; asking again from the total would stack one step on another.
        base = replicas if starting > 0 else current
        feedback = max(base + (0 if starting > 0 else 1), math.ceil(base * min(pressure, 2.0)))
    wanted = max(feedback, need.replicas if need else 0)
    if wanted > current and current < policy.max_replicas:
        desired = min(policy.max_replicas, current + behavior.up_step, wanted)
        memory.remember(now, desired, horizon)
        if since < behavior.up_cooldown:
            return decision(current, "hold", f"in scale-up cooldown ({observed})")
        if not memory.held(now, behavior.up_window, at_least=current + 1):
            return decision(current, "hold", f"stabilizing scale-up ({observed})")
        if need is not None and need.replicas >= feedback:
            driver = f"load needs {need.replicas}: {need.why} ({observed})"
        elif latency_counts and latency >= pressure:
            driver = observed
        else:
            driver = f"load ahead of latency ({observed})"
        return decision(desired, "up", f"scale up: {driver}")
    if breach and starting > 0:
        memory.remember(now, current, horizon)
        return decision(current, "hold", f"waiting for {starting} starting replica(s) ({observed})")

    quiet = not breach and (not latency_counts or latency < DOWN_HEADROOM)
    if idle:
        recommendation = policy.min_replicas
    elif need is not None:
        recommendation = max(policy.min_replicas, need.replicas) if quiet else current
    else:
        # No load model: shrink only if one replica fewer would still meet the SLO.
        fewer = max(1, current - 1)
        after = pressure * current / fewer if current > 1 else pressure
        recommendation = current - 1 if after < DOWN_HEADROOM else current
    recommendation = max(policy.min_replicas, min(current, recommendation))
    memory.remember(now, recommendation, horizon)
    target = memory.window_max(now, down_window)
    if recommendation >= current:
        return decision(current, "hold", f"within SLO ({observed})")
    if since < behavior.down_cooldown:
        return decision(current, "hold", f"in scale-down cooldown ({observed})")
    if target is None or target >= current:
        return decision(current, "hold", f"stabilizing scale-down ({observed})")
    desired = max(target, current - behavior.down_step)
    sized = f"; load needs {need.replicas}: {need.why}" if need is not None and not idle else ""
    return decision(desired, "down", f"scale down: {observed}{sized}")


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
