"""Fleet simulator groundwork: queueing theory, determinism, the fitted model, the network."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from disagg.perf import NETWORKS, EngineShape, PrefillChunk, gpu_profile, model_profile, step_time
from disagg.perf.fitted import DISTSERVE_OPT13B_A100
from disagg.sim.fleet import FleetConfig, simulate
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
    tp1 = EngineShape(model_profile("opt-13b"), gpu_profile("a100"))
    fitted = DISTSERVE_OPT13B_A100
    assert fitted(tp1, [PrefillChunk(512)], []) == pytest.approx(
        (18.10 + 0.1019 * 512 + 7.12e-6 * 512**2) / 1000
    )
    assert fitted(tp1, [], [1000] * 4) == pytest.approx(
        (19.93 + 6.27e-4 * 4000 + 0.0385 * 4) / 1000
    )
    # From a batch of 95 on, DistServe's second decode fit applies.
    assert fitted(tp1, [], [100] * 95) == pytest.approx((7.17 + 5.80e-4 * 9500 + 0.158 * 95) / 1000)
    with pytest.raises(ValueError, match="not TP 8"):
        fitted(EngineShape(tp1.model, tp1.gpu, tp=8), [], [1])


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

    requests = generate("chat", 2.0, 1200, seed=21, shape=burst(200, 200, 20.0))
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
    # It gives the GPUs back after the burst (once it has held them for a return of it).
    assert ours.timeline[-1]["prefill_replicas"] + ours.timeline[-1]["decode_replicas"] < max(
        s["prefill_replicas"] + s["decode_replicas"] for s in ours.timeline
    )


@pytest.mark.parametrize("load", [0.3, 0.5, 0.7])
def test_a_busy_prefill_replica_learns_what_it_computes_when_its_step_budget_is_known(
    load: float,
) -> None:
    from disagg.autoscale.policy import Behavior, PoolPolicy
    from disagg.sim.fleet_policies import SloPolicy

    # What one replica serves saturated: a flood of chat prompts, all of it queued at once.
    flood = generate("chat", 400.0, 4, seed=5)
    saturated = simulate(
        FleetConfig("disaggregated", H100_8B, replicas={"prefill": 1, "decode": 8}), flood
    )
    finished = [o for o in saturated.outcomes if o.prefill_done is not None]
    span = max(o.prefill_done or 0.0 for o in finished) - min(o.request.arrival for o in finished)
    capacity = sum(o.request.prompt_tokens for o in finished) / span
    mean_prompt = sum(r.prompt_tokens for r in flood) / len(flood)
    policy = SloPolicy(
        {
            "prefill": PoolPolicy(10.0, 1, 1, 1, step_tokens=8192),
            "decode": PoolPolicy(1.0, 1, 8, 1),
        },
        Behavior(stale_after=1e9),
    )
    requests = generate("chat", load * capacity / mean_prompt, 300, seed=6)
    config = FleetConfig(
        "disaggregated", H100_8B, replicas={"prefill": 1, "decode": 2}, policy=policy
    )
    simulate(config, requests)
    learned = policy.memory("prefill")
    # Short prompts share steps, so each reads slow alone while the replica is busy but not
    # saturated: the cautious speed is a fifth to two fifths low, the batched one is not.
    assert 0.9 <= (learned.batched_speed or 0.0) / capacity <= 1.1
    assert (learned.prefill_speed or 0.0) / capacity < 0.85


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_decode_runs_give_the_same_results_as_stepping_one_by_one(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import disagg.sim.fleet as fleet

    requests = generate("chat", 6.0, 120, seed=4)
    config = FleetConfig(
        mode,  # type: ignore[arg-type]
        H100_8B,
        replicas={"prefill": 1, "decode": 2},
        network=NETWORKS["ib400"],
    )
    fast = simulate(config, requests)
    monkeypatch.setattr(fleet, "RUN_LOOKAHEAD", 1)
    slow = simulate(config, requests)
    assert [(o.first_token, o.last_token, o.tokens) for o in fast.outcomes] == [
        (o.first_token, o.last_token, o.tokens) for o in slow.outcomes
    ]
    assert all(o.tokens == o.request.output_tokens for o in fast.outcomes)


def test_prefill_first_scheduling_pauses_every_decode_while_prompts_wait() -> None:
    from disagg.sim.scheduler import Scheduler, SimRequest

    scheduler = Scheduler(H100_8B, 4096, 16, 100_000, prefill_first=True)
    first = SimRequest("a", 100, 10)
    scheduler.add(first)
    scheduler.complete(scheduler.plan())  # prompt a, first token
    scheduler.add(SimRequest("b", 300, 10))
    scheduler.add(SimRequest("c", 200, 10))
    step = scheduler.plan()
    # Whole prompts b and c together, and a (decoding) waits for them.
    assert [(r.id, n) for r, n in step.chunks] == [("b", 300), ("c", 200)] and not step.decodes
    scheduler.complete(step)
    assert [r.id for r in scheduler.plan().decodes] == ["a", "b", "c"]


def test_dynamo_planner_sizes_pools_from_rate_and_holds_between_adjustments() -> None:
    from disagg.perf import kv_capacity_tokens
    from disagg.sim.fleet import PoolStats
    from disagg.sim.fleet_policies import ThroughputPlannerPolicy

    def stats(rate: float, replicas: int = 1) -> PoolStats:
        return PoolStats(replicas, replicas, None, None, 0, 0, 0.0, rate, rate * 2000, 2000, 200)

    planner = ThroughputPlannerPolicy(
        step_time,
        {"prefill": H100_8B, "decode": H100_8B},
        {"prefill": kv_capacity_tokens(H100_8B), "decode": kv_capacity_tokens(H100_8B)},
        ttft_target=1.0,
        itl_target=0.02,
        interval=180,
    )
    # One 2000-token prompt takes step_time(2000) alone: prefill engines = rate * that.
    alone = step_time(H100_8B, [PrefillChunk(2000)], [])
    assert planner.desired("prefill", stats(20.0), now=0) == math.ceil(20 * alone)
    low, high = planner.desired("decode", stats(5.0), 0), None
    assert planner.desired("decode", stats(500.0), now=60) == low  # holds until 180 s pass
    high = planner.desired("decode", stats(500.0), now=180)
    assert high > 10 * low


def test_the_simulated_operator_reads_its_p99s_as_prometheus_does() -> None:
    from disagg.autoscale.model import Behavior, PoolPolicy
    from disagg.perf.buckets import ITL_BUCKETS, TTFT_BUCKETS
    from disagg.sim.fleet import PoolStats
    from disagg.sim.fleet_policies import SloPolicy
    from disagg.sim.results import reported_p99

    # 98 prompts at 0.9 s and 2 at 1.2 s: the exact p99 is 1.2 s; histogram_quantile places
    # it inside vLLM's 1-2.5 s bucket by how many passed 1 s.
    assert reported_p99([(0.9, 1.0)] * 98 + [(1.2, 1.0)] * 2, TTFT_BUCKETS) == pytest.approx(1.75)
    # Every gap between two tokens is an observation: one long stream at 60 ms outweighs 99
    # short ones at 20 ms, which a p99 of the requests' means would read as 20 ms.
    streams = [(0.02, 10.0)] * 99 + [(0.06, 500.0)]
    assert reported_p99(streams, ITL_BUCKETS) == pytest.approx(0.05 + 0.025 * 485.1 / 500)
    assert reported_p99([], TTFT_BUCKETS) is None

    # The policy the simulator runs for the operator is given the reported p99, not the exact.
    policy = SloPolicy(
        {"prefill": PoolPolicy(slo=1.0, min_replicas=1, max_replicas=8, gpus_per_replica=1)},
        Behavior(up_cooldown=0),
    )
    stats = PoolStats(
        2, 2, 0.5, None, 0, 0, 0.0, 5.0, 10_000, 2000, 200, served_rate=5.0, ttft_reported=1.75
    )
    assert policy.desired("prefill", stats, now=100) == 3


def test_simulate_cli_writes_a_summary_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from disagg.cli import main

    out = tmp_path / "run"
    argv = ["simulate", "--workload", "code", "--rate", "3", "--duration", "300", "--shape", "burst",
            "--policy", "dynamo", "--provisioning-delay", "30", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "GPU-hours" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 500 and 0 <= summary["attainment"]["both"] <= 1
    assert summary["scenario"]["policy"] == "dynamo" and summary["latencyByMinute"]
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "--rate", "-1"]) == 1
    assert main(["simulate", "--model", "gpt-9"]) == 1
    err = capsys.readouterr().err
    assert "--rate must be greater than zero" in err and "unknown model profile 'gpt-9'" in err
    argv = ["simulate", "--offload-max-tokens", "-5", "--offload-wait-fraction", "0"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--offload-max-tokens must be >= 0" in err
    assert "--offload-wait-fraction must be a positive finite number" in err


def test_the_summary_says_which_pool_the_gpu_hours_went_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from disagg.cli import main

    out = tmp_path / "run"
    argv = ["simulate", "--rate", "2", "--duration", "600", "--policy", "static",
            "--prefill-replicas", "3", "--prefill-tp", "1", "--decode-replicas", "1",
            "--decode-tp", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    hours = summary["durationSeconds"] / 3600
    # Three one-GPU prefill replicas against one two-GPU decode replica, for the whole run.
    by_pool = summary["gpuHoursByPool"]
    assert by_pool["prefill"] == pytest.approx(3 * hours, rel=1e-3)
    assert by_pool["decode"] == pytest.approx(2 * hours, rel=1e-3)
    assert by_pool["prefill"] + by_pool["decode"] == pytest.approx(summary["gpuHours"], abs=2e-3)
    printed = capsys.readouterr().out
    assert f"prefill {by_pool['prefill']:.2f}, decode {by_pool['decode']:.2f}" in printed


def test_the_simulated_engines_count_the_output_tokens_they_generate() -> None:
    from disagg.sim.fleet import PoolName, PoolStats
    from disagg.sim.traffic import Request

    # 4 req/s of 200-token outputs, every 0.25 s: the decode pool generates 800 tokens/s
    # once the first minute's window is full; the prefill pool generates none of them.
    seen: dict[PoolName, list[float | None]] = {"prefill": [], "decode": []}

    class Watch:
        def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
            if 90 <= now <= 240:  # the window full, arrivals still coming
                seen[pool].append(stats.generation_tokens_rate)
            return stats.replicas

    requests = [Request(0.25 * i, 1000, 200) for i in range(4 * 240)]
    simulate(FleetConfig("disaggregated", H100_8B, policy=Watch()), requests)
    assert seen["decode"] and all(r == pytest.approx(800, rel=0.05) for r in seen["decode"])
    assert set(seen["prefill"]) == {0.0}


def test_a_colocated_pool_is_sized_for_its_ttft_as_well_as_its_tpot() -> None:
    # As the operator sizes it: the larger of what each phase asks. 8B long-context prompts at
    # 2 req/s queue for prefill on one engine well before its decode steps slow; sized on its
    # TPOT alone the pool stopped at two engines and 2-3% of prompts came late.
    from disagg.sim.scenario import Scenario, build, requests_for

    scenario = Scenario(
        mode="colocated", workload="long-context", rate=2.0, duration=900, policy="ours",
        decode_replicas=1, ttft=3.0, tpot=0.2, seed=3,
    )  # fmt: skip
    result = simulate(build(scenario), requests_for(scenario))
    settled = [o for o in result.outcomes if o.request.arrival > scenario.duration / 2]
    on_time = [o for o in settled if o.ttft is not None and o.ttft <= scenario.ttft]
    assert len(on_time) / len(settled) >= 0.99
    assert result.attainment(scenario.ttft, scenario.tpot)[1] >= 0.99
