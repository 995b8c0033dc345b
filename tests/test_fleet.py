"""Fleet simulator groundwork: queueing theory, determinism, the fitted model, the network."""

from __future__ import annotations

import pytest

from disagg.perf import NETWORKS, EngineShape, PrefillChunk, gpu_profile, model_profile, step_time
from disagg.sim.fleet import OPT13B_A100_TP1, FleetConfig, simulate
from disagg.sim.traffic import generate

H100_8B = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"))


@pytest.mark.parametrize("load", [0.3, 0.6])
def test_prefill_queue_matches_md1(load: float) -> None:
    # One prefill engine, one fixed-length prompt per step, Poisson arrivals: an M/D/1 queue,
    # whose mean time in system is D + R*D^2 / (2(1 - R*D)) (DistServe eq. 1).
    prompt = 2048
    service = step_time(H100_8B, [PrefillChunk(prompt)], [])
    rate = load / service
    requests = generate("chat", rate, 3000 / rate, seed=7, fixed=(prompt, 2))
    config = FleetConfig(
        "disaggregated",
        H100_8B,
        budget={"prefill": prompt, "decode": 2048},
        max_num_seqs=1,
        network=NETWORKS["ib400"],
    )
    result = simulate(config, requests)
    waits = [
        o.prefill_done - o.request.arrival for o in result.outcomes if o.prefill_done is not None
    ]
    expected = service + rate * service**2 / (2 * (1 - rate * service))
    assert len(waits) == len(requests)
    assert sum(waits) / len(waits) == pytest.approx(expected, rel=0.05)


def test_runs_are_deterministic_for_a_seed() -> None:
    requests = generate("code", 4.0, 60, seed=11)
    assert requests == generate("code", 4.0, 60, seed=11) and requests != generate(
        "code", 4.0, 60, seed=12
    )
    config = FleetConfig("colocated", H100_8B, replicas={"prefill": 0, "decode": 2})
    one, two = simulate(config, requests), simulate(config, requests)
    assert [o.first_token for o in one.outcomes] == [o.first_token for o in two.outcomes]


def test_fitted_model_is_distserve_arithmetic() -> None:
    # prefill 18.10 + 0.1019*512 + 7.12e-6*512^2 ms; decode 19.93 + 6.27e-4*(4*1000) + 0.0385*4 ms
    assert OPT13B_A100_TP1(H100_8B, [PrefillChunk(512)], []) == pytest.approx(
        (18.10 + 0.1019 * 512 + 7.12e-6 * 512**2) / 1000
    )
    assert OPT13B_A100_TP1(H100_8B, [], [1000] * 4) == pytest.approx(
        (19.93 + 6.27e-4 * 4000 + 0.0385 * 4) / 1000
    )


def test_a_slower_network_delays_the_first_token_of_disaggregated_requests() -> None:
    requests = generate("long-context", 0.5, 120, seed=5)
    ttft = {}
    for network in ("ib400", "tcp"):
        config = FleetConfig("disaggregated", H100_8B, network=NETWORKS[network])
        result = simulate(config, requests)
        ttft[network] = sum(o.ttft or 0 for o in result.outcomes) / len(result.outcomes)
    assert ttft["tcp"] > ttft["ib400"] * 1.2


def test_our_policy_follows_a_burst_that_static_provisioning_cannot() -> None:
    from disagg.autoscale.policy import Behavior, PoolPolicy
    from disagg.sim.fleet_policies import SloPolicy, StaticPolicy, ThresholdPolicy
    from disagg.sim.traffic import burst

    requests = generate("chat", 2.0, 600, seed=21, shape=burst(200, 200, 20.0))
    policies = {
        "prefill": PoolPolicy(2.0, 1, 8, 1),
        "decode": PoolPolicy(0.05, 1, 8, 1, max_num_seqs=64),
    }
    behavior = Behavior(up_cooldown=30, down_window=120, down_cooldown=60, stale_after=1e9)
    results = {}
    for policy in (StaticPolicy(), SloPolicy(policies, behavior), ThresholdPolicy(max_num_seqs=64)):
        config = FleetConfig(
            "disaggregated",
            H100_8B,
            network=NETWORKS["ib400"],
            policy=policy,
            max_num_seqs=64,
            provisioning_delay=60,
            interval=15,
            ttft_slo=2.0,
            tpot_slo=0.05,
        )
        results[policy.name] = simulate(config, requests)
    static, ours = results["static"], results["slo (ours)"]
    assert ours.scaling_actions > 0 and static.scaling_actions == 0
    assert max(s["decode_replicas"] + s["prefill_replicas"] for s in ours.timeline) > 2
    assert ours.attainment(2.0, 0.05)[2] > static.attainment(2.0, 0.05)[2]
    # It gives the GPUs back after the burst.
    assert ours.timeline[-1]["prefill_replicas"] + ours.timeline[-1]["decode_replicas"] < max(
        s["prefill_replicas"] + s["decode_replicas"] for s in ours.timeline
    )
