"""The exact engine command line and environment of each pool, for vLLM and SGLang.

Only flags and ``--kv-transfer-config`` keys that the pinned engines accept are emitted: vLLM
0.33 rejects unknown KV-transfer keys (``kv_rank``, ``kv_parallel_size``, ``kv_ip``,
``kv_buffer_size``) at startup, so they never appear here.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any, Final

from disagg.api.spec import DisaggregatedModelSpec, EnvVar, Role

VLLM_PORT: Final = 8000
SGLANG_PORT: Final = 30000
NIXL_SIDE_CHANNEL_PORT: Final = 5600
BOOTSTRAP_PORT: Final = 8998
"""Mooncake (vLLM) and SGLang bootstrap server port, served by prefill."""
MODEL_MOUNT: Final = "/models"

_VLLM_CONNECTORS: Final = {
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
    "lmcache": "LMCacheConnectorV1",
}
_KV_ROLES: Final = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class ContainerPort:
    """A port the engine container listens on."""

    name: str
    port: int


@dataclass(frozen=True)
class EngineLaunch:
    """Everything the engine container of one pool needs to start."""

    argv: list[str]
    env: list[dict[str, Any]]
    ports: list[ContainerPort]
    http_port: int
    pod_annotations: dict[str, str]


BEHIND_SIDECAR: Final = 200
"""How far above its usual port a decode engine listens when llm-d's routing sidecar takes
that port in front of it (router.kind inferencePool; llm-d's own manifests: 8000 and 8200)."""


def serving_port(spec: DisaggregatedModelSpec) -> int:
    """The port every engine pod of the model serves the OpenAI-compatible API on (the
    engine's own, or the routing sidecar's in front of a decode engine)."""
    return VLLM_PORT if spec.runtime.backend == "vllm" else SGLANG_PORT


def behind_sidecar(spec: DisaggregatedModelSpec, role: Role) -> bool:
    """Whether llm-d's routing sidecar fronts this pool's engines."""
    return spec.router.kind == "inferencePool" and role == "decode"


def engine_port(spec: DisaggregatedModelSpec, role: Role) -> int:
    """The HTTP port the engine itself listens on."""
    return serving_port(spec) + (BEHIND_SIDECAR if behind_sidecar(spec, role) else 0)


def model_argument(spec: DisaggregatedModelSpec) -> str:
    """The model string both pools pass to the engine (it must be identical in both)."""
    if spec.model.source.pvc is not None:
        return posixpath.join(MODEL_MOUNT, spec.model.name.lstrip("/"))
    return spec.model.name


def kv_transfer_config(spec: DisaggregatedModelSpec, role: Role) -> dict[str, Any]:
    """vLLM ``--kv-transfer-config`` of one pool; only keys vLLM 0.33 accepts."""
    connector = spec.runtime.kv_connector
    config: dict[str, Any] = {
        "kv_connector": _VLLM_CONNECTORS[connector],
        "kv_role": _KV_ROLES[role],
    }
    if connector == "nixl":
        config["kv_buffer_device"] = "cuda"
        config["kv_connector_extra_config"] = {"backends": ["UCX"]}
    elif connector == "mooncake":
        protocol = "rdma" if spec.network.transport == "rdma" else "tcp"
        extra: dict[str, Any] = {"mooncake_protocol": protocol}
        rdma = spec.network.rdma_or_default
        if rdma is not None and rdma.ucx_devices:
            extra["device_name"] = ",".join(d.split(":")[0] for d in rdma.ucx_devices)
        config["kv_connector_extra_config"] = extra
    else:
        rpc_port = "producer1" if role == "prefill" else "consumer1"
        config["kv_connector_extra_config"] = {
            "discard_partial_chunks": False,
            "lmcache_rpc_port": rpc_port,
        }
    return config


def _colocated(role: Role) -> bool:
    return role == "engine"


def _vllm_argv(spec: DisaggregatedModelSpec, role: Role) -> list[str]:
    pool = spec.pool(role)
    argv = [
        "vllm", "serve", model_argument(spec),
        "--host", "0.0.0.0",
        "--port", str(engine_port(spec, role)),
        "--served-model-name", spec.served_name,
        "--tensor-parallel-size", str(pool.tensor_parallel_size),
    ]  # fmt: skip
    if pool.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(pool.data_parallel_size)]
    if pool.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(pool.max_num_batched_tokens)]
    if pool.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(pool.max_num_seqs)]
    if spec.model.max_model_len is not None:
        argv += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.runtime.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", spec.runtime.kv_cache_dtype]
    hf = spec.model.source.hugging_face
    if hf is not None and hf.revision:
        argv += ["--revision", hf.revision]
    if _colocated(role):
        # Prompts and generations share each step; chunks keep a long prompt from stalling it.
        argv += ["--enable-chunked-prefill"]
    else:
        config = json.dumps(kv_transfer_config(spec, role), separators=(",", ":"), sort_keys=True)
        argv += ["--kv-transfer-config", config]
    argv += ["--disable-access-log-for-endpoints", "/health,/metrics"]
    tracing = spec.observability.tracing
    if tracing is not None:
        argv += ["--otlp-traces-endpoint", tracing.endpoint]
    return argv


