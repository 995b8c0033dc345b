"""`disagg demo`: the whole system, end to end, on one machine (what `make demo` runs).

Steps: the local control plane; the operator installed with the Helm chart and running under
the chart's ServiceAccount; Prometheus, the pod emulator and the router; a model with
autoscaling on; then the traffic story, with a live view; then the summary table, JSON and a
PNG timeline. The control plane stays up for exploring until `disagg demo down`. Ctrl-C stops
the traffic and tears everything down.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from disagg.api.base import parse_duration
from disagg.api.crd import build_crd
from disagg.demo.procs import Kube, wait_for
from disagg.demo.report import PhaseResult, Sample, summarize, table, write
from disagg.demo.stack import MODEL, Stack, drive, model_manifest, stack
from disagg.demo.story import STORIES, Phase
from disagg.devcluster.layout import Layout, cache_dir, default_state_dir
from disagg.devcluster.runner import ClusterError, down, ensure_binaries, repo_root, up
from disagg.extras import require_tools

NAMESPACE = "demo"
RELEASE_NAMESPACE = "disagg-system"


class StepFailed(RuntimeError):
    pass


def _say(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def _step(name: str, action: Callable[[], Any], log_hint: str) -> Any:
    _say(name)
    try:
        return action()
    except (AssertionError, ClusterError, OSError, RuntimeError) as error:
        raise StepFailed(f"step '{name}' failed: {error}\n    logs: {log_hint}") from error


def _install_operator(kube: Kube, layout: Layout) -> tuple[str, ...]:
    """helm upgrade --install the chart; returns operator args using its ServiceAccount token."""
    import subprocess

    root = repo_root()
    if root is None:
        raise RuntimeError("the Helm chart is part of the source checkout; run the demo from it")
    helm = cache_dir() / "bin" / "helm" / "helm"
    result = subprocess.run(
        [
            str(helm),
            "upgrade",
            "--install",
            "disagg-operator",
            str(root / "charts" / "disagg-operator"),
            "-n",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--set",
            "crds.enabled=false",
            "--set",
            "replicaCount=1",
            f"--kubeconfig={layout.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm install failed: {result.stderr.strip()}")
    token = kube.run(
        "create", "token", "disagg-operator", "-n", RELEASE_NAMESPACE, "--duration=12h"
    ).stdout.strip()
    server = yaml.safe_load(layout.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    ca = base64.b64encode((layout.pki / "ca.crt").read_bytes()).decode()
    path = layout.root / "demo-operator.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "operator",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {"server": server, "certificate-authority-data": ca},
                    }
                ],
                "users": [{"name": "disagg-operator", "user": {"token": token}}],
                "contexts": [
                    {"name": "operator", "context": {"cluster": "local", "user": "disagg-operator"}}
                ],
            }
        )
    )
    path.chmod(0o600)
    return (f"--kubeconfig={path}",)


def _fresh_namespace(kube: Kube) -> None:
    if kube.get("namespace", NAMESPACE, "") is not None:
        # The previous run's engine pods wait for a drain that no emulator will do now.
        kube.run("delete", "dm", "--all", "-n", NAMESPACE, "--wait=false", check=False)
        kube.run(
            "delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--force", check=False
        )
        kube.run("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", timeout=150)
    kube.run("create", "namespace", NAMESPACE)
    wait_for(
        "the demo namespace's default ServiceAccount",
        lambda: kube.get("serviceaccount", "default", NAMESPACE),
        timeout=30,
    )


class Recorder:
    """Samples replicas and the model status once a second; feeds the view and the report."""

    def __init__(self, loop: Stack) -> None:
        self.loop = loop
        self.phase = ""
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self.status_line = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> Sample:
        model = self.loop.model()
        status = model.get("status", {})
        metrics = status.get("metrics", {})
        ready = {r: int(status.get(r, {}).get("readyReplicas", 0)) for r in ("prefill", "decode")}
        reasons = [status.get(r, {}).get("lastScaleReason") for r in ("prefill", "decode")]
        times = [status.get(r, {}).get("lastScaleTime") or "" for r in ("prefill", "decode")]
        latest = max(range(2), key=lambda i: times[i])
        reason = (
            f"{('prefill', 'decode')[latest]}: {reasons[latest]}"
            if reasons[latest]
            else "no scaling yet"
        )
        self.status_line = self.loop.kube.run(
            "get", "dm", MODEL, "-n", NAMESPACE, check=False
        ).stdout.strip()
        return Sample(
            time.monotonic() - self.started,
            self.phase,
            self.loop.replicas(),
            ready,
            metrics.get("ttftP99Seconds"),
            metrics.get("tpotP99Seconds"),
            reason,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._sample())
            except (AssertionError, OSError, ValueError) as error:
                logging.getLogger("disagg.demo").debug("sample failed: %r", error)
            self._stop.wait(1.0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _line(recorder: Recorder, phase: Phase, rate: float) -> str:
    s = recorder.samples[-1] if recorder.samples else None
    if s is None:
        return f"[{phase.name}] starting"
    ttft = "-" if s.ttft_p99 is None else f"{s.ttft_p99:.2f}s"
    tpot = "-" if s.tpot_p99 is None else f"{s.tpot_p99 * 1000:.0f}ms"
    return (
        f"t={s.t:5.0f}s [{phase.name:<12}] prefill {s.ready['prefill']}/{s.replicas['prefill']} "
        f"decode {s.ready['decode']}/{s.replicas['decode']}  TTFT p99 {ttft}  TPOT p99 {tpot}  "
        f"load {rate:g} req/s  last: {s.reason}"
    )


def _watch(recorder: Recorder, phase: Phase, done: threading.Event, interactive: bool) -> None:
    if interactive:
        from rich.live import Live
        from rich.panel import Panel
        from rich.table import Table

        def render() -> Panel:
            grid = Table.grid(padding=(0, 2))
            s = recorder.samples[-1] if recorder.samples else None
            grid.add_row("phase", f"{phase.title}: {phase.expect}")
            if s is not None:
                for role, slo in (("prefill", "TTFT"), ("decode", "TPOT")):
                    value = s.ttft_p99 if role == "prefill" else s.tpot_p99
                    shown = (
                        "-"
                        if value is None
                        else (f"{value:.2f}s" if role == "prefill" else f"{value * 1000:.0f}ms")
                    )
                    grid.add_row(
                        role,
                        f"{s.ready[role]}/{s.replicas[role]} ready/desired   {slo} p99 {shown}",
                    )
                grid.add_row("request rate", f"{phase.rate:g} req/s")
                grid.add_row("last decision", s.reason)
            grid.add_row("kubectl get dm", recorder.status_line)
            return Panel(grid, title="disagg-operator demo")

        with Live(render(), refresh_per_second=2, transient=False) as live:
            while not done.wait(0.5):
                live.update(render())
        return
    while not done.wait(5.0):
        print(_line(recorder, phase, phase.rate), flush=True)


def _play(loop: Stack, story: tuple[Phase, ...], interactive: bool) -> list[PhaseResult]:
    recorder = Recorder(loop)
    recorder.start()
    results = []
    assert loop.router is not None
    try:
        for phase in story:
            recorder.phase = phase.name
            started = time.monotonic()
            first = len(recorder.samples)
            done = threading.Event()
            viewer = threading.Thread(
                target=_watch, args=(recorder, phase, done, interactive), daemon=True
            )
            viewer.start()
            _say(f"phase '{phase.title}': {phase.expect}")
            report = None
            if phase.rate:
                report = asyncio.run(
                    drive(
                        loop.router.url,
                        phase.rate,
                        phase.seconds,
                        phase.prompt_tokens,
                        phase.max_tokens,
                    )
                )
            else:
                deadline = time.monotonic() + phase.seconds
                while time.monotonic() < deadline and loop.replicas() != {
                    "prefill": 1,
                    "decode": 1,
                }:
                    time.sleep(1)
                time.sleep(3)
            done.set()
            viewer.join(timeout=5)
            results.append(
                PhaseResult(phase, started, time.monotonic(), report, recorder.samples[first:])
            )
    finally:
        recorder.stop()
    return results


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    # SIGTERM tears down like Ctrl-C: no simulator, router or Prometheus is left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    layout = Layout(default_state_dir())
    interactive = sys.stdout.isatty() and not args.non_interactive
    story = STORIES[args.story]
    out = Path(args.out)
    try:
        binaries = _step(
            "building or finding etcd, Kubernetes, kwok and Helm (first run: many minutes)",
            lambda: ensure_binaries(_say),
            str(cache_dir() / "logs"),
        )
        _step("starting the local control plane", lambda: up(layout, _say), str(layout.logs))
        kube = Kube(binaries, layout)
        _step(
            "installing the CRD",
            lambda: kube.run(
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                "-",
                stdin=yaml.safe_dump(build_crd()),
            ),
            str(layout.logs),
        )
        operator_args = _step(
            "installing the operator with its Helm chart",
            lambda: _install_operator(kube, layout),
            str(layout.logs),
        )
        _step("preparing the demo namespace", lambda: _fresh_namespace(kube), str(layout.logs))
        _say("starting Prometheus, the pod emulator, the operator, the model and the router")
        with stack(kube, NAMESPACE, operator_args) as loop:
            _say(f"the model is Ready; router at {loop.router.url if loop.router else '?'}")
            results = _play(loop, story, interactive)
        spec = model_manifest("")["spec"]
        ttft_slo = parse_duration(spec["autoscaling"]["ttftP99"])
        tpot_slo = parse_duration(spec["autoscaling"]["tpotP99"])
        summary = summarize(results, ttft_slo, tpot_slo, {"prefill": 1, "decode": 1})
        json_path, png_path = write(summary, results, out, ttft_slo, tpot_slo)
    except StepFailed as failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _say("interrupted: stopping the traffic and tearing everything down")
        down(layout, _say)
        return 130
    print(table(summary))
    print(f"\nsummary: {json_path}\ntimeline: {png_path}")
    print(
        f"\nThe control plane is still up. Explore it:\n  export KUBECONFIG={layout.kubeconfig}\n"
        f"  export PATH={cache_dir() / 'bin' / 'k8s'}:$PATH\n"
        f"  kubectl get dm,deploy,pods -n {NAMESPACE}\n"
        "Stop it with: make demo-down"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.action == "down":
        down(Layout(default_state_dir()), _say)
        return 0
    require_tools("disagg demo")
    return run(args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg demo`` to the ``disagg`` parser."""
    demo = sub.add_parser("demo", help="the whole system end to end on this machine")
    demo.add_argument("action", nargs="?", choices=("run", "down"), default="run")
    demo.add_argument(
        "--non-interactive", action="store_true", help="one status line per interval, no live view"
    )
    demo.add_argument(
        "--story", choices=sorted(STORIES), default="full", help="the traffic story to play"
    )
    demo.add_argument("--out", default="out/demo", help="where summary.json and timeline.png go")
    demo.set_defaults(func=cmd_demo)
