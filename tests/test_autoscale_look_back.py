"""The scale-down look-back: how long a pool keeps what a burst took before shrinking, learned
from flaps, surges and bursts' ends, shared by both pools, and forgotten when bursts stop."""

from __future__ import annotations

import math
import random
import re

import pytest

from disagg.autoscale.look_back import share_look_back
from disagg.autoscale.memory import LOOK_BACK_MEMORY
from disagg.autoscale.policy import Decision, PoolMemory, decide_pool
from test_autoscale_load import DECODE, NOW, PREFILL, RULES, decode, prefill


def test_a_scale_down_undone_within_five_minutes_lengthens_the_look_back() -> None:
    memory = PoolMemory()
    memory.scaled(NOW, up=False, configured=300)
    memory.scaled(NOW + 200, up=True, configured=300)
    assert memory.down_window == 600
    memory.scaled(NOW + 1000, up=False, configured=300)
    memory.scaled(NOW + 1100, up=True, configured=300)
    assert memory.down_window == 1200  # at most 4x the configured window
    memory.scaled(NOW + 2000, up=False, configured=300)
    memory.scaled(NOW + 2100, up=True, configured=300)
    assert memory.down_window == 1200
    # A scale-up long after the scale-down is new load, not a flap.
    fresh = PoolMemory()
    fresh.scaled(NOW, up=False, configured=300)
    fresh.scaled(NOW + 900, up=True, configured=300)
    assert fresh.down_window == 0


def test_a_burst_that_returns_is_held_for_as_long_as_it_took_to_return() -> None:
    # Bursts 11 minutes apart: the pool grew for one, shrank 9 minutes later and the next
    # burst undid that. Doubling the 5-minute look-back would shrink it 10 minutes after
    # this burst, just before the one after; it now holds for the 11 minutes the load took
    # to return plus the two a new replica takes to serve.
    memory = PoolMemory(provisioning=120.0)
    memory.scaled(NOW, up=True, configured=300)
    memory.scaled(NOW + 540, up=False, configured=300)
    memory.scaled(NOW + 660, up=True, configured=300)
    assert memory.down_window == 660 + 120
    # Never past 4x the configured window.
    memory.scaled(NOW + 700, up=False, configured=300)
    memory.scaled(NOW + 1800, up=True, configured=300)
    memory.scaled(NOW + 1900, up=False, configured=300)
    memory.scaled(NOW + 2000, up=True, configured=300)
    assert memory.down_window == 1200


def test_a_look_back_one_pool_learned_holds_the_other_pool_too() -> None:
    # The prefill pool learned that bursts come back 11 minutes apart (13 minutes of
    # look-back). Every request passes through both pools: the decode pool, which has
    # not flapped itself, now holds its burst size as long instead of shrinking after the
    # configured 5 minutes, just before the next burst.
    def first_shrink(prefill_memory: PoolMemory) -> float:
        memory, t = PoolMemory(), NOW
        while t < NOW + 1200:
            share_look_back([prefill_memory, memory])
            signals = decode(100.0, t, kv_usage=0.2)
            decision = decide_pool("decode", signals, 3, 3, DECODE, RULES, memory, None, t)
            if decision.action == "down":
                return t - NOW
            t += 15
        return math.inf

    assert first_shrink(PoolMemory()) == 300
    assert first_shrink(PoolMemory(down_window=780)) == 780


def prefill_timeline(rates: list[float], replicas: int) -> list[tuple[float, int, Decision]]:
    """(seconds, replicas before, decision) of each resize of a prefill pool whose arrivals
    follow ``rates`` (one per 15 s evaluation); replicas serve as soon as they are ordered."""
    memory, resizes, last_scale = PoolMemory(prefill_speed=10_000), [], None
    for step, rate in enumerate(rates):
        t = NOW + 15 * step
        signals = prefill(0.3, rate, at=t)
        decision = decide_pool(
            "prefill", signals, replicas, replicas, PREFILL, RULES, memory, last_scale, t
        )
        if decision.desired != replicas:
            resizes.append((15.0 * step, replicas, decision))
            replicas, last_scale = decision.desired, t
    return resizes