def _sglang_argv(spec: DisaggregatedModelSpec, role: Role) -> list[str]:
    pool = spec.pool(role)
    backend = "nixl" if spec.runtime.kv_connector == "nixl" else "mooncake"
    if backend == "mooncake" and spec.network.transport == "tcp":
        backend = "mooncake_tcp"
    argv = [
        "python3", "-m", "sglang.launch_server",
        "--model-path", model_argument(spec),
        "--host", "0.0.0.0",
        "--port", str(engine_port(spec, role)),
        "--served-model-name", spec.served_name,
        "--tp-size", str(pool.tensor_parallel_size),
    ]  # fmt: skip
    if pool.data_parallel_size > 1:
        argv += ["--dp-size", str(pool.data_parallel_size)]
    if _colocated(role):
        # SGLang's default mode is not disaggregated; mixed chunks put prompt chunks and
        # running generations in one batch, so a long prompt does not stall them.
        argv += ["--enable-mixed-chunk"]
    else:
        argv += [
            "--disaggregation-mode", role,
            "--disaggregation-transfer-backend", backend,
        ]  # fmt: skip
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    rdma = spec.network.rdma_or_default
    if rdma is not None and rdma.ucx_devices and not _colocated(role):
        argv += ["--disaggregation-ib-device", ",".join(d.split(":")[0] for d in rdma.ucx_devices)]
    if pool.max_num_batched_tokens is not None:
        argv += ["--chunked-prefill-size", str(pool.max_num_batched_tokens)]
    if pool.max_num_seqs is not None:
        argv += ["--max-running-requests", str(pool.max_num_seqs)]
    if spec.model.max_model_len is not None:
        argv += ["--context-length", str(spec.model.max_model_len)]
    if spec.runtime.kv_cache_dtype != "auto":
        # vLLM's "fp8" means fp8_e4m3 on CUDA; SGLang's argparse refuses the alias.
        dtype = "fp8_e4m3" if spec.runtime.kv_cache_dtype == "fp8" else spec.runtime.kv_cache_dtype
        argv += ["--kv-cache-dtype", dtype]
    hf = spec.model.source.hugging_face
    if hf is not None and hf.revision:
        argv += ["--revision", hf.revision]
    argv += ["--enable-metrics"]
    tracing = spec.observability.tracing
    if tracing is not None:
        argv += ["--enable-trace", "--otlp-traces-endpoint", tracing.endpoint]
    return argv


