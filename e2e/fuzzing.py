"""Mutated DisaggregatedModels through the parser and the real API server, side by side.

From the examples, a seeded generator sets one to three fields (present ones, and optional
ones the examples leave out) to values drawn from pools of plausible and tricky ones: nulls,
wrong types, whole numbers written as fractions, bounds, odd quantities and durations, invalid
names and label syntax, resource and Secret names, the model's own labels, annotations and
finalizers, and fields under ``status``. Each model goes to the parser (``parse_manifest``, what
``disagg validate`` runs) and to the API server as ``kubectl apply`` sends a
new object (a create with ``dryRun=All`` and strict field validation, kubectl's default); the
Deployments, Services and PodDisruptionBudgets of every model both accept go to the API server
as the operator writes them (a server-side apply, also a dry run with strict validation). ``e2e/test_fuzz.py`` asserts on the
report; ``bench/fuzz_models.py`` prints it for any seed and size.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from disagg.api.resource import ManifestError, parse_manifest, parse_model
from disagg.demo.procs import Kube
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.credentials import load_credentials
from disagg.render import RenderContext, render_all

ROOT = Path(__file__).resolve().parent.parent
VALUES: list[Any] = [
    None, -1, 0, 1, 2, 7, 64, 65, 1001, 2**31, 2**53 + 1, 2**63, -(2**63) - 1, 1.5, True, False,
    "", " ", "x", "-x", "8", "１", "0", "1Gi", "1Gi ", "-1", "500m", "1ki", "∞", "1e3", "+1",
    "5s", "0s", "0.0000000001s", "99999999999999999999h", "1h", "2h", "45m", "30m", "1ms",
    "0.5ms", "５s", "bad key!", "ab/cd", "nvidia.com/gpu", "rdma/ib", "example.com/dev",
    "a" * 64, "a" * 254, "Exists", "Equal", "In", "NoExecute", "Bogus", "vllm", "sglang",
    "nixl", "mooncake", "lmcache", "rdma", "tcp", "external", "builtin", "hpa", "keda",
    [], [None], [1], ["x"], {}, {"bogus": 1}, {"key": "zone", "operator": "Exists"},
    {"name": "A", "value": "1"}, {"name": "A", "valueFrom": {}},
    {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}},
    {"requests": {"example.com/dev": "1"}, "limits": {"example.com/dev": "1"}},
    2.0, 4.0, 1e3, 2.5, "Bad_Name", "a..b", "a.b", "x" * 253, {"a": None}, {"Bad Key": "v"},
    {"example.com/" + "d" * 63: "1"}, {"example.com/" + "d" * 64: "1"}, {"example.com/-d": "1"},
    {"EXAMPLE.com/d": "1"}, {"kubernetes.io/d": "1"}, {"example.com/d_1": "1"},
    [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}],
    [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s." * 100 + "s", "key": "k"}}}],
    [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "-c", "key": "k"}}}],
    [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "ok", "key": "bad key"}}}],
    [{"name": "pull"}], [{"name": "Bad_Pull"}], {"name": "v", "emptyDir": {}},
    {"name": "v", "secret": {"secretName": "s", "items": [{"key": "k", "path": "a/../b"}]}},
    {"name": "v", "configMap": {"name": "c"}, "emptyDir": {}},
    {"name": "v", "persistentVolumeClaim": {"claimName": "pvc", "readOnly": True}},
    {"name": "v", "mountPath": "/etc/v"}, {"name": "v", "mountPath": "/etc/v", "subPath": ".."},
    [{"name": "v", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    [{"name": "v", "mountPath": "/data"}], "/etc/x", "/dev/shm", "relative/path",
    [{"key": "k", "path": "..a"}], [{"key": "k", "path": "/abs"}],
    {"team": "a"}, {"disagg.dev/role": "x"}, {"Example.com/x": "y"}, "nvidia", "sa-1",
]  # fmt: skip
PLAUSIBLE: list[Any] = [
    1, 2, 4, 8, 16, 100, True, False, "2s", "500ms", "40ms", "3m", "16Gi", "8", "inference",
    "vllm", "nixl", "tcp", "rdma", "builtin", "external", "hpa", "keda", "meta-llama/x",
    {"pool": "a"}, [{"key": "gpu", "operator": "Exists"}], [{"name": "A", "value": "1"}],
    {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [{"key": "z", "operator": "In",
                                                            "values": ["a"]}]}}]}},
]  # fmt: skip
"""Values that often fit, so enough models are accepted to check what they render."""
OPTIONAL_PATHS = [
    "spec.prefill.replicas", "spec.decode.replicas", "spec.prefill.tensorParallelSize",
    "spec.decode.tensorParallelSize", "spec.prefill.dataParallelSize",
    "spec.prefill.gpusPerReplica", "spec.prefill.maxNumBatchedTokens", "spec.decode.maxNumSeqs",
    "spec.prefill.resources", "spec.decode.resources.requests.cpu",
    "spec.decode.resources.limits.memory", "spec.prefill.nodeSelector",
    "spec.prefill.nodeSelector.pool", "spec.decode.tolerations", "spec.decode.tolerations.0",
    "spec.prefill.priorityClassName", "spec.prefill.affinity", "spec.prefill.env",
    "spec.prefill.env.0", "spec.runtime.env", "spec.runtime.extraArgs", "spec.runtime.image",
    "spec.runtime.backend", "spec.runtime.kvConnector", "spec.runtime.kvCacheDtype",
    "spec.model.name", "spec.model.servedName", "spec.network.transport",
    "spec.network.shmSize", "spec.network.rdma", "spec.network.rdma.resourceName",
    "spec.network.rdma.resourceCount", "spec.router.enabled", "spec.router.replicas",
    "spec.router.port", "spec.router.prefillThresholdTokens", "spec.autoscaling.enabled",
    "spec.autoscaling.mode", "spec.autoscaling.externalScaler", "spec.autoscaling.ttftP99",
    "spec.autoscaling.tpotP99", "spec.autoscaling.interval", "spec.autoscaling.window",
    "spec.autoscaling.maxTotalGPUs", "spec.autoscaling.scaleUp.maxStep",
    "spec.autoscaling.scaleDown.stabilizationWindow", "spec.autoscaling.scaleUp.cooldown",
    "spec.decode.autoscaling.minReplicas", "spec.decode.autoscaling.maxReplicas",
    "spec.prefill", "spec.autoscaling", "spec.decode.resources.requests",
    "spec.decode.resources.limits", "spec.prefill.env.0.valueFrom",
    "spec.prefill.env.0.valueFrom.secretKeyRef.name", "spec.model.servedName",
    "spec.decode.tolerations.0.operator",
    "metadata.labels", "metadata.labels.team", "metadata.annotations",
    "metadata.annotations.note", "metadata.finalizers", "metadata.bogus", "status",
    "status.replicas", "status.bogus", "status.conditions", "status.conditions.0.bogus",
    "status.conditions.0.type", "spec.imagePullSecrets", "spec.decode.pod",
    "spec.decode.pod.labels", "spec.decode.pod.annotations", "spec.decode.pod.volumes",
    "spec.decode.pod.volumeMounts", "spec.decode.pod.serviceAccountName",
    "spec.decode.pod.runtimeClassName", "spec.prefill.pod.volumes.0",
    "spec.prefill.pod.volumeMounts.0", "spec.prefill.pod.volumeMounts.0.mountPath",
    "spec.prefill.pod.volumes.0.secret.items",
]  # fmt: skip


def _set(manifest: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = manifest
    parts = dotted.split(".")
    for part in parts[:-1]:
        if isinstance(node, list):
            index = int(part)
            while len(node) <= index:
                node.append({})
            node = node[index]
            continue
        child = node.get(part)
        if not isinstance(child, dict | list):
            child = [] if parts[parts.index(part) + 1].isdigit() else {}
            node[part] = child
        node = child
    last = parts[-1]
    if isinstance(node, list):
        index = int(last)
        while len(node) <= index:
            node.append(None)
        node[index] = copy.deepcopy(value)
    else:
        node[last] = copy.deepcopy(value)


def generate(seed: int, count: int) -> list[tuple[dict[str, Any], list[str]]]:
    rng = random.Random(seed)
    bases = [
        yaml.safe_load(p.read_text()) for p in sorted((ROOT / "manifests/examples").glob("*.yaml"))
    ]
    models = []
    for i in range(count):
        manifest = copy.deepcopy(rng.choice(bases))
        manifest["metadata"] = {"name": f"fz{i:05d}"}
        changes = []
        for _ in range(rng.randint(1, 3)):
            pool = PLAUSIBLE if rng.random() < 0.6 else VALUES
            path, value = rng.choice(OPTIONAL_PATHS), rng.choice(pool)
            try:
                _set(manifest, path, value)
            except (TypeError, ValueError, AttributeError):
                continue
            changes.append(f"{path}={value!r}"[:80])
        models.append((manifest, changes))
    return models


async def _dry_run_all(
    kubeconfig: Path, objects: list[dict[str, Any]], create: bool
) -> dict[str, str]:
    creds = load_credentials(str(kubeconfig))
    client = KubeClient(creds)
    refused: dict[str, str] = {}
    slots = asyncio.Semaphore(8)

    async def one(obj: dict[str, Any]) -> None:
        async with slots:
            try:
                if create:
                    await client.create(obj, dry_run=True)
                else:
                    await client.apply(obj, manager="fuzz", dry_run=True)
            except KubeError as error:
                refused[obj["metadata"]["name"]] = f"{error.status} {error.message}"[:300]

    try:
        await asyncio.gather(*(one(obj) for obj in objects))
    finally:
        await client.close()
    return refused


def server_refusals(
    kube: Kube, namespace: str, objects: list[dict[str, Any]], create: bool = False
) -> dict[str, str]:
    """name -> the API server's refusal, for every object it would not store: a dry run with
    strict field validation, as a create (``kubectl apply`` of a new object) or as a
    server-side apply (``kubectl apply --server-side``, and the operator's own writes)."""
    placed = [{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in objects]
    return asyncio.run(_dry_run_all(kube.layout.kubeconfig, placed, create))


@dataclass
class Report:
    """What one fuzz run found."""

    seed: int
    models: int
    accepted: int = 0
    refused: int = 0
    disagreements: list[tuple[str, list[str], str | None, str | None]] = field(default_factory=list)
    """(name, changes, our refusal or None, the server's refusal or None)."""
    accepted_names: set[str] = field(default_factory=set)
    children: int = 0
    refused_children: dict[str, str] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    slowest_parse: tuple[float, str] = (0.0, "")
    seconds: float = 0.0


CLASSES: dict[str, list[tuple[str, Any]]] = {
    "null": [
        ("spec.model.servedName", None), ("spec.decode.tolerations", [{"key": "gpu",
        "operator": None}]), ("spec.decode.resources", {"requests": None}),
        ("spec.prefill.nodeSelector", {"pool": None}), ("metadata.labels", {"team": None}),
        ("spec.runtime.env", [None]), ("spec.decode.tolerations", [None]), ("spec.model", None),
    ],
    "whole number written as a fraction": [
        ("spec.decode.replicas", 2.0), ("spec.router.replicas", 2.0),
        ("spec.decode.autoscaling", {"minReplicas": 1, "maxReplicas": 4.0}),
        ("spec.prefill.maxNumBatchedTokens", 8192.0), ("spec.decode.replicas", 2.5),
        ("spec.decode.dataParallelSize", 2.0),
        ("spec.decode", {"dataParallelSize": 2.0, "gpusPerReplica": 2}),
    ],
    "extended resource name": [
        ("spec.decode.resources", {"requests": {f"example.com/{'d' * n}": "1"},
                                   "limits": {f"example.com/{'d' * n}": "1"}})
        for n in (63, 64)
    ] + [
        ("spec.decode.resources", {"requests": {name: "1"}, "limits": {name: "1"}})
        for name in ("example.com/-d", "example.com/d_", "EXAMPLE.com/d", "example.com/a/b",
                     "x" * 250 + ".com/d", "kubernetes.io/d", "requests.example.com/d")
    ],
    "Secret and ConfigMap names": [
        ("spec.runtime.env", [{"name": "A", "valueFrom": {ref: {"name": name, "key": "k"}}}])
        for ref in ("secretKeyRef", "configMapKeyRef")
        for name in ("Bad_Name", "a..b", "-a", "s." * 126 + "s", "s" * 254, "hf-token")
    ],
    "metadata": [
        ("metadata.labels", {"bad key!": "x"}), ("metadata.labels", {"team": "a b"}),
        ("metadata.labels", {"app.kubernetes.io/name": "x" * 63}),
        ("metadata.labels", {"team": "x" * 64}), ("metadata.annotations", {"A b": "x"}),
        ("metadata.annotations", {"Example.com/Owner": "free text"}),
        ("metadata.finalizers", ["Bad Name"]), ("metadata.finalizers", ["foo"]),
        ("metadata.bogus", 1),
    ],
    "pod settings": [
        ("spec.decode.pod", {
            "serviceAccountName": "weights", "runtimeClassName": "nvidia",
            "labels": {"team": "a"}, "annotations": {"Example.com/Owner": "x y"},
            "volumes": [{"name": "ca", "secret": {"secretName": "ca",
                                                  "items": [{"key": "ca.crt", "path": "c/ca.crt"}]}},
                        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
            "volumeMounts": [{"name": "ca", "mountPath": "/etc/ca", "readOnly": True},
                             {"name": "data", "mountPath": "/data", "subPath": "..x"}]}),
        ("spec.imagePullSecrets", [{"name": "mirror-pull"}]),
        ("spec.imagePullSecrets", [{"name": "Bad_Pull"}]),
        ("spec.decode.pod", {"volumes": [{"name": "v", "emptyDir": {}}],
                             "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": ".."}]}),
        ("spec.decode.pod", {"labels": {"disagg.dev/role": "prefill"}}),
        ("spec.decode.pod", {"volumes": [{"name": "v", "secret": {"secretName": "s",
                             "items": [{"key": "k", "path": "/abs"}]}}]}),
    ],
    "status": [
        ("status", {"bogus": 1}), ("status", {"conditions": [{"type": "Ready", "bogus": 1}]}),
        ("status", {"conditions": "not a list", "prefill": 3}), ("status", [{"key": "x"}]),
        ("status", "text"),
    ],
}  # fmt: skip
"""Each kind of value on which the parser and the API server once judged apart, or whose
children the API server once refused, with cases on both sides of the rule."""


def class_models() -> list[tuple[dict[str, Any], list[str]]]:
    """The minimal example with each case of CLASSES set, one model per case."""
    base = yaml.safe_load((ROOT / "manifests/examples/minimal.yaml").read_text())
    models: list[tuple[dict[str, Any], list[str]]] = []
    for kind, cases in CLASSES.items():
        for index, (path, value) in enumerate(cases):
            manifest = copy.deepcopy(base)
            manifest["metadata"] = {"name": f"cl{len(models):03d}"}
            _set(manifest, path, value)
            models.append((manifest, [f"{kind} #{index}: {path}={value!r}"[:120]]))
    return models


def run(kube: Kube, namespace: str, seed: int, count: int) -> Report:
    """Generate ``count`` models from ``seed`` and judge them in ``namespace`` (dry runs)."""
    return judge(kube, namespace, generate(seed, count), seed)


def judge(
    kube: Kube, namespace: str, models: list[tuple[dict[str, Any], list[str]]], seed: int = 0
) -> Report:
    """Judge ``models`` (each with what was changed) by the parser and, in ``namespace``,
    by the API server (dry runs), and the children of those both accept."""
    started = time.monotonic()
    report = Report(seed, len(models))
    ours: dict[str, str | None] = {}
    for manifest, changes in models:
        name = manifest["metadata"]["name"]
        began = time.monotonic()
        try:
            parse_manifest(
                {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
            )
            ours[name] = None
        except ManifestError as error:
            ours[name] = "; ".join(error.problems)[:200]
        except Exception as error:  # a crash is what this looks for
            report.crashes.append(f"{name} {changes}: {error!r}"[:300])
            ours[name] = "crash"
        report.slowest_parse = max(report.slowest_parse, (time.monotonic() - began, name))
    server = server_refusals(kube, namespace, [m for m, _ in models], create=True)
    changes_of = {m["metadata"]["name"]: c for m, c in models}
    report.disagreements = [
        (name, changes_of[name], ours[name], server.get(name))
        for name in ours
        if (ours[name] is None) != (name not in server) and ours[name] != "crash"
    ]
    accepted = [
        m
        for m, _ in models
        if ours[m["metadata"]["name"]] is None and m["metadata"]["name"] not in server
    ]
    report.accepted = len(accepted)
    report.accepted_names = {m["metadata"]["name"] for m in accepted}
    report.refused = sum(1 for n in ours if ours[n] and n in server)
    children = []
    for manifest in accepted:
        meta = {**manifest["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}
        for obj in render_all(RenderContext(parse_model({**manifest, "metadata": meta}))):
            if obj["kind"] in ("Deployment", "Service", "PodDisruptionBudget"):
                obj["metadata"].pop("ownerReferences", None)
                children.append(obj)
    report.children = len(children)
    report.refused_children = server_refusals(kube, namespace, children)
    report.seconds = time.monotonic() - started
    return report
