"""What a pool's load asks of it (pure): the feed-forward replica count, the requests no
size can serve, and what the policy learns from each observation.

The arithmetic lives in :mod:`disagg.autoscale.sizing`; this module reads a pool's
:class:`~disagg.autoscale.model.Signals` into it and says, in words a user can check, which
numbers it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from disagg.autoscale import sizing
from disagg.autoscale.decode import (
    decode_batch,
    decode_keep,
    decode_sequences,
    drains_in_time,
    lengthening,
    saturated_speedup,
    sized_step,
)
from disagg.autoscale.memory import PoolMemory
from disagg.autoscale.model import Behavior, PoolName, PoolPolicy, Signals
from disagg.autoscale.reach import LONE_SEQUENCES, prefill_alone
from disagg.autoscale.sizing import DOWN_HEADROOM
from disagg.autoscale.trend import trend

BATCHED_MIX: Final = 1.5
"""A batched prefill speed orders replicas only for prompts at most this much longer, on
the mean, than those it was read on (a wave of long prompts batches less)."""


@dataclass(frozen=True)
class Need:
    """What the load alone asks of a pool, and the numbers that say so."""

    replicas: int
    why: str
    keep: int = 0
    """The fewest replicas a scale-down may leave: the demand fills them to at most
    DOWN_HEADROOM (and prefill still meets the wait target)."""
    sustained: int = 0
    """``keep`` for what arrives, without the backlog: a backlog is drained once, it is not
    load that comes back, so the scale-down look-back remembers this."""
    drain_per_request: float | None = None
    """Prefill: seconds of one replica's time a waiting prompt costs."""
    wait_budget: float | None = None
    """Prefill: seconds the TTFT SLO leaves a prompt for waiting."""
    backlog_covered: bool = False
    """Decode: the replicas already starting drain the backlog before a replica ordered now
    would serve, so a growing queue asks for nothing more."""
    kept_for: str = ""
    """Decode: why ``keep`` is more than the demand's count alone asks (a smaller pool's
    slower steps), for the messages of a hold or a smaller scale-down."""


def prefill_floor(
    arrival_rate: float, service: float, budgets: sizing.Budgets, limit: int, events: float,
    spread: float,
) -> int:  # fmt: skip
    """The fewest prefill replicas a scale-down may leave for these arrivals: kept busy at
    most DOWN_HEADROOM of the time, and meeting the wait target were the load, and each
    budget's share of prompts, one estimate error above what it reads. Read from ``events``
    prompts whose sizes have squared coefficient of variation ``spread``, the count is off
    by about 1/sqrt(events) and their mean size by sqrt(spread/events); the mean size sets
    how long each prompt waits behind another as well as the load, so its error is taken on
    the service time, not the rate (a window that happened to see short prompts had shrunk a
    pool the next one grew back)."""
    longer = one_error_longer(service, events, spread)
    erlangs = arrival_rate * longer
    busy = math.ceil(erlangs / DOWN_HEADROOM - 1e-9) if erlangs > 0 else 0
    arrivals = arrival_rate * sizing.noise(events)
    reachable = sum(share for share, _ in budgets) or 1.0
    uncertain = one_error_more(budgets, events)
    return max(sizing.prefill_replicas(arrivals, longer, uncertain, limit, reachable), busy)


def one_error_more(budgets: sizing.Budgets, events: float) -> sizing.Budgets:
    """Each budget's share of prompts one error higher: read from ``events`` prompts, a share
    ``s`` is off by about sqrt(s/events) (Poisson in the count). The few prompts with next
    to no budget decide the wait target, and a minute sees one or two of them, or seven: on
    bimodal 70B traffic (8% of prompts of 15-28k tokens) a minute that saw one had shrunk a
    pool that the next minute's seven grew back."""
    counted = max(1.0, events)
    return [(share + math.sqrt(share / counted), budget) for share, budget in budgets]


def one_error_longer(service: float, events: float, spread: float) -> float:
    """A prompt's service time with one error of the mean prompt size read from ``events``
    prompts whose sizes have squared coefficient of variation ``spread``."""
    return service * (1 + math.sqrt(spread / max(1.0, events)))