def test_a_scale_up_for_a_surge_holds_what_it_ordered_for_three_look_backs() -> None:
    # 10 minutes at 8 req/s, a 3-minute burst at 30, then 8 again: the burst may come back
    # a few minutes later, so the pool it grew is kept 15 minutes, not the spec's 5, and
    # the scale-up says so (it is the first flap, not the second, that is avoided).
    rates = [8.0] * 40 + [30.0] * 12 + [8.0] * 120
    resizes = prefill_timeline(rates, 2)
    ups = [(t, d) for t, _, d in resizes if d.action == "up"]
    downs = [(t, d) for t, _, d in resizes if d.action == "down"]
    assert ups and "a surge: held 900s before scaling down" in ups[0][1].reason, ups
    assert "arrivals 3.8x their level 120-240s ago" in ups[0][1].reason
    last_high = 15 * 51  # the burst's last evaluation
    assert downs and downs[0][0] >= last_high + 900 - 15, downs
    # The same rise spread over 20 minutes is a trend, not a surge: the spec's look-back.
    ramp = [8.0 + 22.0 * min(1.0, i / 80) for i in range(100)] + [8.0] * 60
    resizes = prefill_timeline(ramp, 2)
    assert all("surge" not in d.reason for _, _, d in resizes), resizes
    first_down = next(t for t, _, d in resizes if d.action == "down")
    assert first_down <= 15 * 100 + 300 + 15, resizes


def test_a_burst_the_held_pool_absorbs_holds_it_again() -> None:
    # A burst at 30 req/s grew the pool to 3 and holds it 15 minutes. Eleven minutes later a
    # smaller burst (14 req/s, which 2 replicas would serve) comes while the 3 are held: they
    # absorb it within the SLO. Bursts keep coming, so the 3 are held for 15 minutes from the
    # second one: before, it was given back 15 minutes after the first, just before the
    # next burst came (a flap, and that burst's misses).
    rates = [8.0] * 40 + [30.0] * 12 + [8.0] * 40 + [14.0] * 8 + [8.0] * 120
    resizes = prefill_timeline(rates, 2)
    absorbed = 15 * 93  # the second burst's second evaluation: its rate is read over a minute
    (down,) = [(t, d) for t, _, d in resizes if d.action == "down"]
    assert down[0] >= absorbed + 900, resizes
    # Only a burst on steady traffic counts: the same arrivals coming back after a dip (the
    # router sending short prompts to decode while a backlog waited at prefill) are not one.
    memory = PoolMemory(provisioning=120.0)
    dipped = [8.0] * 12 + [3.0] * 6 + [8.0] * 3
    for step, rate in enumerate(dipped):
        memory.note_arrivals(NOW + 15 * step, rate, window=60.0)
    assert not memory.over_steady(NOW + 15 * (len(dipped) - 1))
    steady = [8.0] * 18 + [14.0]
    for step, rate in enumerate(steady):
        memory.note_arrivals(NOW + 1000 + 15 * step, rate, window=60.0)
    assert memory.over_steady(NOW + 1000 + 15 * (len(steady) - 1))


def test_each_replica_s_start_is_timed_from_its_own_order() -> None:
    """Replicas take 300 s to start, evaluations run every 15 s. A second scale-up ordered
    150 s into the first read 450 s when the pool's start was timed from its first order to
    its last arrival (and surges were then read against arrivals 15 minutes old); each timed
    from the evaluation that first saw it ordered reads 285 s both times."""
    memory = PoolMemory()
    memory.track(NOW, None, 1, 1)
    memory.track(NOW + 15, None, 2, 1)
    memory.track(NOW + 165, None, 3, 1)
    assert memory.starting_since == NOW + 15
    memory.track(NOW + 300, None, 3, 2)
    assert memory.provisioning == 285 and memory.starting_since == NOW + 165
    memory.track(NOW + 450, None, 3, 3)
    assert memory.provisioning == 285 and memory.starting_since is None
    # Two ordered at once, one cancelled by a scale-down a minute later: the other is timed
    # from the order, not from the cancellation.
    memory.track(NOW + 600, None, 5, 3)
    memory.track(NOW + 660, None, 4, 3)
    memory.track(NOW + 720, None, 4, 3)
    memory.track(NOW + 900, None, 4, 4)
    assert memory.provisioning == 300 and memory.orders == []
    # A pod restarting after a crash is no order: its 30 s back is not a replica's start.
    memory.track(NOW + 915, None, 4, 3)
    memory.track(NOW + 945, None, 4, 4)
    assert memory.provisioning == 300 and memory.starting_since is None


