"""The project against the pinned engines' own sources (upstream/facts.json, `make facts`):
every flag the renderer emits is one the engine's CLI defines, every value it gives a
flag with fixed choices is among them, every KV-transfer key is a KVTransferConfig field,
every metric the simulator exports or the autoscaler reads exists upstream with vLLM's
buckets, and the API's tensor-parallel rules refuse what the connectors would refuse."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import Histogram

from conftest import ROOT, example_paths
from disagg.api import parse_model
from disagg.api.resource import ManifestError
from disagg.api.spec import DisaggregatedModelSpec, RuntimeSpec
from disagg.autoscale.queries import SGLANG, VLLM, MetricNames
from disagg.perf.buckets import (
    SGLANG_ITL_BUCKETS,
    SGLANG_TTFT_BUCKETS,
    SIM_MAX_MODEL_LEN,
    length_buckets,
)
from disagg.render.engine_args import engine_launch
from disagg.sim.metrics import EngineMetrics
from disagg.versions import SGLANG_VERSION, VLLM_VERSION

FACTS: dict[str, Any] = json.loads((ROOT / "upstream" / "facts.json").read_text())
VLLM_FACTS: dict[str, Any] = FACTS["vllm"]
SGLANG_FACTS: dict[str, Any] = FACTS["sglang"]


def _variants() -> Iterator[DisaggregatedModelSpec]:
    """Every example crossed with the engine settings that change the command line."""
    import yaml

    engines = [
        ("vllm", "nixl"),
        ("vllm", "mooncake"),
        ("vllm", "lmcache"),
        ("sglang", "nixl"),
        ("sglang", "mooncake"),
    ]
    dtypes = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
    for path, (backend, connector), dtype, transport in itertools.product(
        example_paths(), engines, dtypes, ["rdma", "tcp"]
    ):
        manifest = copy.deepcopy(yaml.safe_load(path.read_text()))
        spec = manifest["spec"]
        spec["runtime"] = {**spec.get("runtime", {}), "backend": backend, "kvConnector": connector}
        spec["runtime"]["kvCacheDtype"] = dtype
        spec.setdefault("network", {})["transport"] = transport
        if transport == "tcp":
            spec["network"].pop("rdma", None)
        spec["model"].setdefault("maxModelLen", 8192)
        spec["model"]["source"] = {"huggingFace": {"revision": "main"}}
        spec.setdefault("decode", {})["dataParallelSize"] = 2
        try:
            yield parse_model(manifest).spec
        except ManifestError:
            continue  # a combination the API refuses renders nothing


VARIANTS = list(_variants())


def _options(argv: list[str], after: int) -> Iterator[tuple[str, str | None]]:
    words = argv[after:]
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else None
            value = following if following is not None and not following.startswith("--") else None
            yield word, value


def test_the_facts_are_of_the_pinned_versions() -> None:
    assert (VLLM_FACTS["version"], SGLANG_FACTS["version"]) == (VLLM_VERSION, SGLANG_VERSION), (
        "versions.py moved on: run `make facts`"
    )


def test_the_variants_cover_both_engines_and_every_connector() -> None:
    assert {s.runtime.backend for s in VARIANTS if s.mode == "colocated"} == {"vllm", "sglang"}
    combos = {(s.runtime.backend, s.runtime.kv_connector) for s in VARIANTS}
    assert combos >= {("vllm", "nixl"), ("vllm", "mooncake"), ("vllm", "lmcache")}
    assert combos >= {("sglang", "nixl"), ("sglang", "mooncake")}


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_every_rendered_flag_and_choice_is_one_the_pinned_engine_defines(backend: str) -> None:
    facts = VLLM_FACTS if backend == "vllm" else SGLANG_FACTS
    defined = set(facts["serve_flags" if backend == "vllm" else "server_flags"])
    unknown: set[str] = set()
    refused: set[tuple[str, str]] = set()
    for spec in (s for s in VARIANTS if s.runtime.backend == backend):
        for role in spec.roles:  # the colocated example renders its engine pool
            argv = engine_launch(spec, role).argv
            # after `vllm serve MODEL` / `python3 -m sglang.launch_server`
            for flag, value in _options(argv, 3):
                if flag not in defined:
                    unknown.add(flag)
                choices = facts["choices"].get(flag)
                if choices and value is not None and value not in choices:
                    refused.add((flag, value))
    assert not unknown, f"{backend} {facts['version']} defines no {sorted(unknown)}"
    assert not refused, f"{backend} {facts['version']} refuses {sorted(refused)}"


def test_every_kv_transfer_key_and_connector_is_one_vllm_defines() -> None:
    fields = set(VLLM_FACTS["kv_transfer_config_fields"])
    for spec in (s for s in VARIANTS if s.runtime.backend == "vllm" and s.mode != "colocated"):
        for role in spec.roles:
            argv = engine_launch(spec, role).argv
            config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert set(config) <= fields, set(config) - fields
            assert config["kv_connector"] in VLLM_FACTS["kv_connectors"]


def _exported(name: str, kind: str) -> str:
    """The series name Prometheus sees: prometheus_client adds _total to a counter."""
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def test_the_autoscaler_reads_sglang_latency_against_sglangs_default_buckets() -> None:
    upstream = SGLANG_FACTS["histogram_buckets"]
    assert list(SGLANG_TTFT_BUCKETS) == upstream["time_to_first_token"]
    assert list(SGLANG_ITL_BUCKETS) == upstream["inter_token_latency"]


def test_the_simulator_exports_vllm_metrics_with_vllm_buckets() -> None:
    upstream = VLLM_FACTS["metrics"]
    engine = EngineMetrics("m")
    for metric in vars(engine).values():
        if isinstance(metric, Histogram) and metric.describe()[0].name.startswith("vllm:"):
            metric.labels(**engine.labels)  # a labelled histogram shows buckets once it has a child
    families = {
        family.name: family
        for family in engine.registry.collect()
        if family.name.startswith("vllm:")
    }
    assert families, "the simulator exports no vllm: metric"
    checked_buckets = 0
    for name, family in families.items():
        # prometheus_client reports a counter's family without its _total suffix.
        assert name in upstream, f"vLLM {VLLM_VERSION} has no metric {name}"
        assert family.type == upstream[name]["type"], name
        bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
        bucket_family = upstream[name]["buckets"]
        if family.type != "histogram" or bucket_family is None or not bounds:
            continue
        if bucket_family == "request_tokens":
            expected = list(length_buckets(SIM_MAX_MODEL_LEN))
        else:
            expected = VLLM_FACTS["histogram_buckets"][bucket_family]
        assert bounds[:-1] == expected, f"{name}: buckets are not vLLM's {bucket_family}"
        checked_buckets += 1
    assert checked_buckets >= 4


@pytest.mark.parametrize(
    ("names", "facts"), [(VLLM, VLLM_FACTS), (SGLANG, SGLANG_FACTS)], ids=["vllm", "sglang"]
)
def test_every_metric_the_autoscaler_reads_exists_upstream(
    names: MetricNames, facts: dict[str, Any]
) -> None:
    if isinstance(facts["metrics"], dict):
        series = {_exported(n, m["type"]) for n, m in facts["metrics"].items()}
        series |= {n for n, m in facts["metrics"].items() if m["type"] == "histogram"}
    else:
        series = set(facts["metrics"])
    for field, name in vars(names).items():
        if name is None or field == "prefill_matcher":
            continue
        base = name.removesuffix("_count")
        assert base in series, f"{facts['version']} exports no {name} ({field})"


def test_sglangs_prefill_phase_is_a_stage_it_times() -> None:
    # The stage SGLang observes from a request's first forward to its prefill finishing.
    assert (
        SGLANG.prefill_matcher == f',stage="{SGLANG_FACTS["observed_stages"]["PREFILL_FORWARD"]}"'
    )
    assert VLLM.prefill_matcher == ""


def _larger_is_multiple(a: int, b: int) -> bool:
    return max(a, b) % min(a, b) == 0


def _accepted(backend: str, connector: str, prefill_tp: int, decode_tp: int) -> bool:
    manifest = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "tp"},
        "spec": {
            "model": {"name": "m"},
            "runtime": {"backend": backend, "kvConnector": connector},
            "prefill": {"tensorParallelSize": prefill_tp},
            "decode": {"tensorParallelSize": decode_tp},
        },
    }
    try:
        parse_model(manifest)
    except ManifestError:
        return False
    return True


@pytest.mark.parametrize(
    ("backend", "connector", "rule"),
    [
        ("vllm", "nixl", "nixl_tp"), ("vllm", "mooncake", "mooncake_tp"),
        ("sglang", "nixl", None), ("sglang", "mooncake", None),
    ],
)  # fmt: skip
def test_the_api_never_accepts_a_tp_pair_the_connector_asserts_against(
    backend: str, connector: str, rule: str | None
) -> None:
    if rule is not None:
        assert VLLM_FACTS[rule]["either_direction_if_multiple"], VLLM_FACTS[rule]
    for prefill_tp, decode_tp in itertools.product([1, 2, 3, 4, 6, 8], repeat=2):
        if _accepted(backend, connector, prefill_tp, decode_tp):
            assert _larger_is_multiple(prefill_tp, decode_tp), (prefill_tp, decode_tp)
    # Either direction, when the larger is a multiple of the smaller.
    assert _accepted(backend, connector, 8, 2) and _accepted(backend, connector, 2, 8)


def test_sglang_mooncake_refuses_different_tp_only_for_state_models() -> None:
    """SGLang's Mooncake path refuses a prefill/decode TP mismatch only for hybrid-state,
    unified-memory, DCP-draft and DFLASH models, which the spec cannot tell apart: the API
    takes different TP (a multiple either way) and the field's description names them."""
    guards = SGLANG_FACTS["mooncake_tp_guards"]
    assert guards, "no TP guard found in sglang's mooncake/conn.py: re-read the source"
    special = ("hybrid", "mamba", "minimax", "dflash", "unified", "dcp", "state")
    for guard in guards:
        text = (guard["when"] + " " + guard["message"]).lower()
        assert any(word in text for word in special), f"a TP guard for every model: {guard}"
    assert _accepted("sglang", "mooncake", 4, 2)
    description = RuntimeSpec.model_fields["kv_connector"].description or ""
    assert "equal TP for hybrid models" in description
