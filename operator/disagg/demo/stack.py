"""The closed autoscaling loop on the local control plane, with nothing mocked but the GPUs.

Real pieces: kube-apiserver and controllers, the operator, Prometheus discovering engine
pods from the API server's view, the pod emulator (one engine simulator per engine pod on
the pod's IP), the router discovering pools by watching Pods, and a load generator. Used by
`disagg demo`, e2e/test_autoscaling.py and bench/autoscale_scenarios.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from disagg.demo.load import MODEL
from disagg.demo.procs import LOG_DIR, Kube, Operator, Proc, start, wait_for
from disagg.devcluster import prometheus
from disagg.devcluster.layout import free_port

log = logging.getLogger("disagg.demo")
TIME_SCALE = 1.0
"""Real time: at 10x, event-loop jitter on two shared cores becomes 10x larger simulated latency."""
COLOCATED_MODEL = "llama-colocated"
"""The demo's contrast: the same engines, prefilling and decoding on the same GPUs."""


def colocated_manifest(prom_url: str) -> dict[str, Any]:
    """The contrast model: colocated, two engines (the split's two GPUs to start), each with
    the split's prefill chunk size, autoscaled on the same SLOs within the same bounds."""
    manifest = model_manifest(prom_url)
    spec = manifest["spec"]
    manifest["metadata"]["name"] = COLOCATED_MODEL
    spec["mode"] = "colocated"
    spec["model"]["servedName"] = COLOCATED_MODEL
    spec["decode"] = {
        "replicas": 2,
        "maxNumBatchedTokens": 8192,
        "maxNumSeqs": 8,
        "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
    }
    return manifest


def model_manifest(prom_url: str, **autoscaling: Any) -> dict[str, Any]:
    spec_autoscaling = {
        "enabled": True,
        "ttftP99": "1s",
        "tpotP99": "40ms",
        "prometheusURL": prom_url,
        "interval": "2s",
        "window": "10s",
        "scaleUp": {"stabilizationWindow": "0s", "maxStep": 2, "cooldown": "4s"},
        "scaleDown": {"stabilizationWindow": "10s", "maxStep": 1, "cooldown": "4s"},
        **autoscaling,
    }
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": MODEL},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL},
            "network": {"transport": "tcp", "shmSize": "1Gi"},
            "prefill": {
                "maxNumBatchedTokens": 8192,
                "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
            },
            "decode": {"maxNumSeqs": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
            "router": {"prefillThresholdTokens": 256},
            "autoscaling": spec_autoscaling,
        },
    }


@dataclass
class Stack:
    kube: Kube
    namespace: str
    prom_url: str
    prom: subprocess.Popen[bytes]
    emulator: subprocess.Popen[bytes]
    router: Proc | None
    operator: Operator
    colocated_router: Proc | None = None
    """The contrast model's router, when the stack runs one (``contrast=True``)."""

    def replicas(self) -> dict[str, int]:
        """Pool sizes: prefill and decode, and with the contrast model its engine pool."""
        pools = [(MODEL, "prefill"), (MODEL, "decode")]
        if self.colocated_router is not None:
            pools.append((COLOCATED_MODEL, "engine"))
        result = {}
        for model, role in pools:
            dep = self.kube.get("deployment", f"{model}-{role}", self.namespace) or {}
            result[role] = int(dep.get("spec", {}).get("replicas", 0))
        return result

    def model(self, name: str = MODEL) -> dict[str, Any]:
        return self.kube.get("dm", name, self.namespace) or {}

    def engine_itl_p99(self, model: str, seconds: float) -> float | None:
        """A model's worst inter-token latency p99 over any 10 s of the last ``seconds`` (what
        a dashboard's spike shows: a whole-phase p99 would depend on how soon scaling out
        dilutes it), from its engines' own millisecond histogram
        (``disagg_sim_inter_token_seconds``), once Prometheus has scraped past now; None
        without data."""
        since = time.time()
        wait_for(
            "Prometheus to scrape past the phase",
            lambda: _latest_scrape(self.prom_url, self.namespace) > since,
            timeout=30,
        )
        selector = f'namespace="{self.namespace}",disagg_model="{model}"'
        query = (
            "max_over_time((histogram_quantile(0.99, sum by (le) (rate("
            f"disagg_sim_inter_token_seconds_bucket{{{selector}}}[10s]))))"
            f"[{max(10, round(seconds))}s:1s])"
        )
        return _instant(self.prom_url, query)  # None also when the window holds no gap

    def condition(self, type_: str) -> dict[str, Any]:
        for cond in self.model().get("status", {}).get("conditions", []):
            if cond["type"] == type_:
                c: dict[str, Any] = cond
                return c
        return {}


def _local_router(kube: Kube, namespace: str, model: str, host: str, *selection: str) -> Proc:
    """``disagg router`` on loopback address ``host``, discovering the model's pods."""
    return start(
        f"autoscale-router-{namespace}-{model}",
        "router", "--host", host, "--port", "8000", "--discover",
        "--kubeconfig", str(kube.layout.kubeconfig), "--namespace", namespace,
        "--served-model-name", model, *selection,
        url=f"http://{host}:8000",
        ready_path="/health",
    )  # fmt: skip


