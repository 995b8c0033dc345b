"""`disagg diagnose` against real engine simulators scraped by a real Prometheus.

One story runs against three models at once: steady chat with a wave of 12k-token prompts on
a colocated engine and on a prefill/decode pair behind the router, and uniform overload of a
colocated engine too small for its load. Each test then runs the command as a user would.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane import LOG_DIR, engine, router
from diagnosis import NAMESPACE, Prometheus, Stream, Target, drive, prometheus
from harness import Kube

CHAT = Stream(0, 50, 2, 300, 200)
WAVE = Stream(15, 35, 1.0, 12_000, 8)
OVERLOAD = Stream(0, 50, 6, 2000, 100)
BUDGET = 8192


@pytest.fixture(scope="module")
def story() -> Iterator[tuple[Prometheus, list[list[int]]]]:
    colocated = engine("dg-colocated", "127.44.1.1", "both", time_scale=0.5)
    prefill = engine("dg-prefill", "127.44.2.1", "prefill", time_scale=0.5)
    decode = engine("dg-decode", "127.44.2.2", "decode", time_scale=0.5)
    front = router("dg-router", "127.44.2.3", [prefill], [decode], "--pd-threshold", "1000")
    small = engine(
        "dg-small", "127.44.3.1", "both", "--gpu-profile", "a100", "--max-num-seqs", "4",
        time_scale=0.5,
    )  # fmt: skip
    procs = [colocated, prefill, decode, front, small]
    server = None
    try:
        server = prometheus(
            "dg-prometheus",
            [
                Target(colocated, "colocated", "decode"),
                Target(prefill, "split", "prefill"),
                Target(decode, "split", "decode"),
                Target(small, "small", "decode"),
            ],
            LOG_DIR / "dg-prometheus",
        )

        async def traffic() -> list[list[int]]:
            return list(
                await asyncio.gather(
                    drive(colocated.url, [CHAT, WAVE], seed=11),
                    drive(front.url, [CHAT, WAVE], seed=12),
                    drive(small.url, [OVERLOAD], seed=13, grace=5),
                )
            )

        statuses = asyncio.run(traffic())
        yield server, statuses
    finally:
        if server is not None:
            server.stop()
        for proc in procs:
            proc.stop()


def diagnose(server: Prometheus, model: str, *flags: str) -> tuple[int, str, str]:
    """`disagg diagnose` over the story (wall seconds: 2 s steps over 4 s rate windows)."""
    argv = [
        sys.executable, "-m", "disagg.cli", "diagnose", "--prometheus", server.url,
        "--model", model, "--namespace", NAMESPACE, "--since", "75s", "--step", "2s",
        "--window", "4s", "--model-profile", "llama-3.1-8b", *flags,
    ]  # fmt: skip
    if "--kubeconfig" not in flags:
        argv.append("--no-cluster")  # the story's engines belong to no model in a cluster
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout, result.stderr


def report(server: Prometheus, model: str, *flags: str) -> dict[str, Any]:
    code, out, err = diagnose(server, model, "-o", "json", *flags)
    assert code == 0, err
    parsed: dict[str, Any] = json.loads(out)
    return parsed


def test_a_long_prompt_wave_on_a_colocated_engine_is_interference(
    story: tuple[Prometheus, list[list[int]]],
) -> None:
    server, statuses = story
    assert all(status == 200 for status in statuses[0]), statuses[0]
    found = report(server, "colocated", "--max-num-batched-tokens", str(BUDGET))
    assert found["verdict"] == "interference", found
    assert found["mode"] == "colocated"
    # The correlated windows are the wave's: long prompts, and TPOT far above the calm value.
    assert len(found["spikes"]) >= 3, found["spikes"]
    assert all(s["meanPrompt"] > 1000 for s in found["spikes"]), found["spikes"]
    assert found["numbers"]["peakTpotP99"] > 5 * found["numbers"]["calmTpotP99"], found
    # The next step is the first in the decision order: a smaller chunk budget.
    advice = found["nextStep"]
    assert advice["action"] == "chunk", advice
    assert advice["maxNumBatchedTokens"] < BUDGET, advice
    assert advice["mixedStepSeconds"] < found["slo"]["tpotSeconds"], advice
    assert advice["command"].startswith("disagg plan --model llama-3.1-8b"), advice


def test_the_text_report_shows_the_evidence(story: tuple[Prometheus, list[list[int]]]) -> None:
    server, _ = story
    code, out, err = diagnose(server, "colocated", "--max-num-batched-tokens", str(BUDGET))
    assert code == 0, err
    assert "verdict: interference" in out, out
    assert "steps where TPOT p99 spiked" in out, out
    assert "set spec.decode.maxNumBatchedTokens to" in out, out


def test_a_disaggregated_model_under_the_same_wave_is_healthy(
    story: tuple[Prometheus, list[list[int]]],
) -> None:
    server, statuses = story
    assert all(status == 200 for status in statuses[1]), statuses[1]
    found = report(server, "split")
    assert found["verdict"] == "healthy", found
    assert found["mode"] == "disaggregated"
    assert found["promptPool"] == "prefill" and found["decodingPool"] == "decode"
    # The same prompts reached this model: the prefill pool served the wave.
    assert found["traffic"]["p99Prompt"] > 10_000, found["traffic"]
    assert found["nextStep"]["action"] == "none"


def test_uniform_overload_is_overload(story: tuple[Prometheus, list[list[int]]]) -> None:
    server, _ = story
    found = report(server, "small")
    assert found["verdict"] == "overload", found
    assert found["numbers"]["queueGrowthPerMinute"] > 10, found["numbers"]
    assert found["nextStep"]["action"] == "scale", found["nextStep"]
    assert "decode replicas" in found["nextStep"]["text"]


def test_a_model_without_series_is_not_enough_data(
    story: tuple[Prometheus, list[list[int]]],
) -> None:
    server, _ = story
    found = report(server, "no-such-model")
    assert found["verdict"] == "not-enough-data", found
    assert "disagg_role" in found["summary"], found["summary"]


def test_the_suggested_budget_brings_tpot_p99_back_within_the_slo(
    story: tuple[Prometheus, list[list[int]]],
) -> None:
    server, _ = story
    before = report(server, "colocated", "--max-num-batched-tokens", str(BUDGET))
    budget = before["nextStep"]["maxNumBatchedTokens"]
    assert isinstance(budget, int), before["nextStep"]
    chunked = engine(
        "dg-chunked", "127.44.4.1", "both", "--max-num-batched-tokens", str(budget),
        time_scale=0.5,
    )  # fmt: skip
    own = None
    try:
        own = prometheus(
            "dg-prometheus-chunked",
            [Target(chunked, "chunked", "decode")],
            LOG_DIR / "dg-prometheus-chunked",
        )
        statuses = asyncio.run(drive(chunked.url, [CHAT, WAVE], seed=11))
        assert all(status == 200 for status in statuses), statuses
        after = report(own, "chunked", "--max-num-batched-tokens", str(budget))
    finally:
        if own is not None:
            own.stop()
        chunked.stop()
    assert after["verdict"] == "healthy", after
    assert after["numbers"]["peakTpotP99"] < before["numbers"]["peakTpotP99"] / 3, (before, after)


def test_the_model_in_the_cluster_gives_the_slos_and_engine_facts(
    story: tuple[Prometheus, list[list[int]]], kube: Kube, namespace: str
) -> None:
    server, _ = story
    manifest = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "decode": {"tensorParallelSize": 2, "maxNumBatchedTokens": 4096},
            "autoscaling": {"ttftP99": "3s", "tpotP99": "80ms"},
        },
    }
    kube.run("apply", "-f", "-", stdin=json.dumps(manifest))
    argv = ["--kubeconfig", str(kube.layout.kubeconfig), "--namespace", namespace]
    code, out, err = diagnose(server, "chat", *argv, "-o", "json")
    assert code == 0, err
    found = json.loads(out)
    assert found["settingsFrom"] == "cluster", found
    assert found["slo"] == {"ttftSeconds": 3.0, "tpotSeconds": 0.08}
    # The model's series are not in this Prometheus: nothing to decide, and it says why.
    assert found["verdict"] == "not-enough-data"
    code, _, err = diagnose(server, "no-such-model", *argv)
    assert code == 1
    assert err.strip() == (
        f"error: no DisaggregatedModel {namespace}/no-such-model in the cluster "
        "(--no-cluster skips it)"
    )