def one_fewer(
    fewer: int, arrival_rate: float, prompt: float, speeds: tuple[float, float],
    budgets: sizing.Budgets, events: float, spread: float,
) -> str:  # fmt: skip
    """What ``fewer`` prefill replicas would face, in the terms of the rules that keep them
    (``speeds``: the cautious one prefill_floor keeps a pool on, and what a busy replica
    computes, which orders): for a hold that would otherwise say only that the pool is
    within its SLO. Empty when neither binds."""
    cautious, busy_speed = speeds
    longer = one_error_longer(prompt / cautious, events, spread)
    said = []
    busy = arrival_rate * longer / fewer
    if busy > DOWN_HEADROOM:
        said.append(f"{busy:.0%} busy at {cautious:.0f} tokens/s (at most {DOWN_HEADROOM:.0%})")
    reachable = sum(share for share, _ in budgets) or 1.0
    waits = (
        (
            arrival_rate * prompt / busy_speed, prompt / busy_speed, budgets,
            f"at {busy_speed:.0f} tokens/s",
        ),
        (
            arrival_rate * sizing.noise(events) * longer, longer,
            one_error_more(budgets, events), "with one estimate error more load",
        ),
    )  # fmt: skip
    for work, each, shares, how in waits:
        if work >= fewer:
            said.append(f"more work than {fewer} serve {how}")
            break
        late = sizing.late_share(fewer, work, each, shares) / reachable
        if late > sizing.WAIT_TARGET:
            said.append(
                f"{late * 100:.3g}% of prompts waiting past what the SLO leaves them {how} "
                f"(at most {sizing.WAIT_TARGET:.1%})"
            )
            break
    return f"; on {fewer}, {' and '.join(said)}" if said else ""


