"""Feed-forward pool sizing from load (pure): how many replicas the observed load needs.

Latency tells the autoscaler that a pool was too small a window ago; load tells it how big
the pool must be now. Both pools are sized here from what their engines report:

* **prefill** is a queue in front of ``n`` servers. A replica's speed in prompt tokens per
  second is learned (:func:`learn_prefill_speed`) from the engines' own counters: a prompt
  alone takes ``prompt / speed`` (its prefill-phase time, vLLM's
  ``request_prefill_time_seconds``, when nothing is batched with it) and a saturated replica
  serves ``speed`` tokens per second. The mean prompt over that speed is the service time
  ``s``; arrivals ``λ`` (plus the backlog, drained over a minute, as the replicas ordered now
  will find it: :func:`disagg.autoscale.load.coming_backlog`) give the offered load
  ``a = λ·s`` in Erlangs. Erlang C gives the probability that a prompt waits longer than what
  the TTFT SLO leaves after its own prefill (per bucket of the prefill-time histogram: a
  short prompt may wait almost the whole SLO, one near it hardly at all); the pool is the
  fewest replicas that keep that share under the target. Prompts batched together read slow
  alone while a replica is busy but not saturated, so that speed is cautious (a fifth to two
  fifths under what a busy replica computes on chat prompts in the simulator): a pool
  shrinks no further than it allows. With the engines' step budget known, a second reading
  counts what batching adds, and replicas are ordered on it.
* **decode** holds sequences. Little's law makes the running sequences plus what the queue
  adds (its growth and its backlog drained over a minute, each held one sequence lifetime)
  the demand; a replica holds ``batch`` of them while its step still meets the TPOT SLO. That
  batch is learned online (:func:`learn_batch`): lowered to what a replica held when TPOT
  broke, raised to what it held while TPOT met the SLO with margin.
* **headroom**: demand (arrivals for prefill, sequences for decode) is multiplied by where
  its rise over the last two provisioning delays (a rise seen in both: a step is not a
  trend: :mod:`disagg.autoscale.trend`) leads one delay from now (so the replicas ordered
  now are enough when they arrive)
  and by the uncertainty of the estimate itself: Poisson in the request count and, for prompt
  tokens, compound Poisson (a few long prompts among many short ones move the tokens per
  second more than the request rate; :func:`spread` reads their spread from the prefill-time
  histogram). Surprise bursts are not predicted; the
  policy learns their return instead (see the scale-down look-back in
  :mod:`disagg.autoscale.policy`).
* **unreachable**: a prompt whose prefill alone exceeds the TTFT SLO misses it at any pool
  size; :func:`share_above` measures that share from the prefill-time histogram and
  :func:`tp_to_meet` names the tensor-parallel degree that would serve it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from disagg.autoscale.trend import fit_line, trend

Buckets = Sequence[tuple[float, float]]
"""A cumulative histogram: (upper bound, observations at or below it), bounds ascending."""
Budgets = Sequence[tuple[float, float]]
"""(share of prompts, seconds they may wait) pairs."""

WAIT_TARGET: Final = 0.01
"""Share of prompts allowed to wait past their TTFT budget: the 1% a p99 SLO allows. The
router sends each prompt to the prefill engine with the fewest prompt tokens in flight,
the central queue M/M/n assumes. Where prompts are sent by requests in flight (SGLang's
pairs; the simulator's two random choices or fewest requests), they wait behind long ones
M/M/n does not see, yet half the target there bought about 0.1 point for 5-8% more
GPU-hours and two or three more flaps at one minute of provisioning: not kept apart."""
STRADDLE_SLICES: Final = 4
"""The prompts of the bucket that holds the TTFT SLO are counted in this many slices of its
part under the SLO, each at its slice's top: read as spread evenly over the bucket, as the
share under the SLO is, not all at the SLO with no budget at all."""
DRAIN_SECONDS: Final = 60.0
"""A backlog counts as extra arrivals spread over this long."""
DOWN_HEADROOM: Final = 0.8
"""A pool shrinks only to a size its demand fills to at most 80%: a size the load only just
fits is one the next fluctuation scales back up (a flap)."""


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in an M/M/``servers`` queue offered ``load`` Erlangs."""
    if load <= 0:
        return 0.0
    if servers <= load:
        return 1.0
    blocking = 1.0  # Erlang B by its recurrence: stable for any number of servers
    for k in range(1, servers + 1):
        blocking = load * blocking / (k + load * blocking)
    rho = load / servers
    return blocking / (1 - rho + rho * blocking)


def late_share(servers: int, load: float, service: float, budgets: Budgets) -> float:
    """Share of prompts that wait longer than their own budget (M/M/n:
    P(W > t) = C(n, a)·exp(-(n - a)·t / s)), over a mix of (share, budget) pairs."""
    waits = erlang_c(servers, load)
    if waits <= 0:
        return 0.0
    return sum(
        share * waits * math.exp(-(servers - load) * max(0.0, budget) / service)
        for share, budget in budgets
    )


def prefill_replicas(
    arrival_rate: float,
    service: float,
    budgets: Budgets,
    limit: int = 1000,
    reachable: float | None = None,
) -> int:
    """Fewest replicas for which at most WAIT_TARGET of the prompts (that can meet the SLO
    at all) wait past what the SLO leaves them."""
    load = arrival_rate * service
    if load <= 0:
        return 0
    if not load < limit:  # more work than the limit serves (or a rate read as nothing)
        return limit
    if reachable is None:
        reachable = sum(share for share, _ in budgets) or 1.0
    n = max(1, math.floor(load) + 1)
    while n < limit:
        if late_share(n, load, service, budgets) <= WAIT_TARGET * reachable:
            return n
        n += 1
    return limit


def decode_replicas(sequences: float, batch: float) -> int:
    """Replicas that hold ``sequences`` at ``batch`` each."""
    if sequences <= 0 or batch <= 0:
        return 0
    replicas = sequences / batch
    return math.ceil(replicas - 1e-9) if replicas < 1e9 else 10**9


def share_above(buckets: Buckets, threshold: float) -> float:
    """Share of observations above ``threshold``, interpolating inside its bucket as
    histogram_quantile does."""
    if not buckets or buckets[-1][1] <= 0:
        return 0.0
    total = buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if threshold <= bound:
            if math.isinf(bound):
                below = lower_count
            else:
                width = bound - lower_bound
                fraction = (threshold - lower_bound) / width if width > 0 else 1.0
                below = lower_count + fraction * (count - lower_count)
            return max(0.0, 1 - below / total)
        lower_bound, lower_count = bound, count
    return 0.0


def rebucket(buckets: Buckets, bounds: Sequence[float]) -> Buckets:
    """The same observations counted in other buckets (spread evenly inside each of their
    own, as histogram_quantile assumes): what a histogram with ``bounds`` would hold."""
    if not buckets or buckets[-1][1] <= 0:
        return ()
    total = buckets[-1][1]
    counted = [(b, total * (1 - share_above(buckets, b))) for b in bounds if not math.isinf(b)]
    return (*counted, (math.inf, total))


def quantile(buckets: Buckets, q: float) -> float | None:
    """The q-quantile of a cumulative histogram (histogram_quantile's interpolation); the
    highest finite bound when it falls in the +Inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def wait_budgets(slo: float, buckets: Buckets, mean_service: float) -> list[tuple[float, float]]:
    """(share of prompts, seconds the TTFT SLO leaves them to wait) per bucket of the
    prefill-time histogram, counting each bucket at its slowest (the one that holds the SLO
    in STRADDLE_SLICES slices); prompts whose prefill alone exceeds the SLO are left out
    (they miss at any size). Without a histogram: every prompt
    at twice the mean."""
    if not buckets or buckets[-1][1] <= 0:
        return [(1.0, max(0.0, slo - 2 * mean_service))]
    total = buckets[-1][1]
    budgets, lower_bound, lower_count = [], 0.0, 0.0
    for bound, count in buckets:
        if bound <= slo:
            tops = [bound]
        else:
            width = slo - lower_bound
            tops = [lower_bound + width * (k + 1) / STRADDLE_SLICES for k in range(STRADDLE_SLICES)]
        below = lower_count / total
        for top in tops:
            reached = 1 - share_above(buckets, top)
            if reached > below:
                budgets.append((reached - below, slo - top))
            below = max(below, reached)
        if bound >= slo:
            break
        lower_bound, lower_count = bound, count
    return budgets


def noise(events: float, spread: float = 0.0) -> float:
    """Headroom for the rate estimate itself: one based on ``events`` arrivals is off by about
    1/sqrt(events) (Poisson); work summed over them (prompt tokens), whose sizes have squared
    coefficient of variation ``spread``, by sqrt(1 + spread) times that (compound Poisson)."""
    return 1 + math.sqrt((1 + spread) / max(1.0, events))


def spread(buckets: Buckets) -> float:
    """Squared coefficient of variation of the observations in a cumulative histogram, each
    counted at its bucket's midpoint (the +Inf bucket's at the last finite bound); 0 without
    observations."""
    if not buckets or buckets[-1][1] <= 0:
        return 0.0
    total, first, second = 0.0, 0.0, 0.0
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        point = lower_bound if math.isinf(bound) else (lower_bound + bound) / 2
        weight = count - lower_count
        total, first, second = total + weight, first + weight * point, second + weight * point**2
        if not math.isinf(bound):
            lower_bound = bound
        lower_count = count
    mean = first / total
    return max(0.0, second / total / mean**2 - 1) if mean > 0 else 0.0


def headroom(
    demand: Sequence[tuple[float, float]], delay: float, events: float, sizes: float = 0.0
) -> float:
    """How much more demand to provision for than is seen now: where its rise leads one
    provisioning delay ahead, times the rate estimate's own uncertainty (``sizes``: the
    squared coefficient of variation of each request's work)."""
    return trend(demand, delay) * noise(events, sizes)


