"""Latency buckets set through extraArgs: the autoscaler reads p99s against the bounds the
engine really exports, and bounds an engine would refuse are refused at the spec."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import load_example
from disagg.api import parse_model
from disagg.api.resource import ManifestError
from disagg.cli import build_parser
from disagg.devcluster.podemu import sim_argv
from disagg.perf.buckets import ITL_BUCKETS, SGLANG_ITL_BUCKETS, SGLANG_TTFT_BUCKETS, TTFT_BUCKETS
from disagg.perf.engine_buckets import SGLANG_PHASE_FLAG, VLLM_FAMILIES, VLLM_FLAG
from disagg.reconcile.evaluate import pool_policies
from disagg.sim.cli import _config
from disagg.sim.metrics import EngineMetrics
from test_upstream_facts import SGLANG_FACTS, VLLM_FACTS

FINE_ITL = [0.01, 0.02, 0.03, 0.035, 0.04, 0.045, 0.05, 0.075, 0.1]


def _with_args(example: str, engine: Sequence[str] = (), **pools: list[str]) -> dict[str, Any]:
    manifest = load_example(example)
    spec = manifest["spec"]
    if engine:
        spec.setdefault("runtime", {})["extraArgs"] = list(engine)
    for pool, args in pools.items():
        spec.setdefault(pool, {})["extraArgs"] = args
    return manifest


def test_the_autoscaler_reads_a_vllm_pool_against_the_buckets_its_extra_args_set() -> None:
    custom = json.dumps({"inter_token_latency": FINE_ITL})
    policies = pool_policies(parse_model(_with_args("minimal", decode=[VLLM_FLAG, custom])))
    assert policies["decode"].latency_buckets == tuple(FINE_ITL)
    assert policies["prefill"].latency_buckets == TTFT_BUCKETS  # that pool did not set any

    # Engine-wide arguments reach both pools; vLLM's dotted form and underscores are read as
    # vLLM reads them, and the last value wins as in argparse.
    dotted = ["--custom_histogram_buckets.time_to_first_token+", "0.5,1,1.5,2"]
    both = pool_policies(
        parse_model(_with_args("minimal", engine=[f"{VLLM_FLAG}={custom}", *dotted]))
    )
    assert both["prefill"].latency_buckets == (0.5, 1.0, 1.5, 2.0)
    # The dotted keys replace the whole value, so the inter-token family is vLLM's again.
    assert both["decode"].latency_buckets == ITL_BUCKETS


def test_the_autoscaler_reads_an_sglang_pool_against_its_bucket_flags() -> None:
    flags = ["--bucket-inter-token-latency", "0.02", "0.04", "0.05", "--log-level", "info"]
    policies = pool_policies(parse_model(_with_args("sglang-mooncake", decode=flags)))
    assert policies["decode"].latency_buckets == (0.02, 0.04, 0.05)
    assert policies["prefill"].latency_buckets == SGLANG_TTFT_BUCKETS
    plain = pool_policies(parse_model(load_example("sglang-mooncake")))
    assert plain["decode"].latency_buckets == SGLANG_ITL_BUCKETS


@pytest.mark.parametrize(
    ("example", "where", "args", "problem"),
    [
        ("minimal", "decode", [VLLM_FLAG, "{inter_token_latency: [1]}"], "is not JSON"),
        ("minimal", "decode", [VLLM_FLAG, '{"itl": [0.01]}'], "unknown bucket family 'itl'"),
        (
            "minimal",
            "prefill",
            [VLLM_FLAG, '{"time_to_first_token": [1, 0.5]}'],
            "bounds must be strictly increasing (1 then 0.5)",
        ),
        ("minimal", "runtime", [VLLM_FLAG], "is missing its value"),
        # argparse would take these for the flag, so the buckets would change unseen.
        ("minimal", "prefill", ["--custom", "{}"], "abbreviates --custom-histogram-buckets"),
        ("minimal", "decode", ["--custom_hist.x", "[1]"], "abbreviates --custom-histogram-buckets"),
        ("sglang-mooncake", "decode", ["--bucket-inter", "1"], "abbreviates --bucket-inter"),
        ("sglang-mooncake", "decode", ["--bucket-inter-token-latency", "0", "0.1"], "'0'"),
        ("sglang-mooncake", "runtime", ["--bucket-time-to-first-token", "--log-level"], "missing"),
    ],
)
def test_buckets_an_engine_would_refuse_are_refused_where_they_are_set(
    example: str, where: str, args: list[str], problem: str
) -> None:
    manifest = (
        _with_args(example, engine=args)
        if where == "runtime"
        else _with_args(example, **{where: args})
    )
    with pytest.raises(ManifestError) as refused:
        parse_model(manifest)
    assert f"spec.{where}.extraArgs: " in str(refused.value)
    assert problem in str(refused.value)


def test_the_flags_and_families_are_the_pinned_engines_own() -> None:
    assert VLLM_FLAG in VLLM_FACTS["serve_flags"]
    # request_tokens' defaults depend on the context length, so the facts leave it out.
    assert set(VLLM_FACTS["histogram_buckets"]) | {"request_tokens"} == VLLM_FAMILIES
    assert set(SGLANG_PHASE_FLAG.values()) <= set(SGLANG_FACTS["server_flags"])
    # No other flag is a prefix of these, so a prefix of them can only abbreviate them.
    for flag, flags in [
        (VLLM_FLAG, VLLM_FACTS["serve_flags"]),
        *((f, SGLANG_FACTS["server_flags"]) for f in SGLANG_PHASE_FLAG.values()),
    ]:
        assert [other for other in flags if other != flag and flag.startswith(other)] == []


def _exported_bounds(metrics: EngineMetrics, name: str) -> list[float]:
    metrics.ttft.labels(**metrics.labels).observe(0.2)  # a series appears once observed
    metrics.itl.labels(**metrics.labels).observe(0.02)
    text = generate_latest(metrics.registry).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")][:-1]


def test_a_simulated_vllm_pod_exports_the_buckets_its_arguments_set() -> None:
    custom = json.dumps({"inter_token_latency": FINE_ITL, "request_latency": [1, 2]})
    pod = {
        "metadata": {"labels": {"disagg.dev/role": "decode"}},
        "spec": {"containers": [{"args": ["vllm", "serve", "/models/x", VLLM_FLAG, custom]}]},
        "status": {"podIP": "10.0.0.7"},
    }
    argv = sim_argv(pod, 1.0)
    assert argv is not None
    args = build_parser().parse_args(["sim", "engine", *argv])
    metrics = EngineMetrics("m", _config(args).histogram_buckets)
    assert _exported_bounds(metrics, "vllm:inter_token_latency_seconds") == FINE_ITL
    assert _exported_bounds(metrics, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)

    # The simulator refuses what vLLM refuses.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sim", "engine", VLLM_FLAG, '{"inter_token_latency": []}'])