def _pod_ip(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _user_env(items: list[EnvVar]) -> list[dict[str, Any]]:
    return [item.to_wire() for item in items]


def _merge_env(*groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later groups override earlier ones by name; order of first appearance is kept."""
    merged: dict[str, dict[str, Any]] = {}
    for group in groups:
        for item in group:
            merged[item["name"]] = item
    return list(merged.values())


def _transport_env(spec: DisaggregatedModelSpec) -> list[dict[str, Any]]:
    rdma = spec.network.rdma_or_default
    env: list[dict[str, Any]] = [{"name": "DISAGG_TRANSPORT", "value": spec.network.transport}]
    if rdma is None:
        return env
    env.append({"name": "DISAGG_RDMA_TCP_FALLBACK", "value": str(rdma.allow_tcp_fallback).lower()})
    if rdma.ucx_devices:
        env.append({"name": "UCX_NET_DEVICES", "value": ",".join(rdma.ucx_devices)})
    if rdma.gid_index is not None:
        env.append({"name": "UCX_IB_GID_INDEX", "value": str(rdma.gid_index)})
    return env


def tracing_env(spec: DisaggregatedModelSpec, service: str) -> list[dict[str, Any]]:
    """How an engine's (or the router's) OpenTelemetry SDK exports and samples: over
    OTLP/HTTP (both engines default to gRPC), following the router's sampling decision, and
    named after the model and its pool. Nothing when tracing is off."""
    tracing = spec.observability.tracing
    if tracing is None:
        return []
    return [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        {"name": "OTEL_SERVICE_NAME", "value": service},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{tracing.sampling_ratio:g}"},
    ]


def engine_launch(spec: DisaggregatedModelSpec, role: Role) -> EngineLaunch:
    """The argv, environment, ports and pod annotations of one pool's engine."""
    pool = spec.pool(role)
    vllm = spec.runtime.backend == "vllm"
    port = engine_port(spec, role)
    argv = _vllm_argv(spec, role) if vllm else _sglang_argv(spec, role)
    argv += [*spec.runtime.extra_args, *pool.extra_args]
    colocated = _colocated(role)
    base_env: list[dict[str, Any]] = [
        {"name": "DISAGG_ROLE", "value": role},
        {"name": "DISAGG_BACKEND", "value": spec.runtime.backend},
        *(
            []
            if colocated
            else [{"name": "DISAGG_KV_CONNECTOR", "value": spec.runtime.kv_connector}]
        ),
        _pod_ip("POD_IP"),
    ]
    ports = [ContainerPort("http", port)]
    annotations: dict[str, str] = {}
    if vllm and not colocated:
        # The NIXL side channel is announced to decode in kv_transfer_params.remote_host.
        base_env += [
            _pod_ip("VLLM_NIXL_SIDE_CHANNEL_HOST"),
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        ]
        if spec.runtime.kv_connector == "nixl":
            ports += [
                ContainerPort(
                    "nixl" if rank == 0 else f"nixl-{rank}", NIXL_SIDE_CHANNEL_PORT + rank
                )
                for rank in range(pool.data_parallel_size)
            ]
        if spec.runtime.kv_connector == "mooncake" and role == "prefill":
            base_env.append({"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(BOOTSTRAP_PORT)})
            ports.append(ContainerPort("bootstrap", BOOTSTRAP_PORT))
    elif not vllm:
        base_env.append(_pod_ip("SGLANG_HOST_IP"))
        if role == "prefill":
            ports.append(ContainerPort("bootstrap", BOOTSTRAP_PORT))
            annotations["sglang.ai/bootstrap-port"] = str(BOOTSTRAP_PORT)
    hf = spec.model.source.hugging_face
    if spec.model.source.pvc is None:
        base_env.append({"name": "HF_HOME", "value": "/cache/huggingface"})
        if hf is not None and hf.token_secret_ref is not None:
            ref = hf.token_secret_ref
            base_env.append(
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
                }
            )
    transport = [] if colocated else _transport_env(spec)
    traced = tracing_env(spec, f"{spec.served_name}-{role}")
    env = _merge_env(base_env, transport, traced, _user_env(spec.runtime.env), _user_env(pool.env))
    return EngineLaunch(
        argv=argv, env=env, ports=ports, http_port=port, pod_annotations=annotations
    )
