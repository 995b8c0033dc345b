"""`disagg diagnose`: the verdict rules, the chunk-budget advice, and the command's errors."""

from __future__ import annotations

import json
import math
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from disagg.cli import build_parser, main
from disagg.diagnose import cli as diagnose_cli
from disagg.diagnose.advice import EngineFacts, Traffic, best_budget, next_step
from disagg.diagnose.cli import _settings
from disagg.diagnose.report import to_json, to_text
from disagg.diagnose.series import Step, Timeline, by_role, range_queries, timeline
from disagg.diagnose.verdict import diagnose
from disagg.perf import EngineShape, gpu_profile, model_profile
from disagg.slo import Slo

SLO = Slo(ttft=2.0, tpot=0.05)
H100_8B = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"))
FACTS = EngineFacts(H100_8B, 8192, "llama-3.1-8b", "h100")


def step(
    at: float, tpot: float | None = 0.01, prompt_tokens: float = 600, prompts: float = 2,
    waiting: float = 0, running: float = 3, ttft: float = 0.04, kv: float = 0.01,
) -> Step:  # fmt: skip
    return Step(
        at=at, tpot_p99=tpot, ttft_p99=ttft, prompt_tokens=prompt_tokens, prompts=prompts,
        waiting=waiting, decode_waiting=waiting, running=running, kv_usage=kv,
        decode_pods=1, prompt_pods=1,
    )  # fmt: skip


def colocated(steps: list[Step]) -> Timeline:
    return Timeline("colocated", "decode", "decode", ("decode",), tuple(steps))


def wave(spike_tpot: float = 0.35) -> Timeline:
    """Chat, then ten steps of 12k-token prompts that stretch every token gap, then chat."""
    calm = [step(t) for t in range(0, 20, 2)]
    long = [
        step(t, tpot=spike_tpot, prompt_tokens=24_000, prompts=4, ttft=0.9)
        for t in range(20, 40, 2)
    ]
    after = [step(t) for t in range(40, 60, 2)]
    return colocated(calm + long + after)


def test_tpot_spikes_with_long_prompts_and_no_queue_are_interference() -> None:
    finding = diagnose(wave(), SLO)
    assert finding.verdict == "interference", finding
    assert [s.at for s in finding.spikes] == list(range(20, 40, 2))
    assert finding.numbers["promptTokensPerSecondInSpikes"] == 24_000
    assert "stall decoding" in finding.summary


def test_spikes_within_the_slo_are_healthy() -> None:
    finding = diagnose(wave(spike_tpot=0.045), SLO)
    assert finding.verdict == "healthy", finding
    assert "within the SLO" in finding.summary


def test_spikes_that_prompts_do_not_explain_are_inconclusive() -> None:
    steps = [step(t, tpot=0.3 if 20 <= t < 40 else 0.01) for t in range(0, 60, 2)]
    finding = diagnose(colocated(steps), SLO)
    assert finding.verdict == "inconclusive", finding


def test_a_growing_queue_with_slow_first_tokens_is_overload() -> None:
    steps = [
        step(t, tpot=0.26, waiting=3 * t, running=4, ttft=5 + t, prompt_tokens=6000)
        for t in range(2, 60, 2)
    ]
    finding = diagnose(colocated(steps), SLO)
    assert finding.verdict == "overload", finding
    assert finding.overloaded_role == "decode"
    assert finding.numbers["queueGrowthPerMinute"] == pytest.approx(180, rel=0.01)


def test_a_queue_in_the_prefill_pool_overloads_the_prefill_pool() -> None:
    steps = [
        Step(t, 0.01, 4.0, 20_000, 2, waiting=10 + t, decode_waiting=0, running=3,
             kv_usage=0.1, decode_pods=1, prompt_pods=1)
        for t in range(0, 40, 2)
    ]  # fmt: skip
    split = Timeline("disaggregated", "decode", "prefill", ("decode", "prefill"), tuple(steps))
    finding = diagnose(split, SLO)
    assert (finding.verdict, finding.overloaded_role) == ("overload", "prefill")
    advice = next_step(finding, split, SLO, FACTS, Traffic())
    assert advice.action == "scale" and "spec.prefill.replicas" in advice.text


