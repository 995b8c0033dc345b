"""router.kind inferencePool: the model served the Gateway API Inference Extension's way.

What llm-d-inference-scheduler v0.4.0 (on the Inference Extension v1.2.0) deploys for P/D,
checked against its sources (``deploy/components/inference-gateway``, ``deploy/config/
pd-epp-config.yaml``, ``pkg/plugins``, ``cmd/pd-sidecar``) and the Extension's
(``cmd/epp/runner/runner.go`` flags, the InferencePool v1 CRD):

* an ``InferencePool`` (inference.networking.k8s.io/v1) selecting the model's engine pods,
  its ``endpointPickerRef`` the picker's Service on the ext-proc gRPC port;
* the endpoint picker (EPP) as the model's router component: its ServiceAccount, a Role
  with what it watches (pods, InferencePools, InferenceObjectives), the Service and the
  Deployment, its configuration given inline (``--config-text``): the prefill and decode
  filters on ``llm-d.ai/role``, a prefix-cache scorer and the P/D profile handler;
* llm-d's routing sidecar in front of each decode engine (:func:`routing_sidecar`).
"""

from __future__ import annotations

from typing import Final

from disagg.api.spec import DisaggregatedModelSpec
from disagg.naming import child_name, selector_labels
from disagg.render.common import Manifest, RenderContext, object_meta
from disagg.render.engine_args import engine_port, serving_port
from disagg.versions import LLM_D_EPP_IMAGE, LLM_D_SIDECAR_IMAGE
from disagg.yamlio import dump

INFERENCE_API: Final = "inference.networking.k8s.io/v1"
EXTENSION_GROUP: Final = "inference.networking.k8s.io"
EXPERIMENTAL_GROUP: Final = "inference.networking.x-k8s.io"
LLM_D_ROLE_LABEL: Final = "llm-d.ai/role"
POOL_LABEL: Final = "disagg.dev/inference-pool"
"""On the engine pods only: what the InferencePool selects (the model label alone would
select the picker's own pod too)."""
EPP_GRPC_PORT: Final = 9002
EPP_HEALTH_PORT: Final = 9003
EPP_METRICS_PORT: Final = 9090
BYTES_PER_TOKEN: Final = 4
"""The P/D profile handler compares the prompt's uncached part in bytes of text with its
threshold (``pd_profile_handler.go``: ``len(userInput)``); router.prefillThresholdTokens is in
tokens, about four bytes each in English text."""
SIDECAR_CONNECTORS: Final = {"nixl": "nixlv2", "lmcache": "lmcache"}
"""vLLM's KV connectors as the routing sidecar names them (``--connector``)."""


def pool_pod_labels(spec: DisaggregatedModelSpec, model: str, role: str) -> dict[str, str]:
    """What an engine pod carries beside the operator's labels when an InferencePool serves
    the model: llm-d's role label (its prefill and decode filters read it) and the pool's."""
    if spec.router.kind != "inferencePool" or role not in ("prefill", "decode"):
        return {}
    return {LLM_D_ROLE_LABEL: role, POOL_LABEL: model}


