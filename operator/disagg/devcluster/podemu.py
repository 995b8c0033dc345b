"""The pod emulator: one engine simulator per Running engine pod, on the pod's own IP.

kwok makes pods Running but runs nothing; this plays the kubelet's container part for the
engine pools. For each Running prefill/decode pod of a DisaggregatedModel it starts
``disagg sim engine`` listening on the pod IP (a loopback address) with the role and the
flags the operator rendered (served model name, token budget, max sequences, TP). When the
pod is deleted it behaves like the kubelet: it runs the pod's own preStop hook (``disagg-engine
drain``, pointed at the pod IP instead of the pod's loopback) within the grace
period, stops the engine, and only then removes the pod; pods it manages carry an
annotation that makes kwok wait for the grace period instead of deleting them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from disagg.kube.client import KubeClient, KubeError
from disagg.perf.engine_buckets import VLLM_FLAG, vllm_custom_buckets
from disagg.perf.profiles import model_profile

log = logging.getLogger("disagg.podemu")
EMULATED_ANNOTATION: Final = "disagg.dev/emulated"
SELECTOR: Final = (
    "app.kubernetes.io/managed-by=disagg-operator,disagg.dev/role in (prefill,decode,engine)"
)
WITH_ROUTERS: Final = (
    "app.kubernetes.io/managed-by=disagg-operator,disagg.dev/role in (prefill,decode,engine,router)"
)
SIM_ROLES: Final = {"prefill": "prefill", "decode": "decode", "engine": "both"}
"""The simulator's role for each pool: the colocated engine prefills and decodes."""
PASSED_FLAGS: Final = {
    "--served-model-name": "--served-model-name",
    "--max-num-batched-tokens": "--max-num-batched-tokens",
    "--chunked-prefill-size": "--max-num-batched-tokens",
    "--max-num-seqs": "--max-num-seqs",
    "--max-running-requests": "--max-num-seqs",
    "--tensor-parallel-size": "--tensor-parallel-size",
    "--tp-size": "--tensor-parallel-size",
    "--otlp-traces-endpoint": "--otlp-traces-endpoint",
}


