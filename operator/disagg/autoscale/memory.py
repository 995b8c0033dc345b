"""What the SLO policy remembers of one pool between evaluations (pure data, no I/O).

:class:`PoolMemory` holds the recommendations the stabilization window reads, the demand and
arrivals history the headroom and surges are read from, the prefill speed and decode knee
learned from what the pool served, and the scale-down look-back learned from flaps, surges
and bursts' ends (and when it was last renewed). The model's status keeps it across operator
restarts (:mod:`disagg.autoscale.recall`): every field here is saved there, and a new field
must be too (``SERIES``, ``TIMES``, ``NUMBERS`` or ``LEARNED``; a test fails otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from disagg.autoscale.budget import Slot, counted, recorded
from disagg.autoscale.orders import arrivals, note_orders, take

FLAP_SECONDS: Final = 300.0
MAX_DOWN_WINDOW_FACTOR: Final = 4
HISTORY: Final = 1800.0
"""Seconds of demand history kept (the prefill headroom trend reads it)."""
LIFETIME_SAMPLES: Final = 3
"""Decode lifetimes kept: a rise over two evaluations in a row is a trend, one is noise."""
DEFAULT_PROVISIONING: Final = 120.0
SURGE_RATIO: Final = 1.5
"""Arrivals this many times what they were one to two provisioning delays before are a
surge: a burst, which may come back, not a trend the headroom follows."""
JUMP_SIGMAS: Final = 5
"""A jump in arrivals (a surge, a burst's end) counts only when the rate estimates' own noise
would make it less than once in a million readings: at one request per second, rates read
over a minute wander by half within minutes."""
SURGE_LOOK_BACK: Final = 3
"""A scale-up for a surge, or a burst's end, holds what the pool has this many configured
look-backs (a burst coming back a few minutes later finds it), without waiting for a flap to
learn it."""
STEADY_HISTORY: Final = 600.0
"""Arrivals are kept at least this long for the level a surge a pool absorbs is read
against: over two 2-minute delays, the dip while a chat wave's backlog sent short prompts
to decode was most of it, and arrivals coming back from it read as a burst."""
LOOK_BACK_MEMORY: Final = 3600.0
"""A learned look-back halves (down to the spec's) after this long with no flap, surge or
burst's end to renew it: bursts that stopped coming back stop holding replicas."""


@dataclass
class PoolMemory:
    """What one pool's policy remembers between evaluations."""

    recommendations: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, replicas, sustained): each recommendation, and the same without what only a
    backlog asked for. A backlog is drained once, it is not load that comes back, so the
    scale-down look-back reads the sustained one."""
    demand: list[tuple[float, float]] = field(default_factory=list)
    """(time, demand): prompt tokens/s reaching a prefill pool, whose rise over one
    provisioning delay sets its headroom; sequences held by a decode pool, whose swing tells
    a burst from longer outputs and whose fall a burst's end."""
    batch: float | None = None
    """Decode: sequences per replica at the TPOT SLO, learned from what the pool served."""
    prefill_speed: float | None = None
    """Prefill: prompt tokens per second one replica computes, learned from what it served
    (cautiously: the better of its prompts' times alone and what it serves; below what a
    busy replica computes when its prompts batch). What a pool keeps is sized on it."""
    batched_speed: float | None = None
    """Prefill: the same counting what batching adds, with the engines' step budget known
    (PoolPolicy.step_tokens): what a busy replica computes. What a pool orders is sized on it."""
    batched_prompt: float | None = None
    """Prefill: the mean prompt, in tokens, when the batched speed was last read: it says
    nothing of prompts much longer (they batch less, and attention costs more per token)."""
    provisioning: float = DEFAULT_PROVISIONING
    """How long the replicas that last became ready took, each from the first evaluation
    that saw it ordered."""
    orders: list[tuple[float, int]] = field(default_factory=list)
    """(time, replicas): when the replicas still starting were first seen ordered, oldest
    first."""
    starting_since: float | None = None
    """When the oldest replica still starting was first seen ordered (``orders[0]``)."""
    ready_at: float | None = None
    """When replicas last became ready: all of a scale-up's, or some while others still
    start (the pool's rates and p99 describe the smaller pool for a window after)."""
    ready_count: int | None = None
    """Replicas ready at the last evaluation (None before the first)."""
    wanted_count: int | None = None
    """Replicas the pool was set to at the last evaluation (None before the first): a rise
    is an order."""
    queues: list[tuple[float, float, float | None]] = field(default_factory=list)
    """(time, waiting requests, running ones) of each evaluation over the last rate window
    (and always the previous one): how fast the backlog grows."""
    queue_change: float = 0.0
    """Waiting requests per second since the previous evaluation, negative while a backlog
    drains."""
    window_queue_change: float = 0.0
    """Waiting requests per second over the rate window: the engines' finished requests
    (counted over the same window) plus this is what arrived in it."""
    window_held_change: float = 0.0
    """Requests waiting or running, per second, over the rate window (the queue's alone when
    a running count is missing): the engines' finished requests plus this is what arrived in
    it, also while a backlog drains into running sequences."""
    lifetimes: list[tuple[float, float, float]] = field(default_factory=list)
    """Decode: (time, running sequences, their lifetime in seconds: running over completions
    per second) of the last LIFETIME_SAMPLES evaluations; a lifetime that jumps is outputs
    growing longer before the KV cache shows it."""
    steps: list[tuple[float, float, float]] = field(default_factory=list)
    """Decode: (time, sequences per replica, mean TPOT) of the settled evaluations of the
    last HISTORY seconds: how much a step slows for each sequence batched, which says how
    much longer every sequence lives on a smaller pool. The mean, not the p99: a p99 read
    from histogram buckets sits near a bucket's bound, then jumps to the next."""
    last_down: float | None = None
    """When the pool was last scaled down."""
    last_up: float | None = None
    """When the pool was last scaled up: a flap's scale-up minus this is how long the load
    took to come back."""
    down_window: float = 0.0
    """The scale-down look-back learned from flaps, surges and bursts' ends: longer than the
    spec's when load that was scaled away came back within FLAP_SECONDS, when a scale-up was
    for a surge, or when arrivals fell as a burst ends."""
    learned_at: float | None = None
    """When a flap, surge or burst's end last lengthened or renewed the learned look-back, or
    an hour without them last halved it."""
    idle_since: float | None = None
    """When the pool last went idle (no request arriving, waiting or running); None while it
    serves."""
    outputs: list[tuple[float, float]] = field(default_factory=list)
    """Decode: (time, output tokens generated per request reaching the pool) over the same
    span as ``arrivals``: outputs getting longer a little each minute, which neither the
    arrivals' trend nor the count's jump (lengthening) sees."""
    arrivals: list[tuple[float, float]] = field(default_factory=list)
    """(time, requests per second reaching the pool) of the evaluations of the last two
    provisioning delays and one rate window: a jump between the delays is a surge, a rise
    over both a trend (no scale-down while it lasts; a decode pool's headroom)."""
    ledger: list[Slot] = field(default_factory=list)
    """(slot start, requests, surely missed, maybe missed) of the pool's SLO over its
    compliance window: its error budget (:mod:`disagg.autoscale.budget`)."""
    counted_at: float | None = None
    """When the ledger last counted requests."""

    shape: str | None = None
    """A digest of the spec that sets how fast the pool's engines are (model, engine, GPUs,
    TP, batching, flags, placement) when its speed and knee were learned."""

    def reshape(self, shape: str) -> bool:
        """Note the digest of the spec the pool's engines run. When it changed, what was
        learned of their speed goes (the prefill speeds, the decode knee and step line): a
        pool on another model, TP degree, GPU or engine is not as fast, and a speed read
        too high fades only while the pool is idle. The traffic's history and the learned
        look-back stay. True when it changed."""
        changed = self.shape is not None and self.shape != shape
        if changed:
            self.prefill_speed = self.batched_speed = self.batched_prompt = self.batch = None
            self.steps = []
        self.shape = shape
        return changed

    def count_outcomes(
        self,
        buckets: tuple[tuple[float, float], ...],
        slo: float,
        window: float,
        slo_window: float,
        now: float,
    ) -> tuple[float, float, float]:
        """Count the requests the SLO's histogram (bucket rates over ``window``) says were
        served since the last count, and those that surely and at most missed ``slo``, into
        the ledger; returns those counts."""
        since = None if self.counted_at is None else now - self.counted_at
        counts = counted(buckets, slo, since, window)
        self.ledger = recorded(self.ledger, now, counts, slo_window)
        self.counted_at = now
        return counts

    def remember(
        self, now: float, replicas: int, horizon: float, sustained: int | None = None
    ) -> None:
        """Note a recommendation, and what of it the load would sustain without a backlog."""
        kept = replicas if sustained is None else min(replicas, sustained)
        self.recommendations.append((now, replicas, kept))
        self.recommendations = [e for e in self.recommendations if now - e[0] <= horizon]

    def track(self, now: float, demand: float | None, current: int, ready: int) -> None:
        """Record the demand, when replicas become ready and how long starting replicas
        take to."""
        if demand is not None:
            self.demand.append((now, demand))
            self.demand = [(t, d) for t, d in self.demand if now - t <= HISTORY]
        if self.wanted_count is None and self.starting_since is not None:
            # Saved before orders were kept: what is starting was ordered then.
            self.orders = [(self.starting_since, max(1, current - ready))]
        note_orders(self.orders, self.wanted_count, current, ready, now)
        self.wanted_count = current
        # Replicas ordered apart arrive apart: from the first one's arrival the pool is
        # bigger, and for a window its rates and p99 still describe the smaller one.
        if self.ready_count is not None and ready > self.ready_count:
            self.ready_at = now
        self.ready_count = ready
        arrived = arrivals(self.orders, current, ready)
        if arrived:
            self.ready_at = now
            # One ready as soon as it is seen says only that it took under an interval.
            ordered_at = take(self.orders, arrived, oldest=True)
            if ordered_at is not None and ordered_at < now:
                self.provisioning = max(1.0, now - ordered_at)
        self.starting_since = self.orders[0][0] if self.orders else None

    def arrived_within(self, now: float, window: float) -> bool:
        """Whether replicas became ready within ``window`` of ``now``: the pool's rates and
        p99 still describe the smaller pool before them."""
        return self.ready_at is not None and now - self.ready_at < window

    def note_lifetime(self, now: float, running: float | None, rate: float | None) -> None:
        """Record how long a decode pool's sequences live (Little's law: running over
        completions per second); nothing without both."""
        self.lifetimes = [sample for sample in self.lifetimes if sample[0] < now]
        if running and rate:
            self.lifetimes.append((now, running, running / rate))
            del self.lifetimes[:-LIFETIME_SAMPLES]

    def note_step(self, now: float, per_replica: float, step: float) -> None:
        """Record a settled decode pool's mean TPOT at the sequences each replica holds."""
        self.steps = [sample for sample in self.steps if now - HISTORY < sample[0] < now]
        self.steps.append((now, per_replica, step))

    def queue_growth(
        self, now: float, queue: float | None, window: float, running: float | None = None
    ) -> float:
        """Waiting requests added per second since the previous evaluation (0 if shrinking;
        ``queue_change`` keeps the sign, ``window_queue_change`` the same over ``window``,
        ``window_held_change`` counts the ``running`` ones too)."""
        waiting = queue or 0.0
        previous = self.queues[-1] if self.queues else None
        if previous is None or now <= previous[0]:
            self.queue_change = 0.0
        else:
            self.queue_change = (waiting - previous[1]) / (now - previous[0])
        # A sample from the future is a clock that jumped back: measure from here on.
        self.queues = [sample for sample in self.queues if sample[0] < now]
        self.queues.append((now, waiting, running))
        # Keep the newest sample at least a window old: the change is measured from it (the
        # window is never shorter than an evaluation interval, so the previous one stays).
        while len(self.queues) > 1 and now - self.queues[1][0] >= window:
            self.queues.pop(0)
        start, oldest, ran = self.queues[0]
        span = now - start
        self.window_queue_change = (waiting - oldest) / span if span > 0 else 0.0
        self.window_held_change = self.window_queue_change
        if running is not None and ran is not None and span > 0:
            self.window_held_change += (running - ran) / span
        return max(0.0, self.queue_change)

    def arrived(self, finished: float, growing: float) -> float:
        """Requests per second that reached the pool: what its engines finished over the rate
        window plus how many more it holds (waiting or running) than at the window's start;
        while its queue grows, plus that growth now instead (a surge's first sign). A draining
        backlog's finishes had arrived before: counted again, the drain after an output shift
        read as a burst's end and held the replicas it took."""
        held = growing if growing > 0 else self.window_held_change
        return max(0.0, finished + held)

    def note_arrivals(
        self, now: float, rate: float, window: float, generated: float | None = None
    ) -> None:
        """Record the requests per second reaching the pool (read over a rate ``window``) and,
        for decode, the output tokens it ``generated`` per second over the same window."""
        oldest = now - 2 * self.provisioning - window
        kept = min(oldest, now - STEADY_HISTORY)
        self.arrivals = [sample for sample in self.arrivals if kept <= sample[0] < now]
        self.arrivals.append((now, rate))
        self.outputs = [sample for sample in self.outputs if oldest <= sample[0] < now]
        if generated is not None and rate > 0:
            self.outputs.append((now, generated / rate))

    def _change(self, now: float, window: float) -> tuple[float, float] | None:
        """(arrivals now, their mean one to two provisioning delays ago) when they differ by
        more than JUMP_SIGMAS of the two rates' Poisson noise; None otherwise, when the
        history does not reach back that far, or when traffic started within it: a rate
        read over a ``window`` that began before traffic counts only part of it, so every
        reading back to one window before the earlier delay must have seen traffic."""
        if not self.arrivals or self.arrivals[-1][0] != now:
            return None
        start, end = now - 2 * self.provisioning, now - self.provisioning
        if self.arrivals[0][0] > start:
            return None
        if any(rate <= 0 for t, rate in self.arrivals if start - window <= t < end):
            return None
        mean = self._delay_ago(self.arrivals, now)
        if mean is None:
            return None
        rate = self.arrivals[-1][1]
        # Poisson counts: the reading spans one window, the mean it is compared with one
        # provisioning delay of readings (a delay and a window of arrivals).
        error = math.sqrt(rate / window + mean / (self.provisioning + window))
        return (rate, mean) if abs(rate - mean) > JUMP_SIGMAS * error else None

    def surge(self, now: float, window: float) -> float | None:
        """How many times their mean one to two provisioning delays ago the arrivals are now,
        when that is SURGE_RATIO or more; None otherwise (also when it is within the rates'
        noise or the history cannot tell: see _change)."""
        change = self._change(now, window)
        if change is None:
            return None
        ratio = change[0] / change[1]
        return ratio if ratio >= SURGE_RATIO else None

    def over_steady(self, now: float) -> bool:
        """Whether the arrivals now are SURGE_RATIO times or more their median over the
        history kept (two provisioning delays and a window), and that history never fell
        below 1/SURGE_RATIO of it: arrivals coming back after a dip (short prompts the router
        sent to decode while a backlog waited at prefill) are no burst."""
        if not self.arrivals or self.arrivals[-1][0] != now:
            return False
        if now - self.arrivals[0][0] < 2 * self.provisioning:
            return False
        before = sorted(value for t, value in self.arrivals if t < now)
        usual = before[len(before) // 2]
        return (
            usual > 0
            and self.arrivals[-1][1] >= SURGE_RATIO * usual
            and before[0] >= usual / SURGE_RATIO
        )

    def plunge(self, now: float, window: float) -> float | None:
        """How many times the arrivals now their mean one to two provisioning delays ago was,
        when that is SURGE_RATIO or more (and beyond the rates' noise: see _change), and the
        pool's demand fell too (a burst ending: it may come back); None otherwise. Outputs
        getting longer finish fewer requests for a while, but hold more sequences, not
        fewer (and those count as arrived: see arrived)."""
        change = self._change(now, window)
        if change is None:
            return None
        held = self._delay_ago(self.demand, now)
        if held is None or self.demand[-1][0] != now or self.demand[-1][1] >= held:
            return None
        rate, before = change
        ratio = before / rate if rate > 0 else math.inf
        return ratio if ratio >= SURGE_RATIO else None

    def _delay_ago(self, samples: list[tuple[float, float]], now: float) -> float | None:
        """The mean of ``samples`` one to two provisioning delays before ``now``; None
        without one there."""
        start, end = now - 2 * self.provisioning, now - self.provisioning
        values = [value for t, value in samples if start <= t < end]
        return sum(values) / len(values) if values else None

    def hold_burst(self, now: float, configured: float) -> None:
        """A surge's scale-up or a burst's end: hold what the pool has SURGE_LOOK_BACK
        ``configured`` look-backs (the burst may come back), and renew the learned one."""
        held = min(MAX_DOWN_WINDOW_FACTOR, SURGE_LOOK_BACK) * configured
        self.down_window = max(self.down_window, held)
        self.learned_at = now

    def forget(self, now: float, configured: float) -> float | None:
        """Halve a learned look-back that went LOOK_BACK_MEMORY without a flap, surge or
        burst's end to renew it (back to the ``configured`` one once half is no longer
        longer); the look-back it was, when it did."""
        if not self.down_window or self.learned_at is None:
            return None
        if now - self.learned_at < LOOK_BACK_MEMORY:
            return None
        was, half = self.down_window, self.down_window / 2
        self.down_window = half if half > configured else 0.0
        self.learned_at = now
        return was

    def scaled(self, now: float, up: bool, configured: float, surge: bool = False) -> None:
        """Note a resize. A scale-up soon after a scale-down (a flap) lengthens the look-back:
        to twice what it was, and at least to how long the load took to come back (from the
        scale-up before) plus one provisioning delay, so the pool is still there when it
        returns as late again. A scale-up for a ``surge`` lengthens it to SURGE_LOOK_BACK
        times the configured one at once."""
        if not up:
            self.last_down = now
            return
        if surge:
            self.hold_burst(now, configured)
        if self.last_down is not None and now - self.last_down <= FLAP_SECONDS:
            learned = 2 * max(configured, self.down_window)
            if self.last_up is not None:
                learned = max(learned, now - self.last_up + self.provisioning)
            self.down_window = min(MAX_DOWN_WINDOW_FACTOR * configured, learned)
            self.learned_at = now
            self.last_down = None
        self.last_up = now

    def idle_for(self, now: float, idle: bool) -> float:
        """Note whether the pool is idle now; seconds it has been idle since (0 if not)."""
        if not idle:
            self.idle_since = None
            return 0.0
        if self.idle_since is None or self.idle_since > now:
            self.idle_since = now
        return now - self.idle_since

    def window_peak(self, now: float, window: float) -> tuple[int, float] | None:
        """The largest sustained recommendation of the last ``window`` seconds and the newest
        time it was made (the look-back holds it until that is ``window`` old); None until
        the history covers the window."""
        if not self.recommendations:
            return None
        if window > 0 and now - self.recommendations[0][0] < window:
            return None
        recent = [(kept, t) for t, _, kept in self.recommendations if now - t <= window]
        return max(recent) if recent else None

    def held(
        self, now: float, window: float, *, at_most: int | None = None, at_least: int | None = None
    ) -> bool:
        """Whether the history covers ``window`` and every recommendation in it stayed within
        the bound."""
        if window <= 0:
            return True
        if not self.recommendations or now - self.recommendations[0][0] < window:
            return False
        recent = [r for t, r, _ in self.recommendations if now - t <= window]
        if at_most is not None and any(r > at_most for r in recent):
            return False
        return not (at_least is not None and any(r < at_least for r in recent))
