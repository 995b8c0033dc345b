"""The API server itself enforces the cross-field rules, with the same messages as the models."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from disagg.api import spec as spec_module
from disagg.api.resource import METADATA_NAME_RULE_MESSAGE
from disagg.api.rules import Rule
from disagg.cli import main as disagg_main
from harness import EXAMPLES, Kube

BROKEN: list[tuple[str, dict[str, Any]]] = [
    (
        "env: set value or valueFrom",
        {
            "runtime": {
                "env": [
                    {
                        "name": "A",
                        "value": "1",
                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                    }
                ]
            }
        },
    ),
    (
        "model.source: choose one",
        {"model": {"name": "m", "source": {"huggingFace": {}, "pvc": {"claimName": "w"}}}},
    ),
    (
        "autoscaling.minReplicas must be <=",
        {"decode": {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}}},
    ),
    ("gpusPerReplica must equal", {"prefill": {"tensorParallelSize": 2, "gpusPerReplica": 4}}),
    ("network.rdma is only allowed", {"network": {"transport": "tcp", "rdma": {}}}),
    ("router.replicas must be >= 1", {"router": {"enabled": True, "replicas": 0}}),
    ("autoscaling.ttftP99 must be greater than zero", {"autoscaling": {"ttftP99": "0ms"}}),
    ("autoscaling.tpotP99 must be greater than zero", {"autoscaling": {"tpotP99": "0s"}}),
    (
        "autoscaling.interval must be at least 1s",
        {"autoscaling": {"interval": "5m", "window": "1m"}},
    ),
    ("autoscaling.sloWindow must be from 1h to 2160h", {"autoscaling": {"sloWindow": "30m"}}),
    ("autoscaling.sloWindow must be from 1h", {"autoscaling": {"sloWindow": "2161h"}}),
    (
        "with the nixl and mooncake connectors, the larger of prefill.tensorParallelSize",
        {"prefill": {"tensorParallelSize": 2}, "decode": {"tensorParallelSize": 3}},
    ),
    (
        "with the nixl and mooncake connectors",
        {
            "runtime": {"kvConnector": "mooncake"},
            "prefill": {"tensorParallelSize": 4},
            "decode": {"tensorParallelSize": 6},
        },
    ),
    (
        "the lmcache connector needs runtime.backend vllm",
        {"runtime": {"backend": "sglang", "kvConnector": "lmcache"}},
    ),
    ("autoscaling.maxTotalGPUs is smaller", {"autoscaling": {"maxTotalGPUs": 1}}),
    (
        "autoscaling.mode external is not available with mode colocated",
        {"mode": "colocated", "autoscaling": {"enabled": True, "mode": "external"}},
    ),
    (
        "must be at most 1h (the HPA's limit)",
        {"autoscaling": {"mode": "external", "scaleDown": {"stabilizationWindow": "2h"}}},
    ),
    (
        "must be at most 30m (the HPA's longest policy period)",
        {"autoscaling": {"mode": "external", "scaleUp": {"cooldown": "45m"}}},
    ),
    (
        "must not start with '-' or contain whitespace",
        {"model": {"name": "m", "servedName": "-x"}},
    ),
    (
        "network.rdma.resourceName cannot be nvidia.com/gpu",
        {"network": {"transport": "rdma", "rdma": {"resourceName": "nvidia.com/gpu"}}},
    ),
    (
        "ttftP99 and tpotP99 must be at least 1ms",
        {"autoscaling": {"mode": "external", "tpotP99": "0.5ms"}},
    ),
    (
        "the prefix of key (before '/') must be at most 253",
        {"prefill": {"tolerations": [{"key": "a" * 254 + "/gpu", "operator": "Exists"}]}},
    ),
    ("operator must be Exists when key is empty", {"prefill": {"tolerations": [{"value": "x"}]}}),
    (
        "value must be empty when operator is Exists",
        {"decode": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}},
    ),
    (
        "tolerationSeconds needs effect NoExecute",
        {
            "decode": {
                "tolerations": [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}]
            }
        },
    ),
]
BROKEN += [
    (
        "nodeSelector: each key must be a label key",
        {"prefill": {"nodeSelector": {"bad key": "x"}}},
    ),
    (
        "env valueFrom: set exactly one of",
        {"runtime": {"env": [{"name": "A", "valueFrom": {}}]}},
    ),
    (
        "resources: each name must be cpu, memory",
        {"prefill": {"resources": {"requests": {"bad name!": "1"}}}},
    ),
    (
        "resources: leave out nvidia.com/gpu",
        {"decode": {"resources": {"limits": {"nvidia.com/gpu": "2"}}}},
    ),
    (
        "resources: each request must be at most its limit",
        {"prefill": {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}},
    ),
    (
        "must be a whole number, and it and hugepages need a limit equal",
        {
            "prefill": {
                "resources": {
                    "requests": {"example.com/dev": "500m"},
                    "limits": {"example.com/dev": "500m"},
                }
            }
        },
    ),
    (
        "must be a whole number, and it and hugepages need a limit equal",
        {"prefill": {"resources": {"requests": {"example.com/dev": "1"}}}},
    ),
    (
        "hugepages-<size> must be a whole number of pages",
        {
            "prefill": {
                "resources": {
                    "requests": {"memory": "1Gi", "hugepages-2Mi": "3Mi"},
                    "limits": {"memory": "1Gi", "hugepages-2Mi": "3Mi"},
                }
            }
        },
    ),
    (
        "hugepages-<size> must be a whole number of pages",
        {"decode": {"resources": {"limits": {"cpu": "1", "hugepages-big": "1Gi"}}}},
    ),
    (
        "hugepages need cpu or memory set beside them",
        {
            "prefill": {
                "resources": {
                    "requests": {"hugepages-2Mi": "4Mi"},
                    "limits": {"hugepages-2Mi": "4Mi"},
                }
            }
        },
    ),
]


def _node_affinity(expression: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    return {"prefill": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": required}}}}  # fmt: skip


def _pod_affinity(term: dict[str, Any]) -> dict[str, Any]:
    return {"decode": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term]}}}}  # fmt: skip


BROKEN += [
    (
        "node affinity: the prefix of key",
        _node_affinity({"key": "a" * 254 + "/zone", "operator": "Exists"}),
    ),
    (
        "node affinity: In and NotIn need values",
        _node_affinity({"key": "zone", "operator": "Gt", "values": ["1", "2"]}),
    ),
    (
        "pod affinity: the prefix of key",
        _pod_affinity(
            {
                "topologyKey": "zone",
                "labelSelector": {
                    "matchExpressions": [{"key": "a" * 254 + "/app", "operator": "Exists"}]
                },
            }
        ),
    ),
    (
        "pod affinity: In and NotIn need values, Exists",
        _pod_affinity(
            {
                "topologyKey": "zone",
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]},
            }
        ),
    ),
    (
        "pod affinity: each matchLabels key must be a label key",
        _pod_affinity({"topologyKey": "zone", "labelSelector": {"matchLabels": {"bad key": "x"}}}),
    ),
    (
        "pod affinity: the prefix of topologyKey",
        _pod_affinity({"topologyKey": "a" * 254 + "/zone"}),
    ),
]
POD_FIELDS_THE_API_SERVER_REFUSES: list[tuple[str, dict[str, Any]]] = [
    (
        "prefill.tolerations[0].operator",
        {"prefill": {"tolerations": [{"key": "g", "operator": "Bogus"}]}},
    ),
    (
        "prefill.tolerations[0].effect",
        {"prefill": {"tolerations": [{"key": "g", "effect": "Never"}]}},
    ),
    ("prefill.tolerations[0].key", {"prefill": {"tolerations": [{"key": "bad key!"}]}}),
    ("decode.tolerations[0].value", {"decode": {"tolerations": [{"key": "g", "value": "x" * 64}]}}),
    ("decode.priorityClassName", {"decode": {"priorityClassName": "-Lead"}}),
    ("prefill.resources.requests.cpu", {"prefill": {"resources": {"requests": {"cpu": "-1"}}}}),
    ("decode.resources.limits.memory", {"decode": {"resources": {"limits": {"memory": -5}}}}),
    ("network.shmSize", {"network": {"transport": "rdma", "shmSize": "1Gi "}}),
    ("network.shmSize", {"network": {"transport": "rdma", "shmSize": "∞"}}),
    ("prefill.nodeSelector.pool", {"prefill": {"nodeSelector": {"pool": "x" * 64}}}),
    ("prefill.affinity.bogus", {"prefill": {"affinity": {"bogus": 1}}}),
    (
        "decode.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        {
            "decode": {
                "affinity": {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 0, "podAffinityTerm": {"topologyKey": "zone"}}
                        ]
                    }
                }
            }
        },
    ),
    (
        "prefill.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        {
            "prefill": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                    }
                }
            }
        },
    ),
    (
        "runtime.env[0].valueFrom.fieldRef.fieldPath",
        {
            "runtime": {
                "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]
            }
        },
    ),
    (
        "runtime.env[0].valueFrom.secretKeyRef.name",
        {
            "runtime": {
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}
                ]
            }
        },
    ),
]


def _all_rules() -> list[Rule]:
    rules: list[Rule] = []
    for value in vars(spec_module).values():
        if isinstance(value, type) and "rules" in vars(value):
            rules += list(value.rules)
    return rules


def _pod(settings: dict[str, Any]) -> dict[str, Any]:
    return {"decode": {"pod": settings}}


_EMPTY = {"name": "v", "emptyDir": {}}
BROKEN += [
    # Old spellings of renamed fields: refused, saying where each went.
    ("engine was renamed runtime", {"engine": {"backend": "sglang"}}),
    (
        "prometheusUrl was renamed prometheusURL",
        {"autoscaling": {"prometheusUrl": "http://p:9090"}},
    ),
    ("maxTotalGpus was renamed maxTotalGPUs", {"autoscaling": {"maxTotalGpus": 16}}),
    (
        "gateway routes requests to the router",
        {"router": {"enabled": False}, "gateway": {"parentRefs": [{"name": "edge"}]}},
    ),
    (
        "router.kind inferencePool is reached through a Gateway",
        {"router": {"kind": "inferencePool"}},
    ),
    (
        "router.kind inferencePool needs mode disaggregated",
        {
            "router": {"kind": "inferencePool"},
            "gateway": {"parentRefs": [{"name": "edge"}]},
            "runtime": {"kvConnector": "mooncake"},
        },
    ),
    (
        "path must not contain '//'",
        {"gateway": {"parentRefs": [{"name": "edge"}], "path": "/v1//chat"}},
    ),
    ("pod.labels: each key must be a label key", _pod({"labels": {"bad key": "x"}})),
    ("pod.annotations: each key must be a qualified name", _pod({"annotations": {"a b": "x"}})),
    ("are the operator's", _pod({"labels": {"disagg.dev/role": "x"}})),
    ("set exactly one of secret, configMap", _pod({"volumes": [{"name": "v"}]})),
    ("volumes: the names dshm", _pod({"volumes": [{"name": "dshm", "emptyDir": {}}]})),
    ("pod.volumes: each name once", _pod({"volumes": [_EMPTY, _EMPTY]})),
    (
        "pod.volumeMounts: each names one of pod.volumes",
        _pod({"volumeMounts": [{"name": "v", "mountPath": "/v"}]}),
    ),
    (
        "pod.volumeMounts: each mountPath once",
        _pod({"volumes": [_EMPTY], "volumeMounts": [{"name": "v", "mountPath": "/v"}] * 2}),
    ),
    (
        "and below are the operator's",
        _pod({"volumes": [_EMPTY], "volumeMounts": [{"name": "v", "mountPath": "/cache/x"}]}),
    ),
]


def test_every_rule_has_a_case_here() -> None:
    covered = {fragment for fragment, _ in BROKEN}
    for rule in _all_rules():
        assert any(fragment in rule.message for fragment in covered), (
            f"no e2e case for rule: {rule.message}"
        )


def _manifest(spec_patch: dict[str, Any], name: str = "broken") -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())
    manifest["metadata"] = {"name": name}
    spec = copy.deepcopy(manifest["spec"])
    spec.update(spec_patch)
    manifest["spec"] = spec
    return manifest


@pytest.mark.parametrize(("message", "spec_patch"), BROKEN, ids=[m for m, _ in BROKEN])
def test_api_server_and_disagg_validate_reject_alike(
    kube: Kube,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    message: str,
    spec_patch: dict[str, Any],
) -> None:
    server, ours = _refused_by_both(kube, namespace, tmp_path, capsys, spec_patch)
    assert message in server, server
    assert message in ours
    assert kube.get("dm", "broken", namespace) is None


def _refused_by_both(
    kube: Kube,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    spec_patch: dict[str, Any],
) -> tuple[str, str]:
    """What the API server and ``disagg validate`` say when both refuse the patched model."""
    manifest = _manifest(spec_patch)
    result = kube.apply(yaml.safe_dump(manifest), namespace, "--server-side", check=False)
    assert result.returncode != 0, "the API server accepted it"
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert disagg_main(["validate", "-f", str(path)]) == 1, "disagg validate accepted it"
    return result.stderr, capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "spec_patch"),
    POD_FIELDS_THE_API_SERVER_REFUSES,
    ids=[f for f, _ in POD_FIELDS_THE_API_SERVER_REFUSES],
)
def test_pod_fields_the_api_server_would_refuse_are_refused_up_front(
    kube: Kube,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    field: str,
    spec_patch: dict[str, Any],
) -> None:
    # Accepted here, these rendered pods the API server refuses (issue: 99 of 561 did).
    server, ours = _refused_by_both(kube, namespace, tmp_path, capsys, spec_patch)
    assert field.split(".")[-1] in server, server
    assert f"spec.{field}: " in ours, ours


def _render_and_dry_run(
    kube: Kube,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    manifest: dict[str, Any],
) -> None:
    """Render the model as the operator would and have the API server check its
    Deployments (a server-side dry run: nothing is created)."""
    rendered_model = copy.deepcopy(manifest)
    rendered_model["metadata"]["namespace"] = namespace
    rendered_model["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(rendered_model))
    assert disagg_main(["render", "-f", str(path)]) == 0
    rendered = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    deployments = [o for o in rendered if o["kind"] == "Deployment"]
    for deployment in deployments:
        deployment["metadata"].pop("ownerReferences", None)
    kube.apply(yaml.safe_dump_all(deployments), namespace, "--dry-run=server")


def test_valid_tolerations_render_pods_the_api_server_accepts(
    kube: Kube, namespace: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "pool", "value": "inference"},
        {"operator": "Exists"},
    ]
    manifest = _manifest(
        {"prefill": {"tolerations": tolerations, "priorityClassName": "system-node-critical"}}
    )
    _render_and_dry_run(kube, namespace, tmp_path, capsys, manifest)


def test_valid_resources_selectors_and_env_render_pods_the_api_server_accepts(
    kube: Kube, namespace: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = {
        "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi", "example.com/dev": 2,
                         "ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"},
            "limits": {"memory": "2Gi", "example.com/dev": "2", "hugepages-2Mi": "1Gi",
                       "hugepages-1Gi": "2Gi"},
        },
        "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM", "pool": ""},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["3"]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In",
                         "values": ["a", "b"]}],
                     "matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                      "values": ["node-7"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [
                        {"key": "spot", "operator": "DoesNotExist"}]}}],
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"disagg.dev/role": "prefill"}},
                        "namespaces": ["team-a"]}}],
            },
        },
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                               "divisor": "1Mi"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf.token", "key": "tok_1",
                                                             "optional": True}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        ],
    }  # fmt: skip
    manifest = _manifest({"prefill": pool, "decode": pool})
    _render_and_dry_run(kube, namespace, tmp_path, capsys, manifest)
    kube.apply(yaml.safe_dump(manifest), namespace, "--server-side", "--dry-run=server")


NULLS: list[tuple[str, dict[str, Any], bool]] = [
    ("a defaulted pool", {"prefill": None}, True),
    ("a defaulted count", {"decode": {"replicas": None}}, True),
    ("defaulted autoscaling", {"autoscaling": None}, True),
    ("an optional object", {"network": {"transport": "rdma", "rdma": None}}, False),
    ("a list", {"runtime": {"env": None}}, False),
    ("a quantity", {"prefill": {"resources": {"requests": {"cpu": None}}}}, False),
    ("an affinity", {"prefill": {"affinity": None}}, False),
]


@pytest.mark.parametrize(("case", "spec_patch", "defaulted"), NULLS, ids=[c for c, _, _ in NULLS])
def test_nulls_read_alike_by_the_api_server_and_disagg_validate(
    kube: Kube,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    case: str,
    spec_patch: dict[str, Any],
    defaulted: bool,
) -> None:
    # A create (kubectl apply of a new object) prunes every null in a field that is not
    # nullable, and defaults it where the CRD has a default; disagg validate reads it so. A
    # server-side apply refuses a null without a default, and validate says that in a note.
    manifest = _manifest(spec_patch, name="nulls")
    created = kube.apply(yaml.safe_dump(manifest), namespace, "--dry-run=server", check=False)
    applied = kube.apply(
        yaml.safe_dump(manifest), namespace, "--server-side", "--dry-run=server", check=False
    )
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    ours = disagg_main(["validate", "-f", str(path)])
    said = capsys.readouterr()
    assert (created.returncode, ours) == (0, 0), (created.stderr, said)
    assert (applied.returncode == 0) == defaulted, applied.stderr
    assert ("kubectl apply --server-side refuses it" in said.err) == (not defaulted), said


def test_api_server_rejects_a_name_that_cannot_name_services(kube: Kube, namespace: str) -> None:
    result = kube.apply(yaml.safe_dump(_manifest({}, name="9lives")), namespace, check=False)
    assert result.returncode != 0
    assert METADATA_NAME_RULE_MESSAGE in result.stderr


def test_valid_examples_are_accepted_by_the_api_server(kube: Kube, namespace: str) -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        manifest = yaml.safe_load(path.read_text())
        manifest["metadata"].pop("namespace", None)
        kube.apply(yaml.safe_dump(manifest), namespace, "--dry-run=server")


def test_api_server_accepts_nixl_tp_degrees_that_divide_either_way(
    kube: Kube, namespace: str
) -> None:
    # vLLM's NIXL connector serves prefill TP 8 with decode TP 2 (and the reverse).
    for prefill_tp, decode_tp in ((8, 2), (2, 8)):
        patch = {
            "prefill": {"tensorParallelSize": prefill_tp},
            "decode": {"tensorParallelSize": decode_tp},
        }
        manifest = _manifest(patch, name=f"tp-{prefill_tp}-{decode_tp}")
        kube.apply(yaml.safe_dump(manifest), namespace, "--server-side", "--dry-run=server")


def test_api_server_takes_the_split_only_rules_off_a_colocated_model(
    kube: Kube, namespace: str
) -> None:
    # No KV moves in a colocated model: TP 3 beside TP 2 and a budget for one pool are fine.
    patch = {
        "mode": "colocated",
        "prefill": {"tensorParallelSize": 3},
        "decode": {"tensorParallelSize": 2},
        "autoscaling": {"enabled": True, "maxTotalGPUs": 2},
    }
    manifest = _manifest(patch, name="colocated-uneven")
    kube.apply(yaml.safe_dump(manifest), namespace, "--server-side", "--dry-run=server")
    split = _manifest({**patch, "mode": "disaggregated"}, name="split-uneven")
    refused = kube.apply(
        yaml.safe_dump(split), namespace, "--server-side", "--dry-run=server", check=False
    )
    assert refused.returncode != 0 and "multiple of the smaller" in refused.stderr