def _flag(argv: Sequence[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def sim_argv(pod: dict[str, Any], time_scale: float, extra: Sequence[str] = ()) -> list[str] | None:
    """The simulator command line for an engine pod, or None if it is not one (pure)."""
    containers = pod.get("spec", {}).get("containers", [])
    ip = pod.get("status", {}).get("podIP")
    role = pod.get("metadata", {}).get("labels", {}).get("disagg.dev/role")
    if not containers or not ip or role not in SIM_ROLES:
        return None
    args = [str(a) for a in containers[0].get("args", [])]
    port = _flag(args, "--port") or "8000"
    argv = [
        "--role",
        SIM_ROLES[role],
        "--host",
        ip,
        "--port",
        port,
        "--kv-port",
        "5600",
        "--time-scale",
        f"{time_scale:g}",
    ]
    for engine_flag, sim_flag in PASSED_FLAGS.items():
        value = _flag(args, engine_flag)
        if value is not None and sim_flag not in argv:
            argv += [sim_flag, value]
    vllm = args[:2] == ["vllm", "serve"]
    if vllm:
        argv += _latency_buckets(args)
    model = args[2] if len(args) > 2 and vllm else _flag(args, "--model-path")
    if model and "--model-profile" not in extra:
        with contextlib.suppress(KeyError):  # unknown model: the simulator's default profile
            argv += ["--model-profile", model_profile(model.rsplit("/models/", 1)[-1]).name]
    return [*argv, *extra]


def _last(argv: Sequence[str], flag: str) -> str:
    """The value of the last ``flag`` (argparse lets a later one win)."""
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


def _latency_buckets(args: Sequence[str]) -> list[str]:
    """The TTFT and inter-token bounds a vLLM pod's arguments set (extraArgs may), as one
    ``--custom-histogram-buckets`` the simulator takes: it exports what the engine would."""
    try:
        custom = vllm_custom_buckets(args)
    except ValueError:  # the operator refuses such a spec before a pod has it
        return []
    latency = {
        f: list(custom[f]) for f in ("time_to_first_token", "inter_token_latency") if f in custom
    }
    return [VLLM_FLAG, json.dumps(latency, separators=(",", ":"))] if latency else []


def router_argv(pod: dict[str, Any], kubeconfig: str) -> list[str] | None:
    """``disagg router`` as the router pod's container would run it, on the pod IP and
    watching the API server through ``kubeconfig``; None if it is not a router pod (pure)."""
    containers = pod.get("spec", {}).get("containers", [])
    ip = pod.get("status", {}).get("podIP")
    role = pod.get("metadata", {}).get("labels", {}).get("disagg.dev/role")
    if not containers or not ip or role != "router":
        return None
    args = [str(a) for a in containers[0].get("args", [])]
    return ["router", *args, "--host", ip, "--kubeconfig", kubeconfig]


def plain_env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment given as values (not read from Secrets or fields) (pure)."""
    containers = pod.get("spec", {}).get("containers", [])
    env = (containers or [{}])[0].get("env", [])
    return {e["name"]: str(e["value"]) for e in env if "value" in e}


def otel_env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's OpenTelemetry settings (service name, sampler, protocol), which the
    engine it plays reads from its environment (pure)."""
    return {name: value for name, value in plain_env(pod).items() if name.startswith("OTEL_")}


def pre_stop_sleep(pod: dict[str, Any]) -> float:
    """Seconds of the pod's ``preStop: sleep`` hook (0 without one)."""
    containers = pod.get("spec", {}).get("containers", [])
    hook = (containers or [{}])[0].get("lifecycle", {}).get("preStop", {})
    return float(hook.get("sleep", {}).get("seconds", 0))


def pre_stop_argv(pod: dict[str, Any]) -> tuple[list[str], dict[str, str]] | None:
    """The engine pod's preStop ``disagg-engine drain`` as this host runs it (argv and the
    container's plain env), aimed at the pod IP; None when the pod has no such hook (pure)."""
    containers = pod.get("spec", {}).get("containers", [])
    ip = pod.get("status", {}).get("podIP")
    if not containers or not ip:
        return None
    hook = containers[0].get("lifecycle", {}).get("preStop", {}).get("exec", {})
    command = [str(c) for c in hook.get("command", [])]
    if command[:2] != ["disagg-engine", "drain"]:
        return None
    argv = [sys.executable, "-m", "disagg_engine.cli", *command[1:], "--host", ip]
    return argv, plain_env(pod)


@dataclass
class Running:
    process: asyncio.subprocess.Process
    url: str
    draining: bool = False


class PodEmulator:
    """Watches engine pods and keeps one simulator per Running pod."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str | None,
        time_scale: float,
        extra: Sequence[str],
        log_dir: Path,
        router_kubeconfig: str | None = None,
    ) -> None:
        self.client = client
        self.router_kubeconfig = router_kubeconfig
        """Also run ``disagg router`` for router pods, watching the API server through it."""
        self.selector = WITH_ROUTERS if router_kubeconfig else SELECTOR
        self.namespace = namespace
        self.time_scale = time_scale
        self.extra = list(extra)
        self.log_dir = log_dir
        self.running: dict[str, Running] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                items, version = await self.client.list_with_version(
                    "Pod", self.namespace, self.selector
                )
                for pod in items:
                    await self.observe("MODIFIED", pod)
                watch = self.client.watch("Pod", self.namespace, self.selector, version)
                async for kind, pod in watch:
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        await self.observe(kind, pod)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # keep emulating through API hiccups
                log.warning("Pod watch interrupted: %r", error)
                await asyncio.sleep(1)

    def _key(self, pod: dict[str, Any]) -> str:
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"

    async def observe(self, kind: str, pod: dict[str, Any]) -> None:
        key = self._key(pod)
        meta, status = pod["metadata"], pod.get("status", {})
        current = self.running.get(key)
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = pod
        if kind == "DELETED":
            if current is not None:
                await self._stop(key)
            return
        if meta.get("deletionTimestamp"):
            if current is not None and not current.draining:
                current.draining = True
                self._spawn(self._drain_and_remove(key, pod))
            elif current is None and meta.get("annotations", {}).get(EMULATED_ANNOTATION):
                await self._force_delete(pod)
            return
        if not meta.get("annotations", {}).get(EMULATED_ANNOTATION):
            # Claimed before kwok starts it, so it starts Running but not Ready (see
            # kwok-stages.yaml): no controller counts it ready before its process serves.
            await self._claim(pod)
        if current is None and status.get("phase") == "Running" and status.get("podIP"):
            await self._start(key, pod)

    def _command(self, pod: dict[str, Any]) -> list[str] | None:
        """The ``disagg`` command line that plays this pod's container."""
        if self.router_kubeconfig is not None:
            router = router_argv(pod, self.router_kubeconfig)
            if router is not None:
                return router
        argv = sim_argv(pod, self.time_scale, self.extra)
        return None if argv is None else ["sim", "engine", *argv]

    async def _start(self, key: str, pod: dict[str, Any]) -> None:
        argv = self._command(pod)
        if argv is None:
            return
        meta = pod["metadata"]
        # Not ready until the process answers /health, as its readiness probe would say
        # (kwok made it Ready if it started the pod before the claim reached it).
        await self._set_ready(pod, False)
        log_file = (self.log_dir / f"{meta['namespace']}_{meta['name']}.log").open("ab")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "disagg.cli",
            *argv,
            env={**os.environ, **otel_env(pod)},
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
        log_file.close()
        url = f"http://{_last(argv, '--host')}:{_last(argv, '--port')}"
        self.running[key] = Running(process, url)
        what = "router" if argv[0] == "router" else f"{argv[3]} simulator"
        log.info("Started a %s for %s at %s", what, key, url)
        self._spawn(self._ready_when_healthy(key, pod, url))

    async def _claim(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        meta.setdefault("annotations", {})[EMULATED_ANNOTATION] = "true"
        with contextlib.suppress(KubeError):
            await self.client.patch(
                "Pod",
                meta["namespace"],
                meta["name"],
                {"metadata": {"annotations": {EMULATED_ANNOTATION: "true"}}},
            )

    async def _ready_when_healthy(self, key: str, pod: dict[str, Any], url: str) -> None:
        async with httpx.AsyncClient(timeout=1.0) as http:
            for _ in range(300):
                if key not in self.running:
                    return
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        await self._set_ready(pod, True)
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)

    async def _set_ready(self, pod: dict[str, Any], ready: bool) -> None:
        meta = pod["metadata"]
        value = "True" if ready else "False"
        conditions = [
            {**c, "status": value} if c.get("type") in ("Ready", "ContainersReady") else c
            for c in pod.get("status", {}).get("conditions", [])
        ]
        statuses = [
            {**c, "ready": ready} for c in pod.get("status", {}).get("containerStatuses", [])
        ]
        with contextlib.suppress(KubeError):
            await self.client.patch_status(
                "Pod",
                meta["namespace"],
                meta["name"],
                {"conditions": conditions, "containerStatuses": statuses},
            )

    async def _drain_and_remove(self, key: str, pod: dict[str, Any]) -> None:
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        pause = pre_stop_sleep(pod)
        if pause and key in self.running:
            # The router's hook: keep serving while the Service stops sending to the pod,
            # then SIGTERM, on which it finishes what it holds (within the grace period).
            await asyncio.sleep(pause)
            await self._stop(key, max(10.0, grace - pause))
            await self._force_delete(pod)
            return
        hook = pre_stop_argv(pod)
        if hook is not None and key in self.running:
            argv, env = hook
            process = await asyncio.create_subprocess_exec(
                *argv,
                env={**os.environ, **env},
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
            )
            try:
                _, said = await asyncio.wait_for(process.communicate(), grace)
                log.info("preStop of %s: %s", key, said.decode(errors="replace").strip())
            except TimeoutError:
                process.kill()
                await process.wait()
                log.info("preStop of %s still running after the %ds grace period", key, grace)
        await self._stop(key)
        await self._force_delete(pod)

    async def _force_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(KubeError):
            await self.client.delete_now("Pod", meta["namespace"], meta["name"])

    async def _stop(self, key: str, grace: float = 10.0) -> None:
        current = self.running.pop(key, None)
        if current is None or current.process.returncode is not None:
            return
        current.process.terminate()
        try:
            await asyncio.wait_for(current.process.wait(), grace)
        except TimeoutError:
            current.process.kill()
            await current.process.wait()
        log.info("Stopped the simulator of %s", key)

    def discovery_targets(self) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: the engine pods, labelled as kubernetes_sd would.

        Debian's Prometheus is built without Kubernetes service discovery, so the harness serves
        the same ``__meta_kubernetes_pod_*`` labels from its own watch of the API server, and
        the documented relabeling applies unchanged.
        """
        targets = []
        for pod in self.pods.values():
            ip = pod.get("status", {}).get("podIP")
            argv = sim_argv(pod, self.time_scale)
            if not ip or argv is None:
                continue
            meta = pod["metadata"]
            labels = {
                "__meta_kubernetes_namespace": meta["namespace"],
                "__meta_kubernetes_pod_name": meta["name"],
                "__meta_kubernetes_pod_ip": ip,
                "__meta_kubernetes_pod_phase": pod.get("status", {}).get("phase", ""),
                "__meta_kubernetes_pod_container_port_name": "http",
            }
            for name, value in meta.get("labels", {}).items():
                clean = "".join(c if c.isalnum() else "_" for c in name)
                labels[f"__meta_kubernetes_pod_label_{clean}"] = value
            targets.append(
                {"targets": [f"{ip}:{argv[argv.index('--port') + 1]}"], "labels": labels}
            )
        return targets

    async def close(self) -> None:
        for key in list(self.running):
            await self._stop(key)
