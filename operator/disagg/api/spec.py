"""The ``spec`` of a DisaggregatedModel: what the user asks for.

Field descriptions become ``kubectl explain`` text through the generated CRD, so they are
written for the person reading them there. Cross-field rules live next to the model they
constrain (see :mod:`disagg.api.rules`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from disagg.api.base import ApiModel, Duration, Quantity, parse_duration
from disagg.api.rules import Rule

Backend = Literal["vllm", "sglang"]
KvConnector = Literal["nixl", "mooncake", "lmcache"]
Transport = Literal["rdma", "tcp"]
Role = Literal["prefill", "decode"]

_EXTENDED_RESOURCE = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class SecretKeyRef(ApiModel):
    """A key of a Secret in the model's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(default="token", min_length=1, description="Key inside the Secret.")


class EnvVar(ApiModel):
    """An environment variable, as in a Kubernetes container."""

    name: str = Field(pattern=_ENV_NAME, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).",
    )

    rules: ClassVar = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="env: set value or valueFrom, not both",
            check=lambda m: not (m.value is not None and m.value_from is not None),
        ),
    )


class ResourceRequirements(ApiModel):
    """CPU and memory of each replica. GPUs and RDMA devices are added by the operator."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: '8', memory: 64Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {memory: 128Gi}."
    )


class HuggingFaceSource(ApiModel):
    """Download the model from the Hugging Face Hub when the engine starts."""

    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a Hugging Face access token (exported as HF_TOKEN); "
        "needed for gated models such as Llama.",
    )
    revision: str | None = Field(default=None, description="Branch, tag or commit to load.")


class PvcSource(ApiModel):
    """Load the model from a PersistentVolumeClaim mounted read-only at /models."""

    claim_name: str = Field(min_length=1, description="Name of the PersistentVolumeClaim.")


class ModelSource(ApiModel):
    """Where the weights come from. Defaults to the Hugging Face Hub without a token."""

    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download from the Hugging Face Hub."
    )
    pvc: PvcSource | None = Field(
        default=None,
        description="Read from a PVC; spec.model.name is then the path inside the volume.",
    )

    rules: ClassVar = (
        Rule(
            cel="!(has(self.huggingFace) && has(self.pvc))",
            message="model.source: choose one of huggingFace or pvc",
            check=lambda m: not (m.hugging_face is not None and m.pvc is not None),
        ),
    )


class ModelSpec(ApiModel):
    """The model to serve. Both pools load exactly the same model string."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description="Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct) or, with a "
        "pvc source, the model's directory inside the volume.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients put in the request's `model` field and the `model_name` "
        "metric label. Default: spec.model.name.",
    )
    source: ModelSource = Field(
        default_factory=ModelSource, description="Where the weights come from."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Maximum context length in tokens. Default: the model's."
    )
    mla: bool = Field(
        default=False,
        description="The model uses multi-head latent attention (DeepSeek-V2/V3). Its KV cache "
        "is replicated across tensor-parallel ranks, so NIXL allows decode TP < prefill TP.",
    )


class EngineSpec(ApiModel):
    """The inference engine both pools run."""

    backend: Backend = Field(default="vllm", description="Engine: vllm or sglang.")
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Engine image. Default: the bundled image of the chosen backend, which "
        "carries the disagg launcher as its entrypoint.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the engine containers."
    )
    kv_connector: KvConnector = Field(
        default="nixl",
        description="KV-cache transfer between the pools: nixl (UCX, RDMA), mooncake, or "
        "lmcache (vLLM only).",
    )
    kv_cache_dtype: Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="KV-cache data type; identical in both pools."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Extra engine arguments appended for both pools.",
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
        description="Token budget of one engine step (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size). Large on prefill, small on decode. Default: the engine's.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="Most concurrent sequences (vLLM --max-num-seqs, SGLang "
        "--max-running-requests). Default: the engine's.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pool's pods require."
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="A Kubernetes Affinity for the pool's pods."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=64,
        description="Kubernetes Tolerations for the pool's pods.",
    )
    priority_class_name: str | None = Field(
        default=None, description="PriorityClass of the pool's pods."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Extra engine arguments for this pool only.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables for this pool only.",
    )
    autoscaling: PoolAutoscaling = Field(
        default_factory=PoolAutoscaling, description="Replica bounds used by the autoscaler."
    )

    rules: ClassVar = (
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


class RdmaSpec(ApiModel):
    """RDMA wiring of the engine pods for the KV-cache transfer."""

    resource_name: str = Field(
        default="rdma/ib",
        pattern=_EXTENDED_RESOURCE,
        description="Extended resource of the RDMA device plugin (e.g. rdma/ib, "
        "rdma/rdma_shared_device_a, nvidia.com/hostdev).",
    )
    resource_count: int = Field(
        default=1,
        ge=1,
        le=64,
        description="How many of that resource each replica requests. Shared-device plugins "
        "expose all HCAs through one slot: keep 1.",
    )
    networks: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Multus NetworkAttachmentDefinitions to attach (name, namespace/name or "
        "name@interface); written to the k8s.v1.cni.cncf.io/networks annotation.",
    )
    ucx_devices: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="UCX devices for the transfer (e.g. mlx5_0:1). Empty: the launcher "
        "detects the HCAs present in the pod.",
    )
    gid_index: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="RoCE GID index (UCX_IB_GID_INDEX). Empty: the launcher detects it.",
    )
    host_network: bool = Field(
        default=False, description="Run engine pods on the host network (no Multus needed)."
    )
    allow_tcp_fallback: bool = Field(
        default=False,
        description="When no RDMA device is usable, start on TCP with a warning instead of "
        "failing the pod.",
    )


