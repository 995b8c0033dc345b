"""Feed-forward sizing: the queueing arithmetic, the histogram readings, learning, headroom."""

from __future__ import annotations

import math
import random

import pytest

from disagg.autoscale import sizing, trend

# 100 prefill times: 50 under 0.5 s, 40 in 0.5-1 s, 9 in 1-5 s, 1 above 5 s.
BUCKETS = ((0.5, 50.0), (1.0, 90.0), (5.0, 99.0), (math.inf, 100.0))


def test_erlang_c_matches_the_closed_forms() -> None:
    # One server: an arrival waits with probability rho.
    assert sizing.erlang_c(1, 0.7) == pytest.approx(0.7)
    # Two servers: C = 2 rho^2 / (1 + rho) with rho = a / 2.
    rho = 0.6
    assert sizing.erlang_c(2, 2 * rho) == pytest.approx(2 * rho**2 / (1 + rho))
    assert sizing.erlang_c(3, 3.5) == 1.0  # overloaded: everyone waits
    assert sizing.erlang_c(4, 0.0) == 0.0


def test_prefill_replicas_grow_with_load_and_shrink_with_a_longer_budget() -> None:
    one = [(1.0, 1.5)]
    sizes = [sizing.prefill_replicas(rate, 0.2, one) for rate in (1, 5, 10, 20, 40)]
    assert sizes == sorted(sizes) and sizes[0] == 1
    # Offered load 8 Erlangs can never be served by 8 replicas.
    assert sizing.prefill_replicas(40, 0.2, one) > 8
    assert sizing.prefill_replicas(20, 0.2, [(1.0, 0.1)]) > sizing.prefill_replicas(
        20, 0.2, [(1.0, 3.0)]
    )
    assert sizing.prefill_replicas(0, 0.2, one) == 0
    # A mix where most prompts may wait long needs fewer than all-at-the-tightest.
    mixed = [(0.9, 1.8), (0.1, 0.2)]
    assert sizing.prefill_replicas(20, 0.2, mixed) <= sizing.prefill_replicas(20, 0.2, [(1.0, 0.2)])


def test_histogram_readings_interpolate_inside_a_bucket() -> None:
    assert sizing.share_above(BUCKETS, 1.0) == pytest.approx(0.10)
    assert sizing.share_above(BUCKETS, 3.0) == pytest.approx(0.055)  # halfway through 1-5 s
    assert sizing.share_above(BUCKETS, 10.0) == pytest.approx(0.01)  # only +Inf is above
    assert sizing.share_above((), 1.0) == 0.0
    assert sizing.quantile(BUCKETS, 0.5) == pytest.approx(0.5)
    assert sizing.quantile(BUCKETS, 0.7) == pytest.approx(0.75)
    assert sizing.quantile(BUCKETS, 0.999) == 5.0  # in +Inf: the highest finite bound
    assert sizing.quantile((), 0.5) is None


def test_a_histogram_counted_again_in_other_buckets_reads_as_those_buckets_would() -> None:
    # Counted at its own bounds nothing moves; in one bucket from 0.5 to 5 s the 1-5 s
    # observations spread over all of it, and the 90th percentile moves from 1 to 4.17 s.
    assert sizing.rebucket(BUCKETS, [b for b, _ in BUCKETS]) == BUCKETS
    coarse = sizing.rebucket(BUCKETS, [0.5, 5.0])
    assert coarse == ((0.5, 50.0), (5.0, 99.0), (math.inf, 100.0))
    assert sizing.quantile(BUCKETS, 0.9) == pytest.approx(1.0)
    assert sizing.quantile(coarse, 0.9) == pytest.approx(0.5 + 4.5 * 40 / 49)
    assert sizing.rebucket((), [1.0]) == ()


def test_wait_budgets_leave_out_prompts_that_miss_at_any_size() -> None:
    budgets = sizing.wait_budgets(3.0, BUCKETS, 0.5)
    assert sum(share for share, _ in budgets) == pytest.approx(1 - 0.055)
    assert budgets[0] == (pytest.approx(0.5), pytest.approx(2.5))
    assert min(b for _, b in budgets) == pytest.approx(0.0)  # the slowest that still can
    assert sizing.wait_budgets(3.0, (), 0.5) == [(1.0, 2.0)]


