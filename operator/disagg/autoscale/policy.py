"""The SLO autoscaling policy (pure: no I/O, the clock is an argument).

Each pool is sized on its own SLO: prefill against ``ttftP99``, decode against ``tpotP99``,
from two kinds of evidence. **Load** says how big the pool must be now
(:mod:`disagg.autoscale.load` and :mod:`disagg.autoscale.sizing`: prefill from arrivals
and the engines' own prefill times through Erlang C; decode from running sequences and what
one replica holds), with headroom for where the demand's trend leads over one provisioning
delay (a decode pool's: its arrivals', and while it meets its SLO with no queue, the output
tokens generated per request). **Latency** (TTFT p99, inter-token p99) and load gauges
(waiting requests, KV-cache usage, running requests) catch what the load model misses, and
drive alone where there is no load estimate yet. The inputs are in :mod:`disagg.autoscale.model`,
what the policy remembers in :mod:`disagg.autoscale.memory`. The rules, each covered by a test:

* **hold** when metrics are missing, stale, NaN, or come from fewer pods than are ready
  (no data is never read as idle), or are values no engine reports (negative, infinite, a
  KV-cache usage over 1: :mod:`disagg.autoscale.inputs`);
* scale **up** fast: as soon as the pool breaches (beyond a tolerance band sized from the
  histogram bucket that holds the SLO, so interpolation noise at a bucket edge cannot flap),
  by up to ``scaleUp.maxStep`` replicas, after ``scaleUp.cooldown``; while replicas of an
  earlier scale-up are still starting, only if the ready replicas' load needs more than that
  (a decode pool orders none when the replicas ordered drain the backlog they will find
  before one ordered now would serve), and just after any arrive not for a backlog draining
  into them nor for what the queue grew by on the smaller pool before them; a decode
  pool's waiting requests that its free KV cache and sequence slots hold are passing
  through (their KV still arriving), not a backlog; a decode pool whose sequences start
  living longer (outputs getting longer: the lifetime up by half and the count rising, two
  evaluations running, by three standard deviations, while the rate holds, no queue yet)
  orders one replica as soon as that pace would outgrow it within one provisioning delay,
  before its KV cache fills; a saturated decode pool's sequences are counted as they live on
  a pool sized for them, whose steps are faster (its step line at the most a replica holds);
* scale **down** in proportion, to the largest size recommended during the whole
  ``scaleDown.stabilizationWindow`` (longer, up to 4x, once a scale-down of either pool
  was undone within 5 minutes: bursts that come back are learned, and every request passes
  through both pools: :func:`~disagg.autoscale.look_back.share_look_back`; 3x from a scale-up
  for a surge, arrivals up by half from one provisioning delay to the next (also one a
  prefill pool absorbs within its SLO on steady traffic: it holds its size), or from a
  burst's end, the requests reaching a decode pool down by a third, far beyond their noise,
  and the sequences it holds down too: a burst may come back before a flap could teach it;
  halved after an hour with none of these), not while arrivals rise over both of the last
  two provisioning delays (what it would shed comes back within one), leaving out what only a
  backlog asked for (it is drained once) and what a p99 over the SLO measured before the
  replicas that just arrived served would keep, at most ``scaleDown.maxStep``
  at a time, after ``scaleDown.cooldown``, only while latency holds 20% under the SLO and to a
  size the load fills to at most 80% that would still meet the SLO were the load one estimate
  error above what it reads (a size it only just fits is one the next fluctuation scales
  back up); without a load estimate, only when one replica fewer would still meet the
  SLO; an idle pool (no requests at all) goes down to its minimum, on the spec's look-back
  once it has been idle that long (traffic stopped: bursts have traffic between them);
* **unreachable**: prompts whose prefill alone exceeds the TTFT SLO (or a decode step that
  misses TPOT with almost nothing batched) miss at any size; they do not drive scaling, and
  the decision says which share of requests it is and which TP degree would serve them; a
  TTFT p99 no more than 10% over the prompts' own prefill at the 99th percentile (as the
  prefill-time histogram reads it, or as the TTFT histogram's own buckets would) is not
  the pool's doing either, and neither scales it up nor keeps it from shrinking;
* respect min/max and the model's GPU budget; when the budget binds, the pool whose SLO is
  worse gets the GPUs first, and the decision says it was limited
  (:mod:`disagg.autoscale.combine`, with the colocated pool's size from both phases).

What persists across restarts lives in status: the last scale time, and the whole
:class:`PoolMemory` (:mod:`disagg.autoscale.recall`), so a restarted operator decides as the
one before it would have. Lost, a restart ten minutes into a burst had let the look-back it
learned go, and the pool shrank before the burst came back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final, Literal

from disagg.autoscale.decode import in_transit
from disagg.autoscale.gauges import loudest, read_gauges
from disagg.autoscale.inputs import accepted, unusable
from disagg.autoscale.latency import MIN_TOLERANCE, surely_over, surely_under, tolerance
from disagg.autoscale.load import feed_forward, learn, pool_demand
from disagg.autoscale.look_back import read_look_back, share_look_back
from disagg.autoscale.memory import PoolMemory
from disagg.autoscale.model import Behavior, PoolName, PoolPolicy, ScaledPool, Signals
from disagg.autoscale.reach import UNREACHABLE_MARK, intrinsic_p99, reachable_quantile, unreachable
from disagg.autoscale.sizing import DOWN_HEADROOM, quantile
from disagg.autoscale.trend import trend
from disagg.perf.buckets import LATENCY_BUCKETS

__all__ = [
    "INVALID_MARK",
    "UNREACHABLE_MARK",
    "Action",
    "Behavior",
    "Decision",
    "PoolMemory",
    "PoolName",
    "PoolPolicy",
    "ScaledPool",
    "Signals",
    "decide_pool",
    "share_look_back",
    "tolerance",
]

Action = Literal["up", "down", "hold"]

INVALID_MARK: Final = "metrics invalid"
"""How a hold on values no engine reports begins: status and Events tell it by this."""
UNREACHABLE_P99: Final = 0.01
"""At 1% they alone put the p99 over the SLO: latency stops driving that pool."""


@dataclass(frozen=True)
class Decision:
    """What to do with one pool, and why (the reason lands in status and an Event)."""

    pool: ScaledPool
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
    invalid: str | None = None
    """Which signal held the pool because no engine reports such a value, when one did."""
    counted: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The requests this evaluation counted against the pool's SLO, and of those how many
    surely and at most missed it (its error budget: :mod:`disagg.autoscale.budget`)."""


