"""The policy's load-driven rules: sizing ahead of latency, unreachable SLOs, stale p99s and
proportional scale-down (the look-back learned from flaps, surges and bursts' ends is in
test_autoscale_look_back.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from disagg.autoscale import sizing
from disagg.autoscale.latency import tolerance
from disagg.autoscale.load import coming_backlog, pool_demand, prefill_floor
from disagg.autoscale.policy import (
    Behavior,
    PoolMemory,
    PoolPolicy,
    Signals,
    decide_pool,
)
from disagg.autoscale.reach import unreachable
from disagg.perf.buckets import LATENCY_BUCKETS

NOW = 50_000.0
PREFILL = PoolPolicy(slo=2.0, min_replicas=1, max_replicas=16, gpus_per_replica=4,
                     tensor_parallel=4)  # fmt: skip
DECODE = PoolPolicy(slo=0.04, min_replicas=1, max_replicas=16, gpus_per_replica=4,
                    max_num_seqs=256, tensor_parallel=4)  # fmt: skip
RULES = Behavior(up_cooldown=30, down_window=300, down_cooldown=120, window=60)
# A fast prefill mix: every prompt under 0.5 s.
FAST_PROMPTS = ((0.3, 60.0), (0.5, 100.0), (float("inf"), 100.0))


def prefill(p99: float, rate: float, at: float = NOW, **extra: object) -> Signals:
    values: dict[str, object] = {
        "p99": p99,
        "request_rate": rate,
        "prompt_tokens_rate": rate * 1000,
        "prefill_seconds": 0.1,
        "prefill_buckets": FAST_PROMPTS,
        "queue": 0.0,
        "pods_reporting": 16,
        "sampled_at": at,
    }
    values.update(extra)
    return Signals(**values)  # type: ignore[arg-type]


def test_prefill_grows_from_load_before_latency_moves() -> None:
    # 30 req/s of 1000-token prompts is 3 replicas' worth at 10k tokens/s each, yet the p99
    # still looks fine: the load, not the latency, says the pool is too small.
    memory = PoolMemory(prefill_speed=10_000)
    decision = decide_pool("prefill", prefill(0.4, 30.0), 3, 3, PREFILL, RULES, memory, None, NOW)
    assert decision.action == "up" and decision.desired >= 4
    assert "load needs" in decision.reason and "tokens/s per replica" in decision.reason


def test_prefill_orders_on_what_a_busy_replica_computes_and_keeps_on_the_cautious_speed() -> None:
    # 18 req/s of 1000-token prompts on 2 replicas: 3 replicas' worth at the cautious 10k
    # tokens/s (prompts timed alone), 2 at the 16k a busy replica computes when they batch.
    cautious = decide_pool(
        "prefill", prefill(0.4, 18.0), 2, 2, PREFILL, RULES, PoolMemory(prefill_speed=10_000),
        None, NOW,
    )  # fmt: skip
    assert cautious.action == "up" and cautious.desired == 3, cautious.reason
    memory = PoolMemory(prefill_speed=10_000, batched_speed=16_000, batched_prompt=1000)
    batched = decide_pool("prefill", prefill(0.4, 18.0), 2, 2, PREFILL, RULES, memory, None, NOW)
    assert batched.action == "hold", batched.reason
    # The same tokens in prompts twice as long batch less: they are ordered for cautiously.
    memory = PoolMemory(prefill_speed=10_000, batched_speed=16_000, batched_prompt=1000)
    longer = prefill(0.4, 9.0, prompt_tokens_rate=18_000.0, prefill_seconds=0.2)
    decision = decide_pool("prefill", longer, 2, 2, PREFILL, RULES, memory, None, NOW)
    assert decision.action == "up" and decision.desired == 3, decision.reason
    # A pool of 3 under the same load stays at 3: it shrinks only as far as the cautious
    # speed allows.
    memory = PoolMemory(prefill_speed=10_000, batched_speed=16_000, batched_prompt=1000)
    replicas, last, t = 3, None, NOW
    while t < NOW + 1200:
        decision = decide_pool(
            "prefill", prefill(0.4, 18.0, at=t), replicas, replicas, PREFILL, RULES, memory, last,
            t,
        )  # fmt: skip
        if decision.desired != replicas:
            replicas, last = decision.desired, t
        t += 15
    assert replicas == 3


def test_prompts_that_miss_at_any_size_do_not_drive_scaling_and_are_reported() -> None:
    # 5% of prompts take 2.5-5 s of prefill alone against a 2 s SLO: the p99 is over the SLO
    # whatever the pool size, and the load itself fits in the replicas there are.
    slow = ((0.5, 90.0), (1.0, 95.0), (5.0, 100.0), (float("inf"), 100.0))
    memory = PoolMemory(prefill_speed=10_000)
    signals = prefill(4.5, 2.0, prefill_buckets=slow)
    decision = decide_pool("prefill", signals, 2, 2, PREFILL, RULES, memory, None, NOW)
    assert decision.action != "up", decision.reason
    assert decision.unreachable is not None and decision.unreachable_share > 0.01
    # At the size the load asks for, the hold says why the p99 does not move it.
    decision = decide_pool("prefill", signals, 1, 1, PREFILL, RULES, memory, None, NOW)
    assert decision.reason.startswith("over the SLO, not for want of replicas (TTFT p99 4500ms")
    assert decision.unreachable is not None
    assert "at any size" in decision.unreachable and "TP4" in decision.unreachable
    # Up to 4.9 s against 2 s (with 10% margin) needs a quarter of the time: TP16.
    assert "TP16 would serve them" in decision.unreachable


def test_a_draining_backlog_does_not_scale_again_on_a_stale_p99() -> None:
    memory = PoolMemory(prefill_speed=10_000, queues=[(NOW - 15, 40.0, None)])
    # The queue fell from 40 to 10 since the last look: the 9 s p99 is what the backlog cost.
    signals = prefill(9.0, 10.0, queue=10.0)
    decision = decide_pool("prefill", signals, 3, 3, PREFILL, RULES, memory, None, NOW)
    assert decision.action == "hold", decision.reason
    # The same p99 with the backlog still growing is a reason to add replicas.
    growing = PoolMemory(prefill_speed=10_000, queues=[(NOW - 15, 5.0, None)])
    decision = decide_pool("prefill", signals, 3, 3, PREFILL, RULES, growing, None, NOW)
    assert decision.action == "up", decision.reason


def test_a_growing_queue_that_orders_replicas_is_named_with_its_drain_time() -> None:
    # The p99 is half the SLO, but 40 prompts wait (30 more than 15 s ago) and take 2 s to
    # drain on two replicas at the learned speed, past the 1.7 s the SLO leaves the most
    # common prompt: the queue orders the replica, and the decision says so in its numbers.
    memory = PoolMemory(prefill_speed=10_000, queues=[(NOW - 15, 10.0, None)])
    decision = decide_pool(
        "prefill", prefill(1.0, 5.0, queue=40.0), 2, 2, PREFILL, RULES, memory, None, NOW
    )
    assert decision.action == "up" and decision.desired == 3, decision.reason
    assert decision.reason.startswith(
        "scale up: load ahead of latency: 40 waiting take 2.00s to drain, 1.70s the SLO "
        "leaves them (TTFT p99 1000ms"
    ), decision.reason


def test_a_pool_over_its_slo_does_not_cancel_replicas_still_starting() -> None:
    # Five ordered, one ready, 40 s of TTFT p99 and a backlog that stopped growing: the p99
    # counts toward no further scale-up (it is what the backlog cost), and the load read on
    # the one saturated replica says fewer would do. The four starting are kept until they
    # serve and the p99 is read on them.
    memory = PoolMemory(prefill_speed=10_000, starting_since=NOW - 150, provisioning=300,
                        queues=[(NOW - 15, 170.0, None)])  # fmt: skip
    for step in range(30):  # longer than the 300 s look-back: it holds nothing back
        t = NOW + 15 * step
        signals = prefill(40.0, 2.0, at=t, queue=168.0 - step)
        decision = decide_pool("prefill", signals, 5, 1, PREFILL, RULES, memory, NOW - 150, t)
        assert decision.action == "hold", (t, decision.reason)
    assert "waiting for 4 starting replica(s)" in decision.reason
    # The same pool within its SLO may give back what its load does not need.
    memory = PoolMemory(prefill_speed=10_000, starting_since=NOW - 150, provisioning=300,
                        queues=[(NOW - 15, 0.0, None)])  # fmt: skip
    for step in range(25):
        t = NOW + 15 * step
        decision = decide_pool("prefill", prefill(0.3, 2.0, at=t), 5, 1, PREFILL, RULES, memory,
                               NOW - 150, t)  # fmt: skip
        if decision.action == "down":
            break
    assert decision.action == "down" and decision.desired < 5, decision.reason


def test_replicas_that_just_arrived_order_nothing_for_the_queue_the_smaller_pool_grew() -> None:
    # One replica faced 20 req/s of 1000-token prompts for two minutes while two more
    # started: 553 wait, 31 more each second until the two serve. Three replicas at 20k
    # tokens/s drain that backlog in under a minute; the growth was the smaller pool's.
    def arrived(queue: float) -> str:
        memory = PoolMemory(prefill_speed=20_000, starting_since=NOW - 120,
                            queues=[(NOW - 15, 86.0, None)])  # fmt: skip
        signals = prefill(28.0, 20.0, queue=553.0)
        first = decide_pool("prefill", signals, 3, 3, PREFILL, RULES, memory, NOW - 120, NOW)
        assert first.action == "hold", first.reason
        later = prefill(20.0, 20.0, at=NOW + 15, queue=queue)
        return decide_pool("prefill", later, 3, 3, PREFILL, RULES, memory, NOW - 120,
                           NOW + 15).action  # fmt: skip

    # Draining into the three: nothing more. Still growing on all three: more, at once.
    assert arrived(300.0) == "hold"
    assert arrived(700.0) == "up"


def run_prefill(
    rate: float, replicas: int, seconds: float, p99: float = 0.3, **extra: object
) -> list[tuple[float, int, int]]:
    """Scale-downs of a prefill pool under steady load (1000-token prompts, 10k tokens/s)."""
    memory, downs, t = PoolMemory(prefill_speed=10_000), [], NOW
    while t < NOW + seconds:
        decision = decide_pool(
            "prefill", prefill(p99, rate, at=t, **extra), replicas, replicas, PREFILL, RULES,
            memory, None, t,
        )  # fmt: skip
        assert decision.action != "up", decision.reason
        if decision.action == "down":
            downs.append((t - NOW, replicas, decision.desired))
            replicas = decision.desired
        t += 15
    return downs


def test_scale_down_goes_to_the_largest_size_of_the_window_in_one_step() -> None:
    # 5 req/s needs one replica: one move, after the whole stabilization window.
    assert run_prefill(5.0, 8, 600) == [(300.0, 8, 1)]


def test_a_prefill_pool_shrinks_to_a_size_its_load_keeps_at_most_80_percent_busy() -> None:
    # 30 req/s of 1000-token prompts at 10k tokens/s is 3 replicas' work, measured on 1800
    # prompts a minute: four replicas are 75% busy and meet the wait target with that
    # estimate's error on top. (Sizing the look-back for 25% more load than seen kept five.)
    assert run_prefill(30.0, 8, 900) == [(300.0, 8, 4)]


def test_a_p99_read_before_new_replicas_served_keeps_no_replica_in_the_look_back() -> None:
    # Eight replicas, the last of a scale-up just arrived. For one rate window the p99 still
    # says what the smaller pool left (over the SLO, inside its tolerance band); the load,
    # 5 req/s, is one replica's. The look-back counts from the arrival: one move to one
    # replica after it (the stale reading, kept as "hold at 8", held eight a window longer;
    # with a surge's longer look-back, for the rest of a 20-minute trace).
    over = PREFILL.slo * (1 + tolerance(PREFILL.slo, LATENCY_BUCKETS["vllm"]["prefill"]) / 2)
    memory, replicas, downs, t = PoolMemory(prefill_speed=10_000, ready_at=NOW), 8, [], NOW
    while t < NOW + 600:
        p99 = over if t - NOW < RULES.window else 0.3
        decision = decide_pool("prefill", prefill(p99, 5.0, at=t), replicas, replicas, PREFILL,
                               RULES, memory, NOW - 120, t)  # fmt: skip
        if decision.action == "down":
            downs.append((t - NOW, replicas, decision.desired))
            replicas = decision.desired
        t += 15
    assert downs == [(300.0, 8, 1)], downs


# Long-context prompts of widely varying length (prefill alone from under 0.25 s to 5 s).
LONG_PROMPTS = ((0.25, 40.0), (0.5, 65.0), (1.0, 85.0), (2.5, 98.0), (5.0, 100.0),
                (float("inf"), 100.0))  # fmt: skip


def test_a_prefill_pool_that_read_few_prompts_of_varying_length_keeps_room_for_their_mean() -> None:
    # 0.7 req/s of 12k-token prompts at 20k tokens/s against a 3 s TTFT SLO: a minute shows
    # 42 prompts, and with these sizes their mean is off by about a sixth either way. That
    # error sets how long each prompt waits behind another, not only the load: three
    # replicas stay (two, when it was counted on the rate alone, and the next window of
    # longer prompts grew the pool back).
    policy = replace(PREFILL, slo=3.0)

    def downs(window: float) -> list[tuple[float, int]]:
        rules, memory = replace(RULES, window=window), PoolMemory(prefill_speed=20_000)
        replicas, moves = 6, []
        for t in range(0, 600, 15):
            signals = prefill(
                1.0, 0.7, at=NOW + t, prefill_buckets=LONG_PROMPTS, prompt_tokens_rate=8400.0,
                prefill_seconds=0.6,
            )  # fmt: skip
            decision = decide_pool(
                "prefill", signals, replicas, replicas, policy, rules, memory, None, NOW + t
            )
            if decision.action == "down":
                moves.append((float(t), decision.desired))
                replicas = decision.desired
        return moves

    assert downs(window=60) == [(300.0, 3)]
    # The same load read over ten minutes (420 prompts) is known well enough for two.
    assert downs(window=600) == [(300.0, 2)]


# 1.1% of the prompts take 1.8-2 s of prefill alone: none misses a 2 s TTFT SLO alone, but
# they hold the p99 near it whatever the pool's size.
NEAR_SLO_PROMPTS = ((0.5, 95.0), (1.8, 98.9), (2.0, 100.0), (float("inf"), 100.0))


def test_a_p99_held_up_by_prompts_just_under_the_slo_does_not_keep_a_pool_large() -> None:
    # 5 req/s is half a replica's work; the slowest prompts, which may hardly wait, make it two.
    # A 1.9 s p99 is no more than those prompts' own prefill (1.82 s at the 99th percentile)
    # plus 10%, so it says nothing about the pool's size.
    assert run_prefill(5.0, 4, 600, p99=1.9, prefill_buckets=NEAR_SLO_PROMPTS) == [(300.0, 4, 2)]
    signals = prefill(1.9, 5.0, prefill_buckets=NEAR_SLO_PROMPTS)
    decision = decide_pool(
        "prefill", signals, 4, 4, PREFILL, RULES, PoolMemory(prefill_speed=10_000), None, NOW
    )
    assert "held there by the prompts' own prefill (p99 1.82s alone)" in decision.reason
    # Well over what they take alone, the same p99 is queueing: the pool holds its size.
    assert run_prefill(5.0, 4, 600, p99=2.3, prefill_buckets=NEAR_SLO_PROMPTS) == []


# One prompt in 53 takes 1-1.5 s of prefill alone, the rest under half a second.
ONE_SLOW_PROMPT = ((0.3, 50.0), (0.5, 52.0), (1.0, 52.0), (1.5, 53.0), (float("inf"), 53.0))


def test_a_p99_is_compared_with_the_prompts_own_prefill_as_its_own_buckets_read_it() -> None:
    # At 0.9 req/s a pool of two is under a tenth busy. Its one slow prompt reads as a p99
    # of 1.23 s in the prefill-time histogram, but vLLM's TTFT buckets jump from 1 to 2.5 s,
    # and there the same prompt reads as 1.7 s: read the same way, it is the prompt's own.
    downs = run_prefill(0.9, 2, 600, p99=1.7, prefill_buckets=ONE_SLOW_PROMPT)
    assert downs == [(300.0, 2, 1)]
    signals = prefill(1.7, 0.9, prefill_buckets=ONE_SLOW_PROMPT)
    decision = decide_pool(
        "prefill", signals, 2, 2, PREFILL, RULES, PoolMemory(prefill_speed=10_000), None, NOW
    )
    assert (
        "held there by the prompts' own prefill (p99 1.23s alone, 1.70s in the TTFT "
        "histogram's buckets)" in decision.reason
    )
    # A p99 higher than those buckets read the slow prompt is waiting: the pool holds.
    assert run_prefill(0.9, 2, 600, p99=2.0, prefill_buckets=ONE_SLOW_PROMPT) == []


def test_a_pool_keeps_room_for_the_slowest_prompts_a_minute_saw_few_of() -> None:
    # 2% of the prompts may not wait at all. At 1.5 req/s a minute holds 90 prompts, about two
    # of those: the next minute may bring four. Read as exact, the share lets one replica
    # serve even with the load's own error on top; one error more on the share keeps two.
    budgets = [(0.98, 1.5), (0.02, 0.0)]
    noisy = 1.5 * sizing.noise(90)
    assert sizing.prefill_replicas(noisy, 0.2, budgets) == 1
    assert prefill_floor(1.5, 0.2, budgets, 10, events=90, spread=0.0) == 2
    # Counted over a long time the share is what it reads.
    assert prefill_floor(1.5, 0.2, budgets, 10, events=1e9, spread=0.0) == 1


# 5% of the prompts take 2-5 s of prefill alone: they miss a 2 s TTFT SLO at any size.
UNREACHABLE_PROMPTS = (
    (0.5, 90.0), (1.0, 95.0), (2.0, 95.0), (5.0, 100.0), (float("inf"), 100.0),
)  # fmt: skip


def test_prompts_that_miss_at_any_size_leave_the_others_latency_read() -> None:
    def decide(**extra: object) -> str:
        # A few prompts waiting, more than 15 s ago: the p99 is not a drained backlog's.
        signals = prefill(4.0, 1.0, prefill_buckets=UNREACHABLE_PROMPTS, queue=5.0, **extra)
        memory = PoolMemory(prefill_speed=10_000, queues=[(NOW - 15, 2.0, None)])
        decision = decide_pool("prefill", signals, 2, 2, PREFILL, RULES, memory, NOW - 900, NOW)
        assert decision.unreachable is not None and "5.0% of prompts" in decision.unreachable
        return f"{decision.action} {decision.reason}"

    # Without the TTFT histogram, the p99 is theirs and says nothing of the pool's size.
    alone = decide()
    assert alone.startswith("hold ") and "TTFT p99 4000ms" in alone, alone
    # With it, the p99 of the other 95% is its 94th percentile. Here a tenth of all prompts
    # wait past 2.5 s: the others queue, and the pool grows.
    waiting = ((0.5, 80.0), (1.0, 85.0), (2.5, 90.0), (5.0, 100.0), (float("inf"), 100.0))
    grown = decide(ttft_buckets=waiting)
    assert grown.startswith("up "), grown
    assert "TTFT p94 3512ms vs SLO 2000ms, the p99 of the 95% of prompts that can meet it" in grown
    # Where only the unreachable ones are slow, the others' p99 is under a second.
    served = ((0.5, 85.0), (1.0, 95.0), (2.5, 95.0), (5.0, 100.0), (float("inf"), 100.0))
    held = decide(ttft_buckets=served)
    assert held.startswith("hold ") and "TTFT p94 952ms vs SLO 2000ms" in held, held


def test_a_quiet_pool_judges_its_long_prompts_by_the_times_they_took() -> None:
    """The speed kept is the best one seen, read on shorter prompts; scaled by it, a quiet
    pool's long prompts read faster than they ran, and fewer of them as out of reach."""
    # 5% of prompts take over the 2 s SLO. The mean one (8000 tokens) took 1 s, where the
    # best speed seen (16000 tokens/s) says 0.5 s.
    memory = PoolMemory(prefill_speed=16_000)

    def out_of_reach(**extra: object) -> float:
        signals = prefill(4.0, 1.0, prefill_buckets=UNREACHABLE_PROMPTS, prefill_seconds=1.0,
                          prompt_tokens_rate=8000.0, pods_reporting=2, **extra)  # fmt: skip
        found = unreachable("prefill", signals, 2, PREFILL, memory, 0.4)
        return found[0] if found else 0.0

    # 4000 tokens/s a replica, a quarter of what one computes, and no queue: as they ran.
    assert out_of_reach() == pytest.approx(0.05)
    # With a queue, prefill times include the prompts batched with them: halved, as the
    # speed says, a third of those over the SLO are under it alone.
    assert out_of_reach(queue=5.0) == pytest.approx(0.05 / 3)
    memory.queues = [(NOW - 15, 3.0, None)]  # a queue within the rate window: the same
    assert out_of_reach() == pytest.approx(0.05 / 3)