def test_prompts_in_the_bucket_that_holds_the_slo_spread_their_budgets_over_it() -> None:
    # 4.5% of the prompts take 1-3 s alone: the 1-5 s bucket's share under the 3 s SLO, read
    # as if spread evenly over the bucket. Counted all at 3 s they had no budget at all (a
    # 70B pool held a replica more than the bimodal traffic needed); spread as that share
    # is, a quarter of them each may wait 1.5, 1, 0.5 and 0 s.
    straddling = sizing.wait_budgets(3.0, BUCKETS, 0.5)[2:]
    assert [budget for _, budget in straddling] == pytest.approx([1.5, 1.0, 0.5, 0.0])
    assert [share for share, _ in straddling] == pytest.approx([0.045 / 4] * 4)
    # A bucket whose top is the SLO is counted at its top, as before.
    assert sizing.wait_budgets(1.0, BUCKETS, 0.5) == [
        (pytest.approx(0.5), pytest.approx(0.5)),
        (pytest.approx(0.4), pytest.approx(0.0)),
    ]


def test_trend_extrapolates_a_steady_rise_and_ignores_flat_or_falling_demand() -> None:
    rising = [(t, 10 + 0.05 * t) for t in range(0, 241, 15)]  # +6 req/s per 120 s
    assert trend.trend(rising, 120) == pytest.approx((22 + 6) / 22, rel=0.01)
    flat = [(t, 10.0) for t in range(0, 241, 15)]
    assert trend.trend(flat, 120) == 1.0
    falling = [(t, 30 - 0.05 * t) for t in range(0, 241, 15)]
    assert trend.trend(falling, 120) == 1.0
    # Traffic starting from nothing is not a trend; too little history is not either.
    assert trend.trend([(0, 0.0), (15, 5.0), (30, 9.0)], 120) == 1.0
    explosive = [(t, 2 ** (t / 15)) for t in range(0, 241, 15)]
    assert 1.5 < trend.trend(explosive, 120) <= trend.GROWTH_CAP


def test_demand_wandering_with_its_prompts_sizes_is_no_trend() -> None:
    # Long prompts (5-25k tokens) at 1.4 req/s, read over a minute every 15 s: prompt
    # tokens/s wander between 10k and 20k at a steady rate. Lines through a delay of them
    # rose by chance and were extrapolated: up to a quarter more demand (a prefill replica
    # ordered at a diurnal peak it did not need), 5% or more on a sixth of the readings.
    rng = random.Random(7)
    long_prompts = [(rng.uniform(0, 2400), rng.uniform(5000, 25000)) for _ in range(3400)]
    trends = [
        trend.trend([(t, per_second(long_prompts, t)) for t in range(now - 240, now + 1, 15)], 120)
        for now in range(300, 2401, 15)
    ]
    assert sum(reading > 1.02 for reading in trends) <= 3 and max(trends) < 1.1, max(trends)
    # Chat at 10 req/s doubling within ten minutes is a trend through its own noise.
    rng, chat, t = random.Random(7), [], 0.0
    while t < 600:
        t += rng.expovariate(10 * (1 + t / 600))
        chat.append((t, rng.uniform(500, 1500)))
    for now in range(360, 601, 60):
        seen = [(t, per_second(chat, t)) for t in range(now - 240, now + 1, 15)]
        assert trend.trend(seen, 120) > 1.05


def per_second(prompts: list[tuple[float, float]], t: float) -> float:
    """Prompt tokens per second arriving over the minute before ``t``."""
    return sum(size for at, size in prompts if t - 60 <= at < t) / 60


def test_a_rise_that_slows_toward_its_peak_is_not_extrapolated_at_full_pace() -> None:
    # A daily peak: arrivals climb a sine toward 12 req/s at t = 900 s. Four minutes before
    # it each two minutes rise less than the two before; the next two add 0.4 req/s, not
    # the 0.6 the newer slope alone would. Extrapolating that slope is what orders a replica
    # for a peak that never comes.
    def arrivals(t: float) -> float:
        return 6 + 6 * math.sin(math.pi / 2 * t / 900)

    now = 660
    seen = [(float(t), arrivals(t)) for t in range(now - 240, now + 1, 15)]
    ahead = arrivals(now + 120) / arrivals(now)
    assert trend.trend(seen, 120) == pytest.approx(ahead, abs=0.01)
    # A ramp that keeps its pace keeps its full extrapolation (the rising case above).
    ramp = [(float(t), 10 + 0.05 * t) for t in range(0, 241, 15)]
    assert trend.trend(ramp, 120) == pytest.approx((22 + 6) / 22, rel=0.01)


def test_noise_headroom_shrinks_with_the_evidence() -> None:
    assert sizing.noise(100) == pytest.approx(1.1)
    assert sizing.noise(10_000) == pytest.approx(1.01)
    assert sizing.noise(0) == 2.0
    # Prompt tokens summed over 100 prompts of uneven length (squared CV 3) are known less
    # well than the request count: twice the error.
    assert sizing.noise(100, 3.0) == pytest.approx(1.2)