def test_arrivals_starting_or_rising_slowly_are_no_surge() -> None:
    def surge_after(rates: list[float]) -> float | None:
        memory = PoolMemory(provisioning=120.0)
        for step, rate in enumerate(rates):
            memory.note_arrivals(NOW + 15 * step, rate, window=60.0)
        return memory.surge(NOW + 15 * (len(rates) - 1), window=60.0)

    # Traffic starting: the first reading of a rate window that began before it is low (here
    # nothing), and one tripling of what followed is the window filling, not a burst.
    assert surge_after([0.0] * 8 + [10.0] * 9) is None
    assert surge_after([0.0, 5.0] + [10.0] * 14 + [30.0]) is None
    # Nor is a jump before the history reaches back two provisioning delays.
    assert surge_after([10.0] * 10 + [30.0]) is None
    # 10 -> 14 req/s over four minutes is a trend; 20 after it is half again the level one
    # to two delays before.
    rising = [10.0 + 0.25 * step for step in range(17)]
    assert surge_after(rising) is None
    before = [10.0 + 0.25 * step for step in range(1, 9)]
    assert surge_after([*rising, 20.0]) == pytest.approx(20.0 / (sum(before) / len(before)))
    # A steady pool whose traffic triples is surging.
    assert surge_after([10.0] * 21 + [30.0]) == pytest.approx(3.0)


def test_a_pool_does_not_shrink_while_its_arrivals_keep_rising() -> None:
    # 6 replicas, arrivals rising 4 -> 8 req/s over 10 minutes (never half again within two
    # minutes: no surge), then flat. The load needs fewer replicas all along, but what a
    # scale-down sheds during the rise is back within a provisioning delay: it waits for
    # the arrivals to level off.
    rates = [4.0 + 4.0 * step / 40 for step in range(40)] + [8.0] * 40
    memory, replicas, holds, downs, said = PoolMemory(prefill_speed=10_000), 6, [], [], []
    for step, rate in enumerate(rates):
        t = NOW + 15 * step
        decision = decide_pool(
            "prefill", prefill(0.3, rate, at=t), replicas, replicas, PREFILL, RULES, memory,
            None, t,
        )  # fmt: skip
        if "arrivals rising" in decision.reason:
            holds.append(15 * step)
            said.append(decision.reason.split("; ")[-1])
        if decision.action == "down":
            downs.append(15 * step)
            replicas = decision.desired
    assert downs and 600 <= downs[0] <= 600 + 2 * 120, downs
    assert holds and holds[0] <= RULES.down_window and max(holds) < downs[0], holds
    # The hold says by how much: the ramp adds 0.8 req/s per 120 s delay, 10-20% of the
    # 4-8 req/s it climbs through; as it levels off, the rise fitted over two delays fades.
    first = re.fullmatch(r"arrivals rising: (\d+\.\d)% more within 120s, not scaling down", said[0])
    assert first and 10 <= float(first[1]) <= 20, said
    assert said[-1] == "arrivals rising: under 0.1% more within 120s, not scaling down", said


