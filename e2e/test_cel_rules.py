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
            "engine": {
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
    (
        "with the nixl connector, the larger of prefill.tensorParallelSize",
        {"prefill": {"tensorParallelSize": 2}, "decode": {"tensorParallelSize": 3}},
    ),
    (
        "with the mooncake connector",
        {"engine": {"kvConnector": "mooncake"}, "prefill": {"tensorParallelSize": 2}},
    ),
    (
        "the lmcache connector needs engine.backend vllm",
        {"engine": {"backend": "sglang", "kvConnector": "lmcache"}},
    ),
    ("autoscaling.maxTotalGpus is smaller", {"autoscaling": {"maxTotalGpus": 1}}),
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
]


def _all_rules() -> list[Rule]:
    rules: list[Rule] = []
    for value in vars(spec_module).values():
        if isinstance(value, type) and "rules" in vars(value):
            rules += list(value.rules)
    return rules


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
    manifest["metadata"]["namespace"] = namespace
    manifest["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert disagg_main(["render", "-f", str(path)]) == 0
    rendered = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    deployments = [o for o in rendered if o["kind"] == "Deployment"]
    for deployment in deployments:
        deployment["metadata"].pop("ownerReferences", None)
    kube.apply(yaml.safe_dump_all(deployments), namespace, "--dry-run=server")


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
