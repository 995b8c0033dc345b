"""Settings of one operator process (kept free of kopf so the CLI imports fast)."""

from __future__ import annotations

from dataclasses import dataclass, field

from disagg.prometheus_access import PrometheusAccess
from disagg.versions import DEFAULT_IMAGES, DataPlaneImages


@dataclass(frozen=True)
class RunConfig:
    """Settings of one operator process (from ``disagg run`` flags)."""

    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080
    leader_election: bool = True
    lease_namespace: str = "default"
    lease_name: str = "disagg-operator"
    resync_seconds: float = 300.0
    concurrency: int = 4
    prometheus: PrometheusAccess = field(default_factory=PrometheusAccess)
    images: DataPlaneImages = DEFAULT_IMAGES
