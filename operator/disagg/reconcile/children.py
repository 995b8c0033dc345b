"""A model's children in the cluster: apply what differs, prune what is unwanted.

What is live comes from the :class:`~disagg.kube.informer.ChildCache`, and every write is
recorded there as the API server answered it.

Every child is server-side applied under the operator's field manager, pool replicas
included (they are rendered from the spec or the autoscaler's decision). The one exception
is the moment an external scaler (KEDA, an HPA) takes a pool over: the operator stops
applying ``spec.replicas``, and a field nobody else owns would be removed and fall back to
one replica. So the current count is first handed to a field manager of its own, as the
Kubernetes documentation's "transferring ownership" procedure does for an HPA, and the
scaler's writes take it from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final

from disagg.drift import drift_view, needs_apply, owns_field, stamp
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.events import EventRecorder
from disagg.kube.informer import ChildCache
from disagg.naming import MANAGER
from disagg.rollout import deployment_view

Obj = dict[str, Any]
Live = dict[tuple[str, str], Obj]
CHILD_KINDS: Final = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Service",
    "PodDisruptionBudget",
    "Deployment",
    "HorizontalPodAutoscaler",
    "ScaledObject",
    "InferencePool",
    "HTTPRoute",
)
AFTER_PREREQUISITES: Final = frozenset(
    {
        "RoleBinding",
        "Deployment",
        "HorizontalPodAutoscaler",
        "ScaledObject",
        "InferencePool",
        "HTTPRoute",
    }
)
"""Kinds applied once the ServiceAccounts and Roles of the same pass exist."""
WATCHED_KINDS: Final = (*CHILD_KINDS, "Pod")
"""What the operator's :class:`~disagg.kube.informer.ChildCache` follows."""


def route_view(live: Obj) -> Obj:
    """What a pass reads of an HTTPRoute: what drift reads, and each Gateway's verdict on it
    (its conditions' status, reason and message), which the model's status reports."""
    parents = [
        {
            "parentRef": parent.get("parentRef"),
            "conditions": [
                {key: c.get(key) for key in ("type", "status", "reason", "message")}
                for c in parent.get("conditions") or []
            ],
        }
        for parent in (live.get("status") or {}).get("parents") or []
    ]
    return {**drift_view(live), "status": {"parents": parents}}


WAKE_VIEWS: Final[Mapping[str, Callable[[Obj], Obj]]] = {
    **{kind: drift_view for kind in CHILD_KINDS},
    "Deployment": deployment_view,
    "HTTPRoute": route_view,
}
"""Per kind, what a pass reads of it: a watch event that leaves that unchanged wakes nobody
(the Deployment controller's bookkeeping, a PodDisruptionBudget's healthy counts, an HPA's
metrics would cost a pass each). Pods have none: their readiness is what status reports."""
OPTIONAL_KINDS: Final = frozenset({"ScaledObject", "HTTPRoute", "InferencePool"})
"""Kinds whose CRD may not be installed (KEDA, the Gateway API and its Inference Extension):
a cluster without it has none of them."""
ROUTE_KINDS: Final = frozenset({"HTTPRoute", "InferencePool"})
"""Kinds whose missing API degrades the model instead of refusing it: the engines and the
in-cluster Service serve without them."""
HANDOVER_MANAGER: Final = "disagg-handover"


def named(obj: Obj) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}"


def owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


def only_replicas_differ(obj: Obj, live: Obj | None) -> bool:
    """Whether applying ``obj`` over ``live`` changes nothing but ``spec.replicas`` (a
    resize, which the autoscaler's own Event reports) (pure)."""
    if live is None or "replicas" not in obj.get("spec", {}):
        return False
    at_live_size = {**obj, "spec": {**obj["spec"], "replicas": live["spec"].get("replicas")}}
    return not needs_apply(stamp(at_live_size), live)


def apply_waves(desired: list[Obj]) -> list[list[Obj]]:
    """``desired`` in the order the API server needs, as waves whose children can be applied
    at once (pure): a RoleBinding is refused while its Role does not exist (the escalation
    check resolves the roleRef), and a pod is refused while its ServiceAccount does not, so
    those two go first and everything else with them; the RoleBindings and the workloads
    after."""
    later = [obj for obj in desired if obj["kind"] in AFTER_PREREQUISITES]
    first = [obj for obj in desired if obj["kind"] not in AFTER_PREREQUISITES]
    return [wave for wave in (first, later) if wave]