def test_a_backlog_is_sized_as_it_will_be_when_the_ordered_replicas_serve() -> None:
    # 200 prompts wait, 10 more per second, each costs 0.05 s of the pool's time: 10 s to
    # drain, far past the 1.7 s they may wait. Replicas ordered now serve in 120 s, when
    # 1200 more will have joined the queue.
    memory = PoolMemory(provisioning=120.0)
    signals = prefill(1.5, 60.0, queue=200.0)
    assert coming_backlog(signals, 10.0, memory, 0.05, 1.7) == pytest.approx(1400)
    # Replicas ordered 100 s ago serve in 20 s and stop the growth then if they suffice.
    starting = PoolMemory(provisioning=120.0, starting_since=NOW - 100)
    assert coming_backlog(signals, 10.0, starting, 0.05, 1.7) == pytest.approx(400)
    # A queue that drains within what prompts may wait is not a backlog: no projection.
    assert coming_backlog(prefill(1.5, 60.0, queue=20.0), 10.0, memory, 0.05, 1.7) == 20.0


def test_decode_is_sized_from_sequences_against_its_kv_cache() -> None:
    # 2 replicas hold 300 sequences at 95% KV usage: a replica holds ~134 at the 85% target.
    signals = Signals(
        p99=0.03, request_rate=10.0, running=300.0, queue=20.0, kv_usage=0.95,
        pods_reporting=2, sampled_at=NOW,
    )  # fmt: skip
    decision = decide_pool("decode", signals, 2, 2, DECODE, RULES, PoolMemory(), None, NOW)
    assert decision.action == "up" and decision.desired == 3, decision.reason
    assert "(KV cache)" in decision.reason