def _hold(pool: PoolName, current: int, reason: str) -> Decision:
    return Decision(pool, current, current, "hold", reason)


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
    if signals is not None:
        signals, wrong = accepted(signals)
        if wrong is not None:
            reason = f"holding: {INVALID_MARK}: {wrong}"
            return Decision(pool, current, current, "hold", reason, invalid=wrong)
    problem = unusable(signals, ready, now, behavior.stale_after)
    if problem is not None or signals is None:
        return _hold(pool, current, f"holding: {problem}")
    counted = memory.count_outcomes(
        signals.slo_buckets, policy.slo, behavior.window, behavior.slo_window, now
    )
    label = "TTFT" if pool == "prefill" else "TPOT"
    buckets = policy.latency_buckets or LATENCY_BUCKETS["vllm"][pool]
    band = tolerance(policy.slo, buckets)
    idle = signals.request_rate == 0 and not signals.queue and not signals.running
    latency = 0.0 if idle or signals.p99 is None else signals.p99 / policy.slo
    since = math.inf if last_scale is None else now - last_scale
    growing = memory.queue_growth(
        signals.sampled_at, signals.queue, behavior.window, signals.running
    )
    memory.track(
        now, pool_demand(pool, signals, growing, memory.window_queue_change), current, ready
    )
    if pool == "decode":
        memory.note_lifetime(signals.sampled_at, signals.running, signals.request_rate)
    learn(pool, signals, current, ready, since, policy, behavior, memory, band)
    arrived = memory.arrived(signals.request_rate or 0.0, growing)
    memory.note_arrivals(now, arrived, behavior.window, signals.generation_tokens_rate)
    look_back = read_look_back(pool, memory, behavior, now)
    if memory.ready_at == now:
        # Replicas that arrived since the last evaluation: the queue grew on the smaller pool
        # before them, which says nothing of what the pool now serves; the next evaluation
        # measures that (ordering on it ordered for a backlog the new replicas drain first).
        growing = 0.0
    # Per-replica load is measured on the replicas that serve: starting ones carry none yet.
    replicas = max(1, min(current, ready))
    # For one window after a scale-up's replicas arrive, the p99 still describes the smaller
    # pool, and the backlog it left drains: scaling again on them would scale twice for one
    # load (a backlog that still grows counts).
    fresh = memory.arrived_within(now, behavior.window)
    need = (
        None
        if idle
        else feed_forward(pool, signals, policy, memory, growing, ready, current, behavior.window)
    )
    if need is not None and fresh and memory.queue_change < 0 and need.replicas > current:
        # Just after a scale-up's replicas arrive, a shrinking queue is the backlog they
        # drain: the pool serves (and holds) more than arrives, and sizing on that would
        # scale twice for one load.
        need = replace(need, replicas=current)
    passing = pool == "decode" and in_transit(signals, ready, policy.max_num_seqs)
    queue_counts = not (fresh and growing <= 0) and not passing
    queue_gauge, named = read_gauges(pool, signals, policy, need, replicas, queue_counts)
    gauges = [value for value, _ in named]
    slow = None if idle else unreachable(pool, signals, ready, policy, memory, band)
    # Prompts that miss at any size put the p99 over the SLO on their own, but the TTFT
    # histogram still says how long the others wait: read it where their p99 lies (unread,
    # wait budgets read less cautiously had left a 70B pool of two at a 15 s p99 for 16
    # minutes on a 3 s SLO).
    read_at = (
        reachable_quantile(slow[0])
        if slow is not None and slow[0] >= UNREACHABLE_P99 and signals.ttft_buckets
        else None
    )
    if read_at is not None:
        signals = replace(signals, p99=quantile(signals.ttft_buckets, read_at))
        latency = 0.0 if signals.p99 is None else signals.p99 / policy.slo
    named_q = "p99" if read_at is None else f"p{read_at * 100:.3g}"
    # A p99 says nothing about the pool's size when requests that miss at any size are 1% of
    # the traffic (they alone put it there), or when it is no more than the slowest prompts'
    # own prefill (a few just under the SLO hold it there at any size); and over the SLO it
    # describes the past just after new replicas arrived (fresh: even inside its tolerance,
    # where a hold kept the smaller pool's verdict in the look-back as the size to keep), or
    # beyond its tolerance while a backlog drains under a load estimate (inside it, the
    # p99 is the pool's own: counting it out there flapped a diurnal trace).
    # (Compared as the TTFT histogram reads both: in its coarser buckets one prompt of fifty
    # just over a second alone read as a p99 of 1.7 s, and a pool of two under a tenth busy
    # never counted as quiet enough to shrink.)
    q = read_at or 0.99
    intrinsic = intrinsic_p99(pool, signals, memory, q=q)
    as_read = intrinsic_p99(pool, signals, memory, read_in=buckets, q=q)
    inherent = (
        intrinsic is not None
        and signals.p99 is not None
        and signals.p99 <= max(intrinsic, as_read or 0.0) * (1 + MIN_TOLERANCE)
    )
    draining = need is not None and signals.queue is not None and growing <= 0
    physical = (slow is not None and slow[0] >= UNREACHABLE_P99 and read_at is None) or inherent
    stale = (fresh and latency > 1) or (draining and latency > 1 + band)
    latency_counts = not physical and not stale
    # The load estimate already holds the queue, the KV cache and the batch limits; the gauges
    # drive on their own only where there is no estimate (nothing learned yet), except a
    # queue that is long and still growing: work is arriving that the estimate has not seen
    # (longer prompts than the ones finished so far).
    covered = need is not None and need.backlog_covered
    queue_breach = growing > 0 and queue_gauge > 1 + MIN_TOLERANCE and not covered
    gauge_breach = queue_breach or (need is None and any(x > 1 + MIN_TOLERANCE for x in gauges))
    breach = (latency_counts and latency > 1 + band) or gauge_breach
    pressure = max([latency if latency_counts else 0.0, *gauges])
    observed = (
        "idle"
        if idle
        else f"{label} {named_q} {signals.p99 * 1000:.0f}ms vs SLO {policy.slo * 1000:.0f}ms"
        if signals.p99 is not None
        else "no latency yet"
    )
    if read_at is not None and slow is not None and not idle:
        observed += f", the p99 of the {1 - slow[0]:.0%} of prompts that can meet it"
    if inherent and intrinsic is not None and latency > DOWN_HEADROOM:
        observed += f", held there by the prompts' own prefill ({named_q} {intrinsic:.2f}s alone"
        if as_read and signals.p99 is not None and signals.p99 > intrinsic * (1 + MIN_TOLERANCE):
            observed += f", {as_read:.2f}s in the {label} histogram's buckets"
        observed += ")"
    share, why_unreachable = slow if slow else (0.0, None)
    # What a hold at this size says of the latency.
    if latency <= 1 or (latency_counts and not breach):
        held = "within SLO" if latency <= 1 else f"within the SLO's {band:.0%} tolerance"
    elif physical:
        held = "over the SLO, not for want of replicas"
    elif stale:
        held = (
            "over the SLO while the backlog drains"
            if draining
            else "over the SLO, measured before the new replicas served"
        )
    else:
        held = f"at the maximum of {current}"

    def decision(desired: int, action: Action, reason: str) -> Decision:
        if desired != current:
            memory.scaled(now, desired > current, behavior.down_window, look_back.surge is not None)
        # A burst may come back: say how long what it took is now held (the look-back
        # scaled() left, a flap's included).
        reason += look_back.news(
            memory, behavior.down_window, scaled_up=desired > current or absorbed
        )
        return Decision(
            pool, current, desired, action, reason, pressure=pressure,
            unreachable=why_unreachable, unreachable_share=share, counted=counted,
        )  # fmt: skip

    # What the scale-down look-back keeps: a backlog's share of a recommendation is not
    # load that comes back once it is drained.
    sustained = None if need is None else max(policy.min_replicas, need.sustained)
    within = ready == current and signals.p99 is not None and signals.p99 <= policy.slo
    absorbed = look_back.hold_absorbed(pool, memory, behavior, now, within_slo=within)
    down_window = max(behavior.down_window, memory.down_window)
    horizon = 2 * max(behavior.up_window, down_window) + 60
    # A pool idle for the spec's whole look-back has seen traffic stop, not a pause between
    # bursts (traffic goes on between them): the learned look-back waits for the next burst.
    idle_for = memory.idle_for(now, idle)
    if down_window > behavior.down_window and idle_for >= behavior.down_window:
        stopped = f"; idle {idle_for:.0f}s, so the spec's {behavior.down_window:.0f}s look-back"
        stopped += f" and not the learned {down_window:.0f}s"
        down_window = behavior.down_window
    else:
        stopped = ""
    starting = current - ready
    feedback = 0
    if breach:
        # While a scale-up is still loading the model, the load it was meant for is measured
        # on the ready replicas; asking again from the total would stack one step on another.
        base = replicas if starting > 0 else current
        certain = (
            surely_over(signals.p99, buckets) / policy.slo
            if latency_counts and signals.p99 is not None
            else 0.0
        )
        step = max([certain, *gauges])
        feedback = max(base + (0 if starting > 0 else 1), math.ceil(base * min(step, 2.0)))
    wanted = max(feedback, need.replicas if need else 0)
    if wanted > current and current < policy.max_replicas:
        desired = min(policy.max_replicas, current + behavior.up_step, wanted)
        memory.remember(now, desired, horizon, sustained)
        if since < behavior.up_cooldown:
            cooling = f"{since:.0f}s of {behavior.up_cooldown:.0f}s since the last resize"
            return decision(current, "hold", f"in scale-up cooldown, {cooling} ({observed})")
        if not memory.held(now, behavior.up_window, at_least=current + 1):
            return decision(current, "hold", f"stabilizing scale-up ({observed})")
        if need is not None and need.replicas >= feedback:
            driver = f"load needs {need.replicas}: {need.why} ({observed})"
        elif latency_counts and latency >= pressure:
            driver = observed
        else:
            driver = f"load ahead of latency: {loudest(named)} ({observed})"
        return decision(desired, "up", f"scale up: {driver}")
    if starting > 0 and (breach or latency > 1 + band):
        # Over the SLO, a p99 that no longer counts toward a scale-up still says the pool has
        # not served what it ordered: a starting replica cancelled on a saturated pool's load
        # estimate was ordered again minutes later.
        memory.remember(now, current, horizon, sustained)
        return decision(current, "hold", f"waiting for {starting} starting replica(s) ({observed})")

    # Under the SLO with room to spare: 20% by the p99 read, or surely 10% by its bucket when
    # the buckets cannot resolve 20%.
    roomy = latency < DOWN_HEADROOM or (
        signals.p99 is not None
        and surely_under(signals.p99, buckets) <= (1 - MIN_TOLERANCE) * policy.slo
    )
    quiet = not breach and (not latency_counts or roomy)
    if idle:
        recommendation = policy.min_replicas
    elif need is not None:
        recommendation = max(policy.min_replicas, need.replicas, need.keep) if quiet else current
    else:
        # No load model: shrink only if one replica fewer would still meet the SLO.
        fewer = max(1, current - 1)
        after = pressure * current / fewer if current > 1 else pressure
        recommendation = current - 1 if after < DOWN_HEADROOM else current
    if absorbed:
        recommendation = current
    recommendation = max(policy.min_replicas, min(current, recommendation))
    memory.remember(now, recommendation, horizon, sustained if quiet and not absorbed else None)
    peak = memory.window_peak(now, down_window)
    kept_for = need.kept_for if need is not None and quiet else ""
    if recommendation >= current:
        return decision(current, "hold", f"{held} ({observed}){kept_for}")
    rise = trend(memory.arrivals, memory.provisioning)
    if rise > 1 and not idle:
        # What a scale-down would shed now arrives again within one provisioning delay.
        more = f"{rise - 1:.1%}" if rise >= 1.001 else "under 0.1%"
        return decision(current, "hold", f"{held} ({observed}); arrivals rising: {more} more "
                        f"within {memory.provisioning:.0f}s, not scaling down")  # fmt: skip
    if since < behavior.down_cooldown:
        cooling = f"{since:.0f}s of {behavior.down_cooldown:.0f}s since the last resize"
        return decision(current, "hold", f"in scale-down cooldown, {cooling} ({observed})")
    if peak is None or peak[0] >= current:
        learned = down_window > behavior.down_window
        why = f" over a learned {down_window:.0f}s" if learned else ""
        if peak is None:
            seen = now - memory.recommendations[0][0] if memory.recommendations else 0.0
            why += f": {seen:.0f}s of the {down_window:.0f}s look-back seen"
        else:
            held_for = "" if learned else f" (look-back {down_window:.0f}s)"
            why += f": {peak[0]} recommended {now - peak[1]:.0f}s ago{held_for}"
            why += f", {recommendation} now"
        return decision(current, "hold", f"stabilizing scale-down{why} ({observed})")
    desired = max(peak[0], recommendation, current - behavior.down_step)
    sized = f"; load needs {need.replicas}: {need.why}{kept_for}" if need and not idle else ""
    return decision(desired, "down", f"scale down: {observed}{sized}{stopped}")