SPEED_DECAY: Final = 0.995
"""Per evaluation: a speed seen once fades slowly, so a change of prompt mix is followed."""
BUSY_SHARE: Final = 0.5
"""Above this share of its learned speed a replica batches most prompts with others, so the
alone reading is slowed by them (10% at the peak of the diurnal chat scenario): it may
raise the learned speed, but does not wear it down."""


def learn_prefill_speed(
    learned: float | None,
    prompt_tokens_rate: float | None,
    request_rate: float | None,
    prefill_seconds: float | None,
    ready: int,
    step_tokens: float | None = None,
) -> float | None:
    """Prompt tokens per second one prefill replica computes.

    Both observations underestimate it, from opposite ends: the mean prompt over the mean
    prefill time is exact for prompts computed alone (batched ones look slower), and the
    tokens served per replica are exact when the pool is saturated (idle time looks slower).
    So the larger is the better estimate, and the best seen recently is kept. It fades only
    while the pool is not busy (BUSY_SHARE): under load every reading is low, and letting
    them wear the speed down would scale the pool up for the batching its load causes.

    With the engines' token budget per step (``step_tokens``) a third reading closes the gap
    between the two. An engine step runs the prompts already started first and fills what
    is left of the budget with waiting ones (vLLM v1's scheduler), so a prompt's prefill
    time stretches by what the others take of the room it leaves in its steps. The reading
    is the alone one plus the tokens served per replica times that room (1 - prompt /
    budget): all of them for short prompts (which batch, so a busy replica computes more
    than one prompt alone shows), none for prompts that fill their steps (chunked, they are
    not slowed by the others). Pass it only while the pool's size has been settled over the
    rate window: just after a scale-down the tokens per replica read high.
    """
    if not prompt_tokens_rate or not request_rate or not prefill_seconds or ready < 1:
        return learned
    mean_prompt = prompt_tokens_rate / request_rate
    alone = mean_prompt / prefill_seconds
    per_replica = prompt_tokens_rate / ready
    observed = max(alone, per_replica)
    if step_tokens:
        observed = max(observed, alone + per_replica * max(0.0, 1 - mean_prompt / step_tokens))
    if learned is None:
        return observed
    busy = per_replica > BUSY_SHARE * learned
    return max(observed, learned if busy else SPEED_DECAY * learned)