class NetworkSpec(ApiModel):
    """How the KV cache moves from prefill to decode."""

    transport: Transport = Field(
        default="rdma",
        description="rdma for production (InfiniBand or RoCE); tcp for development only "
        "(KV transfer is tens of times slower).",
    )
    rdma: RdmaSpec | None = Field(
        default=None,
        description="RDMA settings; only with transport rdma. Default: rdma/ib x1, autodetect.",
    )
    shm_size: Quantity = Field(
        default="16Gi", description="Size of the memory-backed /dev/shm of engine pods."
    )

    rules: ClassVar = (
        Rule(
            cel="self.transport == 'rdma' || !has(self.rdma)",
            message="network.rdma is only allowed with network.transport rdma",
            check=lambda m: m.transport == "rdma" or m.rdma is None,
            field_path=".rdma",
        ),
    )

    @property
    def rdma_or_default(self) -> RdmaSpec | None:
        """The RDMA settings in force, or None on TCP."""
        if self.transport != "rdma":
            return None
        return self.rdma or RdmaSpec()


class RouterSpec(ApiModel):
    """The OpenAI-compatible front door that sends each request to prefill, then decode."""

    enabled: bool = Field(default=True, description="Deploy the router.")
    replicas: int = Field(default=1, ge=0, le=100, description="Router replicas.")
    port: int = Field(default=8000, ge=1, le=65535, description="Router HTTP port.")
    image: str | None = Field(default=None, min_length=1, description="Router image override.")
    prefill_threshold_tokens: int = Field(
        default=256,
        ge=0,
        description="Prompts shorter than this (in tokens) skip the prefill pool and go "
        "straight to decode; 0 sends every request through prefill.",
    )
    policy: Literal["least-outstanding", "round-robin", "prefix-affinity"] = Field(
        default="least-outstanding",
        description="How a worker is picked: least outstanding requests (power of two "
        "choices), round robin, or prefix affinity.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Router CPU and memory."
    )

    rules: ClassVar = (
        Rule(
            cel="!self.enabled || self.replicas >= 1",
            message="router.replicas must be >= 1 when the router is enabled",
            check=lambda m: not m.enabled or m.replicas >= 1,
            field_path=".replicas",
        ),
    )


class ScaleUpBehavior(ApiModel):
    """How fast the autoscaler may grow a pool."""

    stabilization_window: Duration = Field(
        default="0s",
        description="A larger size must be recommended this long before it is acted on.",
    )
    max_step: int = Field(default=4, ge=1, le=100, description="Most replicas added per step.")
    cooldown: Duration = Field(default="30s", description="Least time between two scale-ups.")


class ScaleDownBehavior(ApiModel):
    """How fast the autoscaler may shrink a pool: slowly, so it never flaps."""

    stabilization_window: Duration = Field(
        default="5m",
        description="A smaller size must be recommended this long before it is acted on.",
    )
    max_step: int = Field(default=1, ge=1, le=100, description="Most replicas removed per step.")
    cooldown: Duration = Field(
        default="2m", description="Least time after any scaling before a scale-down."
    )


class QueryOverrides(ApiModel):
    """PromQL that replaces a default query. ``$selector`` and ``$window`` are substituted."""

    ttft_p99: str | None = Field(default=None, min_length=1, description="TTFT p99, seconds.")
    tpot_p99: str | None = Field(
        default=None, min_length=1, description="Inter-token p99, seconds."
    )
    queue: str | None = Field(
        default=None, min_length=1, description="Waiting requests in the pool."
    )
    running: str | None = Field(
        default=None, min_length=1, description="Running requests in the pool."
    )
    kv_usage: str | None = Field(
        default=None, min_length=1, description="Mean KV-cache usage, 0..1."
    )
    request_rate: str | None = Field(default=None, min_length=1, description="Requests per second.")
    pods_reporting: str | None = Field(
        default=None, min_length=1, description="Number of pods whose metrics are present."
    )
    last_sample: str | None = Field(
        default=None, min_length=1, description="Unix time of the newest sample (staleness check)."
    )


