"""The ``spec`` of a DisaggregatedModel: what the user asks for (the model, network, router
and autoscaling settings live in their own modules and are re-exported here).

Field descriptions become ``kubectl explain`` text through the generated CRD, so they are
written for the person reading them there. Cross-field rules live next to the model they
constrain (see :mod:`disagg.api.rules`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from disagg.api.affinity import Affinity
from disagg.api.autoscaling import (
    AutoscalingSpec,
    QueryOverrides,
    ScaleDownBehavior,
    ScaleUpBehavior,
)
from disagg.api.base import ApiModel
from disagg.api.container import EnvVar, EnvVarSource, ResourceRequirements
from disagg.api.gateway import GatewaySpec
from disagg.api.model import ModelSource, ModelSpec, SecretKeyRef
from disagg.api.network import NetworkSpec, RdmaSpec, Transport, nixl_tp_compatible
from disagg.api.observability import ObservabilitySpec
from disagg.api.pod import LocalReference, PodSettings
from disagg.api.router import LocalPrefillSpec, PrefillOffloadSpec, RouterSpec
from disagg.api.rules import RENAMED, Rule, renamed
from disagg.api.scheduling import (
    DNS_SUBDOMAIN,
    LABEL_VALUE,
    Toleration,
    label_keys_rule,
)
from disagg.perf.engine_buckets import latency_buckets

Backend = Literal["vllm", "sglang"]
KvConnector = Literal["nixl", "mooncake", "lmcache"]
Role = Literal["prefill", "decode", "engine"]
"""A pool: prefill and decode when disaggregated, the one engine pool when colocated."""
Mode = Literal["disaggregated", "colocated"]


class RuntimeSpec(ApiModel):
    """The inference engine both pools run (``spec.runtime``)."""

    backend: Backend = Field(default="vllm", description="Engine: vllm or sglang.")
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Engine image. Default: the bundled image of the chosen backend. The "
        "pods run `disagg-engine launch -- <engine argv>` and `disagg-engine drain` as their "
        "preStop hook, so an image of your own needs the disagg-engine distribution (standard "
        "library only: `pip install --no-deps disagg-engine`).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the engine containers."
    )
    kv_connector: KvConnector = Field(
        default="nixl",
        description="KV-cache transfer between the pools: nixl (UCX, RDMA), mooncake, or "
        "lmcache (vLLM only). With nixl and mooncake the pools' TP degrees may differ either "
        "way when the larger is a multiple of the smaller; SGLang's mooncake path needs equal "
        "TP for hybrid models with generic KV state (it refuses them at the handshake).",
    )
    kv_cache_dtype: Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="KV-cache data type; identical in both pools."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Extra engine arguments appended for both pools. Latency buckets set "
        "here (vLLM's --custom-histogram-buckets, SGLang's --bucket-time-to-first-token and "
        "--bucket-inter-token-latency) are the ones the autoscaler reads p99s against.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables for both pools.",
    )


class PoolAutoscaling(ApiModel):
    """Bounds of a pool's replica count when autoscaling is enabled."""

    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest replicas.")
    max_replicas: int = Field(default=8, ge=1, le=1000, description="Most replicas.")

    rules: ClassVar = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="autoscaling.minReplicas must be <= autoscaling.maxReplicas",
            check=lambda m: m.min_replicas <= m.max_replicas,
            field_path=".minReplicas",
        ),
    )


