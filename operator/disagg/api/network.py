"""`spec.network`: how the KV cache moves from prefill to decode (RDMA wiring or TCP)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from disagg.api.base import ApiModel, Quantity
from disagg.api.rules import Rule

Transport = Literal["rdma", "tcp"]
_EXTENDED_RESOURCE = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class RdmaSpec(ApiModel):
    """RDMA wiring of the engine pods for the KV-cache transfer."""

    resource_name: str = Field(
        default="rdma/ib",
        pattern=_EXTENDED_RESOURCE,
        description="Extended resource of the RDMA device plugin (e.g. rdma/ib, "
        "rdma/rdma_shared_device_a, nvidia.com/hostdev).",
    )
    resource_count: int = Field(
        default=1,
        ge=1,
        le=64,
        description="How many of that resource each replica requests. Shared-device plugins "
        "expose all HCAs through one slot: keep 1.",
    )
    networks: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Multus NetworkAttachmentDefinitions to attach (name, namespace/name or "
        "name@interface); written to the k8s.v1.cni.cncf.io/networks annotation.",
    )
    ucx_devices: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="UCX devices for the transfer (e.g. mlx5_0:1). Empty: the launcher "
        "detects the HCAs present in the pod.",
    )
    gid_index: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="RoCE GID index (UCX_IB_GID_INDEX). Empty: the launcher detects it.",
    )
    host_network: bool = Field(
        default=False, description="Run engine pods on the host network (no Multus needed)."
    )
    allow_tcp_fallback: bool = Field(
        default=False,
        description="When no RDMA device is usable, start on TCP with a warning instead of "
        "failing the pod.",
    )


class NetworkSpec(ApiModel):
    """How the KV cache moves from prefill to decode."""

    transport: Transport = Field(
        default="rdma",
        description="rdma for production (InfiniBand or RoCE); tcp for development only "
        "(KV transfer is tens of times slower).",
    )
    rdma: RdmaSpec | None = Field(
        default=None,
        description="RDMA settings; only with transport rdma. Default: rdma/ib x1, autodetect.",
    )
    shm_size: Quantity = Field(
        default="16Gi", description="Size of the memory-backed /dev/shm of engine pods."
    )

    rules: ClassVar = (
        Rule(
            cel="!has(self.rdma) || self.rdma.resourceName != 'nvidia.com/gpu'",
            message="network.rdma.resourceName cannot be nvidia.com/gpu: each pool's GPU count "
            "comes from its tensorParallelSize",
            check=lambda m: m.rdma is None or m.rdma.resource_name != "nvidia.com/gpu",
            field_path=".rdma.resourceName",
        ),
        Rule(
            cel="self.transport == 'rdma' || !has(self.rdma)",
            message="network.rdma is only allowed with network.transport rdma",
            check=lambda m: m.transport == "rdma" or m.rdma is None,
            field_path=".rdma",
        ),
    )

    @property
    def rdma_or_default(self) -> RdmaSpec | None:
        """The RDMA settings in force, or None on TCP."""
        if self.transport != "rdma":
            return None
        return self.rdma or RdmaSpec()


def nixl_tp_compatible(prefill_tp: int, decode_tp: int) -> bool:
    """Whether NIXL can move KV between these TP degrees: either may be larger, but the larger
    must be a multiple of the smaller (vLLM's TransferTopology.tp_ratio asserts it at the
    handshake, in vllm/distributed/kv_transfer/kv_connector/utils.py)."""
    larger, smaller = max(prefill_tp, decode_tp), min(prefill_tp, decode_tp)
    return smaller >= 1 and larger % smaller == 0
