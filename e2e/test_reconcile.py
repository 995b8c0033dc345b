"""The operator against the real API server: create, observe, roll, repair, delete."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from harness import Kube, Operator, condition, example, wait_for

MODEL_KINDS = "deployments,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings"


def _example(name: str, **spec_overrides: Any) -> dict[str, Any]:
    manifest = example(name)
    manifest["spec"].update(spec_overrides)
    return manifest


def _apply(kube: Kube, namespace: str, manifest: dict[str, Any]) -> None:
    kube.apply(yaml.safe_dump(manifest), namespace)


def _wait_condition(
    kube: Kube, namespace: str, name: str, type_: str, status: str, timeout: float = 60
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        cond = condition(kube.get("dm", name, namespace), type_)
        return cond if cond and cond["status"] == status else None

    return wait_for(f"{type_}={status} on dm/{name}", probe, timeout=timeout)


def _children(kube: Kube, namespace: str, model: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.json(
        "get", MODEL_KINDS, "-n", namespace, "-l", f"disagg.dev/model={model}"
    )["items"]
    return items


def test_model_becomes_ready_on_gpu_nodes(kube: Kube, operator: Operator, namespace: str) -> None:
    _apply(kube, namespace, _example("minimal"))
    kube.run(
        "wait",
        "--for=condition=Ready",
        "dm/qwen-small",
        "-n",
        namespace,
        "--timeout=60s",
        timeout=90,
    )

    pods = kube.items("pods", namespace, "disagg.dev/model=qwen-small")
    engine_pods = [
        p for p in pods if p["metadata"]["labels"]["disagg.dev/role"] in ("prefill", "decode")
    ]
    assert len(engine_pods) == 2
    for pod in engine_pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1" and limits["rdma/ib"] == "1"
        assert pod["status"]["phase"] == "Running"

    table = kube.run("get", "dm", "qwen-small", "-n", namespace).stdout.split("\n")
    header, row = table[0].split(), table[1].split()
    # ENGINE is empty for a disaggregated model (and TTFT/TPOT without autoscaling).
    assert header[:8] == ["NAME", "READY", "MODE", "PREFILL", "DECODE", "ENGINE", "TTFT", "TPOT"]
    assert row[:5] == ["qwen-small", "True", "disaggregated", "1/1", "1/1"]

    model = kube.get("dm", "qwen-small", namespace)
    assert model is not None
    status = model["status"]
    assert status["observedGeneration"] == model["metadata"]["generation"]
    assert status["router"]["endpoint"] == f"http://qwen-small-router.{namespace}.svc:8000/v1"
    assert condition(model, "Degraded")["status"] == "False"  # type: ignore[index]
    events = kube.items("events", namespace)
    reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "qwen-small"}
    assert "Created" in reasons


def test_too_many_gpus_reports_unschedulable(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    manifest = _example("minimal")
    manifest["metadata"]["name"] = "huge"
    manifest["spec"]["prefill"] = {"tensorParallelSize": 16}
    manifest["spec"]["decode"] = {"tensorParallelSize": 16}
    _apply(kube, namespace, manifest)
    degraded = _wait_condition(kube, namespace, "huge", "Degraded", "True")
    assert degraded["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    # Both pools' pods are unplaceable; the message names a pod of either.
    assert any(f"{role} pod huge-{role}-" in degraded["message"] for role in ("prefill", "decode"))
    assert condition(kube.get("dm", "huge", namespace), "Ready")["status"] == "False"  # type: ignore[index]


def test_missing_rdma_resource_reports_unschedulable(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    manifest = _example("minimal")
    manifest["metadata"]["name"] = "no-rdma"
    manifest["spec"]["network"] = {
        "transport": "rdma",
        "rdma": {"resourceName": "example.com/missing-hca"},
    }
    _apply(kube, namespace, manifest)
    degraded = _wait_condition(kube, namespace, "no-rdma", "Degraded", "True")
    assert "Insufficient example.com/missing-hca" in degraded["message"]


def test_image_and_flag_changes_roll_the_deployments(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    _apply(kube, namespace, _example("minimal"))
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    before = kube.get("deployment", "qwen-small-prefill", namespace)
    assert before is not None

    kube.run(
        "patch",
        "dm",
        "qwen-small",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "runtime": {"image": "registry.example/engine:v2"},
                    "prefill": {"maxNumBatchedTokens": 4096},
                }
            }
        ),
    )

    def rolled() -> dict[str, Any] | None:
        dep = kube.get("deployment", "qwen-small-prefill", namespace)
        if dep is None:
            return None
        container = dep["spec"]["template"]["spec"]["containers"][0]
        return dep if container["image"] == "registry.example/engine:v2" else None

    after = wait_for("the prefill Deployment to take the new image", rolled, timeout=30)
    args = after["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == "4096"
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    decode = kube.get("deployment", "qwen-small-decode", namespace)
    assert (
        decode is not None
        and decode["spec"]["template"]["spec"]["containers"][0]["image"]
        == "registry.example/engine:v2"
    )

    def new_pods_ready() -> bool:
        pods = kube.items("pods", namespace, "disagg.dev/role=prefill")
        images = {
            p["spec"]["containers"][0]["image"]
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
        }
        return images == {"registry.example/engine:v2"}

    wait_for("prefill pods on the new image", new_pods_ready, timeout=60)
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    _wait_condition(kube, namespace, "qwen-small", "Progressing", "False")


def test_deleted_and_edited_children_are_restored(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    _apply(kube, namespace, _example("minimal"))
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    service = kube.get("service", "qwen-small-decode", namespace)
    assert service is not None

    kube.run("delete", "service", "qwen-small-decode", "-n", namespace)
    kube.run("delete", "deployment", "qwen-small-router", "-n", namespace)
    kube.run("scale", "deployment", "qwen-small-prefill", "--replicas=3", "-n", namespace)

    def service_back() -> bool:
        again = kube.get("service", "qwen-small-decode", namespace)
        return again is not None and again["metadata"]["uid"] != service["metadata"]["uid"]

    wait_for("the deleted Service to come back", service_back, timeout=15)
    wait_for(
        "the deleted router Deployment to come back",
        lambda: kube.get("deployment", "qwen-small-router", namespace),
        timeout=15,
    )
    wait_for(
        "the hand-scaled prefill Deployment back at 1 replica",
        lambda: (
            (kube.get("deployment", "qwen-small-prefill", namespace) or {})
            .get("spec", {})
            .get("replicas")
            == 1
        ),
        timeout=15,
    )


def test_disabling_the_router_prunes_its_objects(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    _apply(kube, namespace, _example("minimal"))
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    kube.run(
        "patch",
        "dm",
        "qwen-small",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"router":{"enabled":false}}}',
    )

    def router_gone() -> bool:
        return not [
            c
            for c in _children(kube, namespace, "qwen-small")
            if c["metadata"]["labels"]["disagg.dev/role"] == "router"
        ]

    wait_for("every router object to be pruned", router_gone, timeout=30)
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")


def test_deleting_the_model_garbage_collects_children(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    _apply(kube, namespace, _example("minimal"))
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    assert len(_children(kube, namespace, "qwen-small")) == 12
    kube.run("delete", "dm", "qwen-small", "-n", namespace)
    wait_for(
        "every child to be garbage-collected",
        lambda: not _children(kube, namespace, "qwen-small") and not kube.items("pods", namespace),
        timeout=60,
    )


def test_resync_of_an_unchanged_model_writes_nothing(kube: Kube, namespace: str) -> None:
    # An operator of its own, scoped to this namespace, so other tests' writes do not count.
    operator = Operator(
        kube.layout,
        f"--namespace={namespace}",
        "--no-leader-election",
        "--resync-seconds=2",
        log_name="resync",
    )
    try:
        _check_no_writes_on_resync(kube, operator, namespace)
    finally:
        operator.stop()


def _check_no_writes_on_resync(kube: Kube, operator: Operator, namespace: str) -> None:
    _apply(kube, namespace, _example("llama-8b-nixl-rdma"))
    _wait_condition(kube, namespace, "llama-8b", "Ready", "True")
    wait_for(
        "the model's status to settle",
        lambda: (
            condition(kube.get("dm", "llama-8b", namespace), "Progressing")["status"] == "False"
        ),  # type: ignore[index]
        timeout=30,
    )
    writes_before = operator.writes()
    reconciles_before = operator.reconciles()
    # The operator resyncs every model every 2 s; wait for at least three more passes.
    wait_for(
        "three more reconcile passes",
        lambda: operator.reconciles() >= reconciles_before + 3,
        timeout=30,
    )
    assert operator.writes() == writes_before


CRDS = Path(__file__).resolve().parents[1] / "crds"
MEMORY_PATTERN = (
    "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/prefill/properties/"
    "resources/properties/requests/additionalProperties/pattern"
)


@contextlib.contextmanager
def _crd_without(kube: Kube, pointer: str) -> Iterator[None]:
    """The CRD with one check removed, as an older CRD left behind by `helm upgrade` (which
    never upgrades CRDs) would be; the current one is back afterwards."""
    patch = json.dumps([{"op": "remove", "path": pointer}])
    kube.run("patch", "crd", "disaggregatedmodels.disagg.dev", "--type=json", "-p", patch)
    try:
        yield
    finally:
        kube.run("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))


def test_a_spec_a_stale_crd_accepts_but_the_operator_rejects_degrades(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    manifest = _example("minimal")
    manifest["spec"]["prefill"] = {"resources": {"requests": {"memory": "lots"}}}
    with _crd_without(kube, MEMORY_PATTERN):
        wait_for(
            "the API server to take the laxer schema",
            lambda: kube.apply(yaml.safe_dump(manifest), namespace, check=False).returncode == 0,
            timeout=30,
        )
    degraded = _wait_condition(kube, namespace, "qwen-small", "Degraded", "True")
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.prefill.resources.requests.memory" in degraded["message"]
    assert not _children(kube, namespace, "qwen-small")
    warnings = [e for e in kube.items("events", namespace) if e["reason"] == "InvalidSpec"]
    assert len(warnings) == 1
    reconciles = operator.reconciles()
    wait_for("a few resync passes", lambda: operator.reconciles() >= reconciles + 2, timeout=30)
    assert len([e for e in kube.items("events", namespace) if e["reason"] == "InvalidSpec"]) == 1

    manifest["spec"]["prefill"] = {}
    _apply(kube, namespace, manifest)
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    _wait_condition(kube, namespace, "qwen-small", "Degraded", "False")


def test_latency_buckets_an_engine_would_refuse_leave_the_running_pools_alone(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    manifest = _example("minimal")
    _apply(kube, namespace, manifest)
    _wait_condition(kube, namespace, "qwen-small", "Ready", "True")
    decode = kube.get("deployment", "qwen-small-decode", namespace)
    serving = decode["spec"]["template"]["spec"]["containers"][0]["args"]

    # The API server cannot parse the flag's JSON; the operator refuses it and says where.
    descending = json.dumps({"inter_token_latency": [0.05, 0.02]})
    manifest["spec"]["decode"] = {"extraArgs": ["--custom-histogram-buckets", descending]}
    _apply(kube, namespace, manifest)
    degraded = _wait_condition(kube, namespace, "qwen-small", "Degraded", "True")
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.decode.extraArgs" in degraded["message"]
    assert "strictly increasing" in degraded["message"]
    decode = kube.get("deployment", "qwen-small-decode", namespace)
    assert decode["spec"]["template"]["spec"]["containers"][0]["args"] == serving

    ascending = json.dumps({"inter_token_latency": [0.02, 0.05]})
    manifest["spec"]["decode"] = {"extraArgs": ["--custom-histogram-buckets", ascending]}
    _apply(kube, namespace, manifest)
    _wait_condition(kube, namespace, "qwen-small", "Degraded", "False")
    wait_for(
        "the decode pool to start with the buckets",
        lambda: (
            ascending
            in kube.get("deployment", "qwen-small-decode", namespace)["spec"]["template"]["spec"][
                "containers"
            ][0]["args"]
        ),
        timeout=30,
    )
