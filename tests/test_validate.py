"""`disagg validate` rejects broken manifests with a message naming the field and the rule."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, example_paths, load_example
from disagg.api.resource import parse_model
from disagg.cli import main


def _run(tmp_path: Path, manifest: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "model.yaml"
    path.write_text(manifest if isinstance(manifest, str) else yaml.safe_dump(manifest))
    code = main(["validate", "-f", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _with(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(base)
    node = manifest
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return manifest


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.stem)
def test_examples_are_valid(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", str(path)]) == 0
    assert ": valid" in capsys.readouterr().out


BAD_INPUTS = [
    ("unknown-field", "spec.prefill.replicaz", 2, "spec.prefill.replicaz: unknown field"),
    (
        "wrong-type",
        "spec.decode.replicas",
        "many",
        "spec.decode.replicas: Input should be a valid integer",
    ),
    (
        "negative-replicas",
        "spec.prefill.replicas",
        -1,
        "spec.prefill.replicas: Input should be greater than or equal to 0",
    ),
    (
        "bad-backend",
        "spec.runtime.backend",
        "tgi",
        "spec.runtime.backend: Input should be 'vllm' or 'sglang'",
    ),
    (
        "min-over-max",
        "spec.decode.autoscaling",
        {"minReplicas": 5, "maxReplicas": 2},
        "spec.decode.autoscaling.minReplicas: autoscaling.minReplicas must be <= autoscaling.maxReplicas",
    ),
    (
        "rdma-on-tcp",
        "spec.network",
        {"transport": "tcp", "rdma": {"resourceName": "rdma/ib"}},
        "spec.network.rdma: network.rdma is only allowed with network.transport rdma",
    ),
    (
        "zero-slo",
        "spec.autoscaling.ttftP99",
        "0s",
        "spec.autoscaling.ttftP99: autoscaling.ttftP99 must be greater than zero",
    ),
    (
        "bad-duration",
        "spec.autoscaling.tpotP99",
        "fast",
        "spec.autoscaling.tpotP99: 'fast' is not a duration",
    ),
    (
        "gpus-mismatch",
        "spec.prefill.gpusPerReplica",
        3,
        "spec.prefill.gpusPerReplica: gpusPerReplica must equal tensorParallelSize x dataParallelSize",
    ),
    (
        "lmcache-sglang",
        "spec.runtime",
        {"backend": "sglang", "kvConnector": "lmcache"},
        "spec.runtime.kvConnector: the lmcache connector needs runtime.backend vllm",
    ),
    # Renamed in v1alpha1: the old spellings are refused, saying where each went.
    (
        "renamed-engine",
        "spec.engine",
        {"backend": "sglang"},
        "spec.engine: engine was renamed runtime: move it there",
    ),
    (
        "renamed-prometheus-url",
        "spec.autoscaling.prometheusUrl",
        "http://prometheus:9090",
        "spec.autoscaling.prometheusUrl: prometheusUrl was renamed prometheusURL: move it there",
    ),
    (
        "renamed-max-total-gpus",
        "spec.autoscaling.maxTotalGpus",
        16,
        "spec.autoscaling.maxTotalGpus: maxTotalGpus was renamed maxTotalGPUs: move it there",
    ),
    (
        "two-sources",
        "spec.model.source",
        {"huggingFace": {}, "pvc": {"claimName": "w"}},
        "spec.model.source: model.source: choose one of huggingFace or pvc",
    ),
    (
        "bad-rdma-resource",
        "spec.network.rdma",
        {"resourceName": "rdma"},
        "spec.network.rdma.resourceName: String should match pattern",
    ),
    (
        "bad-quantity",
        "spec.network.shmSize",
        "lots",
        "spec.network.shmSize: 'lots' is not a non-negative Kubernetes quantity",
    ),
    (
        "negative-cpu",
        "spec.prefill.resources",
        {"requests": {"cpu": -1}},
        "spec.prefill.resources.requests.cpu: must be a non-negative Kubernetes quantity",
    ),
    (
        "request-over-limit",
        "spec.prefill.resources",
        {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}},
        "spec.prefill.resources: resources: each request must be at most its limit",
    ),
    (
        "fractional-device",
        "spec.decode.resources",
        {"requests": {"example.com/foo": "500m"}, "limits": {"example.com/foo": "500m"}},
        "spec.decode.resources: resources: an extended resource (such as example.com/device) "
        "must be a whole number",
    ),
    (
        "hugepages-not-whole-pages",
        "spec.decode.resources",
        {
            "requests": {"memory": "1Gi", "hugepages-1Gi": "1536Mi"},
            "limits": {"memory": "1Gi", "hugepages-1Gi": "1536Mi"},
        },
        "spec.decode.resources: resources: hugepages-<size> must be a whole number of pages",
    ),
    (
        "hugepages-huge-exponent",  # judged without computing a 100-million-digit number
        "spec.decode.resources",
        {"limits": {"memory": "1Gi", "hugepages-2Mi": "1e99999999"}},
        "spec.decode.resources: resources: hugepages-<size> must be a whole number of pages",
    ),
    (
        "hugepages-alone",
        "spec.prefill.resources",
        {"limits": {"hugepages-2Mi": "2Mi"}},
        "spec.prefill.resources: resources: hugepages need cpu or memory set beside them",
    ),
    (
        "device-without-limit",
        "spec.decode.resources",
        {"requests": {"example.com/foo": 1}},
        "need a limit equal to the request",
    ),
    (
        "unknown-resource",
        "spec.decode.resources",
        {"limits": {"gpu": 1}},
        "spec.decode.resources: resources: each name must be cpu, memory, ephemeral-storage",
    ),
    (
        "operator-owned-gpus",
        "spec.prefill.resources",
        {"limits": {"nvidia.com/gpu": 8}},
        "resources: leave out nvidia.com/gpu",
    ),
    (
        "bad-node-selector-key",
        "spec.prefill.nodeSelector",
        {"gpu type": "h100"},
        "spec.prefill.nodeSelector: nodeSelector: each key must be a label key",
    ),
    (
        "bad-node-selector-value",
        "spec.prefill.nodeSelector",
        {"gpu": "H100 SXM"},
        "spec.prefill.nodeSelector.gpu: must be a label value",
    ),
    (
        "empty-value-from",
        "spec.runtime.env",
        [{"name": "A", "valueFrom": {}}],
        "spec.runtime.env[0].valueFrom: env valueFrom: set exactly one of",
    ),
    (
        "unknown-value-from",
        "spec.runtime.env",
        [{"name": "A", "valueFrom": {"vaultRef": {"path": "x"}}}],
        "spec.runtime.env[0].valueFrom.vaultRef: unknown field",
    ),
    (
        "unknown-affinity",
        "spec.prefill.affinity",
        {"nodeAfinity": {}},
        "spec.prefill.affinity.nodeAfinity: unknown field",
    ),
    (
        "exists-with-values",
        "spec.prefill.affinity",
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "zone", "operator": "Exists", "values": ["a"]}
                            ]
                        }
                    ]
                }
            }
        },
        "nodeSelectorTerms[0].matchExpressions[0].values: node affinity: In and NotIn need values",
    ),
    (
        "no-topology-key",
        "spec.decode.affinity",
        {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}},
        "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: required field is missing",
    ),
    (
        "bad-field-path",
        "spec.runtime.env",
        [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}],
        "spec.runtime.env[0].valueFrom.fieldRef.fieldPath: must be one of metadata.name",
    ),
    ("missing-model", "spec.model", None, "spec.model: required field is missing"),
    (
        "null-env-entry",
        "spec.runtime.env",
        [None],
        "spec.runtime.env[0]: expected a mapping, got null",
    ),
    ("bad-name", "metadata.name", "9-Llama", "metadata.name: must be a DNS-1035 label"),
    ("wrong-kind", "kind", "Deployment", "kind: expected 'DisaggregatedModel', got 'Deployment'"),
    (
        "gpu-budget",
        "spec.autoscaling.maxTotalGPUs",
        1,
        "spec.autoscaling.maxTotalGPUs: autoscaling.maxTotalGPUs is smaller than the GPUs the pools need",
    ),
]


@pytest.mark.parametrize(
    ("field", "value", "expected"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, expected: str
) -> None:
    manifest = _with(load_example("minimal"), field, value)
    code, output = _run(tmp_path, manifest, capsys)
    assert code == 1
    assert expected in output
    assert "Traceback" not in output


@pytest.mark.parametrize("connector", ["nixl", "mooncake"])
@pytest.mark.parametrize(
    ("prefill_tp", "decode_tp", "valid"),
    [(8, 2, True), (2, 8, True), (4, 4, True), (2, 3, False), (6, 4, False), (3, 6, True)],
)
def test_tp_degrees_may_differ_either_way_when_one_divides_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], prefill_tp: int, decode_tp: int,
    valid: bool, connector: str,
) -> None:  # fmt: skip
    # vLLM 0.33.0 asserts larger % smaller == 0 at the handshake, both directions, for NIXL
    # (TransferTopology.tp_ratio) and Mooncake (_get_tp_ratio).
    manifest = _with(load_example("minimal"), "spec.prefill.tensorParallelSize", prefill_tp)
    manifest["spec"].setdefault("decode", {})["tensorParallelSize"] = decode_tp
    manifest["spec"].setdefault("runtime", {})["kvConnector"] = connector
    code, output = _run(tmp_path, manifest, capsys)
    assert (code == 0) == valid, output
    if not valid:
        assert (
            "spec.decode.tensorParallelSize: with the nixl and mooncake connectors, the larger "
            "of prefill.tensorParallelSize and decode.tensorParallelSize must be a multiple of "
            "the smaller" in output
        )


def test_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run(tmp_path, "spec: [unclosed\n", capsys)
    assert code == 1 and "not valid YAML" in output and "Traceback" not in output


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"model": {"name": "m", "servedName": "-x"}}, "must not start with '-'"),
        ({"model": {"name": "-m"}}, "must not start with '-'"),
        ({"model": {"name": "my model"}}, "or contain whitespace"),
        (
            {"network": {"rdma": {"resourceName": "nvidia.com/gpu"}}},
            "spec.network.rdma.resourceName: network.rdma.resourceName cannot be nvidia.com/gpu",
        ),
    ],
)
def test_values_that_would_break_the_engines_command_line_or_gpu_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, Any], fragment: str
) -> None:
    model = load_example("minimal")
    model["spec"].update(patch)
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and fragment in output, output


@pytest.mark.parametrize(
    ("autoscaling", "fragment"),
    [
        ({"scaleUp": {"stabilizationWindow": "61m"}}, "stabilizationWindow must be at most 1h"),
        ({"scaleDown": {"cooldown": "31m"}}, "cooldown must be at most 30m"),
        ({"ttftP99": "0.9ms"}, "ttftP99 and tpotP99 must be at least 1ms"),
    ],
)
def test_external_scaling_refuses_what_the_hpa_would(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    autoscaling: dict[str, Any],
    fragment: str,
) -> None:
    model = load_example("minimal")
    model["spec"]["autoscaling"] = {"enabled": True, "mode": "external", **autoscaling}
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and fragment in output
    model["spec"]["autoscaling"]["mode"] = (
        "builtin"  # the operator's own autoscaler has no such limits
    )
    code, output = _run(tmp_path, model, capsys)
    assert code == 0, output


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"decode": {"tensorParallelSize": True}}, "Input should be a valid integer (got True)"),
        ({"decode": {"autoscaling": {"maxReplicas": "8"}}}, "valid integer (got '8')"),
        ({"autoscaling": {"enabled": 1}}, "Input should be a valid boolean (got 1)"),
        ({"autoscaling": {"interval": "\uff15s"}}, "is not a duration"),
        ({"autoscaling": {"ttftP99": "0.0000000001s"}}, "ttftP99 must be greater than zero"),
        ({"autoscaling": {"ttftP99": "99999999999999999999h"}}, "longer than the longest duration"),
        ({"prefill": "x"}, "spec.prefill: expected a mapping, got a string ('x')"),
    ],
)
def test_what_the_crd_refuses_disagg_validate_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, Any], fragment: str
) -> None:
    model = load_example("minimal")
    for key, value in patch.items():
        model["spec"][key] = (
            {**model["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        )
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and fragment in output, output
    assert "Value error" not in output and "PoolSpec" not in output


def test_a_status_is_not_the_manifests_to_get_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``kubectl get -o yaml`` returns, status and all: the API server drops a status
    from a create (the CRD has a status subresource) and keeps it out of an update, so it
    does not judge its values, and neither does this; strict decoding looks first, so only a
    field the status schema lacks is refused (see the test below). The operator, reading
    stored objects, never judges a status: one another operator version wrote must not stop
    a model."""
    model = load_example("minimal")
    model["status"] = {"prefill": "not a mapping", "conditions": "not a list"}
    code, output = _run(tmp_path, model, capsys)
    assert code == 0 and ": valid" in output, output
    model["spec"]["bogus"] = 1  # the spec still is
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and "spec.bogus: unknown field" in output, output
    stored = load_example("minimal") | {"status": {"fieldOfANewerOperator": {"x": 1}}}
    assert parse_model(stored).metadata.name == stored["metadata"]["name"]


