"""A decode pool's load (pure): the sequences it must hold, how many one replica holds and
what bounds that, what a smaller pool would hold (its steps batch more, so every sequence
lives longer), outputs getting longer before the KV cache shows it, and waiting requests
that are only passing through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from disagg.autoscale import sizing
from disagg.autoscale.memory import LIFETIME_SAMPLES, PoolMemory
from disagg.autoscale.model import PoolPolicy, Signals
from disagg.autoscale.sizing import DOWN_HEADROOM

KV_USAGE_TARGET: Final = 0.85
CONSOLIDATED_FILL: Final = 0.9
"""A smaller decode pool's predicted count may fill its replicas to at most 90%: the order
rule reads the new count with its own headroom (the estimate's noise, and a trend while the
count climbs to its new level), and a pool filled past that is one it orders back."""
LIFETIME_RISE: Final = 1.5
"""Decode sequences living this much longer within two evaluations, their count rising at
each: outputs are getting longer (a change of workload, not the count's own noise)."""
LIFETIME_NOISE: Final = 3.0
"""Standard deviations the count must rise by for its lifetime's rise to count (Poisson's,
or its own swing where arrivals come in bursts: count_swing)."""
RATE_HELD: Final = 1.15
"""A lifetime's rise counts only while the pool's rate stays within this of where it was:
the rate is averaged over a window and the count is not, so while arrivals rise the count
runs ahead of it and reads as a longer lifetime."""


def decode_keep(
    sequences: float, batch: float, serving: int, line: tuple[float, float] | None
) -> tuple[int, str]:
    """The fewest decode replicas a scale-down may leave, and (when the step line made it
    more) the words that say why.

    The demand fills them to at most DOWN_HEADROOM, the margin for the load to move. And on
    fewer replicas each step batches more, so it is slower and every sequence lives longer:
    with the step line learned (``line``), the count that gives must fit too, to at most
    CONSOLIDATED_FILL of ``batch`` each (itself at the KV-cache target)."""
    keep = sizing.decode_replicas(sequences / DOWN_HEADROOM, batch)
    if line is None or keep < 1:
        return keep, ""
    alone = keep
    while keep < serving:
        held = sizing.consolidated(sequences, serving, keep, line)
        if sizing.decode_replicas(held / CONSOLIDATED_FILL, batch) <= keep:
            break
        keep += 1
    if keep == alone:
        return keep, ""
    base, per_sequence = line
    held = sizing.consolidated(sequences, serving, alone, line)
    if not math.isfinite(held):
        return keep, f"; on {alone} the steps would slow without bound"
    step, later = base + per_sequence * sequences / serving, base + per_sequence * held / alone
    return keep, (
        f"; {alone} would hold {held:.0f} at {later * 1000:.0f}ms a step (now {step * 1000:.0f}ms)"
    )


def lengthening(memory: PoolMemory) -> tuple[float, float, float] | None:
    """(lifetime before, lifetime now, sequences one provisioning delay ahead) when a decode
    pool's outputs are getting longer, else None.

    Outputs that grow longer show first as sequences that live longer: the count rises at a
    steady arrival rate while completions, still the shorter outputs begun earlier, slow
    down. It keeps rising until the longer ones start finishing, and with the queue empty
    neither the queue nor a TPOT knee says so before the KV cache is full. More arrivals
    raise the count and, within the rate's window, the rate too, leaving the lifetime where
    it was: a rise counts only while the rate holds (RATE_HELD). The lifetime up by
    LIFETIME_RISE within two evaluations, rising at each with the count, and the count up
    by LIFETIME_NOISE of its own standard deviations, is more than noise moves them. The
    count's latest pace, kept for one provisioning delay, says how far it may go."""
    samples = memory.lifetimes
    if len(samples) < LIFETIME_SAMPLES:
        return None
    (_, first_running, first_life), (middle_at, middle_running, middle_life), last = samples[-3:]
    now, running, life = last
    rising = first_running < middle_running < running and first_life < middle_life < life
    if not rising or life < LIFETIME_RISE * first_life or now <= middle_at:
        return None
    # A count this far above where it was is beyond its own noise: Poisson's, or more where
    # arrivals come in bursts and the count swung more before.
    first_at = samples[-3][0]
    noise = max(math.sqrt(running + first_running), count_swing(memory.demand, first_at))
    if running - first_running < LIFETIME_NOISE * noise:
        return None
    # Arrivals that rise make the count lead the windowed rate: that is more load, which
    # the count itself sizes, not longer outputs.
    if running / life > RATE_HELD * first_running / first_life:
        return None
    pace = (running - middle_running) / (now - middle_at)
    return first_life, life, running + pace * memory.provisioning


SWING_SAMPLES: Final = 8
"""Changes of the count needed before its swing is read from them."""
RECENT_SWING: Final = 12
"""The latest changes of the count, whose swing counts when it is larger than the whole
history's."""


def count_swing(demand: Sequence[tuple[float, float]], before: float) -> float:
    """How far a decode pool's count moves over two evaluations, as it did before ``before``
    (the root mean square of those changes); 0 with fewer than SWING_SAMPLES of them.

    A count of sequences that each arrived independently is Poisson: it moves by the square
    root of itself. Arrivals in bursts move it more, and a rise of that size is a burst, not
    outputs getting longer."""
    counts = [count for at, count in demand if at < before]
    changes = [later - earlier for earlier, later in zip(counts, counts[2:], strict=False)]
    if len(changes) < SWING_SAMPLES:
        return 0.0

    def rms(moves: Sequence[float]) -> float:
        return math.sqrt(sum(move * move for move in moves) / len(moves))

    return max(rms(changes), rms(changes[-RECENT_SWING:]))


def in_transit(signals: Signals, ready: int, max_num_seqs: int | None) -> bool:
    """Whether a decode pool's waiting requests are only passing through: the free KV cache
    (at the mean a running sequence holds) and the free sequence slots hold all of them.

    A decode engine admits what fits at its next step, so with room to spare a waiting
    request is one whose KV is still arriving (vLLM counts those in
    ``num_requests_waiting``) or that landed since the last step; a prefill step finishing
    several prompts at once lands several together. That is no backlog, and no reason for a
    replica: a backlog waits because the cache or the slots are full."""
    queue, running, usage = signals.queue or 0.0, signals.running, signals.kv_usage
    if not queue or running is None or usage is None or not ready or usage >= 1:
        return False
    room = math.inf if usage <= 0 else (1 - usage) * running / usage
    if max_num_seqs:
        room = min(room, max_num_seqs * ready - running)
    return queue <= room


def drains_in_time(
    signals: Signals, growing: float, memory: PoolMemory, arriving: float, slots: float
) -> bool:
    """Whether ``slots`` decode sequences (the replicas ready and starting) drain the backlog
    they will find before a replica ordered now would serve: the queue grows until the
    starting replicas serve, then each waiting request holds a slot one sequence lifetime
    while the ``arriving`` sequences hold the rest."""
    queue, running, rate = signals.queue or 0.0, signals.running, signals.request_rate
    if memory.starting_since is None or not running or not rate or slots <= arriving:
        return False
    until_ready = max(0.0, memory.provisioning - (signals.sampled_at - memory.starting_since))
    backlog = queue + growing * until_ready
    drain = backlog * (running / rate) / (slots - arriving)
    return drain <= memory.provisioning - until_ready


def sized_step(memory: PoolMemory, batch: float) -> float | None:
    """The mean step (seconds) of a decode pool holding at most ``batch`` sequences a
    replica: its step line there, else the slowest step it served settled; None before it
    served any. A pool sized for its sequences steps no slower than that."""
    line = sizing.step_line([(per_replica, step) for _, per_replica, step in memory.steps])
    if line is not None:
        return line[0] + line[1] * batch
    return max((step for _, _, step in memory.steps), default=None)


def decode_sequences(
    signals: Signals, growing: float, backlog: bool = True, faster: float = 1.0
) -> float:
    """Sequences the decode pool must hold at once (Little's law: arrivals x lifetime).

    A saturated pool runs what it holds and queues the rest; the queue is not all demand at
    once: what it grows by per second, plus (with ``backlog``) the backlog drained over
    DRAIN_SECONDS, each stays one sequence lifetime (running over completions per second).
    A saturated pool batches all it can hold, so its steps are slower than those of a pool
    sized for its sequences (``faster`` times: saturated_speedup), and every sequence lives
    as many steps as it has tokens: on that pool each lives, and the running ones hold,
    that much less. Never more than running plus waiting: that is every sequence
    there is."""
    running, queue = signals.running or 0.0, signals.queue or 0.0
    rate = signals.request_rate
    if not queue or not rate or not running:
        return running + (queue if backlog else 0.0)
    lifetime = running / rate / faster
    drained = queue / sizing.DRAIN_SECONDS if backlog else 0.0
    return min(running + queue, running / faster + (growing + drained) * lifetime)


def saturated_speedup(signals: Signals, step: float | None) -> float:
    """How many times faster a pool sized for its sequences steps (``step``, seconds) than a
    saturated one does now (its mean TPOT); 1 unless it is saturated (a queue) and slower."""
    mean = signals.tpot_mean
    if step is None or step <= 0 or not mean or not signals.queue or mean <= step:
        return 1.0
    return mean / step


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