def test_decode_step_that_misses_tpot_with_nothing_batched_is_unreachable() -> None:
    signals = Signals(
        p99=0.09, request_rate=0.5, running=2.0, kv_usage=0.1, pods_reporting=2, sampled_at=NOW
    )
    decision = decide_pool("decode", signals, 2, 2, DECODE, RULES, PoolMemory(), None, NOW)
    assert decision.unreachable is not None and "TP16" in decision.unreachable


def test_a_slow_step_with_one_sequence_teaches_no_batch_size_and_adds_no_replica() -> None:
    # One sequence on one replica, TPOT p99 183 ms against 40 ms (the step alone, or a stall):
    # a replica does not hold fewer than one sequence, and a second replica would not help.
    memory, replicas = PoolMemory(), 1
    for step in range(20):
        t = NOW + 15 * step
        signals = Signals(
            p99=0.183, request_rate=0.5, running=1.0, kv_usage=0.05, pods_reporting=1,
            sampled_at=t,
        )  # fmt: skip
        decision = decide_pool("decode", signals, replicas, replicas, DECODE, RULES, memory,
                               NOW - 1000, t)  # fmt: skip
        assert decision.action != "up", decision.reason
    assert memory.batch is None


def test_prompts_slow_only_because_they_are_batched_are_load_not_unreachable() -> None:
    # Saturated: 20k tokens/s served by one replica, each 1000-token prompt spends 2.5-5 s in
    # its prefill phase only because 50 others share its steps. Alone it takes 0.05 s.
    batched = ((2.5, 0.0), (5.0, 100.0), (float("inf"), 100.0))
    memory = PoolMemory(prefill_speed=20_000, queues=[(NOW - 15, 10.0, None)])
    signals = prefill(4.0, 20.0, prefill_seconds=2.5, prefill_buckets=batched, queue=60.0)
    decision = decide_pool("prefill", signals, 1, 1, PREFILL, RULES, memory, None, NOW)
    assert decision.unreachable is None, decision.unreachable
    assert decision.action == "up", decision.reason


