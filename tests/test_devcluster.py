"""The local control plane's pure parts: command lines and fake nodes."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from disagg.devcluster import components
from disagg.devcluster.layout import Layout, Ports
from disagg.devcluster.nodes import fake_nodes
from disagg.reconcile.leader import lease_expired

PORTS = Ports(2379, 2380, 6443, 10257, 10259, 10247)


def test_nodes_have_gpus_rdma_and_loopback_pod_cidrs() -> None:
    nodes = fake_nodes()
    gpu = [n for n in nodes if "nvidia.com/gpu" in n["status"]["capacity"]]
    assert len(gpu) == 4 and len(nodes) == 5
    cidrs = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes]
    assert all(c.is_loopback for c in cidrs)
    assert len(set(cidrs)) == len(cidrs), "each node needs its own pod range"
    assert all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes)
    assert gpu[0]["status"]["allocatable"]["rdma/ib"]


def test_apiserver_is_loopback_rbac_and_token_auth(tmp_path: Path) -> None:
    argv = components.kube_apiserver(Path("/bin/apiserver"), Layout(tmp_path), PORTS).argv
    assert "--bind-address=127.0.0.1" in argv and "--authorization-mode=RBAC" in argv
    assert any(a.startswith("--token-auth-file=") for a in argv)
    assert "--secure-port=6443" in argv


def test_controller_manager_runs_the_needed_controllers_and_no_endpoint_controllers(
    tmp_path: Path,
) -> None:
    argv = components.kube_controller_manager(Path("/bin/kcm"), Layout(tmp_path), PORTS).argv
    controllers = (
        next(a for a in argv if a.startswith("--controllers=")).split("=", 1)[1].split(",")
    )
    for needed in ("deployment-controller", "replicaset-controller", "garbage-collector-controller",
                   "namespace-controller", "serviceaccount-token-controller"):  # fmt: skip
        assert needed in controllers
    assert not any("endpoint" in c for c in controllers)


def test_etcd_data_lives_on_tmpfs_and_is_per_state_dir(tmp_path: Path) -> None:
    one, two = Layout(tmp_path / "a"), Layout(tmp_path / "b")
    assert one.etcd_data != two.etcd_data
    assert one.etcd_data == Layout(tmp_path / "a").etcd_data


def test_lease_expiry() -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 1, 0, 0, 30, tzinfo=dt.UTC)
    fresh = {"renewTime": "2026-01-01T00:00:20.000000Z", "leaseDurationSeconds": 15}
    stale = {"renewTime": "2026-01-01T00:00:10.000000Z", "leaseDurationSeconds": 15}
    assert not lease_expired(fresh, now)
    assert lease_expired(stale, now)
    assert lease_expired({}, now)