def test_alias_bombs_and_deep_nesting_are_refused_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for name, previous in zip("bcdefghi", "abcdefgh", strict=True):
        rows.append(f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]")
    code, output = _run(tmp_path, "\n".join(rows) + "\n", capsys)  # 9^9 strings once expanded
    assert code == 1 and "expands to more than 200000 nodes" in output
    for deep in (
        "a: " + "[" * 600 + "]" * 600,
        "a:\n" + "".join(f"{' ' * i}b{i}:\n" for i in range(1, 200)),
    ):
        code, output = _run(tmp_path, deep + "\n", capsys)
        assert code == 1 and "nests deeper than 100 levels" in output and "Traceback" not in output


def test_a_field_nested_too_deep_to_render_is_refused_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_example("minimal")
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(80):  # deeper than any manifest, shallow enough for the YAML reader
        node["x"] = node = {}
    model["spec"].setdefault("decode", {})["affinity"] = {"nodeAffinity": deep}
    code, output = _run(tmp_path, yaml.safe_dump(model), capsys)
    assert code == 1 and "spec.decode.affinity.nodeAffinity.x.x... (65 levels)" in output


def test_not_a_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run(tmp_path, "- just\n- a list\n", capsys)
    assert code == 1 and "<root>: expected a mapping, got list" in output


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", str(EXAMPLES / "nope.yaml")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_every_problem_is_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _with(load_example("minimal"), "spec.prefill.replicas", -2)
    manifest["spec"]["decode"] = {"replicaz": 1}
    code, output = _run(tmp_path, manifest, capsys)
    assert code == 1
    assert "spec.prefill.replicas" in output and "spec.decode.replicaz: unknown field" in output