def test_slow_decoding_everywhere_is_overload_not_interference() -> None:
    steps = [step(t, tpot=0.09) for t in range(0, 40, 2)]
    finding = diagnose(colocated(steps), SLO)
    assert finding.verdict == "overload", finding
    assert "too many sequences" in finding.summary


def test_too_few_steps_or_no_decoding_pool_is_not_enough_data() -> None:
    short = diagnose(colocated([step(0), step(2), step(4, tpot=None)]), SLO)
    assert short.verdict == "not-enough-data" and "only 2 steps" in short.summary
    nothing = diagnose(None, SLO)
    assert nothing.verdict == "not-enough-data" and "disagg_role" in nothing.summary


def test_interference_on_a_colocated_model_suggests_a_smaller_budget_that_meets_both_slos() -> None:
    line = wave()
    finding = diagnose(line, SLO)
    traffic = Traffic(rate=2.0, mean_prompt=2000, p99_prompt=12_000, mean_output=170)
    advice = next_step(finding, line, SLO, FACTS, traffic)
    assert advice.action == "chunk", advice
    assert advice.budget is not None and advice.budget.tokens < 8192
    # The colocated pool (role label "engine") is configured under spec.decode.
    assert f"set spec.decode.maxNumBatchedTokens to {advice.budget.tokens}" in advice.text
    assert advice.budget.mixed_step <= 0.8 * SLO.tpot
    assert advice.budget.long_prompt_ttft <= 0.8 * SLO.ttft
    assert advice.command == (
        "disagg plan --model llama-3.1-8b --gpu h100 --network ib400 --rate 2 --input-tokens 2000 "
        "--output-tokens 170 --ttft 2 --tpot 0.05"
    )


def test_the_budget_is_the_largest_that_fits_and_shrinks_with_the_tpot_slo() -> None:
    loose, tried = best_budget(H100_8B, Slo(2.0, 0.2), 12_000, 4, 2000)
    tight, _ = best_budget(H100_8B, Slo(2.0, 0.04), 12_000, 4, 2000)
    assert loose is not None and tight is not None
    assert tight.tokens < loose.tokens
    bigger = [b for b in tried if b.tokens > loose.tokens]
    assert all(b.mixed_step > 0.8 * 0.2 for b in bigger)
    # Smaller chunks stall decoding less but prefill a prompt in more steps.
    steps = sorted(tried, key=lambda b: b.tokens)
    assert all(a.mixed_step <= b.mixed_step for a, b in pairwise(steps))
    assert steps[0].long_prompt_ttft > steps[-1].long_prompt_ttft


def test_when_no_budget_meets_both_slos_the_advice_is_to_disaggregate() -> None:
    line = wave()
    finding = diagnose(line, Slo(ttft=0.3, tpot=0.05))
    traffic = Traffic(rate=2.0, mean_prompt=2000, p99_prompt=12_000, mean_output=170)
    advice = next_step(finding, line, Slo(ttft=0.3, tpot=0.05), FACTS, traffic)
    assert advice.action == "disaggregate", advice
    assert advice.command is not None and advice.command in advice.text


def test_a_budget_already_at_the_suggestion_means_disaggregate() -> None:
    line = wave()
    finding = diagnose(line, SLO)
    traffic = Traffic(rate=2.0, mean_prompt=2000, p99_prompt=12_000, mean_output=170)
    chunked = next_step(finding, line, SLO, FACTS, traffic)
    assert chunked.budget is not None
    already = EngineFacts(H100_8B, chunked.budget.tokens, "llama-3.1-8b", "h100")
    assert next_step(finding, line, SLO, already, traffic).action == "disaggregate"


