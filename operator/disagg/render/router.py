"""The router: its Deployment, ServiceAccount and the Role that lets it watch pool pods."""

from __future__ import annotations

from typing import Final

from disagg.api.base import parse_duration
from disagg.naming import child_name, labels, pool_selector, router_service_account, selector_labels
from disagg.render.common import Manifest, RenderContext, image_pull_secrets, object_meta

DRAIN_SECONDS: Final = 60
"""How long a stopping router keeps serving the requests it has (``--drain-timeout``)."""
DEREGISTER_SECONDS: Final = 5
"""preStop pause before SIGTERM, so Services stop sending to the pod before it stops listening."""
_DEFAULT_RESOURCES: Final[Manifest] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "1Gi"},
}


def router_endpoint(ctx: RenderContext) -> str | None:
    """In-cluster base URL of the model's OpenAI-compatible API; None with router.kind
    inferencePool, whose router Service is the endpoint picker's gRPC port (the API is
    reached through the Gateway)."""
    if ctx.model.spec.router.kind != "builtin":
        return None
    port = ctx.model.spec.router.port
    return f"http://{child_name(ctx.name, 'router')}.{ctx.namespace}.svc:{port}/v1"


def router_args(ctx: RenderContext) -> list[str]:
    """Command-line arguments of ``disagg router`` for this model."""
    spec = ctx.model.spec
    common = [
        "--host", "0.0.0.0",
        "--port", str(spec.router.port),
        "--served-model-name", spec.served_name,
        "--backend", spec.runtime.backend,
        "--discover",
        "--namespace", ctx.namespace,
        *_tracing_args(ctx),
    ]  # fmt: skip
    if (ctx.router_mode or spec.mode) == "colocated":
        return [
            *common,
            "--colocated",
            "--decode-selector", pool_selector(ctx.name, "engine"),
            "--policy", spec.router.policy,
            "--drain-timeout", str(DRAIN_SECONDS),
        ]  # fmt: skip
    return [
        *common,
        "--prefill-selector", pool_selector(ctx.name, "prefill"),
        "--decode-selector", pool_selector(ctx.name, "decode"),
        "--pd-threshold", str(spec.router.prefill_threshold_tokens),
        "--policy", spec.router.policy,
        "--drain-timeout", str(DRAIN_SECONDS),
        *_local_prefill_args(ctx),
        *_offload_args(ctx),
    ]  # fmt: skip


def _tracing_args(ctx: RenderContext) -> list[str]:
    spec = ctx.model.spec
    tracing = spec.observability.tracing
    if tracing is None:
        return []
    return [
        "--otlp-endpoint", tracing.endpoint,
        "--trace-sampling-ratio", f"{tracing.sampling_ratio:g}",
        "--otlp-service-name", f"{spec.served_name}-router",
    ]  # fmt: skip


def _offload_args(ctx: RenderContext) -> list[str]:
    spec = ctx.model.spec
    offload = spec.router.prefill_offload
    if spec.runtime.backend != "vllm" or offload.max_prompt_tokens == 0:
        return []
    wait = offload.wait_fraction * parse_duration(spec.autoscaling.ttft_p99)
    return [
        "--offload-max-tokens", str(offload.max_prompt_tokens),
        "--offload-wait", f"{wait:g}",
        "--offload-per-decode", str(offload.per_decode_engine),
    ]  # fmt: skip


def _local_prefill_args(ctx: RenderContext) -> list[str]:
    router = ctx.model.spec.router
    if router.policy != "cache-aware":
        return []
    local = router.local_prefill
    return [
        "--local-prefill-max-tokens", str(local.max_uncached_tokens),
        "--local-prefill-min-cached", f"{local.min_cached_fraction:g}",
    ]  # fmt: skip


def _resources(ctx: RenderContext) -> Manifest:
    user = ctx.model.spec.router.resources
    if not user.requests and not user.limits:
        return {k: dict(v) for k, v in _DEFAULT_RESOURCES.items()}
    resources: Manifest = {}
    if user.requests:
        resources["requests"] = dict(user.requests)
    if user.limits:
        resources["limits"] = dict(user.limits)
    return resources


def _probe(period: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def render_router_deployment(ctx: RenderContext) -> Manifest:
    """The router Deployment."""
    spec = ctx.model.spec
    container: Manifest = {
        "name": "router",
        "image": spec.router.image or ctx.images.router,
        "command": ["disagg-router"],
        "args": router_args(ctx),
        "ports": [{"name": "http", "containerPort": spec.router.port, "protocol": "TCP"}],
        "resources": _resources(ctx),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": DEREGISTER_SECONDS}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(ctx, child_name(ctx.name, "router"), "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(ctx.name, "router")},
            "template": {
                "metadata": {"labels": labels(ctx.name, "router")},
                "spec": {
                    "serviceAccountName": router_service_account(ctx.name),
                    "enableServiceLinks": False,
                    # A router being replaced finishes its streams (a rollout or a node drain
                    # loses no request); only its cache-affinity record is lost.
                    "terminationGracePeriodSeconds": DEREGISTER_SECONDS + DRAIN_SECONDS + 5,
                    # Replicas on different nodes where there are any: one node going away
                    # must not take the model's only front door with it.
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector_labels(ctx.name, "router")},
                        }
                    ],
                    "containers": [container],
                    **image_pull_secrets(ctx.model),
                },
            },
        },
    }


def render_router_rbac(ctx: RenderContext) -> list[Manifest]:
    """ServiceAccount, Role (read pods) and RoleBinding the router needs for discovery."""
    name = router_service_account(ctx.name)
    meta = object_meta(ctx, name, "router")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
        },
    ]