@contextmanager
def stack(
    kube: Kube, namespace: str, operator_args: tuple[str, ...] = (), contrast: bool = False
) -> Iterator[Stack]:
    """Everything of the closed loop for one namespace; torn down whatever happens. With
    ``contrast`` a colocated model of the same engines runs beside it, with a router of its
    own."""
    port, sd_port = free_port(), free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    cleanup: list[Any] = []
    try:
        emulator_log = (LOG_DIR / f"podemu-{namespace}.log").open("wb")
        cleanup.append(emulator_log.close)
        emulator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "disagg.cli",
                "dev",
                "emulate-pods",
                "--namespace",
                namespace,
                "--time-scale",
                str(TIME_SCALE),
                "--sd-port",
                str(sd_port),
            ],
            stdout=emulator_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        cleanup.append(lambda: _stop(emulator))
        # Two routers, two addresses: a second one bound to the first's would fail, and the
        # first answering its readiness check would hide that.
        subnet = f"127.45.{free_port() % 250}"
        operator_port = free_port()
        # The routers and the operator run outside pods here: scraped at their addresses,
        # labelled as the chart's PodMonitor labels router pods.
        scraped = [
            prometheus.StaticTarget("disagg-operator", f"127.0.0.1:{operator_port}"),
            *(
                prometheus.StaticTarget(
                    "disagg-routers",
                    f"{subnet}.{index}:8000",
                    {"namespace": namespace, "disagg_model": model, "disagg_role": "router"},
                )
                for index, model in ((1, MODEL), (2, COLOCATED_MODEL))[: 2 if contrast else 1]
            ),
        ]
        prom = prometheus.start(kube.layout, port, f"http://127.0.0.1:{sd_port}/sd", static=scraped)
        cleanup.append(lambda: _stop(prom))
        prom_url = f"http://127.0.0.1:{port}"
        wait_for("Prometheus to answer", lambda: _up(prom_url + "/-/ready"), timeout=30)
        operator = Operator(
            kube.layout,
            f"--namespace={namespace}",
            "--no-leader-election",
            "--resync-seconds=5",
            *operator_args,
            log_name=f"autoscale-{namespace}",
            port=operator_port,
        )
        the_stack = Stack(kube, namespace, prom_url, prom, emulator, None, operator)
        cleanup.append(lambda: the_stack.operator.stop())
        models = [(MODEL, model_manifest(prom_url))]
        if contrast:
            models.append((COLOCATED_MODEL, colocated_manifest(prom_url)))
        for _, manifest in models:
            kube.apply(yaml.safe_dump(manifest), namespace)
        for name, _ in models:
            kube.run(
                "wait", "--for=condition=Ready", f"dm/{name}", "-n", namespace,
                "--timeout=60s", timeout=90,
            )  # fmt: skip
        the_stack.router = _local_router(
            kube, namespace, MODEL, f"{subnet}.1", "--pd-threshold", "256",
            "--prefill-selector", f"disagg.dev/model={MODEL},disagg.dev/role=prefill",
            "--decode-selector", f"disagg.dev/model={MODEL},disagg.dev/role=decode",
        )  # fmt: skip
        cleanup.append(the_stack.router.stop)
        if contrast:
            the_stack.colocated_router = _local_router(
                kube, namespace, COLOCATED_MODEL, f"{subnet}.2", "--colocated",
                "--decode-selector", f"disagg.dev/model={COLOCATED_MODEL},disagg.dev/role=engine",
            )  # fmt: skip
            cleanup.append(the_stack.colocated_router.stop)
        engines = 4 if contrast else 2
        try:
            wait_for(
                "engine metrics in Prometheus",
                lambda: _pods_scraped(prom_url, namespace) >= engines,
                timeout=60,
            )
        except AssertionError as error:
            sd = httpx.get(f"http://127.0.0.1:{sd_port}/sd", timeout=5).text
            targets = httpx.get(prom_url + "/api/v1/targets", timeout=5).text
            raise AssertionError(f"{error}\nSD: {sd[:1500]}\nTargets: {targets[:1500]}") from None
        yield the_stack
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as error:  # keep tearing down the rest
                log.warning("Cleanup step failed: %r", error)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _instant(prom_url: str, query: str) -> float | None:
    """One instant query's single value (None when empty, NaN or unreachable)."""
    try:
        answer = httpx.get(prom_url + "/api/v1/query", timeout=5, params={"query": query})
        result = answer.json()["data"]["result"]
        value = float(result[0]["value"][1]) if result else float("nan")
    except (httpx.HTTPError, KeyError, ValueError, IndexError):
        return None
    return None if value != value else value


def _engine_targets(namespace: str) -> str:
    """The scrape targets of the namespace's engine pods (its routers are scraped too)."""
    return f'up{{namespace="{namespace}", disagg_role!="router"}}'


def _latest_scrape(prom_url: str, namespace: str) -> float:
    """The newest sample time of the namespace's engine targets (0 when unknown)."""
    return _instant(prom_url, f"min(timestamp({_engine_targets(namespace)}))") or 0.0


def _pods_scraped(prom_url: str, namespace: str) -> int:
    return int(_instant(prom_url, f"count({_engine_targets(namespace)} == 1)") or 0)


class ReplicaRecorder:
    """Samples pool replicas once a second in a thread: the scenario's timeline."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.started, self.stack.replicas()))
            self._stop.wait(1.0)

    def __enter__(self) -> ReplicaRecorder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def highest(self, role: str) -> int:
        return max((s[role] for _, s in self.samples), default=0)