def decode_timeline(
    rates: list[float], replicas: int = 1, **extra: object
) -> tuple[list[tuple[float, int, Decision]], list[Decision], PoolMemory]:
    """(resizes, every decision, memory) of a decode pool whose arrivals follow ``rates`` (one
    per 15 s evaluation), each sequence living 20 s; replicas serve as soon as ordered."""
    memory, resizes, decisions, last_scale = PoolMemory(), [], [], None
    for step, rate in enumerate(rates):
        t = NOW + 15 * step
        signals = decode(20 * rate, t, request_rate=rate, **extra)
        decision = decide_pool(
            "decode", signals, replicas, replicas, DECODE, RULES, memory, last_scale, t
        )
        decisions.append(decision)
        if decision.desired != replicas:
            resizes.append((15.0 * step, replicas, decision))
            replicas, last_scale = decision.desired, t
    return resizes, decisions, memory


def test_traffic_that_stops_for_a_whole_look_back_gives_the_burst_back_sooner() -> None:
    # A burst ends and nothing more arrives. A burst's end holds 900 s (the pause before
    # the next burst), but a pool idle for the spec's whole 300 s look-back has seen traffic
    # stop: it shrinks then, and says why.
    resizes, _, _ = decode_timeline([8.0] * 4 + [30.0] * 12 + [0.0] * 100)
    downs = [(t, d) for t, _, d in resizes if d.action == "down"]
    assert downs and downs[0][0] == 15 * 16 + RULES.down_window, resizes
    assert downs[0][1].reason == (
        "scale down: idle; idle 300s, so the spec's 300s look-back and not the learned 900s"
    )
    # A pause shorter than that is between bursts: the learned look-back holds through it.
    resizes, _, _ = decode_timeline([8.0] * 4 + [30.0] * 12 + [0.0] * 13 + [30.0] * 12)
    assert [d.action for _, _, d in resizes] == ["up"], resizes


def test_a_burst_that_ends_is_held_for_three_look_backs_even_if_it_came_too_early_to_read() -> None:
    # A 3-minute burst one minute into the pool's life: too early for the history to tell a
    # surge from traffic starting, so it grows the pool on the configured look-back. When it
    # ends (30 -> 8 req/s, far beyond what the rate's noise moves), the decode pool reads
    # a burst's end and keeps what it took 15 minutes, so a second burst 8 minutes later
    # finds it: no flap.
    rates = [8.0] * 4 + [30.0] * 12 + [8.0] * 32 + [30.0] * 12 + [8.0] * 100
    resizes, decisions, _ = decode_timeline(rates)
    ups = [t for t, _, d in resizes if d.action == "up"]
    downs = [t for t, _, d in resizes if d.action == "down"]
    assert len(ups) == 1 and "surge" not in resizes[0][2].reason, resizes
    ended = [d.reason for d in decisions if "a burst's end" in d.reason]
    assert ended and "held 900s before scaling down" in ended[0], ended
    assert any("stabilizing scale-down over a learned 900s" in d.reason for d in decisions)
    last_high = 15 * 59  # the second burst's last evaluation
    assert downs and downs[0] >= last_high + 900 - 15, resizes
    # The look-back a burst's end sets: three configured ones, renewed as it is read.
    fresh = PoolMemory()
    fresh.hold_burst(NOW, configured=300)
    assert fresh.down_window == 900 and fresh.learned_at == NOW


def test_a_slow_fall_a_busy_pool_or_the_prefill_pool_reads_no_burst_end() -> None:
    # Falling from 30 to 8 req/s over 20 minutes is a trend: the spec's look-back.
    decline = [30.0] * 20 + [30.0 - 22.0 * min(1.0, i / 80) for i in range(120)]
    resizes, decisions, memory = decode_timeline(decline, replicas=3)
    assert memory.down_window == 0 and all("burst" not in d.reason for d in decisions)
    assert any(d.action == "down" for _, _, d in resizes), resizes
    # A pool at its maximum, over its SLO, whose queue grows while the requests it finishes
    # fall is not seeing a burst end: it is what the pool takes that fell, not what arrives
    # (what it holds, running and waiting, rises).
    memory = PoolMemory()
    for step in range(40):
        t, rate = NOW + 15 * step, 30.0 if step < 20 else 8.0
        signals = decode(600.0, t, request_rate=rate, p99=0.08, queue=50.0 + 20 * step)
        decision = decide_pool("decode", signals, 16, 16, DECODE, RULES, memory, None, t)
        assert "burst" not in decision.reason, decision.reason
    assert memory.down_window == 0
    # What a prefill pool finishes falls too when long prompts back it up and the router
    # offloads short ones to decode engines: it reads no burst's end (the decode pool,
    # where every request ends, does) and shrinks on the spec's look-back.
    resizes = prefill_timeline([30.0] * 20 + [8.0] * 60, 4)
    assert all("burst" not in d.reason for _, _, d in resizes), resizes
    assert resizes[0][0] <= 15 * 20 + 300, resizes