def decode(running: float, at: float, **extra: object) -> Signals:
    values: dict[str, object] = {
        "p99": 0.01, "request_rate": 10.0, "running": running, "queue": 0.0,
        "pods_reporting": 16, "sampled_at": at,
    }  # fmt: skip
    values.update(extra)
    return Signals(**values)  # type: ignore[arg-type]


def test_a_decode_backlog_is_drained_over_a_minute_not_held_all_at_once() -> None:
    # One saturated replica runs 200 sequences of 20 s each (10 finish per second) with 600
    # waiting. Holding all 800 at once would take 4 replicas at 230 each; draining the 600
    # over a minute keeps 200 + 10/s x 20 s = 400 running: 2 replicas.
    signals = decode(200.0, NOW, queue=600.0)
    decision = decide_pool("decode", signals, 1, 1, DECODE, RULES, PoolMemory(), None, NOW)
    assert decision.action == "up" and decision.desired == 2, decision.reason


def run_decode(running: float, replicas: int, seconds: float) -> list[tuple[float, int, int]]:
    memory, t, downs = PoolMemory(), NOW, []
    while t < NOW + seconds:
        signals = decode(running, t)
        decision = decide_pool("decode", signals, replicas, replicas, DECODE, RULES, memory,
                               None, t)  # fmt: skip
        if decision.desired != replicas:
            downs.append((t - NOW, replicas, decision.desired))
            replicas = decision.desired
        t += 15
    return downs


