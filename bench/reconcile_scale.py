"""How fast the operator brings N models to life, against applying their children straight.

On the local control plane (started if it is not running): the **floor**, the same
children the operator would render for N models (router off, pools at 0 replicas: no pods)
applied with ``kubectl apply --server-side``, 500 objects per call, one call at a time; the
**operator** (scoped to its own namespace, no leader election) given the N models the same
way, timed until every model's ``status.observedGeneration`` is current and its children
exist (when the API server recorded the last model's status write; the bench's own watch
sees it later); then the floor again into a third namespace. The floor is timed on both
sides of the operator because the cluster grows by a floor's and a run's objects (and their
ReplicaSets) as the run goes: the first floor meets an emptier API server and etcd than the
operator, the second a fuller one, and the ratio is against their mean. Each phase starts
once the Deployment controller has caught up with the one before, and namespaces of earlier
runs are waited out first (deleting 13,000 objects competes with whatever is timed). Prints
the times, the ratio, the operator's writes per model (from its own metrics: children,
status, Events), reconcile passes, RSS, and the writes of one idle resync of every model.

    .venv/bin/python bench/reconcile_scale.py                 # 1,000 models
    .venv/bin/python bench/reconcile_scale.py --models 200
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from disagg.api.resource import parse_model
from disagg.demo.procs import Kube, Operator, local_kube, wait_for
from disagg.devcluster.layout import Layout, default_state_dir
from disagg.render import RenderContext, render_all

ROOT = Path(__file__).resolve().parent.parent
BATCH = 500


def model(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 0},
            "router": {"enabled": False},
        },
    }


def children(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator renders for a model, without the ownerReference (there is no model
    in the floor's namespace, and the garbage collector would delete orphans)."""
    owned = copy.deepcopy(manifest)
    owned["metadata"]["uid"] = str(uuid.uuid4())
    rendered = render_all(RenderContext(parse_model(owned)))
    for obj in rendered:
        obj["metadata"].pop("ownerReferences", None)
    return rendered


def apply_in_batches(kube: Kube, objects: list[dict[str, Any]], manager: str) -> None:
    for start in range(0, len(objects), BATCH):
        batch = {"apiVersion": "v1", "kind": "List", "items": objects[start : start + BATCH]}
        kube.run(
            "apply", "--server-side", f"--field-manager={manager}", "-f", "-",
            stdin=yaml.safe_dump(batch), timeout=600,
        )  # fmt: skip


def earlier_namespaces(kube: Kube) -> list[str]:
    """This bench's namespaces still in the cluster (being deleted, or left by a crash)."""
    names = kube.run("get", "namespaces", "-o", "name").stdout.split()
    return [n for n in names if n.startswith("namespace/scale-")]


def timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