def test_a_learned_look_back_halves_after_an_hour_without_a_burst() -> None:
    memory = PoolMemory()
    memory.hold_burst(NOW, configured=300)
    assert memory.forget(NOW + LOOK_BACK_MEMORY - 1, configured=300) is None
    # A burst's end (or a surge, or a flap) renews it.
    memory.hold_burst(NOW + 3000, configured=300)
    assert memory.forget(NOW + 3000 + LOOK_BACK_MEMORY - 1, configured=300) is None
    assert memory.forget(NOW + 3000 + LOOK_BACK_MEMORY, configured=300) == 900
    assert memory.down_window == 450
    # An hour more and half of it is no longer than the spec's: the spec's again.
    assert memory.forget(NOW + 3000 + 2 * LOOK_BACK_MEMORY, configured=300) == 450
    assert memory.down_window == 0
    assert memory.forget(NOW + 3000 + 5 * LOOK_BACK_MEMORY, configured=300) is None
    flapped = PoolMemory()
    flapped.scaled(NOW, up=False, configured=300)
    flapped.scaled(NOW + 200, up=True, configured=300)
    assert flapped.down_window == 600 and flapped.learned_at == NOW + 200
    # The decision that forgets says so.
    memory = PoolMemory(down_window=900, learned_at=NOW - LOOK_BACK_MEMORY)
    decision = decide_pool("decode", decode(100.0, NOW), 1, 1, DECODE, RULES, memory, None, NOW)
    assert "look-back 900 -> 450s: no flap, surge or burst's end for 3600s" in decision.reason


def test_both_pools_forget_a_shared_look_back_together() -> None:
    # The decode pool read a burst's end and the prefill pool took its look-back. Whether
    # the look-back is shared before each pool's evaluation (the simulator) or once before
    # both (the operator), an hour on it halves once for both pools, and an hour later it
    # is the spec's again, each pool's decision saying so once.
    for shared_per_pool in (True, False):
        memories = {"prefill": PoolMemory(), "decode": PoolMemory()}
        memories["decode"].hold_burst(NOW, configured=300)
        said: list[tuple[float, str]] = []
        for step in range(4 * 240 + 1):
            t = NOW + 15 * step
            if not shared_per_pool:
                share_look_back(memories.values())
            for pool, signals in (
                ("prefill", prefill(0.3, 8.0, at=t)),
                ("decode", decode(80.0, t)),
            ):
                if shared_per_pool:
                    share_look_back(memories.values())
                policy = PREFILL if pool == "prefill" else DECODE
                decision = decide_pool(pool, signals, 1, 1, policy, RULES, memories[pool], None, t)
                if "look-back" in decision.reason:
                    said.append((t - NOW, decision.reason.split("; ")[-1]))
            if step == 240 - 1 or step == 480 - 1 or step == 4 * 240:
                share_look_back(memories.values())
                look_backs = {memory.down_window for memory in memories.values()}
                assert look_backs == {900 if step < 240 else 450 if step < 480 else 0}, step
        message = "look-back {} -> {}s: no flap, surge or burst's end for 3600s"
        hours = [(3600.0, message.format(900, 450)), (7200.0, message.format(450, 300))]
        assert sorted(set(said)) == hours, (shared_per_pool, said)
        assert len(said) <= 4, said


