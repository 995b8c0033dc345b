"""The fake nodes kwok manages: GPU nodes with RDMA devices, and one CPU-only node."""

from __future__ import annotations

from typing import Any

from disagg.devcluster.layout import POD_CIDR_PREFIX

GPU_NODES = 4
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
RDMA_RESOURCES = {"rdma/ib": "64", "rdma/rdma_shared_device_a": "64"}


def _node(
    name: str, index: int, extra_capacity: dict[str, str], labels: dict[str, str]
) -> dict[str, Any]:
    capacity = {"cpu": "192", "memory": "2Ti", "pods": "110", **extra_capacity}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {
            "podCIDR": f"{POD_CIDR_PREFIX}.{index}.0/24",
            "podCIDRs": [f"{POD_CIDR_PREFIX}.{index}.0/24"],
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def fake_nodes() -> list[dict[str, Any]]:
    """GPU nodes (8 x H100, RDMA) and a CPU node for routers and other light pods."""
    nodes = [
        _node(
            f"gpu-node-{i}",
            i + 1,
            {"nvidia.com/gpu": str(GPUS_PER_NODE), **RDMA_RESOURCES},
            {"nvidia.com/gpu.product": GPU_PRODUCT, "nvidia.com/gpu.count": str(GPUS_PER_NODE)},
        )
        for i in range(GPU_NODES)
    ]
    nodes.append(_node("cpu-node-0", GPU_NODES + 1, {}, {"node-role.disagg.dev/cpu": "true"}))
    return nodes