def test_multi_document_file_names_the_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = load_example("minimal")
    bad = _with(good, "spec.router.port", 70000)
    text = yaml.safe_dump(good) + "---\n" + yaml.safe_dump(bad)
    code, output = _run(tmp_path, text, capsys)
    assert code == 1
    assert "(document 2): spec.router.port: Input should be less than or equal to 65535" in output


@pytest.mark.parametrize(
    ("tolerations", "fragment"),
    [
        ([{"key": "gpu", "operator": "Bogus"}], "tolerations[0].operator: Input should be"),
        ([{"key": "bad key!"}], "tolerations[0].key: must be a label key"),
        ([{"value": "x"}], "operator must be Exists when key is empty"),
        ([{"key": "g", "operator": "Exists", "value": "v"}], "value must be empty"),
        ([{"key": "g", "tolerationSeconds": 1}], "tolerationSeconds needs effect NoExecute"),
        (None, "priorityClassName: must be a DNS subdomain name"),
    ],
)
def test_pod_fields_are_checked_as_the_api_server_checks_a_pod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tolerations: Any, fragment: str
) -> None:
    model = load_example("minimal")
    model["spec"]["prefill"] = (
        {"tolerations": tolerations} if tolerations is not None else {"priorityClassName": "-Lead"}
    )
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and fragment in output, output
    # What the API server takes, this takes too: match-all, NoExecute with seconds, prefixed keys.
    model["spec"]["prefill"] = {
        "priorityClassName": "inference-critical",
        "tolerations": [
            {"operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/unreachable",
                "effect": "NoExecute",
                "tolerationSeconds": 9,
            },
            {"key": "pool", "operator": "Equal", "value": "inference"},
        ],
    }
    code, output = _run(tmp_path, model, capsys)
    assert code == 0, output


