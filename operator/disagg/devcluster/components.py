"""The command line of each control-plane component (pure: paths and ports in, argv out).

Flags follow what envtest and kwokctl use for local clusters, trimmed to this harness:
loopback only, token authentication, the RBAC authorizer, and no endpoint controllers
(Kubernetes refuses loopback pod IPs in EndpointSlices, and nothing here needs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from disagg.devcluster.layout import NODE_IP, Layout, Ports

CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "disruption-controller",
    "pod-garbage-collector-controller",
    "clusterrole-aggregation-controller",
)


@dataclass(frozen=True)
class Component:
    """One process of the control plane and how to tell that it is ready."""

    name: str
    argv: list[str]
    health_url: str
    tls: bool


def etcd(binary: Path, layout: Layout, ports: Ports) -> Component:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return Component(
        name="etcd",
        argv=[
            str(binary),
            "--name=disagg",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=disagg={peer}",
            "--quota-backend-bytes=4294967296",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        health_url=f"{client}/health",
        tls=False,
    )


def kube_apiserver(binary: Path, layout: Layout, ports: Ports) -> Component:
    pki = layout.pki
    return Component(
        name="kube-apiserver",
        argv=[
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={layout.tokens}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.key'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # No node-lifecycle controller runs here to lift the not-ready taint this
            # plugin puts on new nodes; kwok marks the fake nodes Ready instead.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ],
        health_url=f"https://127.0.0.1:{ports.apiserver}/readyz",
        tls=True,
    )


def kube_controller_manager(binary: Path, layout: Layout, ports: Ports) -> Component:
    return Component(
        name="kube-controller-manager",
        argv=[
            str(binary),
            f"--kubeconfig={layout.kubeconfig}",
            f"--authentication-kubeconfig={layout.kubeconfig}",
            f"--authorization-kubeconfig={layout.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={layout.pki / 'sa.key'}",
            f"--root-ca-file={layout.pki / 'ca.crt'}",
            "--use-service-account-credentials=false",
            "--concurrent-deployment-syncs=10",
            "--concurrent-replicaset-syncs=10",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ],
        health_url=f"https://127.0.0.1:{ports.controller_manager}/healthz",
        tls=True,
    )


def kube_scheduler(binary: Path, layout: Layout, ports: Ports) -> Component:
    return Component(
        name="kube-scheduler",
        argv=[
            str(binary),
            f"--kubeconfig={layout.kubeconfig}",
            f"--authentication-kubeconfig={layout.kubeconfig}",
            f"--authorization-kubeconfig={layout.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ],
        health_url=f"https://127.0.0.1:{ports.scheduler}/healthz",
        tls=True,
    )


def kwok(binary: Path, layout: Layout, ports: Ports) -> Component:
    return Component(
        name="kwok",
        argv=[
            str(binary),
            f"--kubeconfig={layout.kubeconfig}",
            f"--config={layout.kwok_config}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--node-ip={NODE_IP}",
            f"--server-address=127.0.0.1:{ports.kwok}",
        ],
        health_url=f"http://127.0.0.1:{ports.kwok}/healthz",
        tls=False,
    )
