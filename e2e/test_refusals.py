"""What the cluster refuses at runtime is visible: Degraded with the server's own message,
one Event, no retry storm, and it clears when the cause goes away.

Two refusals a valid spec meets on real clusters: the Deployment controller cannot create
pods (here a PriorityClass that does not exist), and the API server refuses a child outright
(here a ValidatingAdmissionPolicy, as a policy engine would).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness import Kube, Operator, condition, example, scoped_operator, wait_for

MODEL = "qwen-small"


@pytest.fixture
def own_operator(kube: Kube, namespace: str) -> Iterator[Operator]:
    """An operator of its own, scoped to the test's namespace, so its writes are the test's."""
    operator = scoped_operator(kube, namespace, "refusals")
    yield operator
    operator.stop()


def _apply_model(kube: Kube, namespace: str, **prefill: Any) -> None:
    manifest = example("minimal")
    manifest["spec"]["prefill"] = {**manifest["spec"].get("prefill", {}), **prefill}
    kube.apply(yaml.safe_dump(manifest), namespace)


def _degraded(kube: Kube, namespace: str, reason: str) -> dict[str, Any] | None:
    cond = condition(kube.get("dm", MODEL, namespace), "Degraded")
    return cond if cond and cond["status"] == "True" and cond["reason"] == reason else None


def _warnings(kube: Kube, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.items("events", namespace)
        if e.get("reason") == reason and e["involvedObject"].get("kind") == "DisaggregatedModel"
    ]


def _status_and_event_writes(operator: Operator) -> dict[str, float]:
    return {
        k: v
        for k, v in operator.writes(exclude=()).items()
        if 'kind="DisaggregatedModel"' in k or 'kind="Event"' in k
    }


def _passes(operator: Operator, count: int) -> None:
    before = operator.reconciles()
    wait_for(
        f"{count} more reconcile passes",
        lambda: operator.reconciles() >= before + count,
        timeout=30,
    )


def test_pods_the_cluster_refuses_degrade_the_model_until_fixed(
    kube: Kube, namespace: str, own_operator: Operator
) -> None:
    priority = f"e2e-critical-{namespace}"
    _apply_model(kube, namespace, priorityClassName=priority)
    degraded = wait_for(
        "Degraded=ReplicaFailure",
        lambda: _degraded(kube, namespace, "ReplicaFailure"),
        timeout=90,
    )
    assert degraded["message"].startswith("prefill: ")
    assert f"no PriorityClass with name {priority} was found" in degraded["message"]
    _passes(own_operator, 3)
    events = _warnings(kube, namespace, "ReplicaFailure")
    assert len(events) == 1 and events[0].get("count", 1) == 1, events

    kube.apply(
        yaml.safe_dump(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": priority},
                "value": 1000,
            }
        ),
        namespace,
    )
    try:
        wait_for(
            "Degraded to clear once the PriorityClass exists",
            lambda: not _degraded(kube, namespace, "ReplicaFailure"),
            timeout=120,
        )
    finally:
        kube.run("delete", "priorityclass", priority, "--wait=false", check=False)


def _policy(namespace: str) -> str:
    """A policy that refuses decode Deployments in one namespace, as Kyverno or Gatekeeper
    would."""
    name = f"e2e-no-decode-{namespace}"
    scope = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": scope,
                "resourceRules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deployments"],
                    }
                ],
            },
            "validations": [
                {
                    "expression": "!object.metadata.name.endsWith('-decode')",
                    "message": "decode Deployments need an approved change ticket",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": scope},
        },
    }
    return yaml.safe_dump_all([policy, binding])


def test_a_child_the_api_server_refuses_degrades_once_without_a_retry_storm(
    kube: Kube, namespace: str, own_operator: Operator
) -> None:
    policy = _policy(namespace)
    kube.apply(policy, namespace)
    try:
        # Policies take effect once the API server has loaded them: probe with a dry run.
        probe = yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "probe-decode"},
                "spec": {
                    "selector": {"matchLabels": {"app": "probe"}},
                    "template": {
                        "metadata": {"labels": {"app": "probe"}},
                        "spec": {"containers": [{"name": "c", "image": "probe"}]},
                    },
                },
            }
        )
        wait_for(
            "the policy to be enforced",
            lambda: kube.apply(probe, namespace, "--dry-run=server", check=False).returncode != 0,
            timeout=30,
        )
        _apply_model(kube, namespace)
        degraded = wait_for(
            "Degraded=ApplyRejected",
            lambda: _degraded(kube, namespace, "ApplyRejected"),
            timeout=60,
        )
        assert "Deployment qwen-small-decode" in degraded["message"], degraded
        assert "decode Deployments need an approved change ticket" in degraded["message"]
        said = _status_and_event_writes(own_operator)
        _passes(own_operator, 3)
        # Each resync tries the refused apply again (so the model recovers on its own once
        # the cause is gone; the API server stores nothing), but writes no status and posts
        # no new Event.
        assert _status_and_event_writes(own_operator) == said
        assert len(_warnings(kube, namespace, "ApplyRejected")) == 1
    finally:
        kube.run("delete", "-f", "-", stdin=policy, check=False)
    wait_for(
        "the model to recover once the policy is gone",
        lambda: (
            (c := condition(kube.get("dm", MODEL, namespace), "Ready")) and c["status"] == "True"
        ),
        timeout=90,
    )
