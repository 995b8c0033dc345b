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
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from disagg.api.base import parse_duration
from disagg.api.crd import build_crd
from disagg.demo import dashboard
from disagg.demo.live import Recorder, watch
from disagg.demo.load import MODEL, LoadReport, drive
from disagg.demo.procs import Kube, wait_for
from disagg.demo.report import PhaseResult, summarize, table, write
from disagg.demo.stack import COLOCATED_MODEL, Stack, model_manifest, stack
from disagg.demo.story import STORIES, Phase
from disagg.devcluster.layout import Layout, cache_dir, default_state_dir
from disagg.devcluster.prepare import ClusterError, ensure_binaries, repo_root
from disagg.devcluster.runner import down, up
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


MINIMUM = {"prefill": 1, "decode": 1, "engine": 2}
"""Each pool's autoscaling minimum: the split's 1P+1D and the colocated model's 2 engines."""


async def _both(loop: Stack, phase: Phase, chat: Phase) -> tuple[LoadReport, LoadReport]:
    """The phase's traffic to the split and, at the same time, the same to the colocated
    model; with ``over_chat``, ``chat``'s traffic goes on underneath for as long."""
    assert loop.router is not None and loop.colocated_router is not None
    targets = ((loop.router.url, MODEL), (loop.colocated_router.url, COLOCATED_MODEL))
    streams = [(phase.rate, phase.prompt_tokens, phase.max_tokens)]
    if phase.over_chat:
        streams.append((chat.rate, chat.prompt_tokens, chat.max_tokens))
    reports = await asyncio.gather(
        *(
            drive(url, rate, phase.seconds, prompt, out, model=model)
            for url, model in targets
            for rate, prompt, out in streams
        )
    )
    split, colocated = LoadReport(), LoadReport()
    for i, report in enumerate(reports):
        (split if i < len(streams) else colocated).add(report)
    return split, colocated


def _diagnose(loop: Stack, name: str, since: float) -> dict[str, Any]:
    """`disagg diagnose -o json` on one of the demo's models, as a user would run it."""
    result = subprocess.run(
        [
            sys.executable, "-m", "disagg.cli", "diagnose", "--prometheus", loop.prom_url,
            "--model", name, "--namespace", loop.namespace, "--since", f"{max(60, int(since))}s",
            "--step", "5s", "--window", "10s", "--kubeconfig", str(loop.kube.layout.kubeconfig),
            "-o", "json",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if result.returncode != 0 or not result.stdout.strip():
        return {"verdict": "error", "summary": result.stderr.strip()[-500:]}
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


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
                target=watch, args=(recorder, phase, done, interactive), daemon=True
            )
            viewer.start()
            _say(f"phase '{phase.title}': {phase.expect}")
            report = colocated = None
            if phase.rate:
                report, colocated = asyncio.run(_both(loop, phase, story[0]))
            else:
                deadline = time.monotonic() + phase.seconds
                while time.monotonic() < deadline and loop.replicas() != MINIMUM:
                    time.sleep(1)
                time.sleep(3)
            ended = time.monotonic()
            itl = {}
            if phase.rate:
                itl = {m: loop.engine_itl_p99(m, ended - started) for m in (MODEL, COLOCATED_MODEL)}
            done.set()
            viewer.join(timeout=5)
            result = PhaseResult(phase, started, ended, report, recorder.samples[first:], colocated)
            result.engine_itl_p99 = itl.get(MODEL)
            result.colocated_engine_itl_p99 = itl.get(COLOCATED_MODEL)
            results.append(result)
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
        with stack(kube, NAMESPACE, operator_args, contrast=True) as loop:
            _say(
                f"both models are Ready; routers at {loop.router.url if loop.router else '?'} "
                f"({MODEL}, disaggregated) and "
                f"{loop.colocated_router.url if loop.colocated_router else '?'} "
                f"({COLOCATED_MODEL}, colocated)"
            )
            results = _play(loop, story, interactive)
            since = time.monotonic() - results[0].started
            _say("diagnosing both models from their engines' metrics (disagg diagnose)")
            diagnoses = {name: _diagnose(loop, name, since) for name in (MODEL, COLOCATED_MODEL)}
            _say("reading the chart's Grafana dashboard panels from Prometheus")
            now = time.time()
            panels = dashboard.fetch(loop.prom_url, NAMESPACE, MODEL, now - since, now)
        spec = model_manifest("")["spec"]
        ttft_slo = parse_duration(spec["autoscaling"]["ttftP99"])
        tpot_slo = parse_duration(spec["autoscaling"]["tpotP99"])
        summary = summarize(results, ttft_slo, tpot_slo, {"prefill": 1, "decode": 1, "engine": 1})
        summary["diagnoses"] = {
            name: {"verdict": d.get("verdict"), "summary": d.get("summary")}
            for name, d in diagnoses.items()
        }
        json_path, png_path = write(summary, results, out, ttft_slo, tpot_slo)
        board_path = dashboard.draw(
            panels, out / "dashboard.png", f"The chart's dashboard for {NAMESPACE}/{MODEL}"
        )
    except StepFailed as failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _say("interrupted: stopping the traffic and tearing everything down")
        down(layout, _say)
        return 130
    print(table(summary))
    print()
    for name, found in summary["diagnoses"].items():
        print(f"disagg diagnose --model {name}: {found['verdict']}: {found['summary']}")
    print(f"\nsummary: {json_path}\ntimeline: {png_path}\ndashboard: {board_path}")
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
    demo.add_argument(
        "--out",
        default="out/demo",
        help="where summary.json, timeline.png and dashboard.png go",
    )
    demo.set_defaults(func=cmd_demo)