def feed_forward(
    pool: PoolName, signals: Signals, policy: PoolPolicy, memory: PoolMemory, growing: float,
    ready: int, ordered: int, behavior_window: float,
) -> Need | None:  # fmt: skip
    """Replicas the observed load needs with headroom (None when the load cannot be sized:
    no prefill times yet, or no decode batch learned or given). ``growing`` is how many
    waiting requests were added per second since the last evaluation; ``ordered`` counts
    the replicas ready and starting."""
    rate = signals.request_rate or 0.0
    # A prefill pool's demand is prompt tokens: long and short prompts make it noisier than
    # the request count (the prefill-time histogram gives their spread).
    sizes = sizing.spread(signals.prefill_buckets) if pool == "prefill" else 0.0
    events = rate * behavior_window
    # A decode pool's count is arrivals times lifetimes, and only arrivals make a trend: a
    # lifetime that rises (longer outputs, a saturated pool's slower steps, a backlog it
    # holds) stops rising on its own, and longer outputs have a rule of their own
    # (lengthening). Extrapolated, the count's rise after an output shift ordered a decode
    # replica that arrived after two had drained the backlog.
    rising = memory.demand if pool == "prefill" else memory.arrivals
    headroom = sizing.headroom(rising, memory.provisioning, events, sizes)
    meets = signals.p99 is not None and signals.p99 <= policy.slo
    output_trend = 1.0
    if pool == "decode" and not signals.queue and meets:
        # Outputs getting longer a little each minute at a steady rate: the running count
        # swings by a third from one look to the next and hid it; output tokens generated
        # per request arriving, counted over the window, is steady. Not while the pool
        # misses its SLO or a queue waits: after an output shift a saturated pool's tokens
        # per request climb for minutes, and their trend ordered replicas for a rise the
        # shift had already made.
        # Every slope counts here: outputs growing a few percent a minute, read only beyond
        # their noise, filled a replica's KV cache before the next one came (lengthening 42
        # in bench/other_traces.py: 100 -> 98.3%).
        output_trend = trend(memory.outputs, memory.provisioning, sigmas=0.0)
        headroom *= output_trend
    if pool == "prefill":
        speed = memory.prefill_speed
        if (
            speed is None
            or not rate
            or not signals.prefill_seconds
            or not signals.prompt_tokens_rate
        ):
            return None
        mean_prompt = signals.prompt_tokens_rate / rate
        service = mean_prompt / speed
        buckets = prefill_alone(signals, memory)
        # Engines count what they finished; under saturation arrivals also fill the queue.
        offered = (rate + growing) * headroom
        budgets = sizing.wait_budgets(policy.slo, buckets, service)
        typical = max(budgets, key=lambda b: b[0])[1] if budgets else 0.0
        backlog = coming_backlog(signals, growing, memory, service / max(1, ready), typical)
        arrivals = offered + backlog / sizing.DRAIN_SECONDS
        limit = policy.max_replicas + 1
        # Ordered on what a busy replica computes: a replica too few is ordered again on the
        # latency it leaves, a replica too many is held for a whole look-back.
        batched = speed
        learned_on = memory.batched_prompt
        if memory.batched_speed and learned_on and mean_prompt <= BATCHED_MIX * learned_on:
            batched = max(speed, memory.batched_speed)
        n = sizing.prefill_replicas(arrivals, mean_prompt / batched, budgets, limit)
        keep = prefill_floor(arrivals, service, budgets, limit, events, sizes)
        # While a backlog drains the engines finish more than arrives: what arrived over the
        # rate window is what they finished in it plus what the queue grew by in it.
        seen = max(0.0, rate + memory.window_queue_change) * headroom
        sustained = prefill_floor(seen, service, budgets, limit, events, sizes)
        waiting = f" + {signals.queue:.0f} waiting" if signals.queue else ""
        speeds = f"{speed:.0f}"
        if batched > speed:
            speeds = f"{batched:.0f} busy ({speed:.0f} to shrink)"
        why = (
            f"{rate + growing:.2f} req/s x {headroom:.2f} headroom{waiting}, "
            f"{mean_prompt:.0f}-token prompts at {speeds} tokens/s per replica, "
            f"most may wait {typical:.2f}s"
        )
        kept_for = ""
        if min(ordered, ready) > max(1, policy.min_replicas) and max(n, keep) >= ordered:
            kept_for = one_fewer(
                ordered - 1, arrivals, mean_prompt, (speed, batched), budgets, events, sizes
            )
        return Need(n, why, keep, sustained, service, typical, kept_for=kept_for)
    batch, bound = decode_batch(signals, policy, memory, ready)
    if batch is None or signals.running is None:
        return None  # sequences unknown: the gauges and latency decide
    # A saturated pool's lifetimes are those of its slow steps; the pool it orders steps faster.
    step = sized_step(memory, batch)
    faster = saturated_speedup(signals, step)
    sequences = decode_sequences(signals, growing, faster=faster) * headroom
    arriving = decode_sequences(signals, growing, backlog=False, faster=faster)
    slowed = ""
    if faster > 1 and step is not None and signals.tpot_mean:
        slowed = (
            f", living {faster:.2f}x shorter at a {step * 1000:.0f}ms step "
            f"than at the full pool's {signals.tpot_mean * 1000:.0f}ms"
        )
    steady = arriving * headroom
    outputs = ""
    if output_trend > 1.001:
        outputs = f", outputs {output_trend - 1:.1%} longer within {memory.provisioning:.0f}s"
    n = sizing.decode_replicas(sequences, batch)
    # Whether the backlog drains is a question about the coming minutes: the demand as it is
    # now holds the slots it drains into; where the trend leads is what ``steady`` sizes.
    present = arriving * sizing.noise(events)
    covered = ordered > ready and drains_in_time(signals, growing, memory, present, ordered * batch)
    detail = ""
    if covered and n > ordered:
        # A replica ordered now arrives after the ones already starting have drained the
        # backlog: it would serve nothing but the backlog, and find none.
        n = max(ordered, sizing.decode_replicas(steady, batch))
        detail = f"; the {ordered - ready} starting will drain the {signals.queue:.0f} waiting"
    longer = None if signals.queue or ordered > ready else lengthening(memory)
    if longer is not None and n <= ordered and longer[2] > ordered * batch:
        # Once the cache is full the queue rules take over, a minute or more after the
        # change: one replica ordered now arrives that much sooner.
        n = ordered + 1
        detail = (
            f"; sequences now live {longer[1]:.1f}s (from {longer[0]:.1f}s), "
            f"{longer[2]:.0f} of them within one provisioning delay at this pace"
        )
    line = sizing.step_line([(per_replica, step) for _, per_replica, step in memory.steps])
    keep, kept_for = decode_keep(sequences, batch, ready, line)
    return Need(
        n,
        f"{sequences:.0f} sequences (x {headroom:.2f} headroom{outputs}{slowed}) at "
        f"{batch:.0f} each "
        f"({bound}){detail}",
        keep,
        decode_keep(steady, batch, ready, line)[0],
        kept_for=kept_for,
        backlog_covered=covered,
    )