def test_interference_on_a_disaggregated_model_points_at_local_prefill() -> None:
    line = wave()
    split = Timeline("disaggregated", "decode", "prefill", ("decode", "prefill"), line.steps)
    advice = next_step(diagnose(split, SLO), split, SLO, FACTS, Traffic())
    assert advice.action == "local-prefill" and "prefillThresholdTokens" in advice.text


def test_range_answers_are_split_by_pool_and_nan_steps_dropped() -> None:
    answers = {
        "tpotP99": [
            {"metric": {"disagg_role": "decode"}, "values": [[10, "0.01"], [12, "NaN"]]},
        ],
        "running": [{"metric": {"disagg_role": "decode"}, "values": [[10, "3"], [12, "2"]]}],
        "promptTokensRate": [
            {"metric": {"disagg_role": "prefill"}, "values": [[10, "9000"], [12, "0"]]},
        ],
    }
    line = timeline(by_role(answers))  # type: ignore[arg-type]
    assert line is not None
    assert (line.mode, line.prompt_role, line.decoding_role) == (
        "disaggregated",
        "prefill",
        "decode",
    )
    assert [s.tpot_p99 for s in line.steps] == [0.01, None]
    assert [s.prompt_tokens for s in line.steps] == [9000, 0]


def test_a_prefill_pool_that_served_nothing_leaves_the_model_colocated() -> None:
    answers = {
        "running": [{"metric": {"disagg_role": "decode"}, "values": [[10, "3"]]}],
        "promptTokensRate": [{"metric": {"disagg_role": "prefill"}, "values": [[10, "0"]]}],
    }
    line = timeline(by_role(answers))  # type: ignore[arg-type]
    assert line is not None and (line.mode, line.prompt_role) == ("colocated", "decode")


def test_queries_select_the_model_and_group_by_pool() -> None:
    queries = range_queries("vllm", "team-a", 'we"ird', 30)
    assert queries["tpotP99"] == (
        "histogram_quantile(0.99, sum by (disagg_role, le) (rate(vllm:inter_token_latency_"
        'seconds_bucket{namespace="team-a",disagg_model="we\\"ird"}[30s])))'
    )
    assert all("by (disagg_role" in q for q in queries.values())
    sglang = range_queries("sglang", "ns", "m", 30)
    assert "sglang:num_queue_reqs" in sglang["waiting"]


def test_the_report_is_json_and_text_with_the_correlated_windows() -> None:
    line = wave()
    finding = diagnose(line, SLO)
    traffic = Traffic(rate=2.0, mean_prompt=2000, p99_prompt=12_000, mean_output=170)
    advice = next_step(finding, line, SLO, FACTS, traffic)
    context = {
        "model": "m", "namespace": "ns", "start": "2026-12-02T00:00:00+00:00",
        "end": "2026-12-02T00:01:00+00:00", "stepSeconds": 2.0,
    }  # fmt: skip
    report = to_json(context, line, finding, SLO, traffic, advice)
    assert json.loads(json.dumps(report))["verdict"] == "interference"
    assert len(report["spikes"]) == 10 and report["spikes"][0]["tpotP99"] == 0.35
    text = to_text(report)
    assert "verdict: interference" in text
    assert "steps where TPOT p99 spiked" in text and "350 ms" in text
    assert f"maxNumBatchedTokens to {advice.budget.tokens if advice.budget else '?'}" in text


def _args(*flags: str) -> object:
    return build_parser().parse_args(
        ["diagnose", "--prometheus", "http://p:9090", "--no-cluster", *flags]
    )