def test_a_pool_shrinks_only_to_a_size_its_load_fills_to_at_most_80_percent() -> None:
    # 420 sequences fit two replicas of 230, at 95%: the next fluctuation would scale back up.
    assert run_decode(420.0, 3, 900) == []
    # 300 fill two replicas to 68%: one move down, after the stabilization window.
    assert run_decode(300.0, 3, 900) == [(300.0, 3, 2)]


def test_a_decode_pool_does_not_shrink_onto_steps_too_slow_for_the_sequences_it_holds() -> None:
    # Two replicas hold 150 sequences, 75 each, at a 20 ms mean TPOT. By the count alone (at
    # most 230 a replica) one replica would do. But the pool served 25 and 50 a replica at
    # 16 and 18 ms before: a step slows 0.08 ms per sequence batched. On one replica each
    # step is slower, every sequence lives longer, and the count rises to about 280 at 36 ms
    # a step (Little's law): more than the 230 one replica holds, so the pool stays at two.
    reasons: list[str] = []

    def downs(batches: tuple[float, ...]) -> list[tuple[float, int, int]]:
        memory, replicas, t, moves = PoolMemory(), 2, NOW, []
        while t < NOW + 900:
            per_replica = batches[min(len(batches) - 1, round((t - NOW) / 15))]
            step = 0.014 + 0.00008 * per_replica
            # More sequences from more arrivals (each lives 10 s); the p99, read from
            # histogram buckets, sits near the bound the steps fall under.
            signals = decode(2 * per_replica, t, p99=0.025, tpot_mean=step,
                             request_rate=2 * per_replica / 10)  # fmt: skip
            decision = decide_pool("decode", signals, replicas, replicas, DECODE, RULES, memory,
                                   None, t)  # fmt: skip
            reasons.append(decision.reason)
            if decision.desired != replicas:
                moves.append((t - NOW, replicas, decision.desired))
                replicas = decision.desired
            t += 15
        return moves

    assert downs((25.0, 50.0, 75.0)) == []
    # The hold says what one replica would face.
    assert reasons[-1].endswith("; 1 would hold 278 at 36ms a step (now 20ms)"), reasons[-1]
    # A pool that has only ever served this one batch size has no slope to go on: it shrinks.
    assert downs((75.0,)) == [(300.0, 2, 1)]


def test_a_prefill_pool_held_within_its_slo_says_what_one_replica_fewer_would_face() -> None:
    # 8.5 req/s of 1000-token prompts at 10k tokens/s on two replicas, the p99 a fifth of
    # the SLO: "within SLO" alone did not say why the pool keeps two.
    def hold(rate: float) -> str:
        memory = PoolMemory(prefill_speed=10_000)
        decision = decide_pool("prefill", prefill(0.4, rate), 2, 2, PREFILL, RULES, memory,
                               NOW - 900, NOW)  # fmt: skip
        assert decision.action == "hold", decision.reason
        return decision.reason

    assert hold(8.5).endswith(
        "; on 1, 91% busy at 10000 tokens/s (at most 80%) and 15.6% of prompts waiting past "
        "what the SLO leaves them at 10000 tokens/s (at most 1.0%)"
    )
    # Where only the wait check with one estimate error binds, it says that (the load and
    # each budget's share of prompts one error higher).
    assert hold(6.5).endswith(
        "; on 1, 1.33% of prompts waiting past what the SLO leaves them with one estimate "
        "error more load (at most 1.0%)"
    )


def test_replicas_a_backlog_needed_are_given_back_once_it_has_drained() -> None:
    # 6 replicas drain a backlog of 600 prompts at 2 per second while 5 req/s keep arriving
    # (so engines finish 7 req/s); then the queue is empty. 5 req/s of 1000-token prompts at
    # 10k tokens/s is half a replica's work: two at most, once the backlog is gone.
    memory, replicas, downs, last_scale = PoolMemory(prefill_speed=10_000), 6, [], NOW - 1000
    for step in range(-20, 21):
        t = NOW + 15 * step
        draining = step < 0
        queue = -30.0 * step if draining else 0.0
        signals = prefill(9.0 if draining else 0.3, 7.0 if draining else 5.0, at=t, queue=queue)
        decision = decide_pool(
            "prefill", signals, replicas, replicas, PREFILL, RULES, memory, last_scale, t
        )
        if decision.action == "down":
            downs.append((t - NOW, replicas, decision.desired))
            replicas, last_scale = decision.desired, t
    # As soon as the look-back covers the window, straight to what the arrivals need: the
    # backlog's share of the window's recommendations is not load that comes back.
    assert downs and downs[0][0] <= 15 and downs[0][2] <= 2, downs