class AutoscalingSpec(ApiModel):
    """SLO-driven autoscaling: prefill from TTFT, decode from TPOT, read from Prometheus."""

    enabled: bool = Field(default=False, description="Let the autoscaler size both pools.")
    mode: Literal["builtin", "external"] = Field(
        default="builtin",
        description="builtin: the operator's SLO autoscaler sizes the pools. external: the "
        "operator renders a KEDA ScaledObject or an HPA per pool from the same queries and leaves "
        "replica counts to it.",
    )
    external_scaler: Literal["keda", "hpa"] = Field(
        default="keda",
        description="With mode external: KEDA ScaledObjects (Prometheus trigger) or HPAs on "
        "external metrics served by prometheus-adapter.",
    )
    ttft_p99: Duration = Field(
        default="2s", description="Time-to-first-token p99 target; drives the prefill pool."
    )
    tpot_p99: Duration = Field(
        default="50ms",
        description="Inter-token latency (TPOT) p99 target; drives the decode pool.",
    )
    prometheus_url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=r"^https?://",
        description="Prometheus HTTP API the autoscaler queries.",
    )
    interval: Duration = Field(default="15s", description="How often the autoscaler decides.")
    window: Duration = Field(
        default="2m", description="Rate window of the latency and load queries."
    )
    scale_up: ScaleUpBehavior = Field(
        default_factory=ScaleUpBehavior, description="Scale-up speed limits."
    )
    scale_down: ScaleDownBehavior = Field(
        default_factory=ScaleDownBehavior, description="Scale-down speed limits."
    )
    max_total_gpus: int | None = Field(
        default=None, ge=1, description="GPU budget of both pools together. Default: none."
    )
    queries: QueryOverrides | None = Field(
        default=None, description="Replace any of the default PromQL queries."
    )

    rules: ClassVar = (
        Rule(
            cel="duration(self.ttftP99) > duration('0s')",
            message="autoscaling.ttftP99 must be greater than zero",
            check=lambda m: parse_duration(m.ttft_p99) > 0,
            field_path=".ttftP99",
        ),
        Rule(
            cel="duration(self.tpotP99) > duration('0s')",
            message="autoscaling.tpotP99 must be greater than zero",
            check=lambda m: parse_duration(m.tpot_p99) > 0,
            field_path=".tpotP99",
        ),
        Rule(
            cel="duration(self.interval) >= duration('1s') && "
            "duration(self.interval) <= duration(self.window)",
            message="autoscaling.interval must be at least 1s and no longer than "
            "autoscaling.window",
            check=lambda m: 1 <= parse_duration(m.interval) <= parse_duration(m.window),
            field_path=".interval",
        ),
    )


def _tp_rule_ok(spec: DisaggregatedModelSpec) -> bool:
    prefill_tp = spec.prefill.tensor_parallel_size
    decode_tp = spec.decode.tensor_parallel_size
    if spec.engine.kv_connector == "nixl" and not spec.model.mla:
        return decode_tp >= prefill_tp
    return True


def _min_gpus(spec: DisaggregatedModelSpec) -> int:
    return (
        spec.prefill.autoscaling.min_replicas * spec.prefill.gpus
        + spec.decode.autoscaling.min_replicas * spec.decode.gpus
    )


class DisaggregatedModelSpec(ApiModel):
    """A model served by separate prefill and decode pools behind one router."""

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The inference engine.")
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
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="SLO-driven autoscaling of both pools."
    )

    rules: ClassVar = (
        Rule(
            cel="self.engine.kvConnector != 'nixl' || self.model.mla || "
            "self.decode.tensorParallelSize >= self.prefill.tensorParallelSize",
            message="with the nixl connector, decode.tensorParallelSize must be >= "
            "prefill.tensorParallelSize (unless model.mla is true)",
            check=_tp_rule_ok,
            field_path=".decode.tensorParallelSize",
        ),
        Rule(
            cel="self.engine.kvConnector != 'mooncake' || "
            "self.decode.tensorParallelSize == self.prefill.tensorParallelSize",
            message="with the mooncake connector, decode.tensorParallelSize must equal "
            "prefill.tensorParallelSize",
            check=lambda s: (
                s.engine.kv_connector != "mooncake"
                or s.decode.tensor_parallel_size == s.prefill.tensor_parallel_size
            ),
            field_path=".decode.tensorParallelSize",
        ),
        Rule(
            cel="self.engine.kvConnector != 'lmcache' || self.engine.backend == 'vllm'",
            message="the lmcache connector needs engine.backend vllm",
            check=lambda s: s.engine.kv_connector != "lmcache" or s.engine.backend == "vllm",
            field_path=".engine.kvConnector",
        ),
        Rule(
            cel="!has(self.autoscaling.maxTotalGpus) || self.autoscaling.maxTotalGpus >= "
            "self.prefill.autoscaling.minReplicas * self.prefill.tensorParallelSize * "
            "self.prefill.dataParallelSize + self.decode.autoscaling.minReplicas * "
            "self.decode.tensorParallelSize * self.decode.dataParallelSize",
            message="autoscaling.maxTotalGpus is smaller than the GPUs both pools need at "
            "their minReplicas",
            check=lambda s: (
                s.autoscaling.max_total_gpus is None or s.autoscaling.max_total_gpus >= _min_gpus(s)
            ),
            field_path=".autoscaling.maxTotalGpus",
        ),
    )

    def pool(self, role: Role) -> PoolSpec:
        """The spec of one pool."""
        return self.prefill if role == "prefill" else self.decode

    @property
    def served_name(self) -> str:
        """The name clients use in requests."""
        return self.model.served_name or self.model.name