def test_spread_of_a_histogram_counts_each_bucket_at_its_midpoint() -> None:
    assert sizing.spread([]) == 0.0
    assert sizing.spread([(1.0, 0.0), (float("inf"), 0.0)]) == 0.0
    # Everything in one bucket: no spread.
    assert sizing.spread([(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)]) == 0.0
    # Half at 1 s, half at 3 s (midpoints): mean 2, variance 1, squared CV 1/4.
    two = [(2.0, 5.0), (4.0, 10.0), (float("inf"), 10.0)]
    assert sizing.spread(two) == pytest.approx(0.25)
    # The +Inf bucket counts at the last finite bound.
    tail = [(2.0, 5.0), (float("inf"), 10.0)]
    assert sizing.spread(tail) == pytest.approx(((1 + 4) / 2) / 1.5**2 - 1)


def test_prefill_speed_takes_the_better_of_alone_and_saturated_estimates() -> None:
    # 10 req/s of 1000 tokens, 0.1 s each: 10,000 tokens/s alone; 2 replicas serve 5,000 each.
    assert sizing.learn_prefill_speed(None, 10_000, 10, 0.1, 2) == pytest.approx(10_000)
    # Saturated: batched prompts take 0.5 s each, but one replica serves 20,000 tokens/s.
    assert sizing.learn_prefill_speed(None, 20_000, 20, 0.5, 1) == pytest.approx(20_000)
    # The best seen fades slowly rather than being forgotten.
    assert sizing.learn_prefill_speed(20_000, 5_000, 5, 0.5, 1) == pytest.approx(
        20_000 * sizing.SPEED_DECAY
    )
    assert sizing.learn_prefill_speed(7.0, None, 10, 0.1, 1) == 7.0


def test_prefill_speed_counts_the_prompts_batched_beside_each_other() -> None:
    # 1,000-token prompts take 0.2 s each (5,000 tokens/s alone) on 2 replicas serving
    # 6,000 tokens/s each: in 8,000-token steps each prompt leaves 7/8 of a step to others.
    assert sizing.learn_prefill_speed(None, 12_000, 12, 0.2, 2) == pytest.approx(6_000)
    assert sizing.learn_prefill_speed(None, 12_000, 12, 0.2, 2, 8_000) == pytest.approx(
        5_000 + 6_000 * 7 / 8
    )
    # Prompts that fill their steps are chunked and not slowed by the others: nothing added.
    assert sizing.learn_prefill_speed(None, 12_000, 1.5, 1.6, 2, 8_000) == pytest.approx(6_000)


def test_prefill_speed_does_not_fade_under_the_batching_of_a_busy_pool() -> None:
    # Two replicas at 6,000 tokens/s each (60% of the 10,000 learned): prompts share steps,
    # so each reads slower alone (0.11 s for 1,000 tokens: 9,091 tokens/s).
    speed = 10_000.0
    for _ in range(100):
        speed = sizing.learn_prefill_speed(speed, 12_000, 12, 0.11, 2) or 0.0
    assert speed == pytest.approx(10_000)
    # The same reading from a pool at 30% is a change of prompt mix: it is followed.
    speed = 10_000.0
    for _ in range(100):
        speed = sizing.learn_prefill_speed(speed, 6_000, 6, 0.11, 2) or 0.0
    assert speed == pytest.approx(6_000 / 6 / 0.11)


def test_decode_batch_learns_the_knee_from_tpot() -> None:
    # TPOT broke at 100 sequences per replica: the knee is below that.
    assert sizing.learn_batch(None, 100, 0.06, 0.05, 0.1) == pytest.approx(90)
    assert sizing.learn_batch(80, 100, 0.06, 0.05, 0.1) == 80
    # Met with margin at more than the learned knee: the knee was too low.
    assert sizing.learn_batch(80, 120, 0.03, 0.05, 0.1) == 120
    assert sizing.learn_batch(80, 120, 0.045, 0.05, 0.1) == 80  # inside the band: no news
    assert sizing.learn_batch(None, 0, 0.06, 0.05, 0.1) is None


def test_tp_to_meet_doubles_until_the_time_fits() -> None:
    assert sizing.tp_to_meet(8, 5.0, 3.0) == 16
    assert sizing.tp_to_meet(8, 10.0, 3.0) == 32
    assert sizing.tp_to_meet(4, 1.0, 3.0) == 4


def test_a_step_is_not_a_trend() -> None:
    # Flat for a delay, then a jump: the load estimate already sees the new level, and
    # extrapolating the jump would order replicas for a rise that has ended.
    step = [(t, 10.0 if t < 180 else 30.0) for t in range(0, 241, 15)]
    assert trend.trend(step, 120) == 1.0
    # A rise seen in both delays at the same relative pace is extrapolated (linearly: 1.3x
    # where the curve itself reaches 1.43x one delay on).
    growing = [(t, 10 * 1.003**t) for t in range(0, 241, 15)]
    assert 1.25 < trend.trend(growing, 120) < 1.45
