"""The operator's watches are filtered by the API server: pods and objects that are not its
children never reach it, so on a shared GPU cluster its traffic follows its own objects.

The operator talks to the API server through a TCP relay that counts the bytes the server
sends (TLS passes through untouched: the relay sees sizes, not content).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from disagg.demo.relay import CountingRelay
from harness import Kube, Operator, wait_for

UNRELATED_PODS = 300


@pytest.fixture
def relayed_kubeconfig(kube: Kube, tmp_path: Path) -> Iterator[tuple[Path, CountingRelay]]:
    path = tmp_path / "kubeconfig"
    relay = CountingRelay.for_kubeconfig(kube.layout.kubeconfig, path)
    yield path, relay
    relay.close()


def _unrelated_pods(count: int) -> str:
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"batch-job-{i}", "labels": {"app": "batch"}},
            "spec": {"containers": [{"name": "work", "image": "registry.example/batch:1"}]},
        }
        for i in range(count)
    ]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods})


def test_pods_of_other_workloads_are_not_streamed_to_the_operator(
    kube: Kube, namespace: str, relayed_kubeconfig: tuple[Path, CountingRelay]
) -> None:
    kubeconfig, relay = relayed_kubeconfig
    operator = Operator(
        kube.layout,
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--no-leader-election",
        log_name="watch-scope",
    )
    try:
        wait_for(
            "the operator's watches to start",
            lambda: operator.metrics().get("disagg_operator_leader") == 1.0 and relay.received,
            timeout=30,
        )
        before = relay.received
        kube.run(
            "apply", "-n", namespace, "-f", "-", stdin=_unrelated_pods(UNRELATED_PODS), timeout=120
        )
        wait_for(
            f"{UNRELATED_PODS} pods to be scheduled",
            lambda: (
                sum(
                    1
                    for p in kube.items("pods", namespace, "app=batch")
                    if any(c["type"] == "PodScheduled" for c in p["status"].get("conditions", []))
                )
                == UNRELATED_PODS
            ),
            timeout=120,
        )
        # Each pod is over a kilobyte of JSON, at least twice (created, then scheduled):
        # streamed to the operator and filtered there, most of a megabyte.
        received = relay.received - before
        assert received < 64 * 1024, f"the operator was sent {received} bytes for other pods"
        assert operator.process.poll() is None
    finally:
        operator.stop()
