"""One level-based pass over one model: validate, render, apply, prune, observe, write status.

The same function runs for create, update, resume, a child's change and the periodic
resync; it never branches on which event fired. It writes only what differs (see
:mod:`disagg.drift`), so an unchanged model costs reads and no writes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from disagg.api.resource import DisaggregatedModel, ManifestError, parse_model
from disagg.api.status import DisaggregatedModelStatus
from disagg.autoscale.loop import AUTOSCALER_MANAGER, replicas_object
from disagg.drift import needs_apply, stamp
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.events import EventRecorder
from disagg.naming import child_name, model_selector
from disagg.render import RenderContext, render_all, router_endpoint
from disagg.status import Observed, compute_status, invalid_status, status_patch

log = logging.getLogger("disagg.reconcile")
Obj = dict[str, Any]
CHILD_KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Service",
    "PodDisruptionBudget",
    "Deployment",
    "HorizontalPodAutoscaler",
    "ScaledObject",
)
REJECTED = frozenset({400, 403, 404, 405, 413, 415, 422})
"""Statuses that refuse the request itself: applying it again gets the same answer."""
OPTIONAL_KINDS = frozenset({"ScaledObject"})
"""Kinds whose CRD may not be installed (KEDA): a cluster without it has none of them."""


@dataclass(frozen=True)
class Outcome:
    """What a pass did: counts for logs and metrics."""

    applied: int = 0
    pruned: int = 0
    status_written: bool = False
    invalid: bool = False
    gone: bool = False
    autoscaled: bool = False
    """The builtin autoscaler should run for this model."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


def _previous_status(body: Obj) -> DisaggregatedModelStatus | None:
    raw = body.get("status")
    if not raw:
        return None
    try:
        return DisaggregatedModelStatus.model_validate(raw)
    except ValidationError:
        return None  # someone wrote garbage into status: recompute from scratch


def _already_degraded(
    previous: DisaggregatedModelStatus | None,
    reason: str,
    generation: int,
    message: str | None = None,
) -> bool:
    """Whether status already says so for this generation (then its Event was posted)."""
    return previous is not None and any(
        c.type == "Degraded"
        and c.reason == reason
        and c.observed_generation == generation
        and (message is None or c.message == message)
        for c in previous.conditions
    )


async def _write_status(client: KubeClient, body: Obj, status: DisaggregatedModelStatus) -> bool:
    meta = body["metadata"]
    patch = status_patch(body.get("status") or {}, status.to_wire())
    if patch is None:
        return False
    await client.patch_status(
        "DisaggregatedModel", meta["namespace"], meta["name"], patch,
        resource_version=meta.get("resourceVersion"),
    )  # fmt: skip
    return True


async def _apply_children(
    client: KubeClient,
    model: DisaggregatedModel,
    desired: list[Obj],
    live: dict[tuple[str, str], Obj],
    recorder: EventRecorder,
    body: Obj,
) -> int:
    done: dict[str, list[str]] = {"created": [], "updated": []}
    try:
        for obj in desired:
            verb = await _apply_child(client, model, obj, live)
            if verb is not None:
                done[verb].append(_named(obj))
    finally:
        # One Event per pass, not one per child (a new model is one change to the user), and
        # it names what was applied even when a later child was refused.
        parts = [f"{verb} {', '.join(names)}" for verb, names in done.items() if names]
        if parts:
            reason = "Created" if done["created"] else "Updated"
            await recorder.normal(body, reason, "; ".join(parts))
    return len(done["created"]) + len(done["updated"])


async def _apply_child(
    client: KubeClient, model: DisaggregatedModel, obj: Obj, live: dict[tuple[str, str], Obj]
) -> str | None:
    """Apply one child if it differs from what is live: "created", "updated" or None."""
    stamped = stamp(obj)
    key = (obj["kind"], obj["metadata"]["name"])
    current = live.get(key)
    if not needs_apply(stamped, current):
        return None
    role = obj["metadata"]["labels"].get("disagg.dev/role")
    hand_over = (
        obj["kind"] == "Deployment"
        and role in ("prefill", "decode")
        and "replicas" not in obj["spec"]
    )
    if hand_over and current is not None:
        await _hand_over_replicas(client, model, role, current)
    try:
        applied = await client.apply(stamped)
    except KubeError as error:
        hint = " (is the API that serves it installed?)" if error.status == 404 else ""
        raise KubeError(
            error.status, error.reason, f"{_named(obj)}: {error.message}{hint}"
        ) from None
    if hand_over and current is None:
        # A new Deployment starts at one replica; the autoscaler's manager owns it from here.
        applied = await _hand_over_replicas(client, model, role, None)
    # What the API server answered is the live object now: no need to list it again.
    live[key] = {**applied, "kind": obj["kind"]}
    return "created" if current is None else "updated"


def _named(obj: Obj) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}"


