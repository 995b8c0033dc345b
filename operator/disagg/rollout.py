"""Pure reads of a Deployment and its pods: the counts status shows, whether the Deployment
controller has acted on the spec yet, what a rollout still waits for, the view of a
Deployment a reconcile pass compares, and the failures the controller and the scheduler
report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg.drift import drift_view

Obj = dict[str, Any]


def deployment_counts(deployment: Obj | None) -> tuple[int, int, int]:
    """(replicas, ready replicas, desired replicas); zeros for a Deployment not created yet."""
    if deployment is None:
        return 0, 0, 0
    status = deployment.get("status", {})
    desired = int(deployment.get("spec", {}).get("replicas", 1))
    return int(status.get("replicas", 0)), int(status.get("readyReplicas", 0)), desired


def unobserved(deployment: Obj) -> bool:
    """Whether the Deployment's controller has yet to act on a spec that changes a pod.

    One asked for no replicas that runs none has nothing to roll out, whatever its template
    says: the controller's ReplicaSet for it starts no pod, so its rollout is done already."""
    status = deployment.get("status") or {}
    generation = deployment.get("metadata", {}).get("generation", 0)
    if status.get("observedGeneration", 0) >= generation:
        return False
    idle = int((deployment.get("spec") or {}).get("replicas", 1)) == 0
    return not idle or int(status.get("replicas", 0)) > 0


def rollout_pending(deployment: Obj | None) -> str | None:
    """What a Deployment's rollout still waits for (None: it runs its template everywhere,
    ready, with no old replica left)."""
    if deployment is None:
        return "not created yet"
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    desired = int(spec.get("replicas", 1))
    if unobserved(deployment):
        return "rollout pending"
    if int(status.get("updatedReplicas", 0)) < desired:
        return f"{status.get('updatedReplicas', 0)}/{desired} updated"
    if int(status.get("replicas", 0)) > desired:
        return f"{status.get('replicas', 0) - desired} old replicas terminating"
    if int(status.get("readyReplicas", 0)) < desired:
        return f"{status.get('readyReplicas', 0)}/{desired} ready"
    return None


REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
"""The Deployment controller's count of its rollouts (a pass never reads it)."""


def deployment_view(deployment: Obj) -> Obj:
    """What a reconcile pass reads of a Deployment: its metadata and spec (drift, ownership),
    the counts and the rollout state status reports, and ReplicaFailure conditions.

    The controller's bookkeeping (a new resourceVersion, its status-subresource
    managedFields entry, the revision annotation it sets through that subresource on its
    first sync, conditions a pass does not read, an observedGeneration that changes no
    rollout) is left out: a watch event that changes none of the rest wakes nobody."""
    status = deployment.get("status") or {}
    view = drift_view(deployment)
    annotations = dict(view["metadata"].get("annotations") or {})
    annotations.pop(REVISION_ANNOTATION, None)
    return {
        **view,
        "metadata": {**view["metadata"], "annotations": annotations},
        "status": {
            "replicas": status.get("replicas", 0),
            "updatedReplicas": status.get("updatedReplicas", 0),
            "readyReplicas": status.get("readyReplicas", 0),
            "unobserved": unobserved(deployment),
            "failures": [
                cond
                for cond in status.get("conditions") or []
                if cond.get("type") == "ReplicaFailure"
            ],
        },
    }


def unschedulable_pods(pods: list[Obj]) -> list[str]:
    """One line per pending pod the scheduler could not place, with its reason."""
    lines = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for cond in pod.get("status", {}).get("conditions", []):
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and (cond.get("reason") == "Unschedulable")
            ):
                role = pod["metadata"].get("labels", {}).get("disagg.dev/role", "?")
                lines.append(
                    f"{role} pod {pod['metadata']['name']}: {cond.get('message', '').strip()}"
                )
    return lines


def replica_failures(deployments: Mapping[str, Obj | None]) -> list[str]:
    """One line per Deployment whose controller cannot create pods, with the server's reason."""
    lines = []
    for role, deployment in deployments.items():
        for cond in (deployment or {}).get("status", {}).get("conditions", []):
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                lines.append(f"{role}: {cond.get('message', cond.get('reason', '')).strip()}")
    return lines