def render_inference_pool(ctx: RenderContext) -> Manifest:
    return {
        "apiVersion": INFERENCE_API,
        "kind": "InferencePool",
        "metadata": object_meta(ctx, ctx.name, "router"),
        "spec": {
            "selector": {"matchLabels": {POOL_LABEL: ctx.name}},
            "targetPorts": [{"number": serving_port(ctx.model.spec)}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": child_name(ctx.name, "router"),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def epp_config(spec: DisaggregatedModelSpec) -> str:
    """The endpoint picker's configuration: llm-d's P/D sample with the handler's threshold
    from the router's (a prompt whose uncached part is shorter goes to decode alone)."""
    threshold = spec.router.prefill_threshold_tokens * BYTES_PER_TOKEN
    profiles = [
        {
            "name": role,
            "plugins": [
                {"pluginRef": f"{role}-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
            ],
        }
        for role in ("prefill", "decode")
    ]
    return dump(
        {
            "apiVersion": f"{EXPERIMENTAL_GROUP}/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                {"type": "prefill-header-handler"},
                {"type": "prefix-cache-scorer"},
                {"type": "prefill-filter"},
                {"type": "decode-filter"},
                {"type": "max-score-picker"},
                {"type": "pd-profile-handler", "parameters": {"threshold": threshold}},
            ],
            "schedulingProfiles": profiles,
        }
    )


def render_epp(ctx: RenderContext) -> list[Manifest]:
    """The picker's ServiceAccount, Role and RoleBinding, then its Service."""
    name = child_name(ctx.name, "router")
    reads = ["get", "list", "watch"]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": object_meta(ctx, name, "router"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(ctx, name, "router"),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": reads},
                {"apiGroups": [EXTENSION_GROUP], "resources": ["inferencepools"], "verbs": reads},
                {
                    "apiGroups": [EXPERIMENTAL_GROUP],
                    "resources": ["inferenceobjectives"],
                    "verbs": reads,
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(ctx, name, "router"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(ctx, name, "router"),
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(ctx.name, "router"),
                "ports": [
                    {
                        "name": "grpc-ext-proc",
                        "port": EPP_GRPC_PORT,
                        "targetPort": "grpc",
                        "protocol": "TCP",
                        "appProtocol": "http2",
                    },
                ],
            },
        },
    ]


def render_epp_deployment(ctx: RenderContext) -> Manifest:
    """One picker, as llm-d deploys it: more run active-passive only (leader election, which
    takes Lease rights), and a second that merely waits buys no capacity."""
    spec = ctx.model.spec
    name = child_name(ctx.name, "router")
    health = {
        "grpc": {"port": EPP_HEALTH_PORT, "service": "envoy.service.ext_proc.v3.ExternalProcessor"},
        "periodSeconds": 10,
    }
    container: Manifest = {
        "name": "epp",
        "image": spec.router.image or LLM_D_EPP_IMAGE,
        "args": [
            "--pool-name", ctx.name,
            "--pool-namespace", ctx.namespace,
            "--grpc-port", str(EPP_GRPC_PORT),
            "--grpc-health-port", str(EPP_HEALTH_PORT),
            # Authenticating metric scrapes takes cluster-wide TokenReviews, which a
            # namespaced Role cannot grant; Prometheus scrapes it like the router.
            "--metrics-endpoint-auth=false",
            "--zap-encoder", "json",
            "--config-text", epp_config(spec),
        ],
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": health,
        "livenessProbe": health,
        "resources": spec.router.resources.model_dump(by_alias=True, exclude_none=True),
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(ctx, name, "router"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(ctx.name, "router")},
            "template": {
                "metadata": {"labels": object_meta(ctx, name, "router")["labels"]},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 130,
                    "containers": [container],
                },
            },
        },
    }


def routing_sidecar(spec: DisaggregatedModelSpec, data_parallel: int) -> Manifest:
    """llm-d's routing sidecar in front of a decode engine, as a native sidecar: it takes
    the serving port, runs the prefill leg the picker chose (its ``x-prefiller-host-port``
    header) with the KV connector's protocol, then the decode leg on the engine."""
    connector = (
        "sglang"
        if spec.runtime.backend == "sglang"
        else SIDECAR_CONNECTORS[spec.runtime.kv_connector]
    )
    port = serving_port(spec)
    return {
        "name": "routing-sidecar",
        "image": spec.router.sidecar_image or LLM_D_SIDECAR_IMAGE,
        "restartPolicy": "Always",
        "args": [
            f"--port={port}",
            f"--vllm-port={engine_port(spec, 'decode')}",
            f"--connector={connector}",
            "--secure-proxy=false",
            f"--data-parallel-size={data_parallel}",
        ],
        "ports": [{"name": "sidecar", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
