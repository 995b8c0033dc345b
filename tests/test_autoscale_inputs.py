"""Signals no engine reports: the policy holds and says which value, a histogram that is not
one is left out, and no input at all makes a decision raise or leave the pool's bounds."""

from __future__ import annotations

import math
import random

import pytest

from disagg.autoscale.inputs import accepted, clean_buckets
from disagg.autoscale.policy import Behavior, PoolMemory, PoolPolicy, Signals, decide_pool

NOW = 10_000.0
PREFILL = PoolPolicy(slo=2.0, min_replicas=1, max_replicas=16, gpus_per_replica=4)
DECODE = PoolPolicy(slo=0.04, min_replicas=0, max_replicas=8, gpus_per_replica=4,
                    max_num_seqs=256)  # fmt: skip
INF = float("inf")


def signals(**values: object) -> Signals:
    base: dict[str, object] = {"p99": 0.5, "request_rate": 5.0, "queue": 0.0, "running": 20.0,
                               "kv_usage": 0.3, "pods_reporting": 4, "sampled_at": NOW}  # fmt: skip
    base.update(values)
    return Signals(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"queue": -3.0}, "queue is -3, not a finite number >= 0"),
        ({"request_rate": INF}, "requestRate is inf, not a finite number >= 0"),
        ({"running": -INF}, "running is -inf, not a finite number >= 0"),
        ({"prompt_tokens_rate": -1.0}, "promptTokensRate is -1"),
        ({"sampled_at": math.nan}, "lastSample is nan"),
        ({"tpot_mean": -0.02}, "tpotMean is -0.02, not a finite number >= 0"),
        ({"generation_tokens_rate": -5.0}, "generationTokensRate is -5, not a finite number"),
        # A custom query that reports percent: 85 would read as 100x the KV cache.
        ({"kv_usage": 85.0}, "kvUsage is 85, not a fraction of the KV cache (0-1)"),
    ],
)
def test_a_value_no_engine_reports_holds_the_pool_and_is_named(
    values: dict[str, float], message: str
) -> None:
    decision = decide_pool(
        "decode", signals(**values), 4, 4, DECODE, Behavior(), PoolMemory(), None, NOW
    )
    assert decision.action == "hold" and decision.desired == 4
    assert decision.reason.startswith(f"holding: metrics invalid: {message}")


def test_a_full_kv_cache_is_a_usage_of_one_not_an_invalid_value() -> None:
    decision = decide_pool(
        "decode", signals(kv_usage=1.0, running=250.0), 1, 1, DECODE, Behavior(), PoolMemory(),
        None, NOW,
    )  # fmt: skip
    assert decision.action == "up", decision.reason


def test_the_same_bound_spelled_twice_is_summed_and_a_broken_histogram_dropped() -> None:
    # le="1" and le="1.0" from engines of two versions arrive as two series of one bound.
    assert clean_buckets(((1.0, 30.0), (0.5, 10.0), (1.0, 20.0), (INF, 60.0))) == (
        (0.5, 10.0),
        (1.0, 50.0),
        (INF, 60.0),
    )
    assert clean_buckets(((0.5, 40.0), (1.0, 20.0), (INF, 60.0))) == ()  # counts fall
    assert clean_buckets(((0.5, 10.0), (1.0, math.nan), (INF, 60.0))) == ()
    assert clean_buckets(((0.5, 10.0), (1.0, 20.0))) == ()  # no +Inf bucket: not all counted
    assert clean_buckets(((0.5, 0.0), (INF, 0.0))) == ()  # nothing observed
    # Both histograms the policy reads are cleaned: a TTFT histogram whose counts fall is
    # left out, and the prefill-time one beside it kept.
    broken = ((0.5, 40.0), (1.0, 20.0), (INF, 60.0))
    kept = ((0.5, 10.0), (INF, 60.0))
    cleaned, problem = accepted(signals(ttft_buckets=broken, prefill_buckets=kept))
    assert (cleaned.ttft_buckets, cleaned.prefill_buckets, problem) == ((), kept, None)


def test_a_decode_pool_at_zero_replicas_is_sized_from_what_still_arrives() -> None:
    # Scaled to zero, the window still shows 3 sequences and a slow p99: no replica served
    # them, so there is no batch to learn (it divided by zero ready replicas), only a pool to
    # bring back.
    memory = PoolMemory()
    decision = decide_pool(
        "decode", signals(running=3.0, p99=0.09, pods_reporting=0), 0, 0, DECODE, Behavior(),
        memory, NOW - 1000, NOW,
    )  # fmt: skip
    assert decision.action == "up" and decision.desired == 1, decision.reason
    assert memory.batch is None


BAD = (0.0, -1.0, math.nan, INF, -INF, 1e-300, 1e300, None)


def _value(rng: random.Random) -> float | None:
    return rng.choice(BAD) if rng.random() < 0.3 else rng.uniform(0, 50)


def _buckets(rng: random.Random) -> tuple[tuple[float, float], ...]:
    bounds = [*sorted(rng.uniform(0.01, 10) for _ in range(rng.randint(1, 5))), INF]
    counts = sorted(rng.uniform(0, 100) for _ in bounds)
    if rng.random() < 0.3:
        rng.shuffle(counts)
    if rng.random() < 0.2:
        counts[rng.randrange(len(counts))] = rng.choice([math.nan, INF, -5.0])
    return tuple(zip(bounds, counts, strict=True))


def test_no_signals_make_a_decision_raise_or_leave_the_pools_bounds() -> None:
    rng = random.Random(2026)
    for _ in range(1500):
        pool = rng.choice(["prefill", "decode"])
        policy = PREFILL if pool == "prefill" else DECODE
        memory, current, now = PoolMemory(), rng.randint(0, 20), NOW
        for _ in range(rng.randint(1, 6)):
            observed = Signals(
                p99=_value(rng), request_rate=_value(rng), queue=_value(rng),
                running=_value(rng), kv_usage=_value(rng), pods_reporting=rng.randint(0, 20),
                sampled_at=now - rng.choice([0, 5, 100]), prompt_tokens_rate=_value(rng),
                prefill_seconds=_value(rng), prefill_buckets=_buckets(rng),
            )  # fmt: skip
            ready = rng.randint(0, current)
            last = rng.choice([None, now - 10, now - 1000])
            decision = decide_pool(
                pool, observed, current, ready, policy, Behavior(), memory, last, now
            )
            assert isinstance(decision.desired, int)
            in_bounds = policy.min_replicas <= decision.desired <= policy.max_replicas
            assert in_bounds or decision.desired == current, decision
            current, now = decision.desired, now + 15
