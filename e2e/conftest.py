"""The e2e suite runs against the real local control plane (see e2e/cluster and disagg dev).

The session brings the control plane up once (or reuses one that is running), installs the
generated CRD and runs the operator as a process; each test works in its own namespace.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from disagg.devcluster.layout import Layout, default_state_dir
from disagg.devcluster.prepare import ClusterError, find_binaries
from disagg.devcluster.runner import down, up
from harness import ROOT, Kube, Operator, new_namespace, wait_for


def _say(message: str) -> None:
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    layout = Layout(default_state_dir())
    try:
        started = up(layout, _say)
    except ClusterError as error:
        pytest.fail(f"the local control plane did not start: {error}")
    binaries = find_binaries()
    assert binaries is not None
    client = Kube(binaries, layout)
    client.run("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    client.wait_established("disaggregatedmodels.disagg.dev")
    yield client
    if started:
        down(layout, _say)


@pytest.fixture(scope="module")
def operator(kube: Kube) -> Iterator[Operator]:
    """An admin-credentialed operator for one test module (modules that test RBAC run their own)."""
    op = Operator(kube.layout, "--resync-seconds=3", "--lease-name=disagg-e2e")
    wait_for(
        "the operator to lead",
        lambda: op.metrics().get("disagg_operator_leader") == 1.0,
        timeout=30,
    )
    yield op
    op.stop()


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = new_namespace(kube)
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)