def test_a_drained_backlog_still_in_the_engines_rate_window_is_not_load_that_stays() -> None:
    # 20 req/s arrive; 10 replicas drain a backlog of 3000 prompts at 10 more per second,
    # so engines finish 30 req/s until it is gone. Their rate, an average over the window,
    # still reads above 20 for a window after that. What arrived is what they finished
    # plus what the queue grew by over the same window: 20 req/s, three replicas' worth,
    # as soon as the scale-down cooldown allows (the engines' count alone held four for
    # the whole look-back).
    memory, replicas, downs, last_scale = PoolMemory(prefill_speed=10_000), 10, [], NOW - 1000
    for step in range(-20, 41):
        t = NOW + 15 * step
        since_empty = 15.0 * step
        finished = (
            30.0 if step < 0 else 20 + 10 * max(0.0, RULES.window - since_empty) / RULES.window
        )
        queue = max(0.0, -150.0 * step)
        signals = prefill(9.0 if step < 0 else 0.3, finished, at=t, queue=queue)
        decision = decide_pool(
            "prefill", signals, replicas, replicas, PREFILL, RULES, memory, last_scale, t
        )
        if decision.action != "hold":
            downs.append((t - NOW, replicas, decision.desired))
            replicas, last_scale = decision.desired, t
    assert downs == [(0.0, 10, 4), (RULES.down_cooldown, 4, 3)], downs


def test_the_prefill_trend_follows_arrivals_not_a_draining_backlog() -> None:
    # Engines finish 30 req/s of 1000-token prompts while the queue shrinks by 10 a second:
    # 20 req/s arrive. A trend fitted to the 30 would extrapolate the drain.
    draining = prefill(9.0, 30.0, queue=100.0)
    assert pool_demand("prefill", draining, 0.0, -10.0) == pytest.approx(20_000)
    # A growing queue adds what the engines have not reached yet.
    assert pool_demand("prefill", draining, 5.0, 5.0) == pytest.approx(35_000)


def test_the_queue_change_over_the_window_is_measured_from_a_sample_a_window_old() -> None:
    memory = PoolMemory()
    for step, queue in enumerate((100.0, 90.0, 60.0, 30.0, 0.0, 0.0)):
        memory.queue_growth(NOW + 15 * step, queue, 60)
    # 60 s ago the queue held 90: it fell by 1.5 a second over the window, though it did not
    # move since the last sample.
    assert memory.window_queue_change == pytest.approx(-1.5)
    assert memory.queue_change == 0.0
    # A clock that jumps back measures from the new sample on, not from the future.
    memory.queue_growth(NOW, 10.0, 60)
    assert memory.window_queue_change == 0.0
    memory.queue_growth(NOW + 15, 40.0, 60)
    assert memory.window_queue_change == pytest.approx(2.0)


def test_replicas_already_starting_that_will_drain_a_decode_backlog_are_not_ordered_again() -> None:
    # One ready replica holds 200 sequences of 25 s (its KV cache full: 170 each at the
    # target) with 600 waiting, 3 more per second; the replicas ordered 90 s ago serve in 30 s.
    memory = PoolMemory(starting_since=NOW - 90, provisioning=120, queues=[(NOW - 15, 555, None)])
    signals = decode(200.0, NOW, queue=600.0, request_rate=8.0, kv_usage=1.0)
    # Two are starting: three replicas drain the 690 they will find within a minute and a
    # half, long before a fourth ordered now would serve.
    decision = decide_pool("decode", signals, 3, 1, DECODE, RULES, memory, None, NOW)
    assert decision.action == "hold", decision.reason
    # One is starting: two replicas would take six minutes over it, so a third is ordered.
    memory = PoolMemory(starting_since=NOW - 90, provisioning=120, queues=[(NOW - 15, 555, None)])
    decision = decide_pool("decode", signals, 2, 1, DECODE, RULES, memory, None, NOW)
    assert decision.action == "up" and decision.desired > 2, decision.reason


def test_replicas_starting_that_drain_a_backlog_only_after_another_serves_are_not_enough() -> None:
    # The same pool, its two replicas ordered 15 s ago: they serve in 105 s and find 915
    # waiting, which takes them 97 s more. A replica ordered now serves 15 s after they do,
    # while 80 s of that backlog is still left: it is ordered.
    memory = PoolMemory(starting_since=NOW - 15, provisioning=120, queues=[(NOW - 15, 555, None)])
    signals = decode(200.0, NOW, queue=600.0, request_rate=8.0, kv_usage=1.0)
    decision = decide_pool("decode", signals, 3, 1, DECODE, RULES, memory, None, NOW)
    assert decision.action == "up" and decision.desired > 3, decision.reason


def saturated_memory(steps: bool) -> PoolMemory:
    # The pool served 25 to 60 sequences a replica at 22.0 to 22.7 ms a step before its
    # outputs got longer.
    served = [(NOW - 600 + 15 * i, 25.0 + 5 * i, 0.0215 + 0.00002 * (25 + 5 * i)) for i in range(8)]
    return PoolMemory(queues=[(NOW - 15, 570.0, None)], steps=served if steps else [])


def test_a_saturated_decode_pool_is_sized_on_the_steps_of_a_pool_that_holds_it() -> None:
    # One replica holds 200 sequences, every step batching all it can at 36 ms; 600 wait,
    # 2 more a second, and 8 finish a second: they live 25 s. Read at those steps, the pool
    # needs 200 + (2 + 600/60) x 25 = 500 sequences, three replicas of 230. A replica holding
    # at most 230 steps in 26 ms by what the pool served before: sequences live 1.38x
    # shorter there, and two replicas hold them.
    signals = decode(200.0, NOW, queue=600.0, request_rate=8.0, tpot_mean=0.036, p99=0.05)
    slow = decide_pool("decode", signals, 1, 1, DECODE, RULES, saturated_memory(False),
                       NOW - 45, NOW)  # fmt: skip
    assert slow.action == "up" and slow.desired == 3, slow.reason
    sized = decide_pool("decode", signals, 1, 1, DECODE, RULES, saturated_memory(True),
                        NOW - 45, NOW)  # fmt: skip
    assert sized.action == "up" and sized.desired == 2, sized.reason
    assert "living 1.38x shorter at a 26ms step than at the full pool's 36ms" in sized.reason
    # Without a queue the pool is not saturated: its sequences are what it holds.
    calm = replace(signals, queue=0.0, running=150.0)
    held = decide_pool("decode", calm, 1, 1, DECODE, RULES, saturated_memory(True),
                       NOW - 45, NOW)  # fmt: skip
    assert "shorter" not in held.reason, held.reason


