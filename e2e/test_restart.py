"""Crashes and restarts: the operator converges with no duplicate or orphaned objects, through
its own death mid-reconcile and an API server restart."""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any

import yaml

from disagg.devcluster import runner
from harness import EXAMPLES, Kube, Operator, condition, wait_for

MODELS = 50
KINDS = "deployments,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings"
EXPECTED = Counter(
    {
        "Deployment": 3,
        "Service": 3,
        "PodDisruptionBudget": 3,
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
    }
)


def _manifests() -> str:
    base: dict[str, Any] = yaml.safe_load((EXAMPLES / "tcp-dev.yaml").read_text())
    docs = []
    for i in range(MODELS):
        doc = {**base, "metadata": {"name": f"m{i:02d}"}}
        docs.append(yaml.safe_dump(doc))
    return "---\n".join(docs)


def test_killed_mid_reconcile_then_restarted_through_an_api_server_restart_converges(
    kube: Kube, namespace: str
) -> None:
    first = Operator(
        kube.layout, f"--namespace={namespace}", "--no-leader-election", log_name="crash"
    )

    def deployments_written() -> float:
        return sum(v for k, v in first.writes().items() if 'kind="Deployment"' in k)

    kube.apply(_manifests(), namespace)
    # Kill it as soon as it is partway through: some children exist, not all. Its own
    # metrics say so within milliseconds; a kubectl list each time took long enough that the
    # operator had once written all 150 Deployments before the kill.
    wait_for("the first children", lambda: deployments_written() >= 5, timeout=60, interval=0.02)
    first.kill()
    partial = len(kube.items("deployments", namespace))
    assert partial < MODELS * 3, (
        "the operator finished before it could be killed; nothing was tested"
    )

    second = Operator(
        kube.layout, f"--namespace={namespace}", "--no-leader-election", log_name="restart"
    )
    try:
        # While the new operator works through the backlog, the API server goes away and comes
        # back on the same etcd: every watch and request of the operator breaks at once.
        wait_for(
            "the restarted operator to add children",
            lambda: len(kube.items("deployments", namespace)) > partial,
            timeout=60,
            interval=0.05,
        )
        runner.restart(kube.layout, "kube-apiserver", lambda _: None)
        assert second.process.poll() is None, "the operator exited when the API server restarted"

        def converged() -> bool:
            models = kube.items("dm", namespace)
            return len(models) == MODELS and all(
                m.get("status", {}).get("observedGeneration") == m["metadata"]["generation"]
                and condition(m, "Progressing") is not None
                for m in models
            )

        wait_for("every model reconciled after the restart", converged, timeout=180, interval=1)
        children = kube.json("get", KINDS, "-n", namespace, "-l", "disagg.dev/model")["items"]
        models = {m["metadata"]["name"]: m["metadata"]["uid"] for m in kube.items("dm", namespace)}
        per_model: dict[str, Counter[str]] = {name: Counter() for name in models}
        for child in children:
            owner = child["metadata"]["labels"].get("disagg.dev/model")
            assert owner in models, f"orphan {child['kind']} {child['metadata']['name']}"
            refs = child["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [models[owner]]
            per_model[owner][child["kind"]] += 1
        for name, counts in per_model.items():
            assert counts == EXPECTED, f"{name}: {dict(counts)}"
        # The controller-manager's watches broke too and back off before they list again:
        # wait for it to create every ReplicaSet, then make sure there is no second one.
        wait_for(
            "the controller-manager to create the ReplicaSets",
            lambda: len(kube.items("replicasets", namespace)) >= MODELS * 3,
            timeout=120,
            interval=1,
        )
        replicasets = kube.items("replicasets", namespace)
        assert len(replicasets) == MODELS * 3, _rolled(kube, namespace, replicasets)
        assert second.process.poll() is None
    finally:
        second.stop()
        kube.run("delete", "dm", "--all", "-n", namespace, "--wait=false", check=False)


def _rolled(kube: Kube, namespace: str, replicasets: list[dict[str, Any]]) -> str:
    """Which Deployments have more than one ReplicaSet, and how their templates differ."""
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for rs in replicasets:
        by_owner.setdefault(rs["metadata"]["ownerReferences"][0]["name"], []).append(rs)
    lines = ["a restart must not roll the Deployments:"]
    for name, sets in sorted(by_owner.items()):
        if len(sets) < 2:
            continue
        deployment = kube.get("deployment", name, namespace) or {}
        templates = [yaml.safe_dump(rs["spec"]["template"]) for rs in sets]
        lines.append(
            f"  {name}: {len(sets)} ReplicaSets, templates "
            f"{'differ' if len(set(templates)) > 1 else 'identical'}, collisionCount "
            f"{deployment.get('status', {}).get('collisionCount')}, revisions "
            f"{[rs['metadata']['annotations'].get('deployment.kubernetes.io/revision') for rs in sets]}"
        )
        if len(set(templates)) > 1:
            lines += list(
                difflib.unified_diff(
                    templates[0].splitlines(), templates[1].splitlines(), lineterm=""
                )
            )[:40]
    return "\n".join(lines)


def test_standby_replica_takes_over_when_the_leader_dies(kube: Kube, namespace: str) -> None:
    lease = f"disagg-ha-{namespace}"
    one = Operator(
        kube.layout, f"--namespace={namespace}", f"--lease-name={lease}", log_name="ha-1"
    )
    wait_for(
        "the first replica to lead",
        lambda: one.metrics().get("disagg_operator_leader") == 1.0,
        timeout=30,
    )
    two = Operator(
        kube.layout, f"--namespace={namespace}", f"--lease-name={lease}", log_name="ha-2"
    )
    try:
        assert two.metrics().get("disagg_operator_leader") == 0.0
        one.kill()
        wait_for(
            "the standby to take over",
            lambda: two.metrics().get("disagg_operator_leader") == 1.0,
            timeout=40,
        )
        base: dict[str, Any] = yaml.safe_load((EXAMPLES / "tcp-dev.yaml").read_text())
        kube.apply(yaml.safe_dump(base), namespace)
        wait_for(
            "the new leader to reconcile a model",
            lambda: condition(kube.get("dm", "dev-tcp", namespace), "Ready"),
            timeout=60,
        )
    finally:
        two.stop()
