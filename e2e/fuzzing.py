"""Mutated DisaggregatedModels through the parser and the real API server, side by side.

From the examples, a seeded generator sets one to three fields (present ones, and optional
ones the examples leave out) to values drawn from pools of plausible and tricky ones: nulls,
wrong types, bounds, odd quantities and durations, invalid names and label syntax. Each model
goes to the parser (``parse_model``, what ``disagg validate`` and the operator run) and to the
API server (a server-side apply with ``dryRun=All`` and strict field validation, as ``kubectl
apply --server-side`` sends it); the Deployments, Services and PodDisruptionBudgets of every
model both accept go to the API server the same way. ``e2e/test_fuzz.py`` asserts on the
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

from disagg.api.resource import ManifestError, parse_model
from disagg.demo.procs import Kube
from disagg.kube.client import KubeClient, KubeError, load_credentials
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
    "spec.prefill.env.0", "spec.engine.env", "spec.engine.extraArgs", "spec.engine.image",
    "spec.engine.backend", "spec.engine.kvConnector", "spec.engine.kvCacheDtype",
    "spec.model.name", "spec.model.servedName", "spec.network.transport",
    "spec.network.shmSize", "spec.network.rdma", "spec.network.rdma.resourceName",
    "spec.network.rdma.resourceCount", "spec.router.enabled", "spec.router.replicas",
    "spec.router.port", "spec.router.prefillThresholdTokens", "spec.autoscaling.enabled",
    "spec.autoscaling.mode", "spec.autoscaling.externalScaler", "spec.autoscaling.ttftP99",
    "spec.autoscaling.tpotP99", "spec.autoscaling.interval", "spec.autoscaling.window",
    "spec.autoscaling.maxTotalGpus", "spec.autoscaling.scaleUp.maxStep",
    "spec.autoscaling.scaleDown.stabilizationWindow", "spec.autoscaling.scaleUp.cooldown",
    "spec.decode.autoscaling.minReplicas", "spec.decode.autoscaling.maxReplicas",
    "spec.prefill", "spec.autoscaling",
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


async def _dry_run_all(kubeconfig: Path, objects: list[dict[str, Any]]) -> dict[str, str]:
    creds = load_credentials(str(kubeconfig))
    client = KubeClient(creds)
    refused: dict[str, str] = {}
    slots = asyncio.Semaphore(8)

    async def one(obj: dict[str, Any]) -> None:
        async with slots:
            try:
                await client.apply(obj, manager="fuzz", dry_run=True)
            except KubeError as error:
                refused[obj["metadata"]["name"]] = f"{error.status} {error.message}"[:300]

    try:
        await asyncio.gather(*(one(obj) for obj in objects))
    finally:
        await client.close()
    return refused


def server_refusals(kube: Kube, namespace: str, objects: list[dict[str, Any]]) -> dict[str, str]:
    """name -> the API server's refusal, for every object it would not store (a server-side
    apply with dryRun=All and strict field validation, as `kubectl apply --server-side` sends)."""
    placed = [{**o, "metadata": {**o["metadata"], "namespace": namespace}} for o in objects]
    return asyncio.run(_dry_run_all(kube.layout.kubeconfig, placed))


@dataclass
class Report:
    """What one fuzz run found."""

    seed: int
    models: int
    accepted: int = 0
    refused: int = 0
    disagreements: list[tuple[str, list[str], str | None, str | None]] = field(default_factory=list)
    """(name, changes, our refusal or None, the server's refusal or None)."""
    children: int = 0
    refused_children: dict[str, str] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    slowest_parse: tuple[float, str] = (0.0, "")
    seconds: float = 0.0


def run(kube: Kube, namespace: str, seed: int, count: int) -> Report:
    """Generate ``count`` models from ``seed`` and judge them in ``namespace`` (dry runs)."""
    started = time.monotonic()
    report = Report(seed, count)
    models = generate(seed, count)
    ours: dict[str, str | None] = {}
    for manifest, changes in models:
        name = manifest["metadata"]["name"]
        began = time.monotonic()
        try:
            parse_model({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}})
            ours[name] = None
        except ManifestError as error:
            ours[name] = "; ".join(error.problems)[:200]
        except Exception as error:  # a crash is what this looks for
            report.crashes.append(f"{name} {changes}: {error!r}"[:300])
            ours[name] = "crash"
        report.slowest_parse = max(report.slowest_parse, (time.monotonic() - began, name))
    server = server_refusals(kube, namespace, [m for m, _ in models])
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