def test_slos_backend_tp_and_budget_come_from_the_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "apiVersion: disagg.dev/v1alpha1\nkind: DisaggregatedModel\nmetadata: {name: chat}\n"
        "spec:\n  model: {name: meta-llama/Llama-3.1-8B-Instruct}\n"
        "  decode: {tensorParallelSize: 2, maxNumBatchedTokens: 4096}\n"
        "  autoscaling: {ttftP99: 3s, tpotP99: 40ms}\n"
    )
    slo, backend, facts, source = _settings(_args("--model", "chat", "-f", str(manifest)))  # type: ignore[arg-type]
    assert slo == Slo(3.0, 0.04) and backend == "vllm" and source == "manifest"
    assert facts.budget == 4096 and facts.shape is not None and facts.shape.tp == 2
    assert facts.model_profile == "llama-3.1-8b"
    # A flag wins over the manifest.
    slo, _, _, _ = _settings(_args("--model", "chat", "-f", str(manifest), "--tpot-slo", "80ms"))  # type: ignore[arg-type]
    assert math.isclose(slo.tpot, 0.08)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--since", "1hour"), "error: --since: '1hour' is not a duration"),
        (("--since", "1m", "--step", "2m"), "error: --step: longer than --since"),
        (("--since", "720h", "--step", "1s"), "error: --step: 2592000 steps in --since"),
        (("--tpot-slo", "0s"), "error: --tpot-slo: must be longer than 0s"),
        (("--gpu", "h900"), "error: --gpu: unknown GPU profile 'h900'"),
        (("--model-profile", "gpt-9"), "error: --model-profile: unknown model profile 'gpt-9'"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["diagnose", "--prometheus", "http://127.0.0.1:9", "--model", "m", "--no-cluster"]
    code = main([*argv, *flags])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(message), err
    assert err.count("\n") == 1


def test_an_unreachable_prometheus_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--prometheus", "http://127.0.0.1:9", "--model", "m", "--no-cluster"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err == (
        "error: cannot reach Prometheus at http://127.0.0.1:9 (ConnectionError)\n"
    )


def test_a_manifest_without_the_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "apiVersion: disagg.dev/v1alpha1\nkind: DisaggregatedModel\nmetadata: {name: other}\n"
        "spec:\n  model: {name: m}\n"
    )
    code = main(["diagnose", "--prometheus", "http://p", "--model", "chat", "-f", str(manifest)])
    assert code == 1
    assert f"{manifest}: no DisaggregatedModel named 'chat'" in capsys.readouterr().err


def test_the_suggested_plan_command_runs_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    line = wave()
    slo = Slo(ttft=0.3, tpot=0.05)
    traffic = Traffic(rate=2.0, mean_prompt=2000, p99_prompt=12_000, mean_output=170)
    advice = next_step(diagnose(line, slo), line, slo, FACTS, traffic)
    assert advice.command is not None
    argv = shlex.split(advice.command)
    assert argv[:2] == ["disagg", "plan"]
    assert main([*argv[1:], "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] in ("colocated", "disaggregated")


def test_an_explicit_cluster_that_cannot_be_reached_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    argv = ["diagnose", "--prometheus", "http://127.0.0.1:9", "--model", "chat"]
    code = main([*argv, "--namespace", "team-a", "--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("error: cannot read DisaggregatedModel team-a/chat: "), err


def test_the_clusters_model_is_read_whatever_its_status_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Status is the operator's, and may come from another version of it: its fields do not
    decide whether the user's spec can be diagnosed."""
    stored = {
        "apiVersion": "disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
        "metadata": {"name": "chat", "namespace": "ns", "generation": 3},
        "spec": {"model": {"name": "m"}, "autoscaling": {"ttftP99": "3s", "tpotP99": "40ms"}},
        "status": {"rolloutHistory": [{"revision": 2}], "autoscalerMemory": {"mode": 7}},
    }  # fmt: skip
    monkeypatch.setattr(diagnose_cli, "_from_cluster", lambda *_: stored)
    args = build_parser().parse_args(
        ["diagnose", "--prometheus", "http://p:9090", "--model", "chat", "--namespace", "ns"]
    )
    slo, _, _, source = _settings(args)
    assert slo == Slo(3.0, 0.04) and source == "cluster"