def coming_backlog(
    signals: Signals, growing: float, memory: PoolMemory, drain_per_request: float,
    wait_budget: float,
) -> float:  # fmt: skip
    """The backlog replicas ordered now will find: the queue and, once it is a backlog (it
    takes longer to drain than prompts may wait), what it grows by until they serve one
    provisioning delay from now (the pool is short by that much until then)."""
    queue = signals.queue or 0.0
    if queue * drain_per_request <= wait_budget:
        return queue
    horizon = memory.provisioning
    if memory.starting_since is not None:
        # Replicas already starting serve sooner, and stop the growth then if they suffice.
        horizon -= min(horizon, max(0.0, signals.sampled_at - memory.starting_since))
    return queue + growing * horizon


def learn(
    pool: PoolName, signals: Signals, current: int, ready: int, since: float,
    policy: PoolPolicy, behavior: Behavior, memory: PoolMemory, band: float,
) -> None:  # fmt: skip
    """Update the prefill speeds and the decode batch from what the pool served."""
    # Replicas that arrived within the window: its rates and means describe the smaller pool.
    arrived = memory.arrived_within(signals.sampled_at, behavior.window)
    settled = current == ready > 0 and since > behavior.window and not arrived
    if pool == "prefill":
        # The cautious speed (the better of alone and saturated) sizes what a pool keeps;
        # the batched one (counting what batching adds) sizes what it orders.
        tokens, rate = signals.prompt_tokens_rate, signals.request_rate
        observed = (tokens, rate, signals.prefill_seconds, ready)
        memory.prefill_speed = sizing.learn_prefill_speed(memory.prefill_speed, *observed)
        budget = policy.step_tokens if settled else None
        reading = sizing.learn_prefill_speed(None, *observed, budget)
        memory.batched_speed = sizing.learn_prefill_speed(memory.batched_speed, *observed, budget)
        if reading is not None and reading >= (memory.batched_speed or 0.0) and tokens and rate:
            memory.batched_prompt = tokens / rate
        return
    if pool != "decode" or not settled or signals.p99 is None or not signals.running:
        return
    lone = signals.running / ready <= LONE_SEQUENCES
    if lone and signals.p99 > policy.slo * (1 + band):
        return
    if not lone and signals.tpot_mean:
        memory.note_step(signals.sampled_at, signals.running / ready, signals.tpot_mean)
    memory.batch = sizing.learn_batch(
        memory.batch or policy.decode_batch, signals.running / ready, signals.p99, policy.slo, band
    )


def pool_demand(
    pool: PoolName, signals: Signals, growing: float, window_change: float
) -> float | None:
    """What a pool is asked for: prompt tokens per second reaching a prefill pool (its
    headroom trend follows them: a wave of long prompts moves them at a constant request
    rate), sequences a decode pool holds (its count's swing and a burst's end are read from
    them; its headroom trend follows arrivals). Prompts reaching the pool are those its
    engines finished over the rate window plus what the queue grew by in the same window
    (``window_change``, requests per second): the engines' count alone rises while a backlog
    drains, and a trend fitted to that would extrapolate the drain."""
    if pool == "decode":
        return None if signals.running is None else decode_sequences(signals, growing)
    rate, tokens = signals.request_rate, signals.prompt_tokens_rate
    if not rate or tokens is None:
        return rate
    return max(0.0, tokens * (1 + window_change / rate))