class Convergence:
    """Every model's generation and observedGeneration in ``namespace``, followed with one
    ``kubectl get --watch`` (a new one, listing again, whenever the server ends it).

    Listing every model every two seconds instead cost about a second of kubectl CPU per list
    at 1,000 models, taken from the operator and the API server it is timed against; the
    floor is timed with nothing else running."""

    TEMPLATE = '{.metadata.name} {.metadata.generation} {.status.observedGeneration}{"\\n"}'

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._kube, self._namespace = kube, namespace
        self._seen: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stopped.is_set():
            self._process = subprocess.Popen(
                [
                    str(self._kube.binaries.kubectl),
                    f"--kubeconfig={self._kube.layout.kubeconfig}",
                    "get", "dm", "-n", self._namespace, "--watch", "-o",
                    f"jsonpath={self.TEMPLATE}",
                ],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            assert self._process.stdout is not None
            for line in self._process.stdout:
                name, generation, *observed = line.split()
                with self._lock:
                    self._seen[name] = observed == [generation]
            self._process.wait()

    def current(self) -> int:
        """Models whose status reports their current generation."""
        with self._lock:
            return sum(self._seen.values())

    def stop(self) -> None:
        self._stopped.set()
        if self._process is not None:
            self._process.terminate()
        self._thread.join(timeout=10)


def converged(kube: Kube, watch: Convergence, namespace: str, count: int) -> bool:
    if watch.current() < count:
        return False
    deployments = kube.json("get", "deployments", "-n", namespace)["items"]
    return len(deployments) >= 2 * count


def quiet(kube: Kube, namespace: str) -> bool:
    """Whether the Deployment controller has caught up with ``namespace`` (every Deployment
    observed, its ReplicaSet made): a phase timed while it still works through the last
    phase's 2,000 Deployments would pay for them."""
    deployments = kube.json("get", "deployments", "-n", namespace)["items"]
    return all(
        (d.get("status") or {}).get("observedGeneration", 0) >= d["metadata"]["generation"]
        for d in deployments
    )


def last_status_write(kube: Kube, namespace: str) -> float:
    """When the operator last wrote a model's status, as the API server recorded it (the
    managedFields time of its status entry: whole seconds, so the middle of that second).

    This is when the last model converged. Seeing it takes longer: the ``kubectl --watch``
    that follows the models lags behind on a busy host, and the check that the Deployments
    exist lists them all."""
    models = kube.json("get", "dm", "-n", namespace, "--show-managed-fields")["items"]
    written = [
        datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp() + 0.5
        for obj in models
        for entry in obj["metadata"].get("managedFields") or []
        if entry.get("manager") == "disagg-operator" and entry.get("subresource") == "status"
    ]
    if len(written) < len(models):
        raise RuntimeError(f"{len(models) - len(written)} models have no status written")
    return max(written)


def rss_mib(operator: Operator) -> float:
    for line in Path(f"/proc/{operator.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(operator: Operator) -> float:
    """User + system CPU the operator process has used (from /proc)."""
    fields = Path(f"/proc/{operator.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def total(samples: dict[str, float]) -> float:
    return sum(samples.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument(
        "--resync-seconds", type=float, default=300.0, help="the operator's (its default)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="the operator's --concurrency")
    args = parser.parse_args()
    layout = Layout(default_state_dir())
    kube = local_kube(layout, lambda m: print(f"[bench] {m}", file=sys.stderr), ROOT / "crds")
    for namespace in earlier_namespaces(kube):
        kube.run("delete", namespace, "--wait=false", check=False)
    wait_for(
        "earlier runs' namespaces to be deleted",
        lambda: not earlier_namespaces(kube),
        timeout=900,
        interval=2.0,
    )
    run = uuid.uuid4().hex[:6]
    floor_ns, operator_ns, after_ns = (f"scale-{p}-{run}" for p in ("floor", "op", "after"))
    for namespace in (floor_ns, operator_ns, after_ns):
        kube.run("create", "namespace", namespace)
    names = [f"m{i:04d}" for i in range(args.models)]
    try:
        floor_objects = [c for n in names for c in children(model(n, floor_ns))]
        before = timed(lambda: apply_in_batches(kube, floor_objects, "bench-floor"))
        print(f"[bench] floor: {len(floor_objects)} children in {before:.1f}s", file=sys.stderr)
        wait_for("the floor's Deployments observed", lambda: quiet(kube, floor_ns), 600, 2.0)

        operator = Operator(
            layout, f"--namespace={operator_ns}", "--no-leader-election",
            f"--resync-seconds={args.resync_seconds}", f"--concurrency={args.concurrency}",
            log_name="reconcile-scale",
        )  # fmt: skip
        try:
            models = [model(n, operator_ns) for n in names]

            watch = Convergence(kube, operator_ns)

            def give_and_wait() -> None:
                apply_in_batches(kube, models, "bench-user")
                wait_for(
                    f"{args.models} models to converge",
                    lambda: converged(kube, watch, operator_ns, args.models),
                    timeout=3600,
                    interval=0.5,
                )

            cpu_before = cpu_seconds(operator)
            started = time.time()
            try:
                seen = timed(give_and_wait)
            finally:
                watch.stop()
            took = last_status_write(kube, operator_ns) - started
            cpu = cpu_seconds(operator) - cpu_before
            rss = rss_mib(operator)
            convergence_writes = operator.writes(exclude=("Lease",))
            convergence_passes = operator.reconciles()
            conflicts = operator.reconciles("conflict")
            # Deployments report their status after the first pass; let that settle.
            settle = {"writes": total(convergence_writes), "since": time.monotonic()}

            def settled() -> bool:
                now = total(operator.writes(exclude=("Lease",)))
                if now != settle["writes"]:
                    settle.update(writes=now, since=time.monotonic())
                return time.monotonic() - settle["since"] > 10

            wait_for("the operator to stop writing", settled, timeout=600, interval=1.0)
            writes = operator.writes(exclude=("Lease",))
            passes = operator.reconciles()
            # One resync of every model, then the writes it cost.
            wait_for(
                "one idle resync of every model",
                lambda: operator.reconciles() >= passes + args.models,
                timeout=args.resync_seconds * 3 + 600,
                interval=2.0,
            )
            idle = total(operator.writes(exclude=("Lease",))) - total(writes)
        finally:
            operator.stop()
        wait_for("the operator's Deployments observed", lambda: quiet(kube, operator_ns), 600, 2.0)
        after_objects = [c for n in names for c in children(model(n, after_ns))]
        after = timed(lambda: apply_in_batches(kube, after_objects, "bench-floor"))
        print(f"[bench] floor after: {after:.1f}s", file=sys.stderr)
    finally:
        for namespace in (floor_ns, operator_ns, after_ns):
            kube.run("delete", "namespace", namespace, "--wait=false", check=False)
    floor = (before + after) / 2

    by_kind: dict[str, float] = {}
    for key, value in convergence_writes.items():
        kind = key.split('kind="', 1)[1].split('"', 1)[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + value
    print(
        f"\n{args.models} models (router off, pools at 0 replicas: {len(floor_objects)} children)"
    )
    print(
        f"  {'kubectl apply --server-side (floor)':40} {floor:8.1f} s  (before {before:.1f} s, after {after:.1f} s)"
    )
    print(f"  {'operator, apply to every model current':40} {took:8.1f} s  ({took / floor:.2f}x)")
    print(f"  {'  the same as the bench saw it':40} {seen:8.1f} s  ({seen / floor:.2f}x)")
    print(f"  {'writes per model, to converge':40} {total(convergence_writes) / args.models:8.2f}")
    for kind, value in sorted(by_kind.items()):
        print(f"    {kind:38} {value / args.models:8.2f}")
    print(f"  {'writes per model, settled':40} {total(writes) / args.models:8.2f}")
    print(
        f"  {'reconcile passes per model, to converge':40} {convergence_passes / args.models:8.2f}"
    )
    print(f"  {'status writes refused with 409, per model':40} {conflicts / args.models:8.2f}")
    print(f"  {'operator CPU, to converge':40} {cpu:8.1f} s")
    print(f"  {'operator RSS':40} {rss:8.0f} MiB")
    print(f"  {'writes in one idle resync of all':40} {idle:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