async def apply_children(
    client: KubeClient,
    cache: ChildCache,
    desired: list[Obj],
    live: Live,
    recorder: EventRecorder,
    body: Obj,
    unserved: list[Obj] | None = None,
) -> int:
    """Apply each desired child that differs from what is live, a wave at a time (see
    :func:`apply_waves`); one Event names them all. A route whose API the cluster does not
    serve (404) goes to ``unserved`` instead of failing the pass, when that is given."""
    done: dict[str, list[str]] = {"created": [], "updated": []}
    try:
        for wave in apply_waves(desired):
            verbs = await asyncio.gather(
                *(_apply_child(client, cache, obj, live) for obj in wave), return_exceptions=True
            )
            refused: list[BaseException] = []
            for obj, verb in zip(wave, verbs, strict=True):
                if isinstance(verb, str):
                    done[verb].append(named(obj))
                elif unserved is not None and _unserved_route(obj, verb):
                    unserved.append(obj)
                elif isinstance(verb, BaseException):
                    refused.append(verb)
            if refused:
                raise refused[0]
    finally:
        # One Event per pass, not one per child (a new model is one change to the user), and
        # it names what was applied even when another child was refused.
        parts = [f"{verb} {', '.join(names)}" for verb, names in done.items() if names]
        if parts:
            reason = "Created" if done["created"] else "Updated"
            await recorder.normal(body, reason, "; ".join(parts))
    return len(done["created"]) + len(done["updated"])


async def _apply_child(client: KubeClient, cache: ChildCache, obj: Obj, live: Live) -> str | None:
    """Apply one child if it differs from what is live: "created", "updated", "resized"
    (only its replicas changed) or None."""
    stamped = stamp(obj)
    key = (obj["kind"], obj["metadata"]["name"])
    current = live.get(key)
    if not needs_apply(stamped, current):
        return None
    resize = only_replicas_differ(obj, current)
    meta = obj["metadata"]
    with cache.writing(obj["kind"], meta["namespace"], meta["name"]):
        if current is not None and _letting_go_of_replicas(obj, current):
            await client.apply(_replicas_only(current), manager=HANDOVER_MANAGER)
        try:
            applied = await client.apply(stamped)
        except KubeError as error:
            hint = " (is the API that serves it installed?)" if error.status == 404 else ""
            raise KubeError(
                error.status, error.reason, f"{named(obj)}: {error.message}{hint}"
            ) from None
        # What the API server answered is the live object now, for this pass and the next.
        live[key] = {**applied, "kind": obj["kind"]}
        cache.record(live[key])
    if resize:
        return None
    return "created" if current is None else "updated"


def _unserved_route(obj: Obj, outcome: object) -> bool:
    return obj["kind"] in ROUTE_KINDS and isinstance(outcome, KubeError) and outcome.status == 404


def _letting_go_of_replicas(obj: Obj, live: Obj) -> bool:
    return (
        obj["kind"] == "Deployment"
        and "replicas" not in obj["spec"]
        and owns_field(live, MANAGER, ("spec", "replicas"))
    )


def _replicas_only(live: Obj) -> Obj:
    meta = live["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": int(live["spec"].get("replicas", 1))},
    }


async def prune(
    client: KubeClient,
    cache: ChildCache,
    uid: str,
    desired: list[Obj],
    live: Live,
    recorder: EventRecorder,
    body: Obj,
    kept: frozenset[tuple[str, str]] = frozenset(),
) -> int:
    """Delete the model's children the spec no longer wants, except ``kept`` (a mode switch's
    old pools while traffic moves); one Event names them."""
    wanted = {(o["kind"], o["metadata"]["name"]) for o in desired} | kept
    deleted: list[str] = []
    for (kind, name), obj in sorted(live.items()):
        if (kind, name) in wanted or not owned_by(obj, uid):
            continue
        namespace = obj["metadata"]["namespace"]
        with cache.writing(kind, namespace, name):
            if await client.delete(kind, namespace, name, uid=obj["metadata"].get("uid")):
                deleted.append(f"{kind} {name}")
            live.pop((kind, name))
            cache.forget(kind, namespace, name)  # deleted now, or already gone
    if deleted:
        message = f"deleted {', '.join(deleted)}: no longer wanted by the spec"
        await recorder.normal(body, "Deleted", message)
    return len(deleted)
