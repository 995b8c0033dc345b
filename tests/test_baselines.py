"""The baselines a policy is judged against, and what the fleet shows a policy."""

from __future__ import annotations

import dataclasses

import pytest

from disagg.perf import EngineShape, gpu_profile, model_profile
from disagg.sim.baselines import baselines, window_attainment
from disagg.sim.fleet import FleetConfig, PoolName, PoolStats, simulate
from disagg.sim.fleet_policies import SchedulePolicy
from disagg.sim.results import flaps
from disagg.sim.scenario import Scenario, build
from disagg.sim.traffic import Request, generate, step

H100_8B = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"))


def test_a_flap_is_a_scale_down_undone_within_five_minutes() -> None:
    log = [
        (0.0, "prefill", 1, 4),
        (400.0, "prefill", 4, 2),  # undone at 600: a flap
        (600.0, "prefill", 2, 3),
        (700.0, "decode", 3, 2),  # followed by a prefill scale-up only: not a flap
        (800.0, "prefill", 3, 4),
        (900.0, "prefill", 4, 2),  # undone after 500 s: new load, not a flap
        (1400.0, "prefill", 2, 3),
    ]
    assert flaps(log) == 1


def test_a_schedule_is_ordered_one_delay_ahead_and_shrinks_on_time() -> None:
    schedule: dict[PoolName, list[tuple[float, int]]] = {"prefill": [(0, 1), (300, 4), (600, 2)]}
    policy = SchedulePolicy(schedule, lead=120)
    idle = PoolStats(1, 1, None, None, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert [policy.desired("prefill", idle, t) for t in (0, 179, 180, 599, 600)] == [1, 1, 4, 4, 2]
    reactive = SchedulePolicy(schedule, lead=0)
    assert (
        reactive.desired("prefill", idle, 299) == 1 and reactive.desired("prefill", idle, 300) == 4
    )


def test_the_policy_sees_prefill_times_and_served_rates_like_an_engine_reports_them() -> None:
    seen: list[PoolStats] = []

    class Recorder:
        name = "recorder"

        def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
            if pool == "prefill":
                seen.append(stats)
            return stats.replicas

    requests = generate("chat", 4.0, 120, seed=3)
    config = FleetConfig("disaggregated", H100_8B, policy=Recorder())
    simulate(config, requests)
    late = [s for s in seen if s.prefill_seconds is not None]
    assert late, "no prefill times reported"
    stats = late[-1]
    assert 0 < stats.prefill_seconds < 1.0  # type: ignore[operator]
    assert stats.prefill_buckets[-1][1] == pytest.approx(
        max(count for _, count in stats.prefill_buckets)
    )
    assert 0 < stats.served_rate <= stats.request_rate * 1.5
    # The first look, at t=0, must not read one early request as a flood.
    assert seen[0].request_rate < 100


def test_static_oracle_and_ceiling_bracket_each_other_on_a_step() -> None:
    # Without the router's offloading: with it, the decode engine absorbs this step's
    # prompts and one prefill replica serves throughout.
    scenario = Scenario(
        model="llama-3.1-8b", workload="chat", rate=6, duration=900, shape="step",
        ttft=1.0, tpot=0.03, max_replicas=6, policy="static", offload_max_tokens=0,
    )  # fmt: skip
    requests = [
        Request(r.arrival, r.prompt_tokens, r.output_tokens)
        for r in generate("chat", 6, 900, seed=21, shape=step(300, 3.0))
    ]
    found = baselines(build(scenario), requests, target=0.99)
    static, oracle, ceiling = found["static"], found["oracle"], found["ceiling"]
    assert not isinstance(static, float) and not isinstance(oracle, float)
    assert isinstance(ceiling, float)
    # The best static size meets the target (or comes within half a point of the ceiling).
    assert static.attainment >= min(0.99, ceiling - 0.005)
    # The oracle is never more expensive than a fixed size, and meets each window's goal.
    assert oracle.gpu_hours <= static.gpu_hours + 1e-9
    assert oracle.attainment >= min(0.99, ceiling - 0.005) - 0.005
    # Before the step the oracle runs a smaller prefill pool than after it.
    sizes = dict(oracle.schedule["prefill"])
    assert sizes[0.0] < max(sizes.values())
    windows = window_attainment(oracle.result, scenario.ttft, scenario.tpot)
    assert sum(n for n, _ in windows.values()) == len(requests)
    # A smaller fixed size than the best static one misses the target.
    smaller = dict(static.schedule)
    pool: PoolName = "prefill" if smaller["prefill"][0][1] > 1 else "decode"
    if smaller[pool][0][1] > 1:
        config = build(scenario)
        config = dataclasses.replace(
            config, replicas={**config.replicas, **{p: v[0][1] for p, v in smaller.items()},
                              pool: smaller[pool][0][1] - 1},
        )  # fmt: skip
        result = simulate(config, requests)
        assert result.attainment(scenario.ttft, scenario.tpot)[2] < min(0.99, ceiling - 0.005)
