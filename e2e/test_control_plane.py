"""The local control plane itself: real components, fake GPU nodes, loopback pod IPs."""

from __future__ import annotations

import ipaddress

from disagg.devcluster.layout import COMPONENTS
from disagg.devcluster.runner import running_components
from harness import Kube, wait_for


def test_every_component_runs(kube: Kube) -> None:
    assert set(running_components(kube.layout)) == set(COMPONENTS)
    version = kube.json("version")["serverVersion"]
    assert version["gitVersion"] == "v1.35.4"


def test_fake_gpu_nodes_are_ready_with_gpus_and_rdma(kube: Kube) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.json("get", "nodes")["items"]}
    gpu_nodes = [n for name, n in nodes.items() if name.startswith("gpu-node-")]
    assert len(gpu_nodes) == 4 and "cpu-node-0" in nodes
    for node in gpu_nodes:
        allocatable = node["status"]["allocatable"]
        assert allocatable["nvidia.com/gpu"] == "8"
        assert int(allocatable["rdma/ib"]) >= 1
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        assert not node["spec"].get("taints")
    assert "nvidia.com/gpu" not in nodes["cpu-node-0"]["status"]["allocatable"]


def test_pods_get_loopback_ips_from_their_node_cidr(kube: Kube, namespace: str) -> None:
    kube.run(
        "create",
        "deployment",
        "probe",
        "--image=example.invalid/none",
        "--replicas=2",
        "-n",
        namespace,
    )

    def running() -> list[dict[str, object]] | None:
        pods = kube.items("pods", namespace, "app=probe")
        ok = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return ok if len(ok) == 2 else None

    for pod in wait_for("two running probe pods", running, timeout=60):
        ip = ipaddress.ip_address(pod["status"]["podIP"])  # type: ignore[index]
        assert ip.is_loopback and str(ip).startswith("127.42.")
