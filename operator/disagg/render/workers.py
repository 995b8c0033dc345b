"""The pool Deployments: prefill and decode engine pods wired for KV-cache transfer, or the
colocated engine pool, which needs no RDMA."""

from __future__ import annotations

from typing import Any, Final

from disagg.api.base import ApiModel
from disagg.api.spec import DisaggregatedModelSpec, RdmaSpec, Role
from disagg.naming import MULTUS_ANNOTATION, child_name, labels, selector_labels
from disagg.render.common import Manifest, RenderContext, image_pull_secrets, object_meta
from disagg.render.engine_args import MODEL_MOUNT, EngineLaunch, behind_sidecar, engine_launch
from disagg.render.inference_pool import pool_pod_labels, routing_sidecar
from disagg.versions import DEFAULT_IMAGES, DataPlaneImages

GPU_RESOURCE: Final = "nvidia.com/gpu"
LAUNCHER: Final = ["disagg-engine", "launch", "--"]
TERMINATION_GRACE_SECONDS: Final = 120
STARTUP_BUDGET_SECONDS: Final = 1800
"""Model download and load can take many minutes; the startup probe waits this long."""


def engine_image(spec: DisaggregatedModelSpec, images: DataPlaneImages = DEFAULT_IMAGES) -> str:
    """The engine image in force (the bundled one of the backend unless overridden)."""
    if spec.runtime.image:
        return spec.runtime.image
    return images.vllm if spec.runtime.backend == "vllm" else images.sglang


def pool_replicas(ctx: RenderContext, role: Role) -> int | None:
    """Replicas the operator applies to a pool: the spec's; with the builtin autoscaler its
    decision (``ctx.replicas``, else the spec's) within the pool's bounds; None when an
    external scaler owns them. The only place a pool's size is decided for the cluster."""
    spec = ctx.model.spec
    pool = spec.pool(role)
    if not spec.autoscaling.enabled:
        return pool.replicas
    if spec.autoscaling.mode == "external":
        return None
    bounds = pool.autoscaling
    wanted = ctx.replicas.get(role, pool.replicas)
    return max(bounds.min_replicas, min(bounds.max_replicas, wanted))


def _rdma(spec: DisaggregatedModelSpec, role: Role) -> RdmaSpec | None:
    """The RDMA settings a pool uses: none for the colocated engine, which moves no KV."""
    return None if role == "engine" else spec.network.rdma_or_default


def _resources(spec: DisaggregatedModelSpec, role: Role) -> Manifest:
    pool = spec.pool(role)
    extended: dict[str, Any] = {GPU_RESOURCE: str(pool.gpus)}
    rdma = _rdma(spec, role)
    if rdma is not None:
        extended[rdma.resource_name] = str(rdma.resource_count)
    # Extended resources must be equal in requests and limits.
    requests = {**pool.resources.requests, **extended}
    limits = {**pool.resources.limits, **extended}
    return {"requests": requests, "limits": limits}


def _probe(path: str, period: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _volumes(spec: DisaggregatedModelSpec) -> tuple[list[Manifest], list[Manifest]]:
    volumes: list[Manifest] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.network.shm_size}},
    ]
    mounts: list[Manifest] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True})
    else:
        volumes.append({"name": "cache", "emptyDir": {}})
        mounts.append({"name": "cache", "mountPath": "/cache"})
    return volumes, mounts


def _container(
    spec: DisaggregatedModelSpec, role: Role, image: str, launch: EngineLaunch
) -> Manifest:
    drain_seconds = TERMINATION_GRACE_SECONDS - 10
    container: Manifest = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": LAUNCHER,
        "args": launch.argv,
        "ports": [
            {"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in launch.ports
        ],
        "env": launch.env,
        "resources": _resources(spec, role),
        "startupProbe": _probe("/health", 10, STARTUP_BUDGET_SECONDS // 10),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
        # Before the pod is killed, wait until the engine has no running request and (prefill)
        # no KV still lent to a decode engine; the router already stopped sending new ones.
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "disagg-engine", "drain", "--port", str(launch.http_port),
                        "--timeout", str(drain_seconds),
                    ]
                }
            }
        },
    }  # fmt: skip
    if _rdma(spec, role) is not None:
        # IPC_LOCK lifts RLIMIT_MEMLOCK for verbs memory registration (ib_umem_get).
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return container


def _pod_annotations(
    spec: DisaggregatedModelSpec, role: Role, launch: EngineLaunch
) -> dict[str, str]:
    annotations = dict(launch.pod_annotations)
    rdma = _rdma(spec, role)
    if rdma is not None and rdma.networks and not rdma.host_network:
        annotations[MULTUS_ANNOTATION] = ", ".join(rdma.networks)
    return annotations


def _wire(part: ApiModel) -> Manifest:
    """A part of the spec as the API server takes it (camelCase, unset fields left out)."""
    wired: Manifest = part.model_dump(by_alias=True, exclude_none=True, mode="json")
    return wired


def render_pool(ctx: RenderContext, role: Role) -> Manifest:
    """The Deployment of one pool."""
    spec = ctx.model.spec
    replicas = pool_replicas(ctx, role)
    pool = spec.pool(role)
    launch = engine_launch(spec, role)
    volumes, mounts = _volumes(spec)
    container = _container(spec, role, engine_image(spec, ctx.images), launch)
    settings = pool.pod
    container["volumeMounts"] = [*mounts, *(_wire(m) for m in settings.volume_mounts)]
    pod_spec: Manifest = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": settings.automount_service_account_token,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": [*volumes, *(_wire(v) for v in settings.volumes)],
    }
    if settings.service_account_name:
        pod_spec["serviceAccountName"] = settings.service_account_name
    if settings.runtime_class_name:
        pod_spec["runtimeClassName"] = settings.runtime_class_name
    pod_spec.update(image_pull_secrets(ctx.model))
    rdma = _rdma(spec, role)
    if rdma is not None and rdma.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.affinity:
        pod_spec["affinity"] = pool.affinity.model_dump(
            by_alias=True, exclude_none=True, exclude_defaults=True, mode="json"
        )
    if pool.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in pool.tolerations
        ]
    if pool.priority_class_name:
        pod_spec["priorityClassName"] = pool.priority_class_name
    if behind_sidecar(spec, role):
        pod_spec["initContainers"] = [routing_sidecar(spec, pool.data_parallel_size)]
    template_meta: Manifest = {
        "labels": {
            **settings.labels,
            **pool_pod_labels(spec, ctx.name, role),
            **labels(ctx.name, role),
        }
    }
    annotations = {**settings.annotations, **_pod_annotations(spec, role, launch)}
    if annotations:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(ctx, child_name(ctx.name, role), role),
        "spec": {
            **({} if replicas is None else {"replicas": replicas}),
            "selector": {"matchLabels": selector_labels(ctx.name, role)},
            # Surge one pod at a time and never drop below the desired ready count.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 5,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
