"""Whether the operator's memory and API traffic follow its own objects, not the cluster's pods.

On the local control plane (started if it is not running): an operator scoped to one
namespace, with N models in it (router off, pools at 0 replicas), talks to the API server
through a relay that counts the bytes the server sends. Measured in an empty cluster over an
idle window that includes resyncs, then while P unrelated pods are created in the same
namespace (the worst case: no namespace filter can help) and scheduled, then over the same
idle window again. Prints RSS and bytes of each phase and the ratio to the empty cluster.

    .venv/bin/python bench/watch_scope.py                  # 5,000 pods, 50 models
    .venv/bin/python bench/watch_scope.py --pods 1000 --window 30
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from disagg.demo.procs import Kube, Operator, local_kube, wait_for
from disagg.demo.relay import CountingRelay
from disagg.devcluster.layout import Layout, default_state_dir

ROOT = Path(__file__).resolve().parent.parent
BATCH = 500


def model(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "router": {"enabled": False},
        },
    }


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"batch-{i:05d}", "labels": {"app": "batch"}},
        "spec": {"containers": [{"name": "work", "image": "registry.example/batch:1"}]},
    }


def apply(kube: Kube, namespace: str, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), BATCH):
        batch = {"apiVersion": "v1", "kind": "List", "items": items[start : start + BATCH]}
        kube.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(batch), timeout=600)


def rss_mib(operator: Operator) -> float:
    for line in Path(f"/proc/{operator.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle_window(operator: Operator, relay: CountingRelay, seconds: float) -> tuple[int, float]:
    """Bytes the server sent over an idle window, and the RSS at its end."""
    before = relay.received
    time.sleep(seconds)
    return relay.received - before, rss_mib(operator)


def scheduled(kube: Kube, namespace: str, count: int) -> bool:
    pods = kube.json("get", "pods", "-n", namespace, "-l", "app=batch")["items"]
    seen = sum(
        1
        for p in pods
        if any(c["type"] == "PodScheduled" for c in p.get("status", {}).get("conditions", []))
    )
    return seen >= count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--resync-seconds", type=float, default=20.0)
    args = parser.parse_args()
    layout = Layout(default_state_dir())
    kube = local_kube(layout, lambda m: print(f"[bench] {m}", file=sys.stderr), ROOT / "crds")
    namespace = f"scope-{uuid.uuid4().hex[:6]}"
    kube.run("create", "namespace", namespace)
    workdir = Path(tempfile.mkdtemp(prefix="watch-scope-"))
    relay = CountingRelay.for_kubeconfig(layout.kubeconfig, workdir / "kubeconfig")
    try:
        apply(kube, namespace, [model(f"m{i:03d}") for i in range(args.models)])
        operator = Operator(
            layout, f"--kubeconfig={workdir / 'kubeconfig'}", f"--namespace={namespace}",
            "--no-leader-election", f"--resync-seconds={args.resync_seconds}",
            log_name="watch-scope-bench",
        )  # fmt: skip
        try:
            wait_for(
                "every model reconciled",
                lambda: operator.reconciles() >= args.models,
                timeout=300,
            )
            time.sleep(15)  # the Deployments report their status once; let that pass
            empty_bytes, empty_rss = idle_window(operator, relay, args.window)

            before = relay.received
            started = time.monotonic()
            apply(kube, namespace, [pod(i) for i in range(args.pods)])
            wait_for(
                f"{args.pods} pods to be scheduled or found unschedulable",
                lambda: scheduled(kube, namespace, args.pods),
                timeout=1800,
                interval=5.0,
            )
            burst_seconds = time.monotonic() - started
            burst_bytes = relay.received - before
            busy_bytes, busy_rss = idle_window(operator, relay, args.window)
        finally:
            operator.stop()
    finally:
        relay.close()
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)

    print(f"\n{args.models} models; {args.pods} unrelated pods in the operator's namespace")
    print(f"  {'phase':44} {'bytes from API':>14} {'RSS MiB':>8}")
    print(f"  {f'empty cluster, {args.window:.0f} s idle':44} {empty_bytes:14,d} {empty_rss:8.0f}")
    print(f"  {f'creating and scheduling the pods ({burst_seconds:.0f} s)':44} {burst_bytes:14,d}")
    print(f"  {f'with the pods, {args.window:.0f} s idle':44} {busy_bytes:14,d} {busy_rss:8.0f}")
    traffic = busy_bytes / empty_bytes if empty_bytes else float("nan")
    print(f"  ratio with pods / empty: traffic {traffic:.2f}x, RSS {busy_rss / empty_rss:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