def test_resources_selectors_and_env_the_api_server_takes_are_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_example("minimal")
    model["spec"]["prefill"] = {
        "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi", "example.com/dev": 2},
            "limits": {"memory": "1Gi", "example.com/dev": "2", "rdma/hca": 1},
        },
        "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM", "pool": ""},
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 5,
                        "preference": {
                            "matchExpressions": [
                                {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["3"]}
                            ]
                        },
                    }
                ]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "x"}},
                    }
                ]
            },
        },
        "env": [
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf.token", "key": "tok_1"}}},
        ],
    }
    code, output = _run(tmp_path, model, capsys)
    assert code == 0, output


def test_nulls_read_as_absent_as_a_create_reads_them_and_the_reader_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubectl apply of a new object and kubectl create send a create, where the API server
    prunes a null in a field that is not nullable (and defaults it where the CRD has a
    default); kubectl apply --server-side refuses the same null, so validate says so."""
    model = load_example("minimal")
    model["spec"]["prefill"] = None
    model["spec"]["decode"] = {"replicas": None, "tensorParallelSize": 2, "nodeSelector": None}
    model["spec"]["model"]["servedName"] = None
    model["spec"]["autoscaling"] = None
    model["metadata"]["labels"] = {"team": None}
    code, output = _run(tmp_path, model, capsys)
    assert code == 0 and ": valid" in output, output
    assert "note: " in output and "spec.model.servedName: null, left out" in output, output
    assert "kubectl apply --server-side refuses it" in output


def test_a_whole_number_written_as_a_fraction_is_taken_where_no_rule_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The OpenAPI check takes 2.0 for an integer; a CEL rule that reads the field does not
    ("expected int, got float64"), so the API server refuses it there, and so does this."""
    model = load_example("minimal")
    model["spec"]["decode"] = {"replicas": 2.0}
    code, output = _run(tmp_path, model, capsys)
    assert code == 0, output
    model["spec"]["decode"] = {"autoscaling": {"minReplicas": 1, "maxReplicas": 4.0}}
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and "spec.decode.autoscaling.maxReplicas" in output, output
    model["spec"]["decode"] = {"replicas": 2.5}
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and "spec.decode.replicas" in output, output
    # A rule guarded by !has(self.gpusPerReplica) reads dataParallelSize only beside it.
    model["spec"]["decode"] = {"dataParallelSize": 2.0}
    assert _run(tmp_path, model, capsys)[0] == 0
    model["spec"]["decode"] = {"dataParallelSize": 2.0, "gpusPerReplica": 2}
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and "spec.decode.dataParallelSize" in output, output


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (
            {"labels": {"bad key!": "x"}},
            "metadata.labels: label key 'bad key!' must be a qualified",
        ),
        ({"labels": {"team": "a b"}}, "metadata.labels: label 'team': value 'a b' must be at most"),
        ({"labels": {"team": "x" * 64}}, "metadata.labels: label 'team': value"),
        ({"annotations": {"a b": "x"}}, "metadata.annotations: annotation key 'a b' must be a"),
        ({"annotations": {"note": "x" * 300_000}}, "metadata.annotations: annotations total"),
        ({"finalizers": ["Bad Name"]}, "metadata.finalizers: finalizer 'Bad Name' must be"),
        ({"bogus": 1}, "metadata: unknown field(s) bogus"),
    ],
)
def test_metadata_is_judged_as_the_api_server_judges_an_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], metadata: dict[str, Any], expected: str
) -> None:
    model = load_example("minimal")
    model["metadata"].update(metadata)
    code, output = _run(tmp_path, model, capsys)
    assert code == 1 and expected in output, output