def learn_batch(
    learned: float | None, per_replica: float, p99: float, slo: float, band: float
) -> float | None:
    """Sequences a decode replica holds at the TPOT SLO, updated from one clean observation."""
    if per_replica <= 0:
        return learned
    if p99 > slo * (1 + band):
        knee = 0.9 * per_replica
        return knee if learned is None else min(learned, knee)
    if p99 < 0.7 * slo and learned is not None and per_replica > learned:
        return per_replica
    return learned


STEP_SPREAD: Final = 1.5
"""The step line is fitted only to batches spread this wide (the largest over the smallest):
over a narrow range its slope is the latency's noise."""


def step_line(samples: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(seconds a decode step takes with nothing batched, seconds each sequence per replica
    adds): the least-squares line of (sequences per replica, TPOT) samples. None without
    STEP_SPREAD between the batches, or for a line that does not rise from above zero."""
    if len(samples) < 2:
        return None
    low, high = min(b for b, _ in samples), max(b for b, _ in samples)
    if low <= 0 or high < STEP_SPREAD * low:
        return None
    line = fit_line(samples)
    if line is None:
        return None
    per_sequence, mean_step, mean_batch = line
    base = mean_step - per_sequence * mean_batch
    if per_sequence <= 0 or base <= 0:
        return None
    return base, per_sequence


def consolidated(sequences: float, replicas: int, fewer: int, line: tuple[float, float]) -> float:
    """Sequences a decode pool holding ``sequences`` on ``replicas`` holds on ``fewer``.

    Each sequence lives as many steps as it has tokens to produce (Little's law: the count is
    arrivals times lifetime), and a step on a replica that batches more is slower by the
    line's slope: the count solves held = sequences x step(held / fewer) / step(now). Infinite
    when no count solves it (every sequence added slows the rest enough to add another)."""
    base, per_sequence = line
    step_now = base + per_sequence * sequences / replicas
    room = step_now - per_sequence * sequences / fewer
    return sequences * base / room if room > 0 else math.inf


def tp_to_meet(tp: int, seconds: float, slo: float) -> int:
    """The smallest power-of-two multiple of ``tp`` whose time (assumed to fall in proportion
    to the TP degree: an optimistic bound) meets ``slo`` with 10% margin."""
    factor = 1
    while seconds / factor > 0.9 * slo and factor < 64:
        factor *= 2
    return tp * factor
