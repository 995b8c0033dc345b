"""External autoscaling against the real API server, with KEDA's own ScaledObject CRD.

KEDA's CRD comes from its Go module (``make binaries`` fetches the version pinned in
e2e/cluster/keda.version); the HPA is the built-in ``autoscaling/v2``. The API server's
validation decides whether what the operator renders is accepted, an unchanged model costs
no writes (Events included), and switching the scaler or the mode prunes the one that is no
longer wanted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import Kube, condition, example, scoped_operator, wait_for

CACHE = Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache/disagg"))
KEDA_CRD = CACHE / "crds" / "keda" / "keda.sh_scaledobjects.yaml"
MODEL = "llama-8b"
SELECTOR = f"disagg.dev/model={MODEL}"


@pytest.fixture
def keda(kube: Kube) -> Iterator[None]:
    if not KEDA_CRD.exists():
        pytest.fail(f"KEDA's ScaledObject CRD is missing at {KEDA_CRD}: run `make binaries`")
    kube.run("apply", "--server-side", "-f", str(KEDA_CRD))
    kube.wait_established("scaledobjects.keda.sh")
    yield
    kube.run("delete", "-f", str(KEDA_CRD), "--wait=false", check=False)


def _model(**autoscaling: Any) -> str:
    manifest = example("llama-8b-nixl-rdma")
    manifest["spec"]["autoscaling"].update(autoscaling)
    return yaml.safe_dump(manifest)


def _scalers(kube: Kube, namespace: str, resource: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in kube.items(resource, namespace, SELECTOR)}


def _both(scalers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """The scalers once there is one per pool."""
    return scalers if len(scalers) == 2 else None


def _settled(kube: Kube, namespace: str) -> bool:
    progressing = condition(kube.get("dm", MODEL, namespace), "Progressing")
    return progressing is not None and progressing["status"] == "False"


def _created_events(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    events = kube.items("events", namespace)
    return [e for e in events if e.get("reason") == "Created"]


def test_scalers_are_accepted_written_once_and_pruned_on_a_switch(
    kube: Kube, keda: None, namespace: str
) -> None:
    operator = scoped_operator(kube, namespace, "external")
    try:
        kube.apply(_model(enabled=True, mode="external", externalScaler="keda"), namespace)
        scaled = wait_for(
            "both pools' ScaledObjects",
            lambda: _both(_scalers(kube, namespace, "scaledobjects.keda.sh")),
            timeout=60,
        )
        prefill = scaled[f"{MODEL}-prefill"]["spec"]
        assert prefill["scaleTargetRef"]["name"] == f"{MODEL}-prefill"
        assert prefill["triggers"][0]["metricType"] == "Value"
        assert prefill["triggers"][0]["metadata"]["threshold"] == "1.5"
        wait_for("the model's status to settle", lambda: _settled(kube, namespace), timeout=60)

        writes = operator.writes(exclude=("Lease",))
        passes = operator.reconciles()
        wait_for(
            "three more reconcile passes", lambda: operator.reconciles() >= passes + 3, timeout=30
        )
        assert operator.writes(exclude=("Lease",)) == writes
        # One Event for the new model, naming every child it created, scalers included.
        created = _created_events(kube, namespace)
        assert len(created) == 1 and created[0].get("count", 1) == 1, created
        message = created[0]["message"]
        for child in ("Deployment llama-8b-prefill", "ScaledObject llama-8b-prefill",
                      "ScaledObject llama-8b-decode"):  # fmt: skip
            assert child in message, message

        kube.apply(_model(enabled=True, mode="external", externalScaler="hpa"), namespace)
        hpas = wait_for(
            "HPAs in place of the ScaledObjects",
            lambda: (
                None
                if _scalers(kube, namespace, "scaledobjects.keda.sh")
                else _both(_scalers(kube, namespace, "hpa"))
            ),
            timeout=60,
        )
        target = hpas[f"{MODEL}-decode"]["spec"]["metrics"][0]["external"]["target"]
        assert target["type"] == "Value" and target["value"] in ("40m", "0.04")

        kube.apply(_model(enabled=True, mode="builtin"), namespace)
        wait_for(
            "the HPAs to be pruned",
            lambda: not _scalers(kube, namespace, "hpa"),
            timeout=60,
        )
    finally:
        operator.stop()


def test_hpa_mode_works_on_a_cluster_without_keda(kube: Kube, namespace: str) -> None:
    # KEDA's CRD is gone (the test above removes it): its list answers 404, which means no
    # ScaledObjects, not a failed pass.
    kube.run("wait", "--for=delete", "crd/scaledobjects.keda.sh", "--timeout=60s", check=False)
    operator = scoped_operator(kube, namespace, "no-keda")
    try:
        kube.apply(_model(enabled=True, mode="external", externalScaler="hpa"), namespace)
        wait_for("both HPAs", lambda: len(_scalers(kube, namespace, "hpa")) == 2, timeout=60)
        wait_for("the model's status to settle", lambda: _settled(kube, namespace), timeout=60)
    finally:
        operator.stop()


def _replicas_owners(kube: Kube, namespace: str) -> set[str]:
    found = kube.run(
        "get", "deployment", f"{MODEL}-decode", "-n", namespace, "-o", "json",
        "--show-managed-fields", check=False,
    )  # fmt: skip
    if found.returncode != 0:
        return set()
    deployment = json.loads(found.stdout)
    return {
        entry["manager"]
        for entry in deployment["metadata"].get("managedFields", [])
        if "f:replicas" in entry.get("fieldsV1", {}).get("f:spec", {})
    }


def _decode_replicas(kube: Kube, namespace: str) -> int:
    deployment = kube.get("deployment", f"{MODEL}-decode", namespace)
    assert deployment is not None
    return int(deployment["spec"]["replicas"])


def test_an_external_scaler_takes_a_pool_over_at_its_current_size(
    kube: Kube, namespace: str
) -> None:
    # Server-side apply removes a field its manager stops applying when nobody else owns it,
    # and a Deployment without replicas runs one: the operator hands the count over first.
    operator = scoped_operator(kube, namespace, "handover")
    try:
        kube.apply(_model(enabled=True, mode="builtin"), namespace)
        wait_for(
            "the operator to create the decode pool at its spec size",
            lambda: _replicas_owners(kube, namespace) == {"disagg-operator"},
            timeout=60,
        )
        assert _decode_replicas(kube, namespace) == 2

        kube.apply(_model(enabled=True, mode="external", externalScaler="hpa"), namespace)
        wait_for("both HPAs", lambda: len(_scalers(kube, namespace, "hpa")) == 2, timeout=60)
        passes = operator.reconciles()
        wait_for("two more passes", lambda: operator.reconciles() >= passes + 2, timeout=30)
        assert _decode_replicas(kube, namespace) == 2
        assert _replicas_owners(kube, namespace) == {"disagg-handover"}

        # What the HPA would do (this control plane runs no HPA controller), then back to
        # the builtin autoscaler, which carries on from the pool's live size.
        kube.run("scale", f"deployment/{MODEL}-decode", "--replicas=3", "-n", namespace)
        kube.apply(_model(enabled=True, mode="builtin"), namespace)
        wait_for(
            "the operator to own the pool's size again",
            lambda: "disagg-operator" in _replicas_owners(kube, namespace),
            timeout=30,
        )
        assert not _scalers(kube, namespace, "hpa")
        assert _decode_replicas(kube, namespace) == 3
    finally:
        operator.stop()