async def _hand_over_replicas(
    client: KubeClient, model: DisaggregatedModel, role: str, live: Obj | None
) -> Obj:
    """Let the autoscaler's field manager own ``spec.replicas`` before the operator lets go.

    The operator stops applying replicas when autoscaling is on; if nobody else owned the
    field, server-side apply would drop it and the pool would fall back to one replica.
    """
    bounds = model.spec.pool(role).autoscaling  # type: ignore[arg-type]
    current = int(live["spec"].get("replicas", 1)) if live else model.spec.pool(role).replicas  # type: ignore[arg-type]
    replicas = max(bounds.min_replicas, min(bounds.max_replicas, current))
    name = child_name(model.metadata.name, role)  # type: ignore[arg-type]
    return await client.apply(
        replicas_object(model.metadata.namespace, name, replicas), manager=AUTOSCALER_MANAGER
    )


async def _prune(
    client: KubeClient,
    uid: str,
    desired: list[Obj],
    live: dict[tuple[str, str], Obj],
    recorder: EventRecorder,
    body: Obj,
) -> int:
    wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
    deleted: list[str] = []
    for (kind, name), obj in sorted(live.items()):
        if (kind, name) in wanted or not _owned_by(obj, uid):
            continue
        if await client.delete(
            kind, obj["metadata"]["namespace"], name, uid=obj["metadata"].get("uid")
        ):
            deleted.append(f"{kind} {name}")
            live.pop((kind, name))
    if deleted:
        message = f"deleted {', '.join(deleted)}: no longer wanted by the spec"
        await recorder.normal(body, "Deleted", message)
    return len(deleted)


async def _list_children(
    client: KubeClient, namespace: str, name: str
) -> dict[tuple[str, str], Obj]:
    live: dict[tuple[str, str], Obj] = {}
    for kind in CHILD_KINDS:
        try:
            objects = await client.list_objects(kind, namespace, model_selector(name))
        except KubeError as error:
            if error.status == 404 and kind in OPTIONAL_KINDS:
                continue
            raise
        for obj in objects:
            live[(kind, obj["metadata"]["name"])] = obj
    return live


async def reconcile_model(
    client: KubeClient,
    recorder: EventRecorder,
    namespace: str,
    name: str,
    replicas: Callable[[DisaggregatedModel], Awaitable[dict[str, int]]] | None = None,
) -> Outcome:
    """Bring one model's children and status in line with its spec."""
    body = await client.get("DisaggregatedModel", namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome(gone=True)  # ownerReferences let the garbage collector remove children
    generation = int(body["metadata"].get("generation", 0))
    previous = _previous_status(body)
    try:
        model = parse_model(body)
    except ManifestError as error:
        status = invalid_status(error.problems, generation, previous, _now())
        if not _already_degraded(previous, "InvalidSpec", generation):
            await recorder.warning(body, "InvalidSpec", "; ".join(error.problems))
        written = await _write_status(client, body, status)
        return Outcome(status_written=written, invalid=True)

    overrides = await replicas(model) if replicas is not None else {}
    ctx = RenderContext(model, replicas=overrides)
    desired = render_all(ctx)
    live = await _list_children(client, namespace, name)
    uid = body["metadata"]["uid"]
    try:
        applied = await _apply_children(client, model, desired, live, recorder, body)
    except KubeError as error:
        if error.status == 403 and "being terminated" in error.message:
            return Outcome(gone=True)  # the namespace is going away, and the model with it
        if error.status not in REJECTED:
            await recorder.warning(body, "ApplyFailed", str(error))
            raise  # transient: the queue retries with backoff
        # Refused (invalid, forbidden by admission or a policy, an API not installed): the
        # same apply gets the same answer, so say why once; resyncs try again, and the model
        # recovers by itself when the cause goes away.
        message = f"the API server refused {error.message}"
        rejected = invalid_status([message], generation, previous, _now(), "ApplyRejected")
        if not _already_degraded(previous, "ApplyRejected", generation, message):
            await recorder.warning(body, "ApplyRejected", message)
        return Outcome(status_written=await _write_status(client, body, rejected), invalid=True)
    pruned = await _prune(client, uid, desired, live, recorder, body)

    pods = await client.list_objects("Pod", namespace, model_selector(name))
    deployments = {
        role: live.get(("Deployment", child_name(name, role)))
        for role in ("prefill", "decode", "router")
    }
    observed = Observed(
        generation=generation,
        deployments=deployments,
        pods=pods,
        router_enabled=model.spec.router.enabled,
        router_endpoint=router_endpoint(ctx),
        autoscaling_enabled=model.spec.autoscaling.enabled,
        autoscaling_mode=model.spec.autoscaling.mode,
    )
    status = compute_status(observed, previous, _now())
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    if degraded.status == "True" and not _already_degraded(previous, degraded.reason, generation):
        await recorder.warning(body, degraded.reason, degraded.message)
    written = await _write_status(client, body, status)
    autoscaling = model.spec.autoscaling
    return Outcome(
        applied=applied, pruned=pruned, status_written=written,
        autoscaled=autoscaling.enabled and autoscaling.mode == "builtin",
    )  # fmt: skip