def test_outputs_getting_longer_are_no_burst_end() -> None:
    # A decode pool counts the requests it finishes: when outputs quadruple, 10 req/s keep
    # arriving but a fourth as many finish for a while, as after a burst. The sequences it
    # holds rise instead of falling: no burst's end.
    memory = PoolMemory()
    for step in range(40):
        t = NOW + 15 * step
        finished, running = (10.0, 40.0) if step < 20 else (2.5, 40.0 + 6 * (step - 19))
        signals = decode(running, t, request_rate=finished)
        decision = decide_pool("decode", signals, 4, 4, DECODE, RULES, memory, None, t)
        assert "burst" not in decision.reason, decision.reason
    assert memory.down_window == 0


def test_a_backlog_draining_is_no_burst_end() -> None:
    # 10 req/s arrive throughout, each sequence living 20 s. For four minutes the pool
    # finishes only 6 a second and a queue builds; new replicas then drain it in two minutes
    # (18 finish a second) and the pool settles back at 10. What it finished fell from 18 to
    # 10, and what it holds fell with it, as at a burst's end: but what it held fell by as
    # much as it finished more, so nothing more arrived and nothing ended.
    def finishing(step: int) -> float:
        return 10.0 if step < 20 else 6.0 if step < 36 else 18.0 if step < 44 else 10.0

    memory, queue, finished, backlogs = PoolMemory(), 0.0, [], []
    for step in range(100):
        t = NOW + 15 * step
        finished.append(finishing(step))
        queue = max(0.0, queue + (10.0 - finished[-1]) * 15)
        backlogs.append(queue)
        # The engines' rate is read over the rate window (RULES: 60 s, four evaluations).
        rate = sum(finished[-4:]) / len(finished[-4:])
        signals = decode(200.0, t, request_rate=rate, queue=queue)
        decision = decide_pool("decode", signals, 4, 4, DECODE, RULES, memory, None, t)
        assert "burst" not in decision.reason and "surge" not in decision.reason, (t, decision)
    assert max(backlogs) == 960 and backlogs[-1] == 0
    assert memory.down_window == 0
    # The same backlog draining into the running sequences (the queue was already empty)
    # reads the same: what the pool holds counts running sequences too.
    memory = PoolMemory()
    memory.queue_growth(NOW, 0.0, 60.0, running=500.0)
    growing = memory.queue_growth(NOW + 60, 0.0, 60.0, running=200.0)
    assert memory.arrived(15.0, growing) == pytest.approx(10.0)
    # Without a running count, the queue's change alone.
    memory = PoolMemory()
    memory.queue_growth(NOW, 300.0, 60.0)
    assert memory.arrived(15.0, memory.queue_growth(NOW + 60, 0.0, 60.0)) == pytest.approx(10.0)


def test_traffic_stopping_holds_the_pool_as_a_burst_end_and_says_so() -> None:
    # Traffic that stops may start again in minutes or not at all: nothing tells which, so
    # what the pool holds is kept three look-backs like any burst's end, and the reason
    # says the arrivals fell to nothing (not to 1/inf).
    _, decisions, memory = decode_timeline([10.0] * 20 + [0.0] * 4, replicas=2)
    assert memory.down_window == 900
    assert "arrivals fell to nothing from their level 120-240s ago" in decisions[-1].reason


def test_arrivals_wandering_with_their_own_noise_are_no_surge_and_no_burst_end() -> None:
    # 0.5 req/s read over a minute: the count's noise moves the rate by half within minutes,
    # up or down, but never by five of its standard deviations.
    rng, counts, memory, jumps = random.Random(11), [], PoolMemory(), []
    for step in range(2000):
        counts.append(sum(rng.random() < 0.5 for _ in range(15)))
        t = NOW + 15 * step
        rate = sum(counts[-4:]) / 60
        memory.track(t, 20 * rate, 1, 1)
        memory.note_arrivals(t, rate, window=60.0)
        jumps += [jump for jump in (memory.surge(t, 60.0), memory.plunge(t, 60.0)) if jump]
    assert jumps == []
