"""A model behind the user's Gateway, against the real API server with the Gateway API's
own CRDs (``make binaries`` fetches the standard channel at the version pinned in
e2e/cluster/gateway-api.version from its Go module).

No Gateway controller runs here: the test writes the route's status as one would (the
``status`` subresource, ``status.parents`` with Accepted and ResolvedRefs) and checks that
the model reports it. Without the CRDs the model degrades and its engines still run.
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
GATEWAY_CRDS = CACHE / "crds" / "gateway-api"
MODEL = "qwen-gateway"
ROUTE = f"{MODEL}-router"


INFERENCE_CRDS = CACHE / "crds" / "inference-extension"


@pytest.fixture
def gateway_api(kube: Kube) -> Iterator[None]:
    for crds, first in ((GATEWAY_CRDS, "gateway.networking.k8s.io_httproutes.yaml"),
                        (INFERENCE_CRDS, "inference.networking.k8s.io_inferencepools.yaml")):  # fmt: skip
        if not (crds / first).exists():
            pytest.fail(f"{first} is missing in {crds}: run `make binaries`")
        kube.run("apply", "--server-side", "-f", str(crds.resolve()))
    kube.wait_established("httproutes.gateway.networking.k8s.io")
    kube.wait_established("inferencepools.inference.networking.k8s.io")
    yield
    # Gone before the next test: one installing them again must not meet them terminating.
    for crds in (GATEWAY_CRDS, INFERENCE_CRDS):
        kube.run("delete", "-f", str(crds.resolve()), "--wait=true", "--timeout=60s", check=False)


def _model(behind_gateway: bool = True) -> str:
    manifest = example("behind-gateway")
    if not behind_gateway:
        del manifest["spec"]["gateway"]
    return yaml.safe_dump(manifest)


def _degraded(kube: Kube, namespace: str, reason: str) -> dict[str, Any] | None:
    found = condition(kube.get("dm", MODEL, namespace), "Degraded")
    return found if found and found["status"] == "True" and found["reason"] == reason else None


def _gateway_status(kube: Kube, namespace: str) -> dict[str, Any]:
    status: dict[str, Any] = (kube.get("dm", MODEL, namespace) or {}).get("status", {})
    return status.get("gateway") or {}


def _report(kube: Kube, namespace: str, accepted: str, reason: str) -> None:
    """What a Gateway controller writes on the route."""
    parent = {
        "parentRef": {
            "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge",
            "namespace": "gateway-system", "sectionName": "https",
        },
        "controllerName": "example.net/gateway-controller",
        "conditions": [
            {"type": "Accepted", "status": accepted, "reason": reason, "message": f"{reason}.",
             "observedGeneration": 1, "lastTransitionTime": "2026-12-07T00:00:00Z"},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "",
             "observedGeneration": 1, "lastTransitionTime": "2026-12-07T00:00:00Z"},
        ],
    }  # fmt: skip
    kube.run(
        "patch", "httproute", ROUTE, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"parents": [parent]}}),
    )  # fmt: skip


def test_the_route_is_accepted_by_the_api_server_reported_and_pruned(
    kube: Kube, gateway_api: None, namespace: str
) -> None:
    operator = scoped_operator(kube, namespace, "gateway")
    try:
        kube.apply(_model(), namespace)
        route = wait_for("the HTTPRoute", lambda: kube.get("httproute", ROUTE, namespace), 60)
        spec = route["spec"]
        assert spec["hostnames"] == ["llm.example.com"]
        assert spec["parentRefs"][0]["name"] == "edge"
        (rule,) = spec["rules"]
        assert rule["matches"][0]["path"] == {"type": "PathPrefix", "value": "/v1"}
        assert rule["backendRefs"][0]["name"] == ROUTE  # the router Service
        assert rule["backendRefs"][0]["kind"] == "Service"  # the API server's default
        waiting = wait_for(
            "the route in the model's status",
            lambda: (
                _gateway_status(kube, namespace).get("route") == ROUTE
                and _gateway_status(kube, namespace)
            ),
            60,
        )
        assert waiting["parents"] == [
            {"gateway": "gateway-system/edge/https", "accepted": "Unknown",
             "resolvedRefs": "Unknown"}
        ]  # fmt: skip

        _report(kube, namespace, "False", "NotAllowedByListeners")
        refused = wait_for(
            "Degraded=RouteNotAccepted",
            lambda: _degraded(kube, namespace, "RouteNotAccepted"),
            60,
        )
        assert "gateway-system/edge/https" in refused["message"]
        assert "NotAllowedByListeners" in refused["message"]

        _report(kube, namespace, "True", "Accepted")
        wait_for(
            "the Gateway's acceptance in status",
            lambda: (
                (_gateway_status(kube, namespace).get("parents") or [{}])[0].get("accepted")
                == "True"
            ),
            60,
        )
        healthy = condition(kube.get("dm", MODEL, namespace), "Degraded")
        assert healthy is not None and healthy["status"] == "False", healthy
        events = [e for e in kube.items("events", namespace) if e.get("reason") == "RouteAccepted"]
        assert len(events) == 1 and "gateway-system/edge/https" in events[0]["message"]
        # One Event for the new model, naming the route beside the rest.
        (created,) = [e for e in kube.items("events", namespace) if e.get("reason") == "Created"]
        assert f"HTTPRoute {ROUTE}" in created["message"], created

        # A route the operator did not write is put back; its status is the controller's.
        kube.run(
            "patch", "httproute", ROUTE, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"hostnames": ["other.example.com"]}}),
        )  # fmt: skip
        wait_for(
            "the route's hostnames put back",
            lambda: (
                (kube.get("httproute", ROUTE, namespace) or {})["spec"]["hostnames"]
                == ["llm.example.com"]
            ),
            60,
        )

        kube.apply(_model(behind_gateway=False), namespace)
        wait_for("the route pruned", lambda: kube.get("httproute", ROUTE, namespace) is None, 60)
        wait_for("no gateway in status", lambda: not _gateway_status(kube, namespace), 60)
    finally:
        operator.stop()


def test_an_inference_pool_is_accepted_converges_and_a_switch_back_prunes_it(
    kube: Kube, gateway_api: None, namespace: str
) -> None:
    manifest = example("inference-pool")
    operator = scoped_operator(kube, namespace, "inference-pool")
    try:
        kube.apply(yaml.safe_dump(manifest), namespace)
        pool = wait_for(
            "the InferencePool", lambda: kube.get("inferencepool", "qwen-pool", namespace), 60
        )
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
        route = wait_for(
            "the HTTPRoute", lambda: kube.get("httproute", "qwen-pool-router", namespace), 60
        )
        backend = route["spec"]["rules"][0]["backendRefs"][0]
        assert (backend["kind"], backend["name"]) == ("InferencePool", "qwen-pool")
        # kwok runs every pod, the picker and the sidecar'd decode engine included.
        ready = wait_for(
            "Ready",
            lambda: (
                (c := condition(kube.get("dm", "qwen-pool", namespace), "Ready"))
                and c["status"] == "True"
                and c
            ),
            120,
        )
        assert "router" in ready["message"]
        decode = kube.get("deployment", "qwen-pool-decode", namespace)
        assert decode is not None
        sidecars = decode["spec"]["template"]["spec"]["initContainers"]
        assert [c["name"] for c in sidecars] == ["routing-sidecar"]

        manifest["spec"]["router"] = {"kind": "builtin"}
        kube.apply(yaml.safe_dump(manifest), namespace)
        wait_for(
            "the InferencePool pruned",
            lambda: kube.get("inferencepool", "qwen-pool", namespace) is None,
            60,
        )
        wait_for(
            "the route back on the router Service",
            lambda: (
                (kube.get("httproute", "qwen-pool-router", namespace) or {})["spec"]["rules"][0][
                    "backendRefs"
                ][0].get("kind")
                == "Service"
            ),
            60,
        )
    finally:
        operator.stop()


def test_without_the_gateway_api_the_model_degrades_and_its_engines_run(
    kube: Kube, namespace: str
) -> None:
    # The CRDs are gone (the tests above remove them): applying the route answers 404.
    kube.run(
        "wait", "--for=delete", "crd/httproutes.gateway.networking.k8s.io", "--timeout=60s",
        check=False,
    )  # fmt: skip
    operator = scoped_operator(kube, namespace, "no-gateway-api")
    try:
        kube.apply(_model(), namespace)
        degraded = wait_for(
            "Degraded=GatewayAPIUnavailable",
            lambda: _degraded(kube, namespace, "GatewayAPIUnavailable"),
            60,
        )
        assert "gateway.networking.k8s.io/v1 HTTPRoute" in degraded["message"]
        for role in ("prefill", "decode", "router"):
            assert kube.get("deployment", f"{MODEL}-{role}", namespace) is not None, role
        assert kube.get("service", ROUTE, namespace) is not None
    finally:
        operator.stop()