def test_metadata_the_api_server_takes_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_example("minimal")
    model["metadata"].update(
        labels={"app.kubernetes.io/part-of": "llm", "empty": ""},
        annotations={"Example.com/Owner": "a b c", "note": "x" * 1000},
        finalizers=["example.com/keep", "foo"],
    )
    code, output = _run(tmp_path, model, capsys)
    assert code == 0, output


def test_a_status_field_its_schema_lacks_is_refused_as_strict_validation_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_example("minimal")
    for status, path in (
        ({"bogus": 1}, "status.bogus"),
        ({"conditions": [{"type": "Ready", "bogus": 1}]}, "status.conditions[0].bogus"),
        ({"conditions": {"pool": "a"}}, "status.conditions.pool"),
        ([{"key": "gpu"}], "status[0].key"),
    ):
        model["status"] = status
        code, output = _run(tmp_path, model, capsys)
        assert code == 1 and f"{path}: unknown field (status is the operator's" in output, output


def test_a_namespace_the_api_server_would_refuse_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_example("minimal")
    for namespace, fragment in (
        ("Bad_NS", "metadata.namespace: must be a namespace name"),
        ("a" * 64, "metadata.namespace: String should have at most 63 characters"),
    ):
        model["metadata"]["namespace"] = namespace
        code, output = _run(tmp_path, model, capsys)
        assert code == 1 and fragment in output, output
    model["metadata"]["namespace"] = "team-a"
    assert _run(tmp_path, model, capsys)[0] == 0


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"labels": {"disagg.dev/role": "x"}}, "are the operator's"),
        ({"annotations": {"app.kubernetes.io/name": "x"}}, "are the operator's"),
        ({"labels": {"bad key!": "x"}}, "pod.labels: each key must be a label key"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "are the operator's"),
        ({"volumes": [{"name": "a"}]}, "set exactly one of secret, configMap"),
        ({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
         "pod.volumes: each name once"),
        ({"volumeMounts": [{"name": "a", "mountPath": "/a"}]}, "each names one of pod.volumes"),
        ({"volumes": [{"name": "a", "emptyDir": {}}],
          "volumeMounts": [{"name": "a", "mountPath": "/dev/shm/x"}]}, "are the operator's"),
        ({"volumes": [{"name": "a", "secret": {"secretName": "s",
                                               "items": [{"key": "k", "path": "../k"}]}}]},
         "items[0].path"),
        ({"volumes": [{"name": "a", "emptyDir": {}}],
          "volumeMounts": [{"name": "a", "mountPath": "relative"}]}, "mountPath"),
        ({"runtimeClassName": "Bad_Class"}, "runtimeClassName"),
        ({"serviceAccountName": "-sa"}, "serviceAccountName"),
    ],
)  # fmt: skip
def test_pod_settings_the_api_server_would_refuse_or_that_collide_with_the_operators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pod: dict[str, Any], expected: str
) -> None:
    manifest = _with(load_example("minimal"), "spec.decode.pod", pod)
    code, output = _run(tmp_path, manifest, capsys)
    assert code == 1 and expected in output, output