class PoolSpec(ApiModel):
    """One GPU pool (prefill or decode): a Deployment of identical engine replicas."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas when autoscaling is off. With autoscaling on, the autoscaler "
        "alone sets the pool size within autoscaling.minReplicas..maxReplicas.",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs per engine (TP).")
    data_parallel_size: int = Field(
        default=1, ge=1, le=64, description="Engines per replica (DP ranks in one pod)."
    )
    gpus_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs requested per replica (nvidia.com/gpu). Default and only allowed "
        "value: tensorParallelSize x dataParallelSize.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory per replica."
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Token budget of one engine step (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size). Large on prefill, small on decode. Default: the engine's. "
        "Set on prefill, the autoscaler also counts what batching adds to a replica's speed.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Most concurrent sequences (vLLM --max-num-seqs, SGLang "
        "--max-running-requests). Default: the engine's.",
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] = Field(
        default_factory=dict, max_length=64, description="Node labels the pool's pods require."
    )
    affinity: Affinity | None = Field(
        default=None, description="A Kubernetes Affinity for the pool's pods."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Kubernetes Tolerations for the pool's pods.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PriorityClass of the pool's pods (a DNS subdomain name; it must exist, "
        "or the pods are not created and the model reports Degraded/ReplicaFailure).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Extra engine arguments for this pool only, after the engine-wide ones "
        "(the last of a repeated flag wins).",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables for this pool only.",
    )
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description="The pool's pods: service account, runtime class, extra labels and "
        "annotations, and volumes of your own mounted in the engine container.",
    )
    autoscaling: PoolAutoscaling = Field(
        default_factory=PoolAutoscaling, description="Replica bounds used by the autoscaler."
    )

    rules: ClassVar = (
        label_keys_rule(
            "nodeSelector",
            "node_selector",
            "nodeSelector: each key must be a label key: an optional DNS-subdomain prefix and "
            "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit",
        ),
        Rule(
            cel="!has(self.gpusPerReplica) || "
            "self.gpusPerReplica == self.tensorParallelSize * self.dataParallelSize",
            message="gpusPerReplica must equal tensorParallelSize x dataParallelSize",
            check=lambda m: (
                m.gpus_per_replica is None
                or m.gpus_per_replica == m.tensor_parallel_size * m.data_parallel_size
            ),
            field_path=".gpusPerReplica",
        ),
    )

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tensor_parallel_size * self.data_parallel_size


TP_RATIO_CONNECTORS: Final = ("nixl", "mooncake")
"""Connectors that move KV between prefill and decode TP degrees when the larger is a
multiple of the smaller, either way: vLLM 0.33.0 asserts it at the handshake for NIXL
(``TransferTopology.tp_ratio`` in ``kv_connector/utils.py``) and for Mooncake
(``_get_tp_ratio`` in ``kv_connector/v1/mooncake/mooncake_connector.py``); SGLang 0.5.23's
Mooncake backend slices KV heads between any two (``compute_head_slice_params``), so the
same rule is safe for it."""


def _tp_rule_ok(spec: DisaggregatedModelSpec) -> bool:
    if spec.mode == "colocated" or spec.runtime.kv_connector not in TP_RATIO_CONNECTORS:
        return True
    return nixl_tp_compatible(spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size)


def _min_gpus(spec: DisaggregatedModelSpec) -> int:
    return sum(
        spec.pool(role).autoscaling.min_replicas * spec.pool(role).gpus for role in spec.roles
    )


_COLOCATED: Final = "self.mode == 'colocated'"
_MIN_GPUS_CEL: Final = (
    "(self.mode == 'colocated' ? 0 : self.prefill.autoscaling.minReplicas * "
    "self.prefill.tensorParallelSize * self.prefill.dataParallelSize) + "
    "self.decode.autoscaling.minReplicas * self.decode.tensorParallelSize * "
    "self.decode.dataParallelSize"
)


class DisaggregatedModelSpec(ApiModel):
    """A model served by separate prefill and decode pools behind one router, or by one
    colocated engine pool."""

    model: ModelSpec = Field(description="The model to serve.")
    mode: Mode = Field(
        default="disaggregated",
        description="disaggregated: a prefill pool and a decode pool with KV-cache transfer "
        "between them. colocated: one engine pool (<name>-engine) that prefills and decodes "
        "with chunked prefill, no KV connector, configured by `decode` (its "
        "maxNumBatchedTokens is the chunk size) and autoscaled on both SLOs; `prefill`, "
        "`runtime.kvConnector`, `network` and `router.prefillThresholdTokens` are kept but "
        "unused. Colocation suits short prompts, low concurrency and networks without RDMA; "
        "`disagg diagnose` says which a running model needs. Changing it is a rollout: the "
        "new pools become Ready before the old ones go.",
    )
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="The inference engine both pools run: its backend, image, KV connector, "
        "arguments and environment.",
    )
    prefill: PoolSpec = Field(
        default_factory=PoolSpec, description="The prefill pool (compute-bound prompt work)."
    )
    decode: PoolSpec = Field(
        default_factory=PoolSpec, description="The decode pool (memory-bound token generation)."
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec, description="KV-cache transfer networking."
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The request router.")
    image_pull_secrets: list[LocalReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets to pull the engine and router images with (a private registry "
        "or mirror), on every pod of the model.",
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="SLO-driven autoscaling of both pools."
    )
    observability: ObservabilitySpec = Field(
        default_factory=ObservabilitySpec,
        description="Request traces (OpenTelemetry) from the router and the engines.",
    )
    gateway: GatewaySpec | None = Field(
        default=None,
        description="Publish the model behind a Gateway the cluster already runs: a Gateway "
        "API v1 HTTPRoute from its listeners to the router Service. Status reports whether "
        "the Gateway accepted the route. Needs the Gateway API CRDs; without them the model "
        "reports Degraded (GatewayAPIUnavailable) and keeps serving in-cluster. Unset: no "
        "route.",
    )
    engine: dict[str, Any] | None = Field(
        default=None,
        description=f"{RENAMED} `runtime`: refused with that message, kept in the schema so "
        "that a model stored before the rename keeps its fields (it reports InvalidSpec, its "
        "pods serving unchanged, until the field is moved).",
    )

    rules: ClassVar = (
        renamed("engine", "runtime", lambda s: s.engine),
        Rule(
            cel="!has(self.gateway) || self.router.enabled",
            message="gateway routes requests to the router: it needs router.enabled",
            check=lambda spec: spec.gateway is None or spec.router.enabled,
            field_path=".gateway",
        ),
        Rule(
            cel="self.router.kind != 'inferencePool' || has(self.gateway)",
            message="router.kind inferencePool is reached through a Gateway: set spec.gateway",
            check=lambda spec: spec.router.kind != "inferencePool" or spec.gateway is not None,
            field_path=".router.kind",
        ),
        Rule(
            cel="self.router.kind != 'inferencePool' || (self.mode == 'disaggregated' && "
            "(self.runtime.backend == 'sglang' || self.runtime.kvConnector != 'mooncake'))",
            message="router.kind inferencePool needs mode disaggregated and a KV connector "
            "llm-d's routing sidecar speaks: vLLM with nixl or lmcache, or SGLang",
            check=lambda spec: (
                spec.router.kind != "inferencePool"
                or (
                    spec.mode == "disaggregated"
                    and (
                        spec.runtime.backend == "sglang" or spec.runtime.kv_connector != "mooncake"
                    )
                )
            ),
            field_path=".router.kind",
        ),
        Rule(
            cel=f"{_COLOCATED} || !(self.runtime.kvConnector in {list(TP_RATIO_CONNECTORS)}) || "
            "(self.prefill.tensorParallelSize >= self.decode.tensorParallelSize ? "
            "self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0 : "
            "self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0)",
            message="with the nixl and mooncake connectors, the larger of "
            "prefill.tensorParallelSize and decode.tensorParallelSize must be a multiple of the "
            "smaller (the engines fail the KV handshake otherwise)",
            check=_tp_rule_ok,
            field_path=".decode.tensorParallelSize",
        ),
        Rule(
            cel=f"{_COLOCATED} || self.runtime.kvConnector != 'lmcache' || "
            "self.runtime.backend == 'vllm'",
            message="the lmcache connector needs runtime.backend vllm",
            check=lambda s: (
                s.mode == "colocated"
                or s.runtime.kv_connector != "lmcache"
                or s.runtime.backend == "vllm"
            ),
            field_path=".runtime.kvConnector",
        ),
        Rule(
            cel="!has(self.autoscaling.maxTotalGPUs) || self.autoscaling.maxTotalGPUs >= "
            + _MIN_GPUS_CEL,
            message="autoscaling.maxTotalGPUs is smaller than the GPUs the pools need at "
            "their minReplicas",
            check=lambda s: (
                s.autoscaling.max_total_gpus is None or s.autoscaling.max_total_gpus >= _min_gpus(s)
            ),
            field_path=".autoscaling.maxTotalGPUs",
        ),
        Rule(
            cel="self.mode != 'colocated' || !self.autoscaling.enabled || "
            "self.autoscaling.mode != 'external'",
            message="autoscaling.mode external is not available with mode colocated: the "
            "engine pool scales on both SLOs, which the builtin autoscaler does",
            check=lambda s: (
                s.mode != "colocated"
                or not s.autoscaling.enabled
                or s.autoscaling.mode != "external"
            ),
            field_path=".autoscaling.mode",
        ),
    )

    @model_validator(mode="after")
    def _check_latency_buckets(self) -> DisaggregatedModelSpec:
        """Latency buckets set through extraArgs must be ones the engine takes: the
        autoscaler reads p99s against them, and the engine would refuse to start on others.
        (Python only: CEL cannot parse the JSON of vLLM's flag.)"""
        backend = self.runtime.backend
        checks = [(".runtime.extraArgs", self.runtime.extra_args)] + [
            (f".{name}.extraArgs", [*self.runtime.extra_args, *pool.extra_args])
            for name, pool in (("prefill", self.prefill), ("decode", self.decode))
            if pool.extra_args
        ]
        for where, args in checks:
            try:
                latency_buckets(backend, args)
            except ValueError as error:
                raise PydanticCustomError(
                    "rule", "{message}", {"message": str(error), "field_path": where}
                ) from None
        return self

    @staticmethod
    def pool_field(role: str) -> str:
        """The field of ``spec`` that configures a pool (``decode`` for the colocated
        engine pool, whose role label is ``engine``)."""
        return "prefill" if role == "prefill" else "decode"

    def pool(self, role: Role) -> PoolSpec:
        """The spec of one pool (the colocated engine pool is configured by ``decode``)."""
        return self.prefill if role == "prefill" else self.decode

    @property
    def roles(self) -> tuple[Role, ...]:
        """The pools this mode runs, in render order."""
        return ("engine",) if self.mode == "colocated" else ("prefill", "decode")

    @property
    def served_name(self) -> str:
        """The name clients use in requests."""
        return self.model.served_name or self.model.name


__all__ = [
    "AutoscalingSpec",
    "Backend",
    "DisaggregatedModelSpec",
    "EnvVar",
    "EnvVarSource",
    "KvConnector",
    "LocalPrefillSpec",
    "Mode",
    "ModelSource",
    "ModelSpec",
    "NetworkSpec",
    "PoolSpec",
    "PrefillOffloadSpec",
    "QueryOverrides",
    "RdmaSpec",
    "ResourceRequirements",
    "Role",
    "RouterSpec",
    "RuntimeSpec",
    "ScaleDownBehavior",
    "ScaleUpBehavior",
    "SecretKeyRef",
    "Transport",
]
