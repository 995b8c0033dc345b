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
    manifest = _manifest(spec_patch)
    result = kube.apply(yaml.safe_dump(manifest), namespace, "--server-side", check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert disagg_main(["validate", "-f", str(path)]) == 1
    assert message in capsys.readouterr().err
    assert kube.get("dm", "broken", namespace) is None


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