def test_a_step_read_just_after_new_replicas_arrive_is_not_learned() -> None:
    # A window's mean TPOT just after replicas arrive is the smaller, saturated pool's: taken
    # as the step at the new, smaller batch per replica it had bent the step line.
    signals = decode(180.0, NOW, tpot_mean=0.033, p99=0.03)
    arrived = PoolMemory(ready_at=NOW - 15)
    decide_pool("decode", signals, 2, 2, DECODE, RULES, arrived, NOW - 600, NOW)
    assert arrived.steps == []
    served = PoolMemory(ready_at=NOW - RULES.window)
    decide_pool("decode", signals, 2, 2, DECODE, RULES, served, NOW - 600, NOW)
    assert served.steps == [(NOW, 90.0, 0.033)]


def test_a_decode_backlog_draining_into_replicas_that_just_arrived_scales_nothing_more() -> None:
    # Three replicas arrived 15 s ago and the queue fell from 280 to 160 since: the 450
    # sequences running are the backlog being drained, not demand that stays.
    signals = decode(450.0, NOW, queue=160.0, kv_usage=0.7)
    fresh = PoolMemory(ready_at=NOW - 15, queues=[(NOW - 15, 280.0, None)])
    decision = decide_pool("decode", signals, 3, 3, DECODE, RULES, fresh, NOW - 135, NOW)
    assert decision.action == "hold", decision.reason
    # The same load long after the last scale-up is a pool that is too small.
    settled = PoolMemory(ready_at=NOW - 600, queues=[(NOW - 15, 280.0, None)])
    decision = decide_pool("decode", signals, 3, 3, DECODE, RULES, settled, NOW - 720, NOW)
    assert decision.action == "up", decision.reason


def test_a_backlog_draining_into_the_first_of_two_starting_replicas_scales_nothing_more() -> None:
    # Two replicas were ordered minutes apart. The first arrived just now, the second still
    # starts; the queue fell from 620 to 527 since the last evaluation: the 308 sequences
    # running are the backlog moving into the new replica (running jumped, completions lag
    # by a lifetime), not demand that stays. Read as demand, they asked for five replicas.
    memory = PoolMemory(queues=[(NOW - 15, 620.0, None)], ready_count=1,
                        starting_since=NOW - 300)  # fmt: skip
    before = decode(184.0, NOW - 15, queue=620.0, request_rate=6.6, kv_usage=1.0)
    decide_pool("decode", before, 3, 1, DECODE, RULES, memory, NOW - 75, NOW - 15)
    signals = decode(308.0, NOW, queue=527.0, request_rate=6.9, kv_usage=0.79)
    decision = decide_pool("decode", signals, 3, 2, DECODE, RULES, memory, NOW - 75, NOW)
    assert decision.action == "hold", decision.reason
    assert memory.ready_at == NOW


def test_requests_passing_through_a_decode_pool_with_room_order_no_replica() -> None:
    # A prefill step finished four prompts at once; their KV is still arriving when the
    # decode replica is sampled. It runs 44 sequences at 24% of its KV cache: it admits all
    # four at its next step, so they are no backlog.
    passing = decode(44.0, NOW, queue=4.0, kv_usage=0.24, request_rate=12.0)
    memory = PoolMemory(queues=[(NOW - 15, 0.0, None)])
    decision = decide_pool("decode", passing, 1, 1, DECODE, RULES, memory, NOW - 900, NOW)
    assert decision.action == "hold", decision.reason
    # The same queue appearing in front of a full KV cache is a backlog.
    memory = PoolMemory(queues=[(NOW - 15, 0.0, None)])
    full = decode(170.0, NOW, queue=4.0, kv_usage=1.0, request_rate=12.0)
    decision = decide_pool("decode", full, 1, 1, DECODE, RULES, memory, NOW - 900, NOW)
    assert decision.action == "up", decision.reason
    # And in front of a replica at its max-num-seqs.
    memory = PoolMemory(queues=[(NOW - 15, 0.0, None)])
    slots = decode(256.0, NOW, queue=4.0, kv_usage=0.5, request_rate=12.0)
    decision = decide_pool("decode", slots, 1, 1, DECODE, RULES, memory, NOW - 900, NOW)
    assert decision.action == "up", decision.reason


def watch_decode(samples: list[tuple[float, float, float]], replicas: int = 1) -> list[str]:
    """Decisions of a decode pool of ``replicas`` over (running, completions/s, KV usage)
    samples 15 s apart, none of them queueing yet."""
    memory, reasons = PoolMemory(), []
    for step, (running, rate, kv) in enumerate(samples):
        t = NOW + 15 * step
        signals = decode(running, t, request_rate=rate, kv_usage=kv)
        decision = decide_pool("decode", signals, replicas, replicas, DECODE, RULES, memory,
                               None, t)  # fmt: skip
        reasons.append(f"{decision.action} {decision.desired}: {decision.reason}")
    return reasons


