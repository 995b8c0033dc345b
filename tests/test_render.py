"""Rendering: what a model becomes, checked field by field."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from conftest import EXAMPLES, ROOT, example_paths, load_example
from disagg.api import parse_model
from disagg.cli import main
from disagg.render import RenderContext, render_all
from disagg.render.workers import pool_replicas
from disagg.versions import DataPlaneImages
from disagg.yamlio import dump_all

GOLDEN = ROOT / "tests" / "golden"
FORBIDDEN_KV_KEYS = {"kv_rank", "kv_parallel_size", "kv_ip", "kv_buffer_size"}


def _render(
    manifest: dict[str, Any], uid: str | None = "uid-1", **replicas: int
) -> list[dict[str, Any]]:
    manifest = {**manifest, "metadata": {**manifest["metadata"]}}
    if uid:
        manifest["metadata"]["uid"] = uid
    return render_all(RenderContext(parse_model(manifest), replicas=replicas))


def _get(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} rendered {len(matches)} times"
    return matches[0]


def _engine(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    container: dict[str, Any] = _get(objects, "Deployment", name)["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.stem)
def test_examples_match_golden_files(path: Any) -> None:
    import yaml

    manifest = yaml.safe_load(path.read_text())
    rendered = dump_all(_render(manifest, uid="00000000-0000-0000-0000-000000000001"))
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.read_text() == rendered, f"run UPDATE_GOLDEN=1 pytest {__file__}"


def test_render_is_deterministic() -> None:
    manifest = load_example("llama-8b-nixl-rdma")
    assert dump_all(_render(manifest)) == dump_all(_render(manifest))


def test_children_kinds_and_names() -> None:
    objects = _render(load_example("minimal"))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "qwen-small-router"),
        ("Role", "qwen-small-router"),
        ("RoleBinding", "qwen-small-router"),
        ("Service", "qwen-small-prefill"),
        ("Service", "qwen-small-decode"),
        ("Service", "qwen-small-router"),
        ("PodDisruptionBudget", "qwen-small-prefill"),
        ("PodDisruptionBudget", "qwen-small-decode"),
        ("PodDisruptionBudget", "qwen-small-router"),
        ("Deployment", "qwen-small-prefill"),
        ("Deployment", "qwen-small-decode"),
        ("Deployment", "qwen-small-router"),
    ]


def test_the_router_survives_a_node_drain_by_default() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in _render(load_example("minimal"))}
    router = objects[("Deployment", "qwen-small-router")]["spec"]
    assert router["replicas"] == 2
    spread = router["template"]["spec"]["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == router["selector"]["matchLabels"]
    budget = objects[("PodDisruptionBudget", "qwen-small-router")]["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"] == router["selector"]


def test_every_child_is_owned_labelled_and_in_the_model_namespace() -> None:
    objects = _render(load_example("llama-8b-nixl-rdma"))
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "inference"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "disagg.dev/v1alpha1",
                "kind": "DisaggregatedModel",
                "name": "llama-8b",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels["disagg.dev/model"] == "llama-8b"
        assert labels["app.kubernetes.io/managed-by"] == "disagg-operator"
        assert labels["app.kubernetes.io/instance"] == "llama-8b"
        assert labels["disagg.dev/role"] in {"prefill", "decode", "router"}
        assert labels["app.kubernetes.io/component"] == labels["disagg.dev/role"]


def test_offline_render_without_uid_has_no_owner_reference() -> None:
    objects = _render(load_example("minimal"), uid=None)
    assert all("ownerReferences" not in o["metadata"] for o in objects)


def test_vllm_nixl_argv_per_role() -> None:
    objects = _render(load_example("llama-8b-nixl-rdma"))
    for name, role in (("llama-8b-prefill", "kv_producer"), ("llama-8b-decode", "kv_consumer")):
        container = _engine(objects, name)
        assert container["command"] == ["disagg-engine", "launch", "--"]
        argv = container["args"]
        assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
        assert _flag(argv, "--port") == "8000"
        assert _flag(argv, "--served-model-name") == "llama-3.1-8b"
        assert _flag(argv, "--tensor-parallel-size") == "1"
        assert _flag(argv, "--max-model-len") == "32768"
        config = json.loads(_flag(argv, "--kv-transfer-config") or "{}")
        assert config == {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_buffer_device": "cuda",
            "kv_connector_extra_config": {"backends": ["UCX"]},
        }
    prefill = _engine(objects, "llama-8b-prefill")["args"]
    decode = _engine(objects, "llama-8b-decode")["args"]
    assert _flag(prefill, "--max-num-batched-tokens") == "16384"
    assert _flag(decode, "--max-num-batched-tokens") == "512"
    assert _flag(decode, "--max-num-seqs") == "256"


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.stem)
def test_no_rejected_kv_transfer_keys(path: Any) -> None:
    import yaml

    for obj in _render(yaml.safe_load(path.read_text())):
        if obj["kind"] != "Deployment" or obj["metadata"]["labels"]["disagg.dev/role"] == "router":
            continue
        argv = obj["spec"]["template"]["spec"]["containers"][0]["args"]
        config = _flag(argv, "--kv-transfer-config")
        if config is not None:
            assert not FORBIDDEN_KV_KEYS & set(json.loads(config))


def test_nixl_side_channel_env_and_ports() -> None:
    container = _engine(_render(load_example("llama-8b-nixl-rdma")), "llama-8b-prefill")
    env = _env(container)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["DISAGG_ROLE"] == "prefill"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "nixl": 5600}


def test_data_parallel_exposes_one_side_channel_port_per_rank() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["decode"] = {"dataParallelSize": 4, "tensorParallelSize": 2}
    container = _engine(_render(manifest), "qwen-small-decode")
    assert _flag(container["args"], "--data-parallel-size") == "4"
    assert [p["containerPort"] for p in container["ports"]] == [8000, 5600, 5601, 5602, 5603]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_rdma_pod_wiring() -> None:
    objects = _render(load_example("llama-8b-nixl-rdma"))
    deployment = _get(objects, "Deployment", "llama-8b-decode")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-rdma-net"
    container = pod["spec"]["containers"][0]
    for side in ("requests", "limits"):
        assert container["resources"][side]["rdma/ib"] == "1"
        assert container["resources"][side]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["memory"] == "64Gi"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    env = _env(container)
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert "UCX_TLS" not in env
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["spec"]["enableServiceLinks"] is False


def test_rdma_without_devices_leaves_ucx_to_autodetect() -> None:
    env = _env(_engine(_render(load_example("minimal")), "qwen-small-prefill"))
    assert "UCX_NET_DEVICES" not in env and "UCX_TLS" not in env
    assert env["DISAGG_TRANSPORT"] == "rdma"


def test_tcp_transport_has_no_rdma_wiring() -> None:
    objects = _render(load_example("tcp-dev"))
    pod = _get(objects, "Deployment", "dev-tcp-prefill")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "annotations" not in pod["metadata"]
    assert "securityContext" not in container
    assert set(container["resources"]["limits"]) == {"nvidia.com/gpu"}
    assert not any(k.startswith("UCX_") for k in _env(container))


def test_70b_heterogeneous_tp_gpus_and_scheduling() -> None:
    objects = _render(load_example("llama-70b-tp4-tp8"))
    prefill = _get(objects, "Deployment", "llama-70b-prefill")["spec"]["template"]["spec"]
    decode = _get(objects, "Deployment", "llama-70b-decode")["spec"]["template"]["spec"]
    assert prefill["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert decode["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert _flag(prefill["containers"][0]["args"], "--tensor-parallel-size") == "4"
    assert _flag(decode["containers"][0]["args"], "--tensor-parallel-size") == "8"
    assert _flag(decode["containers"][0]["args"], "--kv-cache-dtype") == "fp8"
    assert prefill["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert prefill["priorityClassName"] == "inference-critical"
    assert prefill["tolerations"][0]["key"] == "nvidia.com/gpu"
    # Both pools load the same path from the PVC (the NIXL compatibility hash includes it).
    assert (
        prefill["containers"][0]["args"][2]
        == decode["containers"][0]["args"][2]
        == "/models/llama-3.1-70b-instruct"
    )
    assert {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "model-weights", "readOnly": True},
    } in prefill["volumes"]
    rdma = prefill["containers"][0]["resources"]["limits"]["rdma/rdma_shared_device_a"]
    assert rdma == "1"
    assert _env(prefill["containers"][0])["UCX_IB_GID_INDEX"] == "3"


def test_sglang_mooncake_prefill_and_decode() -> None:
    objects = _render(load_example("sglang-mooncake"))
    prefill = _get(objects, "Deployment", "qwen-32b-sglang-prefill")["spec"]["template"]
    decode = _get(objects, "Deployment", "qwen-32b-sglang-decode")["spec"]["template"]
    p_args = prefill["spec"]["containers"][0]["args"]
    d_args = decode["spec"]["containers"][0]["args"]
    assert p_args[:3] == ["python3", "-m", "sglang.launch_server"]
    assert _flag(p_args, "--disaggregation-mode") == "prefill"
    assert _flag(d_args, "--disaggregation-mode") == "decode"
    assert _flag(p_args, "--disaggregation-transfer-backend") == "mooncake"
    assert _flag(p_args, "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in d_args
    assert _flag(p_args, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert "--enable-metrics" in p_args and "--enable-metrics" in d_args
    assert "--kv-transfer-config" not in p_args
    assert prefill["metadata"]["annotations"] == {"sglang.ai/bootstrap-port": "8998"}
    assert "annotations" not in decode["metadata"]
    assert prefill["spec"]["hostNetwork"] is True
    assert prefill["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    ports = {p["name"]: p["containerPort"] for p in prefill["spec"]["containers"][0]["ports"]}
    assert ports == {"http": 30000, "bootstrap": 8998}


def test_probes_tolerate_slow_model_loading() -> None:
    container = _engine(_render(load_example("minimal")), "qwen-small-decode")
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_services_and_pdbs() -> None:
    objects = _render(load_example("minimal"))
    prefill = _get(objects, "Service", "qwen-small-prefill")["spec"]
    assert prefill["clusterIP"] == "None"
    assert prefill["selector"] == {"disagg.dev/model": "qwen-small", "disagg.dev/role": "prefill"}
    router = _get(objects, "Service", "qwen-small-router")["spec"]
    assert router["type"] == "ClusterIP" and router["ports"][0]["port"] == 8000
    pdb = _get(objects, "PodDisruptionBudget", "qwen-small-decode")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert all(o["metadata"]["name"] != "vllm" for o in objects if o["kind"] == "Service")


def test_router_discovers_pools_with_least_privilege() -> None:
    objects = _render(load_example("llama-8b-nixl-rdma"))
    role = _get(objects, "Role", "llama-8b-router")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    deployment = _get(objects, "Deployment", "llama-8b-router")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llama-8b-router"
    args = pod["containers"][0]["args"]
    assert _flag(args, "--prefill-selector") == "disagg.dev/model=llama-8b,disagg.dev/role=prefill"
    assert _flag(args, "--decode-selector") == "disagg.dev/model=llama-8b,disagg.dev/role=decode"
    assert _flag(args, "--pd-threshold") == "256"
    assert _flag(args, "--namespace") == "inference"
    assert deployment["spec"]["replicas"] == 2
    security = pod["containers"][0]["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]


def _router_args(manifest: dict[str, Any]) -> list[str]:
    name = manifest["metadata"]["name"]
    deployment = _get(_render(manifest), "Deployment", f"{name}-router")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_router_offloads_short_prompts_after_half_the_ttft_slo_of_waiting() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["autoscaling"] = {"ttftP99": "3s"}
    args = _router_args(manifest)
    assert _flag(args, "--offload-wait") == "1.5"
    assert _flag(args, "--offload-max-tokens") == "2048"
    assert _flag(args, "--offload-per-decode") == "1"
    manifest["spec"]["router"] = {"prefillOffload": {"maxPromptTokens": 0}}
    assert "--offload-max-tokens" not in _router_args(manifest), "0 turns it off"
    manifest["spec"]["router"] = {}
    manifest["spec"]["runtime"] = {**manifest["spec"].get("engine", {}), "backend": "sglang"}
    assert "--offload-max-tokens" not in _router_args(manifest), (
        "the SGLang path pairs every request with a prefill engine"
    )


def test_disabled_router_renders_no_router_objects() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["router"] = {"enabled": False}
    objects = _render(manifest)
    assert all(o["metadata"]["labels"]["disagg.dev/role"] != "router" for o in objects)


def test_pool_replicas_follow_the_autoscaler_decision_within_bounds_and_external_scalers_own_theirs() -> (
    None
):
    manifest = load_example("llama-8b-nixl-rdma")
    model = parse_model({**manifest, "metadata": {**manifest["metadata"], "uid": "u"}})
    bounds = {r: model.spec.pool(r).autoscaling for r in ("prefill", "decode")}
    decided = {"prefill": 5, "decode": bounds["decode"].max_replicas + 22}
    deployments = {
        o["metadata"]["name"]: o["spec"]
        for o in render_all(RenderContext(model, replicas=decided))
        if o["kind"] == "Deployment"
    }
    assert deployments["llama-8b-prefill"]["replicas"] == 5
    assert deployments["llama-8b-decode"]["replicas"] == bounds["decode"].max_replicas
    assert deployments["llama-8b-router"]["replicas"] == 2
    # Before any decision (offline render, a new model): the spec's size within the bounds.
    fresh = {
        o["metadata"]["name"]: o["spec"] for o in _render(manifest) if o["kind"] == "Deployment"
    }
    assert fresh["llama-8b-prefill"]["replicas"] == max(
        bounds["prefill"].min_replicas, manifest["spec"]["prefill"].get("replicas", 1)
    )
    assert not [
        o for o in _render(manifest) if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    ]
    manifest["spec"]["autoscaling"]["mode"] = "external"
    external = {
        o["metadata"]["name"]: o["spec"] for o in _render(manifest) if o["kind"] == "Deployment"
    }
    assert "replicas" not in external["llama-8b-prefill"]
    assert "replicas" not in external["llama-8b-decode"]
    ctx = RenderContext(model, replicas={"prefill": 5})
    assert pool_replicas(ctx, "prefill") == 5


def test_external_mode_renders_keda_scaled_objects_from_the_same_queries() -> None:
    manifest = load_example("llama-8b-nixl-rdma")
    manifest["spec"]["autoscaling"].update(mode="external")
    scalers = {o["metadata"]["name"]: o for o in _render(manifest) if o["kind"] == "ScaledObject"}
    prefill = scalers["llama-8b-prefill"]["spec"]
    assert prefill["scaleTargetRef"]["name"] == "llama-8b-prefill"
    assert (prefill["minReplicaCount"], prefill["maxReplicaCount"]) == (1, 6)
    trigger = prefill["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1.5"
    # A p99 is not divided among replicas: the HPA's proportional rule, not per-pod averages.
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["query"] == (
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{namespace="inference",disagg_model="llama-8b",disagg_role="prefill"}[120s])))'
    )
    decode = scalers["llama-8b-decode"]["spec"]
    assert "inter_token_latency_seconds" in decode["triggers"][0]["metadata"]["query"]
    assert decode["triggers"][0]["metadata"]["threshold"] == "0.04"
    behavior = decode["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    manifest["spec"]["autoscaling"].update(externalScaler="hpa")
    hpa = next(o for o in _render(manifest) if o["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "disagg_ttft_p99_seconds"
    assert hpa["spec"]["metrics"][0]["external"]["target"] == {"type": "Value", "value": "1500m"}


def test_engine_pods_drain_before_they_stop() -> None:
    container = _engine(_render(load_example("minimal")), "qwen-small-prefill")
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["disagg-engine", "drain"] and _flag(command, "--port") == "8000"
    assert float(_flag(command, "--timeout") or 0) < 120


def test_user_env_overrides_and_pool_env_wins() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["runtime"] = {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}
    manifest["spec"]["decode"] = {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}]}
    objects = _render(manifest)
    assert _env(_engine(objects, "qwen-small-prefill"))["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert _env(_engine(objects, "qwen-small-decode"))["VLLM_LOGGING_LEVEL"] == "INFO"


def test_extra_args_are_appended_engine_then_pool() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["runtime"] = {"extraArgs": ["--enforce-eager"]}
    manifest["spec"]["prefill"] = {"extraArgs": ["--block-size", "128"]}
    argv = _engine(_render(manifest), "qwen-small-prefill")["args"]
    assert argv[-3:] == ["--enforce-eager", "--block-size", "128"]


def test_a_pool_affinity_reaches_its_pods_as_written() -> None:
    manifest = load_example("minimal")
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
            ]
        },
    }
    manifest["spec"]["decode"] = {"affinity": affinity}
    decode = next(o for o in _render(manifest) if o["metadata"]["name"].endswith("-decode")
                  and o["kind"] == "Deployment")  # fmt: skip
    assert decode["spec"]["template"]["spec"]["affinity"] == affinity


def test_the_operators_image_registry_and_tag_name_every_bundled_image_a_model_leaves_out() -> None:
    mirror = DataPlaneImages("registry.local:5000/mirror", "0.1.0-rc1")
    model = parse_model(load_example("minimal"))
    objects = render_all(RenderContext(model, images=mirror))
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in objects
        if d["kind"] == "Deployment"
    }
    assert images == {
        "qwen-small-prefill": "registry.local:5000/mirror/engine:0.1.0-rc1-vllm0.33.0",
        "qwen-small-decode": "registry.local:5000/mirror/engine:0.1.0-rc1-vllm0.33.0",
        "qwen-small-router": "registry.local:5000/mirror/router:0.1.0-rc1",
    }
    named = load_example("minimal")
    named["spec"]["runtime"] = {"image": "example.com/my-vllm:1", "backend": "sglang"}
    named["spec"]["router"] = {"image": "example.com/my-router:1"}
    for d in render_all(RenderContext(parse_model(named), images=mirror)):
        if d["kind"] == "Deployment":
            assert d["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
                "example.com/my-"
            )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--image-registry", "Registry.Local/x"], "--image-registry 'Registry.Local/x': must be"),
        (["--image-registry", "reg.local/"], "--image-registry 'reg.local/': must be"),
        (["--image-tag", "a b"], "--image-tag 'a b': must be an image tag"),
    ],
)
def test_render_refuses_a_registry_or_tag_no_image_can_have(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(EXAMPLES / "minimal.yaml")
    assert main(["render", "-f", path, *flags]) == 1
    assert expected in capsys.readouterr().err


def test_pod_settings_reach_the_pool_pods_beside_what_the_operator_sets() -> None:
    manifest = load_example("minimal")
    manifest["spec"]["imagePullSecrets"] = [{"name": "mirror-pull"}]
    manifest["spec"]["decode"] = {
        "pod": {
            "serviceAccountName": "weights-reader",
            "automountServiceAccountToken": True,
            "runtimeClassName": "nvidia",
            "labels": {"team": "search"},
            "annotations": {"example.com/cost-center": "42"},
            "volumes": [
                {"name": "certs", "secret": {"secretName": "corp-ca"}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
            ],
            "volumeMounts": [{"name": "certs", "mountPath": "/etc/corp-ca", "readOnly": True}],
        }
    }
    objects = render_all(RenderContext(parse_model(manifest)))
    pods = {
        d["metadata"]["name"]: d["spec"]["template"] for d in objects if d["kind"] == "Deployment"
    }
    decode = pods["qwen-small-decode"]
    assert decode["metadata"]["labels"]["team"] == "search"
    assert decode["metadata"]["labels"]["disagg.dev/role"] == "decode"
    assert decode["metadata"]["annotations"]["example.com/cost-center"] == "42"
    spec = decode["spec"]
    assert spec["serviceAccountName"] == "weights-reader"
    assert spec["automountServiceAccountToken"] is True and spec["runtimeClassName"] == "nvidia"
    assert [v["name"] for v in spec["volumes"]] == ["dshm", "cache", "certs", "scratch"]
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "certs", "mountPath": "/etc/corp-ca", "readOnly": True} in mounts
    # Every pod of the model pulls with the secret; the prefill pool keeps its defaults.
    for name, template in pods.items():
        assert template["spec"]["imagePullSecrets"] == [{"name": "mirror-pull"}], name
    prefill = pods["qwen-small-prefill"]["spec"]
    assert prefill["automountServiceAccountToken"] is False and "serviceAccountName" not in prefill


TRACES = "http://otel-collector.observability:4318/v1/traces"


@pytest.mark.parametrize("example", ["minimal", "sglang-mooncake"])
def test_tracing_reaches_the_router_and_every_engine_over_otlp_http(example: str) -> None:
    manifest = load_example(example)
    manifest["spec"]["observability"] = {"tracing": {"endpoint": TRACES, "samplingRatio": 0.25}}
    objects = _render(manifest)
    name = manifest["metadata"]["name"]
    router = _engine(objects, f"{name}-router")["args"]
    assert _flag(router, "--otlp-endpoint") == TRACES
    assert _flag(router, "--trace-sampling-ratio") == "0.25"
    for pool in ("prefill", "decode"):
        container = _engine(objects, f"{name}-{pool}")
        args, env = container["args"], _env(container)
        assert _flag(args, "--otlp-traces-endpoint") == TRACES
        assert ("--enable-trace" in args) == (example == "sglang-mooncake")
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"].endswith(f"-{pool}")
    untraced = _render(load_example(example))
    assert "--otlp-endpoint" not in _engine(untraced, f"{name}-router")["args"]
    assert not any(
        e["name"].startswith("OTEL_") for e in _engine(untraced, f"{name}-decode")["env"]
    )


@pytest.mark.parametrize(
    ("tracing", "problem"),
    [
        ({"endpoint": "otel-collector:4318"}, "endpoint"),
        ({"endpoint": TRACES, "samplingRatio": 1.5}, "samplingRatio"),
        ({"samplingRatio": 0.5}, "endpoint"),
    ],
)
def test_a_wrong_tracing_spec_is_refused_naming_the_field(
    tracing: dict[str, Any], problem: str
) -> None:
    manifest = load_example("minimal")
    manifest["spec"]["observability"] = {"tracing": tracing}
    with pytest.raises(ValueError, match=problem):
        parse_model(manifest)


def test_a_model_behind_a_gateway_gets_an_httproute_to_its_router() -> None:
    objects = _render(load_example("behind-gateway"))
    route = _get(objects, "HTTPRoute", "qwen-gateway-router")
    service = _get(objects, "Service", "qwen-gateway-router")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "edge",
            "namespace": "gateway-system",
            "sectionName": "https",
        }
    ]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [
        {"name": service["metadata"]["name"], "port": service["spec"]["ports"][0]["port"]}
    ]
    assert route["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # The route is applied after everything else: the engines serve without it.
    assert objects[-1] is route
    without = load_example("behind-gateway")
    del without["spec"]["gateway"]
    assert not [o for o in _render(without) if o["kind"] == "HTTPRoute"]


def test_an_inference_pool_model_is_served_by_llm_ds_picker_and_sidecar() -> None:
    import yaml

    objects = _render(load_example("inference-pool"))
    kinds = sorted(o["kind"] for o in objects)
    assert kinds.count("InferencePool") == 1 and kinds.count("HTTPRoute") == 1
    pool = _get(objects, "InferencePool", "qwen-pool")["spec"]
    assert pool["targetPorts"] == [{"number": 8000}]
    assert pool["endpointPickerRef"]["name"] == "qwen-pool-router"
    assert pool["endpointPickerRef"]["port"] == {"number": 9002}
    # It selects the engine pods, each labelled with its role as llm-d's filters read it, and
    # not the picker's own pod.
    selector = pool["selector"]["matchLabels"]
    for role in ("prefill", "decode"):
        pod = _get(objects, "Deployment", f"qwen-pool-{role}")["spec"]["template"]["metadata"]
        assert selector.items() <= pod["labels"].items()
        assert pod["labels"]["llm-d.ai/role"] == role
    picker = _get(objects, "Deployment", "qwen-pool-router")["spec"]["template"]
    assert not selector.items() <= picker["metadata"]["labels"].items()
    (epp,) = picker["spec"]["containers"]
    assert epp["image"] == "ghcr.io/llm-d/llm-d-inference-scheduler:v0.4.0"
    assert _flag(epp["args"], "--pool-name") == "qwen-pool"
    config = yaml.safe_load(_flag(epp["args"], "--config-text") or "")
    (handler,) = [p for p in config["plugins"] if p["type"] == "pd-profile-handler"]
    assert handler["parameters"]["threshold"] == 256 * 4  # bytes of prompt text
    assert {p["name"] for p in config["schedulingProfiles"]} == {"prefill", "decode"}
    # The sidecar takes the serving port in front of decode; the engine moves behind it.
    decode = _get(objects, "Deployment", "qwen-pool-decode")["spec"]["template"]["spec"]
    (sidecar,) = decode["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert "--port=8000" in sidecar["args"] and "--vllm-port=8200" in sidecar["args"]
    assert "--connector=nixlv2" in sidecar["args"]
    assert _flag(_engine(objects, "qwen-pool-decode")["args"], "--port") == "8200"
    assert _flag(_engine(objects, "qwen-pool-prefill")["args"], "--port") == "8000"
    assert (
        "initContainers"
        not in _get(objects, "Deployment", "qwen-pool-prefill")["spec"]["template"]["spec"]
    )
    # No builtin router: its Service is the picker's gRPC port, the route goes to the pool.
    service = _get(objects, "Service", "qwen-pool-router")["spec"]["ports"]
    assert [p["port"] for p in service] == [9002]
    route = _get(objects, "HTTPRoute", "qwen-pool-router")["spec"]["rules"][0]
    assert route["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen-pool"}
    ]