def test_outputs_getting_longer_order_a_decode_replica_before_the_kv_cache_fills() -> None:
    # Outputs quadruple: at 10 req/s sequences that lived 4 s live 9.5 s two looks later,
    # the count rising 35 in the last 15 s. At that pace the 90 running become 370 within the
    # two minutes a replica takes to start, past the 212 one replica holds at 85% of its
    # KV cache, which is at 36% now: one more replica is ordered now, not once it is full.
    longer = watch_decode([(40, 10.0, 0.15), (55, 10.0, 0.21), (90, 9.5, 0.36)])
    assert longer[-1].startswith("up 2: scale up: load needs 2"), longer[-1]
    assert "sequences now live 9.5s (from 4.0s), 370 of them" in longer[-1]
    assert all(r.startswith("hold") for r in longer[:-1]), longer
    # The same rise from more arrivals (each sequence living 4 s) is load the pool holds.
    more = watch_decode([(40, 10.0, 0.15), (55, 13.8, 0.21), (90, 22.5, 0.36)])
    assert all(r.startswith("hold") for r in more), more
    # Lifetimes that jump once and fall back are noise, not longer outputs.
    noise = watch_decode([(40, 10.0, 0.15), (70, 9.0, 0.28), (60, 10.0, 0.24), (90, 9.5, 0.36)])
    assert all(r.startswith("hold") for r in noise), noise
    # So is a count that wanders 2.6 standard deviations (58 -> 90) at a steady 18 req/s.
    wander = watch_decode([(58, 18.0, 0.25), (70, 18.0, 0.33), (90, 17.8, 0.44)])
    assert all(r.startswith("hold") for r in wander), wander
    # Arrivals that step from 3 to 20 req/s: the count jumps at once, the rate (averaged
    # over a minute) follows, and the lifetime reads 0.9 -> 11 s. More arrivals are load
    # the count sizes as it comes, not outputs getting longer.
    step = watch_decode([(3, 3.3, 0.03), (10, 3.3, 0.05), (65, 5.7, 0.27)])
    assert all(r.startswith("hold") for r in step), step
    # Arrivals in bursts: for five minutes the count has swung between 40 and 90 every
    # half minute at the same 10 req/s. The rise that read as longer outputs above is one
    # more burst.
    swings = [(40.0, 10.0, 0.15), (40.0, 10.0, 0.15), (90.0, 10.0, 0.36), (90.0, 10.0, 0.36)]
    bursty = watch_decode(swings * 5 + [(40, 10.0, 0.15), (55, 10.0, 0.21), (90, 9.5, 0.36)])
    assert all(r.startswith("hold") for r in bursty), bursty


def test_a_count_that_turned_bursty_minutes_ago_is_not_read_as_longer_outputs() -> None:
    # Half an hour of a count that moves by a few sequences, then three minutes in which it
    # swings between 40 and 90 (a wave of long prompts backs prefill up, and its steps land
    # prompts on decode in bunches). Against the half hour's swing the rise below is beyond
    # noise; against the last minutes' it is one more bunch (chat wave 602 ordered a decode
    # replica for it twice, and gave it back each time).
    calm = [(38.0, 10.0, 0.14), (40.0, 10.0, 0.15), (42.0, 10.0, 0.16), (40.0, 10.0, 0.15)] * 28
    bunches = [(40.0, 10.0, 0.15), (40.0, 10.0, 0.15), (90.0, 10.0, 0.36), (90.0, 10.0, 0.36)]
    rise = [(40.0, 10.0, 0.15), (55.0, 10.0, 0.21), (90.0, 9.5, 0.36)]
    assert watch_decode(calm + rise)[-1].startswith("up 2"), watch_decode(calm + rise)[-1]
    bursty = watch_decode(calm + bunches * 3 + rise)
    assert all(r.startswith("hold") for r in bursty), [r for r in bursty if "hold" not in r]


def test_the_decode_headroom_follows_arrivals_not_lifetimes_that_rise() -> None:
    def decode_after(samples: list[tuple[float, float]]) -> str:
        # Two replicas whose KV cache holds 250 sequences each: the last decision.
        return watch_decode([(n, rate, n / 500) for n, rate in samples], replicas=2)[-1]

    # Over four minutes two replicas come to hold 400 sequences, from 150, at a steady 10
    # finished a second: each lives 40 s, from 15 s. A count that rises like this stops once
    # the lifetimes stop; extrapolated a provisioning delay ahead it read 1.37x, 546
    # sequences, and ordered a third replica of 212. The arrivals (finished plus the held
    # count's rise) are flat: 400 sequences with the rate's noise fit the two.
    longer = [(150 + 250 * i / 16, 10.0) for i in range(17)]
    held = decode_after(longer)
    assert held.startswith("hold 2"), held
    # The same count from arrivals rising from 3.75 to 10 a second, each living 40 s: that
    # is a trend, and the headroom still orders for it.
    more = [(150 + 250 * i / 16, (150 + 250 * i / 16) / 40) for i in range(17)]
    grown = decode_after(more)
    assert grown.startswith("up 3"), grown
    assert "headroom" in grown and "x 1.0" not in grown, grown


def test_outputs_lengthening_slowly_are_provisioned_for_one_delay_ahead() -> None:
    # 10 req/s whose outputs grow 7% every two minutes: the running count follows them, each
    # sequence 0.4% of the KV cache, so one replica holds 212 at 85%. On the count alone the
    # second replica is ordered when the count nears 212, seven minutes in; with the output
    # tokens generated per request, whose rise is carried one provisioning delay ahead, two
    # minutes sooner, when it arrives as the first replica fills.
    def first_order(generated: bool, p99: float = 0.01) -> tuple[float, str]:
        memory = PoolMemory()
        for step in range(40):
            t, growth = NOW + 15 * step, 1.07 ** (step / 8)
            extra: dict[str, object] = {"kv_usage": 0.004 * 162 * growth, "p99": p99}
            if generated:
                extra["generation_tokens_rate"] = 10.0 * 1000 * growth
            signals = decode(162 * growth, t, **extra)
            decision = decide_pool("decode", signals, 1, 1, DECODE, RULES, memory, None, t)
            if decision.action != "hold":
                return t - NOW, f"{decision.action} {decision.desired}: {decision.reason}"
        return math.inf, ""

    alone, _ = first_order(generated=False)
    sooner, reason = first_order(generated=True)
    assert (alone, sooner) == (420.0, 300.0)
    assert reason.startswith("up 2: scale up: load needs 2: 213 sequences"), reason
    assert "outputs 6.5% longer within 120s" in reason
    # A pool over its TPOT SLO (inside the dead band) may be saturated, its tokens per
    # request still climbing after an output shift: their trend is not carried ahead.
    assert first_order(generated=True, p99=0.042)[0] == 420.0
